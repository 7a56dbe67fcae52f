"""What a checkpoint's content is made of: the run position as plain values (and back, checked), the
run-local state split into one part per field (and joined again), and — for `GraphMismatch` — how two
graph structures differ, in words. engine/keep/checkpoint.py turns these into parts, blobs and versions."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..run import Expired, InterruptRecord, ResumeRequest, RunPosition, Sleeping, legacy_interrupt_id
from ..shape import Chunks
from .store import MAX_PART_NAME, MAX_PARTS

if TYPE_CHECKING:
    from ..codec import Serializer

__all__ = ["position_to_plain", "position_from_plain", "split_state", "join_state", "register_engine_types",
           "describe_difference"]


# --- position <-> plain values ------------------------------------------------------------------------

def position_to_plain(pos: RunPosition, *, nested: dict[str, Any] | None = None) -> dict[str, Any]:
    """The position as plain values; `nested`: the nested runs' progress as stored (engine/keep/nested_parts.py),
    instead of `pos.nested`."""
    nested = pos.nested if nested is None else nested
    return {
        "step": pos.step, "pending": pos.pending, "inbox": pos.inbox, "skipped": pos.skipped,
        "interrupts": {k: _record_to_plain(r) for k, r in pos.interrupts.items()},
        "before": pos.paused_before, "after": pos.paused_after, "released": pos.released, "ledger": pos.ledger,
        "done": pos.done,
        "output": pos.output,
        **({"static_ids": pos.static_ids} if pos.static_ids else {}),
        **({"lineage": pos.lineage} if pos.lineage else {}),
        **({"answers": pos.answers} if pos.answers is not None else {}),
        **({"nested": nested} if nested else {}),
        **({"writers": pos.writers} if pos.writers else {}),
        **({"takeovers": [pos.taken_at, pos.takeovers]} if pos.takeovers else {}),
        **({"turn": pos.turn} if pos.turn else {}),
    }


def _record_to_plain(r: InterruptRecord) -> dict[str, Any]:
    plain = {
        "address": r.address, "id": r.id, "info": r.info, "state": r.state, "has_state": r.has_state,
        "child": None if r.child is None else {**position_to_plain(r.child), "state": r.child.state},
        "subs": [_record_to_plain(s) for s in r.subs],
    }
    if r.above:
        plain["above"] = [_record_to_plain(a) for a in r.above]
    if r.answered:
        plain["answered"], plain["answer"] = True, r.answer
    if r.deadline is not None:
        plain["deadline"] = r.deadline
    if r.has_on_deadline:
        plain["on_deadline"] = [r.on_deadline]
    return plain


def position_from_plain(d: dict[str, Any]) -> RunPosition:
    """Rebuild a position; a field of the wrong type raises ValueError (the caller reports the run)."""
    _shape(type(d) is dict and type(d["step"]) is int and type(d["done"]) is bool, "step or done")
    _shape(_str_map(d["pending"]) and _str_map(d["interrupts"]) and _str_map(d["skipped"]), "pending")
    _shape(_str_map(d["inbox"]) and all(_str_map(v) for v in d["inbox"].values()), "inbox")
    _shape(all(type(v) is list and all(type(s) is str for s in v) for v in d["skipped"].values()), "skipped")
    _shape(all(type(v) is list and all(type(n) is str for n in v) for v in (d["before"], d["after"])), "pauses")
    static_ids, lineage, answers = d.get("static_ids", {}), d.get("lineage", ""), d.get("answers")
    nested = d.get("nested", {})
    _shape(_str_map(nested) and all(type(v) in (bytes, str) for v in nested.values()), "nested runs")
    _shape(_str_map(static_ids) and all(type(v) is str for v in static_ids.values()), "static pause IDs")
    _shape(type(lineage) is str and (answers is None or _str_map(answers)), "lineage or answers")
    if answers is not None:
        ResumeRequest.from_plain(answers)  # raises ValueError when its parts have the wrong type
    writers = d.get("writers", {})
    _shape(_str_map(writers) and all(type(v) is str for v in writers.values()), "state writers")
    counted = d.get("takeovers", [0, 0])
    _shape(type(counted) is list and len(counted) == 2 and all(type(n) is int for n in counted), "takeover count")
    taken_at, takeovers = counted
    turn = d.get("turn", {})
    _shape(_str_map(turn) and all(type(v) is int and v >= 0 for v in turn.values()), "turn")
    return RunPosition(
        step=d["step"], pending=d["pending"], inbox=d["inbox"], skipped=d["skipped"],
        interrupts={k: _record_from_plain(v) for k, v in d["interrupts"].items()},
        paused_before=d["before"], paused_after=d["after"], released=d.get("released", []),
        static_ids=static_ids, ledger=d.get("ledger", 0), lineage=lineage, answers=answers, nested=nested,
        writers=writers, takeovers=takeovers, taken_at=taken_at, turn=turn,
        done=d["done"],
        output=d["output"], state=d.get("state"),
    )


def _record_from_plain(d: dict[str, Any]) -> InterruptRecord:
    _shape(type(d) is dict and type(d["address"]) is str and type(d["has_state"]) is bool
           and type(d["subs"]) is list and (d["child"] is None or type(d["child"]) is dict), "interrupt record")
    rid, above, answered = d.get("id") or legacy_interrupt_id(d["address"]), d.get("above", []), d.get("answered", False)
    _shape(type(rid) is str and type(above) is list and type(answered) is bool, "interrupt record")
    deadline, on_deadline = d.get("deadline"), d.get("on_deadline")
    _shape((deadline is None or (type(deadline) in (int, float) and math.isfinite(deadline)))
           and (on_deadline is None or (type(on_deadline) is list and len(on_deadline) == 1)), "pause deadline")
    return InterruptRecord(
        deadline=None if deadline is None else float(deadline),
        on_deadline=on_deadline[0] if on_deadline else None, has_on_deadline=on_deadline is not None,
        address=d["address"], id=rid, info=d["info"], state=d["state"], has_state=d["has_state"],
        child=None if d["child"] is None else position_from_plain(d["child"]),
        subs=[_record_from_plain(s) for s in d["subs"]],
        above=[_record_from_plain(a) for a in above], answered=answered, answer=d.get("answer"),
    )


def _str_map(value: Any) -> bool:
    return type(value) is dict and all(type(k) is str for k in value)


def _shape(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"the stored position's {what} has the wrong type")


# --- state <-> parts -----------------------------------------------------------------------------------

def split_state(state: Any, serializer: Serializer, *, room: int = MAX_PART_NAME - 2) -> tuple[Any, dict[str, Any]]:
    """The state's kind and its fields: a dict's str keys, a registered class's fields, or itself.

    A state with more fields than a version may have parts, or with a field name longer than `room` (what its
    part name leaves for it), is one part: the writer never writes what a reader (or a store) would refuse.
    """
    if state is None:
        return None, {}
    if type(state) is dict and _fits(state, room):
        return "dict", state
    entry = serializer.registry.entry_for_type(type(state))
    if entry is not None and entry.kind in ("model", "dataclass"):
        fields = entry.dump(state)
        if _fits(fields, room):
            return ["obj", entry.name], fields
    return "value", {"": state}


def _fits(fields: dict[Any, Any], room: int) -> bool:
    """Whether each field can be a part of its own: str names that fit, and not too many of them."""
    return len(fields) <= MAX_PARTS - 2 and all(type(k) is str and len(k) <= room for k in fields)


def join_state(kind: Any, fields: dict[str, Any], serializer: Serializer) -> Any:
    if kind is None:
        return None
    if kind == "dict":
        return fields
    if kind == "value":
        return fields[""]
    entry = serializer.registry.entry_named(kind[1])
    if entry is None:
        from ..codec import UnknownType

        raise UnknownType(kind[1])
    return entry.load(fields)


def register_engine_types(serializer: Serializer) -> None:
    registry = serializer.registry
    if registry.entry_for_type(Chunks) is None:
        registry.register(Chunks, name="waypoint.Chunks")
    if registry.entry_for_type(Expired) is None:
        registry.register(Expired, name="waypoint.Expired")
    if registry.entry_for_type(Sleeping) is None:
        registry.register(Sleeping, name="waypoint.Sleeping")


def describe_difference(old: dict[str, Any], new: dict[str, Any], where: str = "") -> str:
    """What changed between two graph structures, in words (for GraphMismatch). `old` is read from a
    store: if it is not shaped like a structure, the answer says so instead of failing."""
    try:
        return _difference(old, new, where)
    except Exception:  # an altered or damaged stored structure (unsigned stores): no detail to give
        return "the stored graph structure is unreadable, so what changed cannot be said"


def _difference(old: dict[str, Any], new: dict[str, Any], where: str = "") -> str:
    prefix = f"in subgraph '{where}': " if where else ""
    changes: list[str] = []
    for key in ("name", "trigger"):
        if old.get(key) != new.get(key):
            changes.append(f"{key} was {old.get(key)!r}, now {new.get(key)!r}")
    old_nodes, new_nodes = old.get("nodes", {}), new.get("nodes", {})
    if removed := sorted(set(old_nodes) - set(new_nodes)):
        changes.append(f"node(s) {removed} removed")
    if added := sorted(set(new_nodes) - set(old_nodes)):
        changes.append(f"node(s) {added} added")
    for key in sorted(set(old_nodes) & set(new_nodes)):
        a, b = old_nodes[key], new_nodes[key]
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                changes.append(_difference(a, b, f"{where}/{key}".strip("/")))
            else:
                changes.append(f"node '{key}' changed kind")
    old_edges = {tuple(e) for e in old.get("edges", [])}
    new_edges = {tuple(e) for e in new.get("edges", [])}
    if gone := sorted(old_edges - new_edges):
        changes.append("edge(s) " + ", ".join(f"{a} -> {b}" for a, b in gone) + " removed")
    if came := sorted(new_edges - old_edges):
        changes.append("edge(s) " + ", ".join(f"{a} -> {b}" for a, b in came) + " added")
    if old.get("branches") != new.get("branches"):
        changes.append("branches changed")
    if old.get("flow") != new.get("flow"):
        changes.append("the workflow's inputs (field mappings, data or control dependencies) changed")
    return prefix + ("; ".join(changes) or "the structure differs")


def _nested_under(pos: Any, key: str) -> bool:
    """Whether a run nested in node `key` (a subgraph's, an agent tool's) has recorded progress in `pos.nested`."""
    return any(f";node:{key};" in f"{address};" for address in getattr(pos, "nested", {}) or {})


def deploy_conflicts(old: dict[str, Any], new: dict[str, Any], pos: Any, where: str = "") -> list[str]:
    """What in a graph's new structure `new` could change what a run at `pos`, written under `old`, already did —
    an empty list when the new version may continue it (docs/resume.md, "Deploys"). The run's nodes are compared:
    each node its position names (pending, inbox, paused) must still be there, of the same kind (a subgraph a
    paused nested run sits in is compared the same way, below). Added nodes, edges and branches, and nodes and
    routes the run is not at, change only what it does next. A DAG graph (`trigger="all"`) and a workflow decide
    when a node is ready from every edge into it, so theirs must be unchanged. `old` is read from a store: a
    structure of an unexpected shape is a conflict, never an error."""
    prefix = f"in subgraph '{where}': " if where else ""
    try:
        if old.get("name") != new.get("name"):
            return [f"{prefix}the graph is named {new.get('name')!r}, not {old.get('name')!r}"]
        if old.get("trigger") != new.get("trigger"):
            return [f"{prefix}its trigger is {new.get('trigger')!r}, not {old.get('trigger')!r}"]
        if new.get("trigger") == "all" or "flow" in new or "flow" in old:
            return [] if old == new else [prefix + _difference(old, new)]
        old_nodes, new_nodes = old["nodes"], new["nodes"]
        conflicts = []
        at = {*pos.pending, *pos.inbox, *pos.interrupts} - {"__start__", "__end__"}
        for key in sorted(at):
            if key not in new_nodes:
                conflicts.append(f"{prefix}node '{key}', where the run is, is gone")
            elif isinstance(old_nodes.get(key), dict) != isinstance(new_nodes[key], dict):
                conflicts.append(f"{prefix}node '{key}', where the run is, changed kind (a subgraph or not)")
            elif isinstance(new_nodes[key], dict) and key in pos.interrupts and pos.interrupts[key].child is not None:
                sub = f"{where}/{key}".strip("/")
                conflicts += deploy_conflicts(old_nodes[key], new_nodes[key], pos.interrupts[key].child, sub)
            elif isinstance(new_nodes[key], dict) and old_nodes[key] != new_nodes[key] and _nested_under(pos, key):
                conflicts.append(f"{prefix}subgraph '{key}', where a nested run of it is under way, changed (its "
                                 "progress is not compared: it continues only under the version that wrote it)")
        return conflicts
    except (AttributeError, KeyError, TypeError):
        return [f"{prefix}the stored graph structure is unreadable"]

