"""Streams between nodes, and how a stream becomes one value (concatenation).

In a streaming run (`astream`, `aevents`) a node's output travels as a `Chunks` value: the list of
chunks it yielded. A node that wants a value gets them concatenated; a node that streams gets them
one by one. Concatenation rules: registered functions first, then `str` and `bytes`
join, dicts merge per key (recursively), anything else keeps the last chunk. An empty stream where
a value is needed is a `GraphRunError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import GraphRunError

__all__ = ["Chunks", "register_concat", "concat"]

T = TypeVar("T")

_CONCAT: dict[type, Callable[[list[Any]], Any]] = {}


def register_concat(cls: type[T], fn: Callable[[list[T]], T]) -> None:
    """Use `fn(chunks) -> value` to concatenate stream chunks of type `cls` (and its subclasses)."""
    if not isinstance(cls, type):
        raise TypeError(f"register_concat expects a type, got {cls!r}")
    _CONCAT[cls] = fn


def registered_for(registry: dict[type, Callable], cls: type) -> Callable | None:
    """The function `registry` holds for `cls` or its nearest base (None: none registered)."""
    if not registry:
        return None
    for base in cls.__mro__:
        fn = registry.get(base)
        if fn is not None:
            return fn
    return None


@dataclass(slots=True)
class Chunks:
    """The materialised output stream of one node in a streaming run: an ordered list of chunks."""

    items: list[Any]

    async def aiter(self) -> AsyncIterator[Any]:
        for item in self.items:
            yield item


def concat(chunks: list[Any], *, where: str = "a stream") -> Any:
    """Concatenate stream chunks into one value by the rules above; `where` names the node for errors."""
    if not chunks:
        raise GraphRunError(
            f"{where} produced an empty stream where a value is needed; "
            "make the streaming node yield at least one chunk"
        )
    if len(chunks) == 1:
        return chunks[0]
    first = chunks[0]
    fn = registered_for(_CONCAT, type(first))
    if fn is not None:
        return fn(chunks)
    if isinstance(first, str) and all(isinstance(c, str) for c in chunks):
        return "".join(chunks)
    if isinstance(first, (bytes, bytearray)) and all(isinstance(c, (bytes, bytearray)) for c in chunks):
        return b"".join(chunks)
    if isinstance(first, dict) and all(isinstance(c, dict) for c in chunks):
        per_key: dict[Any, list[Any]] = {}
        for chunk in chunks:
            for key, value in chunk.items():
                per_key.setdefault(key, []).append(value)
        return {key: concat(values, where=where) for key, values in per_key.items()}
    return chunks[-1]


def to_value(value: Any, *, where: str) -> Any:
    """A plain value from either a plain value or `Chunks`."""
    if type(value) is Chunks:
        return concat(value.items, where=where)
    return value


def to_chunks(value: Any) -> list[Any]:
    """The chunks of a value: its own chunks if it is `Chunks`, else the value as a one-chunk stream."""
    if type(value) is Chunks:
        return value.items
    return [value]
