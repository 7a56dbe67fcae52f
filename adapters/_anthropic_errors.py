"""How a failed Anthropic SDK call becomes a `ModelError` (status, retryable, a message that says what to do).

As for OpenAI (adapters/_openai_errors.py, whose helpers this shares): the API key is masked in every
text quoted, and the SDK's exception is chained only when nothing along its chain holds the key. An error
the server sends in the middle of a stream (an `error` event, e.g. `overloaded_error`) arrives with the
stream's status 200; its error type decides whether to retry.
"""

from __future__ import annotations

from typing import Any

from waypoint.engine.errors import ModelError

from ._openai_errors import _chain, _describe, redact

__all__ = ["model_error"]

_ADVICE = {
    400: "the server rejected the request; check the messages, the tool schemas and max_tokens",
    401: "the server refused the API key; check ANTHROPIC_API_KEY (or api_key=) is valid for this server",
    403: "the API key may not use this model; check the key's workspace and permissions",
    404: "check the model name and base_url (the server must serve /v1/messages for this model)",
    408: "the server timed out; retry",
    413: "the request is too large; send fewer or shorter messages",
    429: "rate limited; retry after a pause (the retry middleware does) or lower the request rate",
    529: "the API is overloaded; retry after a pause (the retry middleware does)",
}
# Error types that mean "try again" whatever the status (a mid-stream error event comes with status 200).
_RETRYABLE_TYPES = {"overloaded_error", "api_error", "rate_limit_error", "timeout_error"}


def _status_error(exc: Any, api_key: str | None) -> tuple[int | None, bool, str]:
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    kind = error.get("type") if isinstance(error.get("type"), str) else None
    detail = error.get("message") if isinstance(error.get("message"), str) else None
    detail = redact(detail or (str(exc.body) if exc.body else "") or str(exc), api_key)
    if len(detail) > 300:  # a proxy's HTML error page, say
        detail = detail[:299] + "…"
    status = exc.status_code
    mid_stream = status < 400
    retryable = status in (408, 429) or status >= 500 or kind in _RETRYABLE_TYPES
    code = 529 if kind == "overloaded_error" else 429 if kind == "rate_limit_error" else status
    advice = _ADVICE.get(code) or ("a server error; retry later (the retry middleware does)" if retryable
                                   else "the server rejected the request; check the model name and arguments")
    retry_after = exc.response.headers.get("retry-after") if getattr(exc, "response", None) is not None else None
    if retry_after:
        advice += f" (the server asks to wait {retry_after} s)"
    what = f"{kind}: {detail}" if kind else detail
    head = "an error event in the stream" if mid_stream else f"HTTP {status}"
    return (None if mid_stream else status), retryable, f"{head}: {what} — {advice}"


def model_error(exc: BaseException, *, model: str, server: str, api_key: str | None, timeout: float,
                during: str = "") -> ModelError:
    """A `ModelError` for `exc`, raised by the SDK or its HTTP client while calling `model` at `server`."""
    import anthropic
    import httpx2

    status: int | None = None
    if isinstance(exc, anthropic.APIStatusError):
        status, retryable, what = _status_error(exc, api_key)
    elif isinstance(exc, (anthropic.APITimeoutError, httpx2.TimeoutException)):
        retryable = True
        what = (f"no answer within {timeout:g} s ({_describe(exc)}) — retry, or give the model a longer "
                "timeout= if its answers are slow")
    elif isinstance(exc, (anthropic.APIConnectionError, httpx2.TransportError)):
        retryable = True
        what = (f"the connection dropped ({_describe(exc)}) — retry" if during else
                f"the connection failed ({_describe(exc)}) — retry; if it persists, check base_url and that "
                "the server is running")
    else:  # an answer the SDK, or the model class, cannot read: a proxy's glitch passes, so try again
        retryable = True
        what = (f"its answer could not be read ({_describe(exc)}) — retry; if it persists, check the server's logs "
                "(and any proxy in between)")
    where = f" {during}" if during else ""
    error = ModelError(redact(f"model '{model}' at {server} failed{where}: {what}", api_key), status=status,
                       retryable=retryable, model=model)
    if not api_key or not any(api_key in str(e) or api_key in repr(e) for e in _chain(exc)):
        error.__cause__ = exc
    return error
