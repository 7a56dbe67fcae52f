"""Placeholder ScriptedChatModel (replaced by the full one from the models branch)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..errors import ModelError
from .schema import Message, ToolCall, ToolInfo

__all__ = ["ScriptedChatModel"]


class ScriptedChatModel:
    def __init__(self, replies: Sequence[Any], *, name: str = "scripted", chunk_size: int | None = None,
                 delay: float = 0.0) -> None:
        self.replies = list(replies)
        self.name = name
        self.chunk_size = chunk_size
        self.delay = delay
        self.calls: list[dict[str, Any]] = []

    async def _next(self, messages, tools, tool_choice) -> Message:
        self.calls.append({"messages": list(messages), "tools": tools, "tool_choice": tool_choice})
        if len(self.calls) > len(self.replies):
            raise ModelError(f"model '{self.name}' ran out of its {len(self.replies)} scripted replies")
        reply = self.replies[len(self.calls) - 1]
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            reply = reply(messages, tools)
            if inspect.isawaitable(reply):
                reply = await reply
        return Message.assistant(reply) if isinstance(reply, str) else reply

    async def generate(self, messages, *, tools: Sequence[ToolInfo] | None = None, tool_choice="auto") -> Message:
        return await self._next(messages, tools, tool_choice)

    async def stream(self, messages, *, tools=None, tool_choice="auto") -> AsyncIterator[Message]:
        reply = await self._next(messages, tools, tool_choice)
        words = reply.content.split(" ") if reply.content else []
        for i, word in enumerate(words):
            if self.delay and i:
                await asyncio.sleep(self.delay)
            yield Message(role="assistant", content=word + (" " if i < len(words) - 1 else ""))
        for i, call in enumerate(reply.tool_calls):
            yield Message(role="assistant", tool_calls=(ToolCall(index=i, id=call.id, name=call.name,
                                                                 arguments=call.arguments),))
        if not words and not reply.tool_calls:
            yield Message(role="assistant", content="")
