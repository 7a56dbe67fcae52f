"""The `ChatModel` protocol every model implements (OpenAI, scripted, offline, wrapped by middleware)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Literal, Protocol, Union, runtime_checkable

from .schema import Message, ToolInfo

__all__ = ["ChatModel", "ToolChoice"]

ToolChoice = Union[Literal["auto", "required", "none"], str]
"""`"auto"` (the model decides), `"required"` (it must call a tool), `"none"`, or one tool's name."""


@runtime_checkable
class ChatModel(Protocol):
    """A chat model: a whole answer (`generate`) or its chunks as they are produced (`stream`).

    Both raise `ModelError` when the call fails. Chunks are `Message`s that `concat_messages` joins
    into the message `generate` would have returned.
    """

    name: str

    async def generate(self, messages: Sequence[Message], *, tools: Sequence[ToolInfo] | None = None,
                       tool_choice: ToolChoice = "auto") -> Message: ...

    def stream(self, messages: Sequence[Message], *, tools: Sequence[ToolInfo] | None = None,
               tool_choice: ToolChoice = "auto") -> AsyncIterator[Message]: ...
