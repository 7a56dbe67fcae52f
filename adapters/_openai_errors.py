"""How a failed OpenAI SDK / httpx call becomes a `ModelError` (status, retryable, a message that says what to do).

The API key never reaches the message: it is masked in every text we quote, and the original exception
is chained as `__cause__` only when no message along its chain contains the key.
"""

from __future__ import annotations

from typing import Any

from waypoint.engine.errors import ModelError

__all__ = ["model_error", "redact"]

_ADVICE = {
    400: "the server rejected the request; check the messages, the tool schemas and the extra arguments",
    401: "the server refused the API key; check OPENAI_API_KEY (or api_key=) is valid for this server",
    403: "the API key may not use this model; check the key's project and permissions",
    404: "check the model name and base_url (the server must serve /chat/completions for this model)",
    408: "the server timed out; retry",
    422: "the server could not process the request; check the messages and the tool schemas",
    429: "rate limited; retry after a pause (the retry middleware does) or lower the request rate",
}


def redact(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` masked."""
    return text.replace(secret, "***") if secret else text


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def _describe(exc: BaseException) -> str:
    """The exception and the low-level causes under it (the SDK's own messages are often just 'Connection error.')."""
    parts = []
    for e in _chain(exc):
        text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if text not in parts:
            parts.append(text)
    return " <- ".join(parts[:3])


def _status_error(exc: Any, api_key: str | None) -> tuple[int, bool, str]:
    status = exc.status_code
    body = exc.body
    detail = body.get("message") if isinstance(body, dict) else None
    detail = redact(detail or (str(body) if body else "") or exc.message, api_key)  # before cutting it short
    if len(detail) > 300:  # a proxy's HTML error page, say
        detail = detail[:299] + "…"
    retryable = status in (408, 429) or status >= 500
    advice = _ADVICE.get(status) or ("a server error; retry later (the retry middleware does)" if status >= 500
                                     else "the server rejected the request; check the model name and arguments")
    retry_after = exc.response.headers.get("retry-after") if exc.response is not None else None
    if retry_after:
        advice += f" (the server asks to wait {retry_after} s)"
    return status, retryable, f"HTTP {status}: {detail} — {advice}"


def model_error(exc: BaseException, *, model: str, server: str, api_key: str | None, timeout: float,
                during: str = "") -> ModelError:
    """A `ModelError` for `exc`, raised by the SDK or httpx while calling `model` at `server`."""
    import httpx
    import openai

    status: int | None = None
    if isinstance(exc, openai.APIStatusError):
        status, retryable, what = _status_error(exc, api_key)
    elif isinstance(exc, (openai.APITimeoutError, httpx.TimeoutException)):
        retryable = True
        what = (f"no answer within {timeout:g} s ({_describe(exc)}) — retry, or give the model a longer "
                "timeout= if its answers are slow")
    elif isinstance(exc, (openai.APIConnectionError, httpx.TransportError)):
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
