"""Per-field reducers for graph state, and `Update`: how nodes write state so parallel branches merge.

A state class declares a reducer per field with `typing.Annotated` (LangGraph's convention):

    @dataclass
    class Research:
        messages: Annotated[list[Message], add_messages] = field(default_factory=list)
        notes: Annotated[list[str], append] = field(default_factory=list)
        best: Annotated[int, max] = 0          # any function (current, update) -> new value
        summary: str = ""                      # no reducer: a write replaces it

A node writes fields by returning `Update({"notes": [...]}, output=...)`. The engine applies a task's writes
when it applies the task — Pregel after the superstep, in graph order (the order nodes were added); a DAG
each batch as it finishes, in graph order within the batch — each field through its
reducer: `new = reducer(current, update)` (a field a dict state does not hold yet starts from the empty
value of its declared container type, else None). The writes of one `apply_writes` call are applied all or
nothing: every reducer runs before any field changes. A field without a
reducer takes one write per step; two tasks writing it in one step (or, in a DAG, two tasks that may run
in parallel) is a `GraphRunError` naming the field and the nodes — declare a reducer to merge them.

`append` and `add_messages` are *append-owned*: the engine appends in place and knows which items are
new, so a checkpoint writes only them whatever the items are (engine/keep/checkpoint.py). Their contract: an
item already in the list is never changed in place; a change goes through the reducer (`add_messages`
replaces an item by ID). Reads stay free; an in-place change is found and stored at the run's next
pause or end, with a `RuntimeWarning` (docs/state.md).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from ..errors import GraphBuildError, GraphRunError

__all__ = ["Update", "append", "add_messages", "Reducers", "StateJournal", "reducers_of", "apply_writes"]


class Update:
    """What a node returns to write graph state: `values` go into their fields (each through its reducer)
    and `output` is sent on along the node's edges, as a plain return value would be."""

    __slots__ = ("values", "output")

    def __init__(self, values: Mapping[str, Any], output: Any = None) -> None:
        if not isinstance(values, Mapping) or not all(type(k) is str for k in values):
            raise TypeError(f"Update(values) takes a mapping of field names to values, got {values!r}")
        self.values = dict(values)
        self.output = output

    def __repr__(self) -> str:
        return f"Update({self.values!r}, output={self.output!r})"


def append(current: Any, update: Any) -> list[Any]:
    """Append the items of `update` (a list or tuple) to the field's list."""
    items = _items(update, "append")
    if current is None:
        return list(items)
    if type(current) is not list:
        raise TypeError(f"append: the field holds a {type(current).__name__}, not a list")
    current.extend(items)
    return current


def add_messages(current: Any, update: Any) -> list[Any]:
    """Append messages; one whose ID equals a listed message's ID replaces that message in place.

    An item's ID is its `id` attribute, or its `"id"` key for a dict; items without one (or with None)
    are always appended. Like LangGraph's `add_messages`, for any item type (the graph core knows none).
    """
    return _add_by_id(current, update, None)[0]


append.appends = True  # type: ignore[attr-defined]  # the checkpoint may write only the new items
add_messages.appends = True  # type: ignore[attr-defined]


def _items(update: Any, who: str) -> list[Any] | tuple[Any, ...]:
    if type(update) not in (list, tuple):
        raise TypeError(f"{who}: the update must be a list or tuple of items, got {type(update).__name__}")
    return update


def _item_id(item: Any) -> Any:
    if type(item) is dict:
        return item.get("id")
    return getattr(item, "id", None)


def _add_by_id(current: Any, update: Any, memo: dict[str, Any] | None) -> tuple[list[Any], bool]:
    """`add_messages`, with an index of IDs kept in `memo` between calls (so a call costs what it adds).
    Returns the list and whether every item was appended (False: one replaced a listed item)."""
    items = _items(update, "add_messages")
    if current is None:
        current = []
    elif type(current) is not list:
        raise TypeError(f"add_messages: the field holds a {type(current).__name__}, not a list")
    index = _id_index(current, memo)
    appended_only = True
    for item in items:
        ident = _item_id(item)
        at = index.get(ident) if ident is not None else None
        if at is not None and at < len(current) and _item_id(current[at]) == ident:
            current[at] = item
            appended_only = False
            continue
        if ident is not None:
            index[ident] = len(current)
        current.append(item)
    if memo is not None:
        memo["list"], memo["count"] = current, len(current)
    return current, appended_only


def _id_index(current: list[Any], memo: dict[str, Any] | None) -> dict[Any, int]:
    """Item ID -> position: reused from `memo` when it indexed this very list (items appended since then
    are added to it), rebuilt otherwise."""
    if memo is not None and memo.get("list") is current and memo.get("count", 0) <= len(current):
        index = memo["index"]
        start = memo["count"]
    else:
        index, start = {}, 0
    for i in range(start, len(current)):
        ident = _item_id(current[i])
        if ident is not None:
            index[ident] = i
    if memo is not None:
        memo["index"] = index
    return index


# --- declared reducers ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reducers:
    """The reducers a state class declares (field -> function), and the fields it has (None: any key)."""

    by_field: dict[str, Callable[[Any, Any], Any]] = field(default_factory=dict)
    names: frozenset[str] | None = None
    empty: dict[str, type] = field(default_factory=dict)
    """What a reducer gets as the current value of a field a dict state does not hold yet: the field's
    declared container type, empty (`Annotated[list, operator.add]` works as in LangGraph)."""

    @property
    def owned(self) -> frozenset[str]:
        """Fields whose reducer only appends (or replaces by ID): a checkpoint writes only what is new."""
        return frozenset(k for k, fn in self.by_field.items() if getattr(fn, "appends", False) is True)


NO_REDUCERS = Reducers()


def reducers_of(factory: Any, graph: str) -> Reducers:
    """The reducers declared on a state class's annotations (`Annotated[T, reducer]`); none for a factory
    that is not a class. A metadata item that is a function (not a class) is the field's reducer."""
    if not isinstance(factory, type):
        return NO_REDUCERS
    model_fields = getattr(factory, "model_fields", None)
    if isinstance(model_fields, dict):  # pydantic resolved the annotations when the class was made
        declared = {name: (f.annotation, f.metadata) for name, f in model_fields.items()}
    else:
        try:
            hints = typing.get_type_hints(factory, include_extras=True)
        except Exception as err:  # unresolvable forward references: say which class, and why it happens
            raise GraphBuildError(
                f"graph '{graph}': the annotations of state class {factory.__qualname__} cannot be resolved "
                f"({type(err).__name__}: {err}); define the names they use at module level (a class made inside "
                "a function under `from __future__ import annotations` cannot see that function's names)"
            ) from None
        declared = {name: (hint.__origin__, hint.__metadata__) if typing.get_origin(hint) is typing.Annotated
                    else (hint, ()) for name, hint in hints.items()}
    found: dict[str, Callable[[Any, Any], Any]] = {}
    empty: dict[str, type] = {}
    for name, (annotation, metadata) in declared.items():
        fns = [m for m in metadata if callable(m) and not isinstance(m, type)]
        if len(fns) > 1:
            raise GraphBuildError(f"graph '{graph}': state field '{name}' declares {len(fns)} reducers; keep one")
        if fns:
            found[name] = fns[0]
            base = typing.get_origin(annotation) or annotation
            if base in (list, dict, set, tuple, int, float, str):
                empty[name] = base
    return Reducers(found, _field_names(factory, declared), empty)


def _field_names(factory: type, declared: dict[str, Any]) -> frozenset[str] | None:
    """The fields a state class has (None: any name, as for a plain dict)."""
    if is_dataclass(factory):
        return frozenset(f.name for f in fields(factory))
    return frozenset(declared) if declared else None


# --- applying writes -------------------------------------------------------------------------------------

@dataclass
class StateJournal:
    """What reducers did to the append-owned fields since the last checkpoint: the fields where an item
    was replaced (not only appended). The checkpoint reads it and clears it once written."""

    owned: frozenset[str] = frozenset()
    replaced: set[str] = field(default_factory=set)
    memos: dict[str, dict[str, Any]] = field(default_factory=dict)

    def written(self) -> None:
        self.replaced.clear()


def apply_writes(state: Any, writes: list[tuple[str, Mapping[str, Any]]], reducers: Reducers,
                 journal: StateJournal | None, graph: str) -> dict[str, str]:
    """Apply `(node, values)` writes in order, each field through its reducer; return the fields without a
    reducer that were written, with their writer.

    All or nothing: a `GraphRunError` — a state without fields, an unknown field, a field without a reducer
    written twice, a reducer that raises — leaves the state as it was. Every reducer runs before any field
    changes: `append` / `add_messages` only check their update then (they append once all is well), and a
    reducer of one's own gets a copy of a list, dict or set it might change in place."""
    once: dict[str, str] = {}
    for node, values in writes:
        for name in values:
            _check_field(state, name, reducers, node, graph)
            if name in reducers.by_field:
                continue
            if name in once:
                raise GraphRunError(
                    f"graph '{graph}': state field '{name}' is written by both '{once[name]}' and '{node}' "
                    f"in one step and has no reducer to merge them; declare one "
                    f"(Annotated[..., append] or a function (current, update) -> new) or write it once")
            once[name] = node
    new, appends = _stage(state, writes, reducers, graph)
    _commit(state, new, appends, journal, graph)
    return once


def _stage(state: Any, writes: list[tuple[str, Mapping[str, Any]]], reducers: Reducers,
           graph: str) -> tuple[dict[str, Any], list[tuple[str, Callable[..., Any], list[Any], Any]]]:
    """Run every reducer without changing the state: the fields' new values, and the appends `append` /
    `add_messages` will make to a list the state holds (`(field, reducer, list, update)`, checked first)."""
    new: dict[str, Any] = {}
    appends: list[tuple[str, Callable[..., Any], list[Any], Any]] = []
    for node, values in writes:
        for name, value in values.items():
            fn = reducers.by_field.get(name)
            if fn is None:
                new[name] = value
                continue
            staged = name in new
            current = new[name] if staged else _get(state, name, reducers.empty.get(name))
            try:
                if fn is append or fn is add_messages:
                    _check_append(fn, current, value)
                    if current is not None and current is _current(state, name):  # the state's own list:
                        appends.append((name, fn, current, value))  # grown once every write is known to apply
                    else:  # none yet, or one of this step's own (staged, or a dict state's empty one): grow it now
                        new[name] = fn(current, value)
                else:
                    if not staged and type(current) in _OWN_COPY:
                        current = current.copy()  # it may change it in place, then raise (or a later one may)
                    new[name] = fn(current, value)
            except Exception as err:
                raise GraphRunError(f"graph '{graph}': the reducer of state field '{name}' failed on the write of "
                                    f"node '{node}': {type(err).__name__}: {err}") from err
    return new, appends


_OWN_COPY = (list, dict, set)


def _check_append(fn: Callable[..., Any], current: Any, update: Any) -> None:
    """Raise what `append` / `add_messages` would raise on this write, before it changes anything: the update
    is not a list or tuple, an item's ID cannot be looked up, the field holds no list."""
    who = "append" if fn is append else "add_messages"
    items = _items(update, who)
    if fn is add_messages:
        for item in items:
            hash(_item_id(item))
    if current is not None and type(current) is not list:
        raise TypeError(f"{who}: the field holds a {type(current).__name__}, not a list")


def _commit(state: Any, new: dict[str, Any], appends: list[tuple[str, Callable[..., Any], list[Any], Any]],
            journal: StateJournal | None, graph: str) -> None:
    """Set the staged fields (each one set back if a later one cannot be: a model validating assignments),
    then grow the state's lists (which cannot fail once checked)."""
    done: list[tuple[str, Any]] = []
    try:
        for name, value in new.items():
            done.append((name, _current(state, name)))
            _set(state, name, value)
    except Exception as err:
        for name, old in reversed(done[:-1]):
            if old is _ABSENT:
                state.pop(name, None)
            else:
                _set(state, name, old)
        raise GraphRunError(f"graph '{graph}': the state {type(state).__name__} refused the new value of field "
                            f"'{done[-1][0]}': {type(err).__name__}: {err}") from err
    for name, fn, target, update in appends:
        if fn is append:
            target.extend(update)
        elif journal is None:
            _add_by_id(target, update, None)
        elif not _add_by_id(target, update, journal.memos.setdefault(name, {}))[1]:
            journal.replaced.add(name)


_ABSENT = object()


def _current(state: Any, name: str) -> Any:
    """What the field holds now (`_ABSENT`: a dict state does not have it)."""
    if isinstance(state, dict):
        return state.get(name, _ABSENT)
    return getattr(state, name, None)


def _check_field(state: Any, name: str, reducers: Reducers, node: str, graph: str) -> None:
    if state is None or isinstance(state, (str, bytes, int, float, bool, list, tuple)):
        raise GraphRunError(
            f"graph '{graph}': node '{node}' writes state field '{name}', but the graph's state has no fields "
            f"({type(state).__name__}); give Graph(state=...) a dataclass, pydantic model or TypedDict")
    known = reducers.names
    unknown = name not in known if known is not None else type(state) is not dict and not hasattr(state, name)
    if unknown:
        raise GraphRunError(f"graph '{graph}': node '{node}' writes state field '{name}', which the state "
                            f"{type(state).__name__} does not have" + _fields_hint(known))


def _fields_hint(known: frozenset[str] | None) -> str:
    return f" (its fields: {', '.join(sorted(known))})" if known else ""


def _get(state: Any, name: str, empty: type | None) -> Any:
    if isinstance(state, dict):
        if name not in state:
            return empty() if empty is not None else None
        return state[name]
    return getattr(state, name, None)


def _set(state: Any, name: str, value: Any) -> None:
    if isinstance(state, dict):
        state[name] = value
    else:
        setattr(state, name, value)
