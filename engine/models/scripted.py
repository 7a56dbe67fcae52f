"""`ScriptedChatModel`: a chat model that answers from a list, for tests (shipped like httpx's MockTransport)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Union

from ..errors import ModelError
from ._chunks import indexed, split_message
from .base import ToolChoice
from .schema import Message, ToolInfo

__all__ = ["ScriptedChatModel", "ModelCall", "Reply"]

Reply = Union[
    Message,
    str,
    BaseException,
    Callable[[list[Message], list[ToolInfo]], "Message | str | Awaitable[Message | str]"],
]
"""A scripted reply: a message, assistant text, an exception to raise, or a function of (messages, tools)."""


@dataclass(frozen=True, kw_only=True)
class ModelCall:
    """What one call to a scripted model was given."""

    messages: tuple[Message, ...]
    """The conversation the model saw."""
    tools: tuple[ToolInfo, ...]
    """The tools offered (empty when none)."""
    tool_choice: ToolChoice
    """The `tool_choice` asked for."""


class ScriptedChatModel:
    """Each call (`generate` or `stream`) takes the next reply; `.calls` records what each call got.

    A reply is a `Message`, a `str` (assistant text), a callable `(messages, tools) -> Message | str`
    (sync or async), or an exception instance, which the call raises. `stream()` yields the reply in
    chunks — words, or `chunk_size` characters; tool calls as fragments by index — with `delay` seconds
    between them. Tool calls come back with their position as `index`, as streamed ones do. Running out
    of replies raises `ModelError`.
    """

    def __init__(self, replies: Sequence[Reply], *, name: str = "scripted", chunk_size: int | None = None,
                 delay: float = 0.0) -> None:
        self.name = name
        self.replies = list(replies)
        self.chunk_size = chunk_size
        self.delay = delay
        self.calls: list[ModelCall] = []

    def __repr__(self) -> str:
        return f"ScriptedChatModel(name={self.name!r}, {len(self.calls)}/{len(self.replies)} replies used)"

    async def _next(self, messages: Sequence[Message], tools: Sequence[ToolInfo] | None,
                    tool_choice: ToolChoice) -> Message:
        n = len(self.calls)
        self.calls.append(ModelCall(messages=tuple(messages), tools=tuple(tools or ()), tool_choice=tool_choice))
        if n >= len(self.replies):
            raise ModelError(
                f"scripted model '{self.name}' (no server) has no reply for call {n + 1}: "
                f"{len(self.replies)} replies were scripted — add more to ScriptedChatModel([...])",
                model=self.name)
        reply = self.replies[n]
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            reply = reply(list(messages), list(tools or ()))
            if inspect.isawaitable(reply):
                reply = await reply
        if isinstance(reply, str):
            return Message.assistant(reply)
        if isinstance(reply, Message):
            return indexed(reply)
        raise TypeError(f"scripted model '{self.name}': reply {n + 1} is {type(reply).__name__}; "
                        "expected a Message, a str, a callable returning one, or an exception")

    async def generate(self, messages: Sequence[Message], *, tools: Sequence[ToolInfo] | None = None,
                       tool_choice: ToolChoice = "auto") -> Message:
        """The next reply, whole."""
        return await self._next(messages, tools, tool_choice)

    async def stream(self, messages: Sequence[Message], *, tools: Sequence[ToolInfo] | None = None,
                     tool_choice: ToolChoice = "auto") -> AsyncIterator[Message]:
        """The next reply in chunks, `delay` seconds apart."""
        reply = await self._next(messages, tools, tool_choice)
        for n, chunk in enumerate(split_message(reply, self.chunk_size)):
            if n and self.delay:
                await asyncio.sleep(self.delay)
            yield chunk
