"""Field mapping for `Workflow` (Eino's compose Workflow): which field of a predecessor's output feeds which
field of a node's input, and how a node's input is assembled from them when it runs.

    from_field("a.b")        field a.b of the predecessor's output  -> the whole input
    to_field("x")            the whole output                        -> field x of the input
    map_fields("a", "x.y")   field a                                 -> field x.y
    (no mapping)             the whole output                        -> the whole input

A path is a dotted string (`"doc.title"`) or a tuple of segments (for names containing dots). Reading a path
walks dict keys and attributes (dataclasses, pydantic models, any object); writing one builds nested dicts,
and a node whose input is annotated with a dataclass or pydantic model gets that class, built from them.
The builder and its compile-time checks are in engine/compose/workflow.py; this module is what the run loop uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, is_dataclass
from typing import Any

from ..errors import GraphRunError

__all__ = ["FieldMapping", "from_field", "to_field", "map_fields", "path_of", "FlowPlan", "assemble", "show_path"]


def path_of(path: str | tuple[str, ...] | list[str], what: str) -> tuple[str, ...]:
    """A field path as a tuple of segments; `what` names it in the error for an empty or malformed one."""
    if isinstance(path, str):
        parts = tuple(path.split("."))
    elif isinstance(path, (tuple, list)) and all(isinstance(p, str) for p in path):
        parts = tuple(path)
    else:
        raise TypeError(f"{what}: a field path is a dotted string or a tuple of names, got {path!r}")
    if not parts or any(p == "" for p in parts):
        raise TypeError(f"{what}: field path {path!r} has an empty name")
    return parts


def show_path(path: tuple[str, ...]) -> str:
    return ".".join(path) if path else "(the whole value)"


@dataclass(frozen=True)
class FieldMapping:
    """One mapping of a workflow input: `source` in the predecessor's output to `target` in the node's input
    (an empty path is the whole value)."""

    source: tuple[str, ...] = ()
    target: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{show_path(self.source)} -> {show_path(self.target)}"


def from_field(path: str | tuple[str, ...]) -> FieldMapping:
    """Field `path` of the predecessor's output becomes the node's whole input."""
    return FieldMapping(source=path_of(path, "from_field"))


def to_field(path: str | tuple[str, ...]) -> FieldMapping:
    """The predecessor's whole output becomes field `path` of the node's input."""
    return FieldMapping(target=path_of(path, "to_field"))


def map_fields(source: str | tuple[str, ...], target: str | tuple[str, ...]) -> FieldMapping:
    """Field `source` of the predecessor's output becomes field `target` of the node's input."""
    return FieldMapping(source=path_of(source, "map_fields"), target=path_of(target, "map_fields"))


@dataclass(frozen=True)
class FlowPlan:
    """What `Workflow.compile()` decided about data flow, as the run loop reads it."""

    sources: dict[str, tuple[tuple[str, tuple[FieldMapping, ...]], ...]] = field(default_factory=dict)
    """node -> its data predecessors, in the order their inputs were added, each with its mappings."""
    statics: dict[str, tuple[tuple[tuple[str, ...], Any], ...]] = field(default_factory=dict)
    control: dict[str, frozenset[str]] = field(default_factory=dict)
    """node -> its control predecessors: it is skipped when all of them are."""
    classes: dict[str, type] = field(default_factory=dict)
    """node -> the dataclass or pydantic model its input is built as."""

    def structure(self) -> list[list[Any]]:
        """The data and control wiring as plain data (part of the graph's fingerprint)."""
        rows = []
        for node in sorted(set(self.sources) | set(self.control)):
            for src, mappings in self.sources.get(node, ()):
                rows.append([src, node, "data", sorted(str(m) for m in mappings)])
            for src in sorted(self.control.get(node, ())):
                rows.append([src, node, "control", []])
        return sorted(rows)


_MISSING = object()


def assemble(plan: FlowPlan, graph: str, node: str, got: Mapping[str, Any]) -> Any:
    """A workflow node's input from the outputs its data predecessors delivered (`got`; a skipped one
    delivers nothing, so its fields stay unset) and its static values."""
    sources, statics = plan.sources.get(node, ()), plan.statics.get(node, ())
    if not sources and not statics:
        return None
    whole: Any = _MISSING
    fields: dict[str, Any] = {}
    for path, value in statics:
        _put(fields, path, value)
    for src, mappings in sources:
        if src not in got:
            continue
        output = got[src]
        for m in mappings:
            value = _extract(output, m.source, graph, src, node)
            if m.target:
                _put(fields, m.target, value)
            else:
                whole = value
    if whole is not _MISSING:
        return whole
    cls = plan.classes.get(node)
    return fields if cls is None else _build(cls, fields, graph, node)


def _extract(value: Any, path: tuple[str, ...], graph: str, src: str, node: str) -> Any:
    for i, name in enumerate(path):
        if isinstance(value, Mapping):
            if name in value:
                value = value[name]
                continue
        elif hasattr(value, name):
            value = getattr(value, name)
            continue
        raise GraphRunError(
            f"workflow '{graph}': node '{node}' maps field '{show_path(path[:i + 1])}' of the output of '{src}', "
            f"which the output does not have (it is a {type(value).__name__}); fix the mapping or the node's output")
    return value


def _put(fields: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        fields = fields.setdefault(name, {})
    fields[path[-1]] = value


def _build(cls: type, fields: dict[str, Any], graph: str, node: str) -> Any:
    try:
        validate = getattr(cls, "model_validate", None)
        if validate is not None:
            return validate(fields)
        if is_dataclass(cls):
            return cls(**fields)
    except Exception as err:
        raise GraphRunError(
            f"workflow '{graph}': node '{node}' takes a {cls.__name__}, which could not be built from its mapped "
            f"fields {sorted(fields)}: {type(err).__name__}: {err}") from err
    return fields
