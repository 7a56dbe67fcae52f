"""Waypoint messages to and from the chat-completions wire format (pure functions, no I/O, no SDK import).

Requests are plain dicts; responses are read by attribute from the SDK's objects, so these functions
also work on any object of that shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from waypoint.engine.models.base import ToolChoice
from waypoint.engine.models.schema import Message, ToolCall, ToolInfo, Usage

__all__ = ["request_messages", "request_tools", "message_from_completion", "chunks_from_delta", "usage_of"]


def _wire_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content}
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name and message.role != "assistant":
        out["name"] = message.name
    if message.role == "assistant" and message.tool_calls:
        # An assistant turn that only calls tools has null content, as OpenAI itself returns it.
        out["content"] = message.content or None
        out["tool_calls"] = [
            # A call streamed with no argument fragments has "" arguments; servers want a JSON object.
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
            for c in message.tool_calls
        ]
    return out


def request_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The `messages=` of a chat-completions request."""
    return [_wire_message(m) for m in messages]


def request_tools(tools: Sequence[ToolInfo] | None, tool_choice: ToolChoice) -> dict[str, Any]:
    """The `tools=` and `tool_choice=` arguments; none at all when no tools are offered."""
    if not tools:
        return {}
    wire = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters}} for t in tools]
    if tool_choice in ("auto", "required", "none"):
        choice: Any = tool_choice
    else:
        choice = {"type": "function", "function": {"name": tool_choice}}
    return {"tools": wire, "tool_choice": choice}


def usage_of(raw: Any) -> Usage | None:
    if raw is None:
        return None
    return Usage(prompt_tokens=raw.prompt_tokens or 0, completion_tokens=raw.completion_tokens or 0,
                 total_tokens=raw.total_tokens or 0)


def message_from_completion(completion: Any) -> Message:
    """The assistant message of a whole (non-streamed) completion; tool calls carry their position as index."""
    if not completion.choices:
        raise ValueError("the answer holds no choices")
    choice = completion.choices[0]
    calls = tuple(
        ToolCall(id=c.id or "", name=c.function.name or "", arguments=c.function.arguments or "", index=i)
        for i, c in enumerate(choice.message.tool_calls or ())
    )
    return Message(role="assistant", content=choice.message.content or "", tool_calls=calls,
                   usage=usage_of(completion.usage), finish_reason=choice.finish_reason,
                   response_id=_name(completion, "id"), response_model=_name(completion, "model"))


def _name(answer: Any, field: str) -> str | None:
    """The answer's `id` / `model` when the server sent one as text (a compatible server may send neither)."""
    value = getattr(answer, field, None)
    return value if isinstance(value, str) and value else None


def _fragment(call: Any) -> ToolCall:
    function = call.function
    return ToolCall(index=call.index, id=call.id or "", name=(function.name if function else None) or "",
                    arguments=(function.arguments if function else None) or "")


def chunks_from_delta(chunk: Any) -> list[Message]:
    """The Waypoint chunks in one streamed completion chunk: content, tool-call fragments, finish, usage.

    Fragments are kept exactly as streamed (`concat_messages` joins them by index). Chunks carrying
    nothing (the opening `role` delta) are dropped.
    """
    out = []
    for choice in chunk.choices or ():
        delta = choice.delta
        content = (delta.content if delta else None) or ""
        calls = tuple(_fragment(c) for c in ((delta.tool_calls if delta else None) or ()))
        if content or calls or choice.finish_reason:
            finished = {"response_id": _name(chunk, "id"), "response_model": _name(chunk, "model")} \
                if choice.finish_reason else {}
            out.append(Message(role="assistant", content=content, tool_calls=calls,
                               finish_reason=choice.finish_reason, **finished))
    usage = usage_of(getattr(chunk, "usage", None))
    if usage is not None:
        out.append(Message(role="assistant", usage=usage))
    return out
