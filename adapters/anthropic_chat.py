"""`AnthropicChatModel`: Claude through the official `anthropic` SDK's messages API (extra `[anthropic]`).

The SDK is imported when the first `AnthropicChatModel` is created, not when this package is (it takes
most of a second to import). As with `OpenAIChatModel`: the SDK's own retries are off (Waypoint's retry
middleware decides from `ModelError.retryable`), there is one client per running event loop, and the API
key never appears in an error. The wire format is in `_anthropic_wire.py`; what goes out is made sendable
(valid UTF-8, JSON only) by `_outgoing.py`, which `OpenAIChatModel` shares.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

from waypoint.engine.errors import ModelError
from waypoint.engine.models.base import ToolChoice
from waypoint.engine.models.schema import Message, ToolInfo

from ._anthropic_errors import model_error
from ._anthropic_wire import StreamReader, message_from_response, request
from ._outgoing import accepted_arguments, build_request, offered_tools, server_of
from ._per_loop import ClientPerLoop

__all__ = ["AnthropicChatModel"]

_DEFAULT_BASE_URL = "https://api.anthropic.com"
_NO_KEY = "not-needed"  # a local server or proxy given as base_url may need none; the SDK insists on one


class AnthropicChatModel:
    """A chat model served over Anthropic's messages API (Claude), streaming, tool use and tool results.

    `api_key` defaults to `ANTHROPIC_API_KEY`, `base_url` to `ANTHROPIC_BASE_URL` or Anthropic's API.
    `max_tokens` is required by the API (default 4096). `extra` goes to every `messages.create` call
    (`stop_sequences=`, `thinking=`, `metadata=`, ...; a field the SDK does not take as an argument, such as
    `top_p=`, goes in the request body as it is). Calls raise `ModelError` with `status` and `retryable`.
    """

    provider = "anthropic"  # gen_ai.provider.name, for tracing

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 60.0, max_tokens: int = 4096, temperature: float | None = None,
                 **extra: Any) -> None:
        import anthropic

        self.name = model
        self.model = model
        self.base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or _DEFAULT_BASE_URL
        self.server = server_of(self.base_url)  # never user:password
        self.timeout = timeout
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.extra = extra
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key and self.base_url == _DEFAULT_BASE_URL:
            raise ModelError(f"model '{model}' at {self.server}: no API key — set ANTHROPIC_API_KEY or pass "
                             "api_key=; for a local server or a proxy pass base_url=", model=model)
        self._api_key = key or _NO_KEY
        self._accepted = accepted_arguments(anthropic.resources.messages.AsyncMessages.create)
        self._clients = ClientPerLoop(lambda: anthropic.AsyncAnthropic(
            api_key=self._api_key, base_url=self.base_url, timeout=timeout, max_retries=0))

    def __repr__(self) -> str:
        return f"AnthropicChatModel(model={self.model!r}, server={self.server!r})"

    def _request(self, messages: Sequence[Message], tools: Sequence[ToolInfo] | None,
                 tool_choice: ToolChoice) -> dict[str, Any]:
        def build() -> dict[str, Any]:
            offered = offered_tools(tools, tool_choice, model=self.name, server=self.server)
            out = {"model": self.model, "max_tokens": self.max_tokens, **request(messages, offered, tool_choice)}
            if self.temperature is not None:
                out["temperature"] = self.temperature
            return {**out, **self.extra}

        return build_request(build, self._accepted, model=self.name, server=self.server)

    def _error(self, exc: BaseException, during: str = "") -> ModelError:
        return model_error(exc, model=self.name, server=self.server, api_key=self._api_key,
                           timeout=self.timeout, during=during)

    async def generate(self, messages: Sequence[Message], *, tools: Sequence[ToolInfo] | None = None,
                       tool_choice: ToolChoice = "auto") -> Message:
        """The whole answer; raises `ModelError` when the call fails."""
        body = self._request(messages, tools, tool_choice)
        client = await self._clients.get()
        try:
            message = message_from_response(await client.messages.create(**body))
        except Exception as exc:  # the SDK's errors, and an answer that the SDK or we cannot read
            error = self._error(exc)
        else:
            return message
        raise error  # outside the except block: the original is chained only if it is free of the key

    async def stream(self, messages: Sequence[Message], *, tools: Sequence[ToolInfo] | None = None,
                     tool_choice: ToolChoice = "auto") -> AsyncIterator[Message]:
        """The answer's chunks as the server sends them; raises `ModelError`, also when the stream breaks off."""
        body = self._request(messages, tools, tool_choice)
        client = await self._clients.get()
        reader, sent, error = StreamReader(), 0, None
        try:
            response = await client.messages.create(**body, stream=True)
            try:
                async for event in response:
                    for chunk in reader.chunks(event):
                        sent += 1
                        yield chunk
            finally:
                await response.close()
        except Exception as exc:  # as in generate(); a consumer that stops early raises GeneratorExit, not this
            error = self._error(exc, f"after {sent} streamed chunks" if sent else "")
        if error is None and not reader.finished:
            error = ModelError(
                f"model '{self.name}' at {self.server}: the stream ended after {sent} chunks without a "
                "stop_reason (the connection was cut short) — retry", retryable=True, model=self.name)
        if error is not None:
            raise error

