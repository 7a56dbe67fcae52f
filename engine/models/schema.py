"""Chat messages: `Message`, `ToolCall`, `Usage`, and how streamed chunks become one message.

Messages are frozen pydantic models registered with the codec under stable names, so a conversation
in run-local state is stored as an append-only chain: an unchanged message is never encoded twice.
A model that streams yields `Message` chunks; `concat_messages` joins them (content joins; tool-call
fragments join by `index` into whole calls; reasoning blocks, each sent whole, follow one another), and the engine uses it wherever a stream of messages
must become one value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..codec import register_type
from ..shape import register_concat

__all__ = ["Message", "ToolCall", "Usage", "Reasoning", "Role", "ToolInfo", "concat_messages", "as_messages",
           "tool_infos"]

Role = Literal["system", "user", "assistant", "tool"]


@register_type(name="waypoint.ToolCall")
class ToolCall(BaseModel):
    """A call the model asks for: `arguments` is the JSON text the model wrote (validated later).

    In a streamed chunk, a call arrives in fragments that share an `index`; the first carries `id` and
    `name`, the rest more `arguments` text.
    """

    model_config = ConfigDict(frozen=True)

    id: str = ""
    name: str = ""
    arguments: str = ""
    index: int | None = None


@register_type(name="waypoint.Usage")
class Usage(BaseModel):
    """Token counts the server reported for one model call."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@register_type(name="waypoint.Reasoning")
class Reasoning(BaseModel):
    """A block of a model's reasoning that its provider requires back, unchanged, with the turn it belongs to
    (Anthropic's `thinking` blocks with their `signature`, `redacted_thinking` with its `data`). Kept on the
    assistant `Message`, sent back only to the provider that wrote it, never part of `content`."""

    model_config = ConfigDict(frozen=True)

    provider: str
    kind: str
    text: str = ""
    signature: str = ""
    data: str = ""


@register_type(name="waypoint.Message")
class Message(BaseModel):
    """One chat message. `tool_call_id` and `name` identify the call a tool message answers; `reasoning` holds
    what a provider wants back with an assistant turn (a message stored before it existed reads as `()`)."""

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    reasoning: tuple[Reasoning, ...] = ()
    response_id: str | None = None
    """The provider's ID of the answer (`chatcmpl-...`, `msg_...`), when it gave one (traces show it)."""
    response_model: str | None = None
    """The model that answered, as the provider names it (it may differ from the one asked for)."""

    @classmethod
    def system(cls, content: str) -> Message:
        return cls(role="system", content=content)

    @classmethod
    def user(cls, content: str) -> Message:
        return cls(role="user", content=content)

    @classmethod
    def assistant(cls, content: str = "", tool_calls: Sequence[ToolCall] = ()) -> Message:
        return cls(role="assistant", content=content, tool_calls=tuple(tool_calls))

    @classmethod
    def tool(cls, content: str, *, tool_call_id: str, name: str) -> Message:
        return cls(role="tool", content=content, tool_call_id=tool_call_id, name=name)


class ToolInfo(BaseModel):
    """What a model is told about a tool: its name, what it does, and a JSON schema of its arguments."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}


def tool_infos(tools: Iterable[Any] | None) -> list[ToolInfo]:
    """What a model is told about `tools`: each a `ToolInfo`, or anything carrying one as `.info` (a `Tool`)."""
    infos = []
    for t in tools or ():
        info = t if isinstance(t, ToolInfo) else getattr(t, "info", None)
        if not isinstance(info, ToolInfo):
            raise TypeError(f"tools= takes ToolInfo or Tool objects (made by @tool), got {type(t).__name__}")
        infos.append(info)
    return infos


def concat_messages(chunks: Sequence[Message]) -> Message:
    """One message from streamed chunks: content joins, tool-call fragments join by index."""
    if len(chunks) == 1:
        return chunks[0]
    calls: dict[Any, dict[str, Any]] = {}
    for chunk in chunks:
        for position, call in enumerate(chunk.tool_calls):
            key = call.index if call.index is not None else (call.id or position)
            slot = calls.setdefault(key, {"id": "", "name": "", "arguments": [], "index": call.index})
            slot["id"] = slot["id"] or call.id
            slot["name"] = slot["name"] or call.name
            slot["arguments"].append(call.arguments)
    return Message(
        role=next((c.role for c in chunks if c.role), "assistant"),
        content="".join(c.content for c in chunks),
        tool_calls=tuple(ToolCall(id=s["id"], name=s["name"], arguments="".join(s["arguments"]), index=s["index"])
                         for s in calls.values()),
        tool_call_id=next((c.tool_call_id for c in chunks if c.tool_call_id), None),
        name=next((c.name for c in chunks if c.name), None),
        usage=next((c.usage for c in reversed(chunks) if c.usage is not None), None),
        finish_reason=next((c.finish_reason for c in reversed(chunks) if c.finish_reason), None),
        reasoning=tuple(r for c in chunks for r in c.reasoning),
        response_id=next((c.response_id for c in chunks if c.response_id), None),
        response_model=next((c.response_model for c in chunks if c.response_model), None),
    )


def as_messages(value: str | Message | Iterable[Message | dict[str, Any]] | None) -> list[Message]:
    """What a caller may hand an agent: a string (a user message), a message, or a list of them."""
    if value is None:
        return []
    if isinstance(value, str):
        return [Message.user(value)]
    if isinstance(value, Message):
        return [value]
    if isinstance(value, dict):
        return [Message.model_validate(value)]
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in value]


register_concat(Message, concat_messages)
