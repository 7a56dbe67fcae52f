"""`jsonable(value)`: a decoded value as JSON data, for showing a stored run (the CLI, the service).

Pydantic models and dataclasses become maps, enums their values, dates ISO text, bytes `<N bytes>`,
anything else a clipped `repr` — never raw bytes, never an unbounded string.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import Any

from .errors import clip

__all__ = ["jsonable"]


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
