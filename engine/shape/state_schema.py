"""A state class's fields as plain data — stored with a run's graph structure — and the changes of them a stored
run cannot be continued across (docs/resume.md, "Deploys").

The schema of a dataclass or pydantic state is `{"fields": {name: {"type": text, "required": bool}}, "extra": bool}`:
each field's annotation as text (reducers and other `Annotated` metadata left out: they say how a field is
written, not what it holds), whether it has no default, and whether the class keeps undeclared fields (pydantic
`extra="allow"`). Any other state (a dict, a factory function, none) has no schema, and nothing is compared.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

__all__ = ["state_schema", "state_changes", "StateChange", "field_hints", "validate_field"]


def field_hints(factory: Any) -> dict[str, Any] | None:
    """The resolved annotation of each field of a state class (no `Annotated` metadata); None for other states."""
    if not isinstance(factory, type):
        return None
    model_fields = getattr(factory, "model_fields", None)
    if isinstance(model_fields, dict):  # pydantic: annotations resolved when the class was made
        return {name: f.annotation for name, f in model_fields.items()}
    if not dataclasses.is_dataclass(factory):
        return None
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # reducers_of refused such a class already; keep what the class says
        hints = {}
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(factory)}


def state_schema(factory: Any) -> dict[str, Any] | None:
    """The schema of a state class (module docstring), or None when the state is not a dataclass or pydantic model."""
    hints = field_hints(factory)
    if hints is None:
        return None
    model_fields = getattr(factory, "model_fields", None)
    if isinstance(model_fields, dict):
        required = {name: f.is_required() for name, f in model_fields.items()}
        extra = (getattr(factory, "model_config", None) or {}).get("extra") == "allow"
    else:
        required = {f.name: f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                    for f in dataclasses.fields(factory)}
        extra = False
    return {"fields": {name: {"type": type_text(hint), "required": required[name]} for name, hint in hints.items()},
            "extra": extra}


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def type_text(hint: Any, _seen: frozenset[type] = frozenset()) -> str:
    """An annotation as text that is the same in every process: `int | None`, `list[Message]`, `Literal['a']`.

    A class of the application's own (not Waypoint's, not the standard library's) is shown with what a stored
    value of it must fit: a pydantic model's, a dataclass's or a TypedDict's fields with their types (`Item{n: int,
    tags?: list[str]}`, `?`: it has a default), an Enum's members (`Color(RED, GREEN)`) — so a change inside it is a
    change of the field (refused, and moved with `update_state(values=...)`), never a run that no longer decodes.
    Adding a field with a default or a member is a change too: failing closed costs a migration, not a run."""
    if isinstance(hint, str):
        return " ".join(hint.split())
    if hint is None or hint is type(None):
        return "None"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return type_text(args[0], _seen)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(type_text(a, _seen) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is not None:
        name = type_text(origin, _seen)
        return f"{name}[{', '.join(type_text(a, _seen) for a in args)}]" if args else name
    if isinstance(hint, type):
        return hint.__qualname__ + _inside(hint, _seen)
    if hint is Ellipsis:
        return "..."
    name = getattr(hint, "__name__", None) or getattr(hint, "_name", None)
    return name if isinstance(name, str) else _ADDRESS.sub("", repr(hint))


def _inside(cls: type, seen: frozenset[type]) -> str:
    """What a stored value of an application class must fit (see `type_text`); "" for other classes."""
    module = getattr(cls, "__module__", "") or ""
    if cls in seen or module.split(".")[0] in _NOT_OURS or (module in _STDLIB and module != "__main__"):
        return ""
    seen = seen | {cls}
    if issubclass(cls, enum.Enum):
        return f"({', '.join(m.name for m in cls)})"
    fields = _fields(cls)
    if fields is None:
        return ""
    return "{" + ", ".join(f"{n}{'' if required else '?'}: {type_text(h, seen)}" for n, h, required in fields) + "}"


def _fields(cls: type) -> list[tuple[str, Any, bool]] | None:
    """(name, annotation, required) of each field of `cls`, or None when `cls` declares no fields."""
    model_fields = getattr(cls, "model_fields", None)
    if isinstance(model_fields, dict):
        return [(n, f.annotation, f.is_required()) for n, f in model_fields.items()]
    if dataclasses.is_dataclass(cls):
        hints = _hints(cls)
        return [(f.name, hints.get(f.name, f.type), f.default is dataclasses.MISSING
                 and f.default_factory is dataclasses.MISSING) for f in dataclasses.fields(cls)]
    keys = getattr(cls, "__required_keys__", None)
    if isinstance(keys, frozenset) and isinstance(getattr(cls, "__total__", None), bool):  # a TypedDict (either kind)
        hints = _hints(cls)
        return [(n, hints.get(n), n in keys) for n in sorted(hints)]
    return None


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation that does not resolve: compared as written
        return dict(getattr(cls, "__annotations__", {}))


_NOT_OURS = frozenset({"waypoint", "pydantic", "pydantic_core", "typing_extensions"})
"""Modules whose classes are shown by name alone: Waypoint's own types keep stored values readable across its
releases, and these libraries' across theirs."""
_STDLIB = frozenset(getattr(__import__("sys"), "stdlib_module_names", ()))


@dataclass(frozen=True, kw_only=True)
class StateChange:
    """One change of the state's fields that a stored run cannot be continued across."""

    field: str
    kind: typing.Literal["type", "removed", "added"]
    old: str | None = None
    """The field's type when the run was written (None: not known, or the field is new)."""
    new: str | None = None
    """Its type now (None: the field is gone)."""

    def __str__(self) -> str:
        if self.kind == "type":
            return f"state field '{self.field}' changed type: it was {self.old}, now {self.new}"
        if self.kind == "removed":
            was = f" (of type {self.old})" if self.old else ""
            return f"state field '{self.field}'{was} is gone from the state, and the run holds a value for it"
        return f"state field '{self.field}' ({self.new}) was added without a default, and the run holds no value for it"


def state_changes(stored: Any, new: dict[str, Any] | None, held: set[str]) -> list[StateChange]:
    """What in the state schema `new` a run written under `stored` (a schema read from a store, or None when the
    run was written before schemas were kept) and holding values for the fields `held` cannot be continued
    across: a field whose type changed, a field it holds that is gone, a field added without a default. What
    cannot be compared is not: a stored schema that is missing or not of the expected shape is read as
    "types unknown", and only the fields the run holds are compared."""
    if new is None:
        return []
    fields = new["fields"]
    old = _fields_of(stored)
    changes = []
    for name in sorted(set(old) & set(fields)):
        if old[name] != fields[name]["type"]:
            changes.append(StateChange(field=name, kind="type", old=old[name], new=fields[name]["type"]))
    if not new["extra"]:
        for name in sorted(held - set(fields)):
            changes.append(StateChange(field=name, kind="removed", old=old.get(name)))
    for name in sorted(set(fields) - held - set(old)):
        if fields[name]["required"]:
            changes.append(StateChange(field=name, kind="added", new=fields[name]["type"]))
    return changes


def _fields_of(stored: Any) -> dict[str, str]:
    """`{field: type text}` of a stored schema; empty when there is none or it is not shaped as one."""
    fields = stored.get("fields") if isinstance(stored, dict) else None
    if not isinstance(fields, dict):
        return {}
    return {k: v["type"] for k, v in fields.items()
            if isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("type"), str)}


def validate_field(factory: Any, name: str, value: Any) -> Any:
    """`value` checked (and converted, as pydantic does: a dict into a model) against field `name`'s annotation.
    Raises ValueError saying why it does not fit."""
    from pydantic import TypeAdapter, ValidationError

    hint = (field_hints(factory) or {}).get(name, Any)
    try:
        return TypeAdapter(hint).validate_python(value)
    except ValidationError as err:
        raise ValueError(f"{type_text(hint)} expected: {' '.join(str(err).split())[:300]}") from None
