"""Cut a whole `Message` into the chunks a streaming model would send (for the scripted and offline models)."""

from __future__ import annotations

import re

from .schema import Message, ToolCall

__all__ = ["split_message", "indexed"]

_WORDS = re.compile(r"\s*\S+\s*")


def _pieces(text: str, size: int | None) -> list[str]:
    if not text:
        return []
    if size is None:
        return _WORDS.findall(text) or [text]
    return [text[i:i + size] for i in range(0, len(text), size)]


def indexed(message: Message) -> Message:
    """`message` with each tool call's `index` set to its position, as streamed calls carry it."""
    if all(c.index == i for i, c in enumerate(message.tool_calls)):
        return message
    calls = tuple(c.model_copy(update={"index": i}) for i, c in enumerate(message.tool_calls))
    return message.model_copy(update={"tool_calls": calls})


def split_message(message: Message, chunk_size: int | None = None) -> list[Message]:
    """Chunks that `concat_messages` joins back into `indexed(message)`.

    Content comes in words (or `chunk_size` characters); each tool call as a first fragment with its
    index, id and name, then its arguments in pieces; usage and finish_reason on the last chunk.
    """
    message = indexed(message)
    role = message.role
    out = [Message(role=role, content=p) for p in _pieces(message.content, chunk_size)]
    for call in message.tool_calls:
        args = _pieces(call.arguments, chunk_size or 8)
        out.append(Message(role=role, tool_calls=(ToolCall(index=call.index, id=call.id, name=call.name,
                                                            arguments=args[0] if args else ""),)))
        out += [Message(role=role, tool_calls=(ToolCall(index=call.index, arguments=a),)) for a in args[1:]]
    last = {"usage": message.usage, "finish_reason": message.finish_reason,
            "tool_call_id": message.tool_call_id, "name": message.name,
            "response_id": message.response_id, "response_model": message.response_model}
    if not out:
        return [message]
    out[-1] = out[-1].model_copy(update=last)
    return out
