"""`OpenAIChatModel`: chat completions through the official `openai` SDK, against OpenAI or any compatible server.

The SDK is imported when the first `OpenAIChatModel` is created, not when this package is. Its own retries
are off: a failed call raises `ModelError` at once and Waypoint's retry middleware decides. An
`AsyncOpenAI` client (httpx underneath) is bound to the event loop it first ran on, and
`CompiledGraph.invoke()` runs a fresh loop per call, so the model keeps one client per running loop and
closes it when that loop shuts down.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

from waypoint.engine.errors import ModelError
from waypoint.engine.models.base import ToolChoice
from waypoint.engine.models.schema import Message, ToolInfo

from ._openai_errors import model_error
from ._openai_wire import chunks_from_delta, message_from_completion, request_messages, request_tools
from ._outgoing import accepted_arguments, build_request, offered_tools, server_of
from ._per_loop import ClientPerLoop

__all__ = ["OpenAIChatModel"]

_DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Local OpenAI-compatible servers (vLLM, Ollama, llama.cpp) ignore the key, but the SDK insists on one.
_NO_KEY = "not-needed"


class OpenAIChatModel:
    """A chat model served over the chat-completions API (OpenAI, vLLM, Ollama, llama.cpp server, ...).

    `api_key` defaults to `OPENAI_API_KEY`; with a `base_url` and no key at all, a placeholder is sent
    (local servers ignore it). `extra` goes to every `chat.completions.create` call (`max_tokens=`,
    `seed=`, `extra_body=`, ...). Calls raise `ModelError` with `status` and `retryable`.
    """

    provider = "openai"  # gen_ai.provider.name, for tracing

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 60.0, temperature: float | None = None, **extra: Any) -> None:
        import openai

        self.name = model
        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or _DEFAULT_BASE_URL
        self.server = server_of(self.base_url)  # never user:password
        self.timeout = timeout
        self.temperature = temperature
        self.extra = extra
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key and self.base_url == _DEFAULT_BASE_URL:
            raise ModelError(
                f"model '{model}' at {self.server}: no API key — set OPENAI_API_KEY or pass api_key=; "
                "for a local OpenAI-compatible server pass base_url=", model=model)
        self._api_key = key or _NO_KEY
        self._accepted = accepted_arguments(openai.resources.chat.completions.AsyncCompletions.create)
        self._clients = ClientPerLoop(lambda: openai.AsyncOpenAI(
            api_key=self._api_key, base_url=self.base_url, timeout=timeout, max_retries=0))

    def __repr__(self) -> str:
        return f"OpenAIChatModel(model={self.model!r}, server={self.server!r})"

    def _request(self, messages: Sequence[Message], tools: Sequence[ToolInfo] | None,
                 tool_choice: ToolChoice) -> dict[str, Any]:
        def build() -> dict[str, Any]:
            offered = offered_tools(tools, tool_choice, model=self.name, server=self.server)
            request = {"model": self.model, "messages": request_messages(messages),
                       **request_tools(offered, tool_choice)}
            if self.temperature is not None:
                request["temperature"] = self.temperature
            return {**request, **self.extra}

        return build_request(build, self._accepted, model=self.name, server=self.server)

    def _error(self, exc: BaseException, during: str = "") -> ModelError:
        return model_error(exc, model=self.name, server=self.server, api_key=self._api_key,
                           timeout=self.timeout, during=during)

    async def generate(self, messages: Sequence[Message], *, tools: Sequence[ToolInfo] | None = None,
                       tool_choice: ToolChoice = "auto") -> Message:
        """The whole answer; raises `ModelError` when the call fails."""
        request = self._request(messages, tools, tool_choice)
        client = await self._clients.get()
        try:
            message = message_from_completion(await client.chat.completions.create(**request))
        except Exception as exc:  # the SDK's errors, and an answer that the SDK or we cannot read
            error = self._error(exc)
        else:
            return message
        raise error  # outside the except block: the original is chained only if it is free of the key

    async def stream(self, messages: Sequence[Message], *, tools: Sequence[ToolInfo] | None = None,
                     tool_choice: ToolChoice = "auto") -> AsyncIterator[Message]:
        """The answer's chunks as the server sends them; raises `ModelError`, also when the stream breaks off."""
        request = self._request(messages, tools, tool_choice)
        client = await self._clients.get()
        sent, finished, error = 0, False, None
        try:
            response = await client.chat.completions.create(
                **request, stream=True, stream_options={"include_usage": True})
            try:
                async for raw in response:
                    for chunk in chunks_from_delta(raw):
                        finished = finished or chunk.finish_reason is not None
                        sent += 1
                        yield chunk
            finally:
                await response.close()
        except Exception as exc:  # as in generate(); a consumer that stops early raises GeneratorExit, not this
            error = self._error(exc, f"after {sent} streamed chunks" if sent else "")
        if error is None and not finished:
            # The SDK ends quietly when a body stops early; an answer with no finish_reason was cut short.
            error = ModelError(
                f"model '{self.name}' at {self.server}: the stream ended after {sent} chunks without a "
                "finish_reason (the connection was cut short) — retry", retryable=True, model=self.name)
        if error is not None:
            raise error
