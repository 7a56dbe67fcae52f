"""Fan-in: how several values reaching one node in the same step become its one input.

Rules: a single value passes through; a function registered with `register_merge`
for the values' type wins; dicts are merged by key union (a key sent twice is an error);
anything else is an error that says how to fix the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..errors import GraphRunError
from ..shape import registered_for

__all__ = ["register_merge", "merge_values"]

T = TypeVar("T")

_MERGE: dict[type, Callable[[list[Any]], Any]] = {}


def register_merge(cls: type[T], fn: Callable[[list[T]], T]) -> None:
    """Merge several values of type `cls` arriving at one node in one step with `fn(values) -> value`."""
    if not isinstance(cls, type):
        raise TypeError(f"register_merge expects a type, got {cls!r}")
    _MERGE[cls] = fn


def merge_values(node: str, sources: Sequence[str], values: list[Any]) -> Any:
    """Merge `values` (sent by `sources`, in graph order) into the input of `node`."""
    if len(values) == 1:
        return values[0]
    cls = type(values[0])
    fn = registered_for(_MERGE, cls)
    if fn is not None and all(isinstance(v, cls) for v in values):
        return fn(values)
    if all(isinstance(v, dict) for v in values):
        merged: dict[Any, Any] = {}
        owner: dict[Any, str] = {}
        for source, value in zip(sources, values):
            for key, item in value.items():
                if key in merged:
                    raise GraphRunError(
                        f"fan-in at node '{node}': key {key!r} is sent by both '{owner[key]}' and "
                        f"'{source}'; give each predecessor its own keys (output_key=...) or "
                        f"register_merge(dict, fn) to combine them"
                    )
                merged[key] = item
                owner[key] = source
        return merged
    kinds = ", ".join(f"'{s}' -> {type(v).__name__}" for s, v in zip(sources, values))
    raise GraphRunError(
        f"fan-in at node '{node}': {len(values)} values arrived in one step ({kinds}) and there is "
        f"no way to merge them; set output_key= on the predecessors so they send dicts, "
        f"or register_merge({cls.__name__}, fn)"
    )
