"""`jsonable(value)`: a decoded value as JSON data, for showing a stored run (the CLI, the service).

Pydantic models and dataclasses become maps, enums their values, dates ISO text, bytes `<N bytes>`,
anything else a clipped `repr` — never raw bytes, never an unbounded string. `message_json` shows a chat
message with its tool calls' arguments as data; `output_json` a run's output, message or not.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
from typing import Any

from ..errors import clip

__all__ = ["jsonable", "message_json", "output_json", "tool_arguments"]


def jsonable(value: Any, *, limit: int = 2000, depth: int = 0) -> Any:
    """`value` as JSON data; text that is not a plain string is cut to `limit` characters."""
    if depth > 40:
        return "..."
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if isinstance(value, enum.Enum):
        return jsonable(value.value, limit=limit, depth=depth + 1)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    dump = getattr(value, "model_dump", None)  # a pydantic model
    if callable(dump) and not isinstance(value, type):
        return jsonable(dump(), limit=limit, depth=depth + 1)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name, None), limit=limit, depth=depth + 1)
                for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k if isinstance(k, str) else clip(repr(k), 200): jsonable(v, limit=limit, depth=depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, limit=limit, depth=depth + 1) for v in value]
    return clip(repr(value), limit)


def tool_arguments(text: str) -> Any:
    """Tool-call arguments as JSON data when they are JSON (else the text the model wrote)."""
    try:
        return json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return text


def message_json(m: Any) -> dict[str, Any]:
    """A chat message (duck-typed: `role`, `content`, `tool_calls`, `tool_call_id`, `name`) as JSON data."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": tool_arguments(c.arguments)}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"], out["name"] = m.tool_call_id, m.name
    return out


def output_json(value: Any, *, limit: int = 2000) -> Any:
    """A run's output: `message_json` for an agent's final message, `jsonable` for anything else."""
    if hasattr(value, "role") and hasattr(value, "tool_calls") and hasattr(value, "content"):
        return message_json(value)
    return jsonable(value, limit=limit)
