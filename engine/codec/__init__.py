"""The codec: values to bytes and back, and never code — msgpack records of registered types (`serde`), signed
when a key is set; JSON views of stored values for pages and the CLI (`jsonable`); objects named `module:attr`
(`loading`). Loaded on first use: `import waypoint.engine` does not load msgpack."""

from __future__ import annotations

from typing import Any

_WHERE = {
    "MAX_RECORD_BYTES": "serde",
    "Serializer": "serde",
    "UnknownType": "serde",
    "default_serializer": "serde",
    "register_type": "serde",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'waypoint.engine.codec' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)

__all__ = [
    "MAX_RECORD_BYTES", "Serializer", "UnknownType", "default_serializer", "register_type"
]
