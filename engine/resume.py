"""What a node sees when it runs again after a pause, and what the caller asked for on resume.

Inside a node (or a tool), with Eino's meaning:

- `get_interrupt_state(T=None) -> (was_interrupted, has_state, state)`: did *this* point (its address)
  pause last time, and with what `StatefulInterrupt` state;
- `get_resume_context(T=None) -> (is_target, has_data, data)`: did the caller target this point on
  resume, and with what data. A point that has paused points below it which were targeted is a
  target too (without data): it must run so that they can.

`T` validates and converts (pydantic `TypeAdapter`); a mismatch raises `pydantic.ValidationError`
inside the node, so it fails as that node's `NodeError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from .interrupts import InterruptCtx, InterruptInfo, interrupt_id
from .position import InterruptRecord, RunPosition
from .scope import _TASK, current_task

__all__ = ["ResumeRequest", "get_interrupt_state", "get_interrupt_info", "get_resume_context", "address_segment",
           "segment_of",
           "pending_interrupt_ids", "static_pauses", "awaits_answer", "has_static_pause", "interrupt_info"]


@dataclass(frozen=True, kw_only=True)
class ResumeRequest:
    """`resume=` as given to ainvoke: targeted IDs with their data, or everything."""

    data: dict[str, Any] = field(default_factory=dict)
    ids: frozenset[str] = frozenset()
    everything: bool = False

    @staticmethod
    def parse(resume: Any) -> ResumeRequest | None:
        if resume is None or resume is False:
            return None
        if resume is True:
            return ResumeRequest(everything=True)
        if isinstance(resume, dict):
            return ResumeRequest(data=dict(resume), ids=frozenset(resume))
        if isinstance(resume, (str, bytes)):
            raise TypeError("resume= takes a dict {interrupt_id: data}, a list of interrupt IDs, or True")
        ids = frozenset(resume)
        return ResumeRequest(ids=ids)

    def targets(self, record: InterruptRecord) -> bool:
        """Whether this paused task (or anything paused inside it) was asked to resume."""
        return self.everything or any(i in self.ids for i in record_ids(record))


def static_pauses(pos: RunPosition, address: str) -> Iterator[tuple[str, str, str]]:
    """`(address, node, "before" | "after")` for each static pause of one run (not nested runs)."""
    for key in pos.paused_before:
        yield f"{address};node:{key};pause:before", key, "before"
    for key in pos.paused_after:
        yield f"{address};node:{key};pause:after", key, "after"


def record_ids(record: InterruptRecord) -> Iterator[str]:
    """Every interrupt ID in a paused task: its own, its subs', and those of a nested run."""
    if record.child is not None:
        yield from position_ids(record.child, record.address)
        return
    yield interrupt_id(record.address)
    for sub in record.subs:
        yield from record_ids(sub)


def position_ids(pos: RunPosition, address: str) -> Iterator[str]:
    """Every pending interrupt ID of a run at `address`: static pauses first, then paused tasks."""
    for point, _, _ in static_pauses(pos, address):
        yield interrupt_id(point)
    for record in pos.interrupts.values():
        yield from record_ids(record)


def pending_interrupt_ids(pos: RunPosition, address: str) -> list[str]:
    return list(position_ids(pos, address))


def awaits_answer(pos: RunPosition) -> bool:
    """True when some paused task (here or nested) needs `resume=`; static pauses need none."""
    return any(r.child is None or awaits_answer(r.child) for r in pos.interrupts.values())


def has_static_pause(pos: RunPosition) -> bool:
    """True when this run or a nested one stopped at an interrupt_before / interrupt_after."""
    return bool(pos.paused_before or pos.paused_after) or any(
        r.child is not None and has_static_pause(r.child) for r in pos.interrupts.values())


def _walk(records: dict[str, InterruptRecord]) -> Iterator[InterruptRecord]:
    for record in records.values():
        if record.child is not None:
            continue
        yield record
        yield from record.subs


@contextmanager
def address_segment(kind: str, name: str, sub_id: str | None = None) -> Iterator[str]:
    """Run the body at a deeper address (`;<kind>:<name>[:<sub_id>]`), e.g. one tool call in a node.

    Interrupts raised inside get this address, and `get_interrupt_state` / `get_resume_context`
    answer for it. Yields the address.
    """
    scope = current_task()
    if scope is None:
        raise RuntimeError("address_segment() is only meaningful inside a running node")
    for part in (kind, name, sub_id or ""):
        if ";" in part or ":" in part:
            raise ValueError(f"address parts may not contain ';' or ':' (got {part!r})")
    address = f"{scope.address};{kind}:{name}" + (f":{sub_id}" if sub_id else "")
    token = _TASK.set(replace(scope, address=address))
    try:
        yield address
    finally:
        _TASK.reset(token)


def segment_of(address: str, kind: str) -> tuple[str, ...] | None:
    """The parts of the innermost `;<kind>:...` segment of an address (`address_segment`'s inverse), or None.

    `segment_of(ctx.address, "tool")` is `(name, call_id)` for an interrupt raised inside a tool call;
    `segment_of(ctx.address, "pause")` is `("before",)` or `("after",)` for a static pause.
    """
    prefix = kind + ":"
    for segment in reversed(address.split(";")):
        if segment.startswith(prefix):
            return tuple(segment[len(prefix):].split(":"))
    return None


def _scope_or_error(fn: str) -> Any:
    scope = current_task()
    if scope is None:
        raise RuntimeError(f"{fn}() must be called inside a running node or tool")
    return scope


def _convert(value: Any, T: Any) -> Any:
    if T is None or value is None:
        return value
    from pydantic import TypeAdapter

    return TypeAdapter(T).validate_python(value)


def get_interrupt_state(T: Any = None) -> tuple[bool, bool, Any]:
    """`(was_interrupted, has_state, state)` for the calling node or tool, from the last pause.

    Only a paused task that runs again sees its pause; a later pass through the same point does not.
    """
    scope = _scope_or_error("get_interrupt_state")
    record = scope.resumed.get(scope.address) if scope.resumed else None
    if record is None:
        return False, False, None
    if not record.has_state:
        return True, False, None
    return True, True, _convert(record.state, T)


def get_interrupt_info() -> Any:
    """What the calling point's last pause said (`Interrupt(info)`), when it runs again after it; else None."""
    scope = _scope_or_error("get_interrupt_info")
    record = scope.resumed.get(scope.address) if scope.resumed else None
    return None if record is None else record.info


def get_resume_context(T: Any = None) -> tuple[bool, bool, Any]:
    """`(is_target, has_data, data)`: whether the caller resumed this point, and with what data.

    The answer belongs to the paused task that runs again; a later pass is not a target.
    """
    scope = _scope_or_error("get_resume_context")
    request: ResumeRequest | None = scope.resume
    if request is None:
        return False, False, None
    own = interrupt_id(scope.address)
    if own in request.data:
        data = request.data[own]
        return True, data is not None, _convert(data, T)
    resumed = scope.resumed or {}
    if own in request.ids or request.everything and scope.address in resumed:
        return True, False, None
    below = scope.address + ";"
    for address in resumed:
        if address.startswith(below) and (request.everything or interrupt_id(address) in request.ids):
            return True, False, None
    return False, False, None


def resumed_records(pos: RunPosition) -> dict[str, InterruptRecord]:
    """Address -> record of every pause point in this run's own tasks (not nested runs)."""
    return {r.address: r for r in _walk(pos.interrupts)}


def interrupt_info(pos: RunPosition, address: str) -> InterruptInfo:
    """The caller's view of a paused run: every root-cause interrupt, nested runs included.

    Static pauses (`interrupt_before` / `interrupt_after`) are listed too, at `<node>;pause:before`
    (or `after`), and their nodes by path (`sub/b` inside subgraph node `sub`) in `before_nodes` /
    `after_nodes`.
    """
    contexts: list[InterruptCtx] = []
    static: dict[str, list[str]] = {"before": [], "after": []}

    def walk(pos: RunPosition, address: str, prefix: tuple[str, ...]) -> None:
        for key, record in pos.interrupts.items():
            if record.child is not None:
                walk(record.child, record.address, (*prefix, key))
                continue
            ctx = InterruptCtx(id=interrupt_id(record.address), address=record.address, info=record.info,
                               is_root_cause=not record.subs, parent=None)
            if record.subs:
                for sub in record.subs:
                    contexts.append(InterruptCtx(id=interrupt_id(sub.address), address=sub.address,
                                                 info=sub.info, is_root_cause=True, parent=ctx))
            else:
                contexts.append(ctx)
        for point, key, when in static_pauses(pos, address):
            node = "/".join((*prefix, key))
            static[when].append(node)
            contexts.append(InterruptCtx(id=interrupt_id(point), address=point, info={"pause": when, "node": node}))

    walk(pos, address, ())
    return InterruptInfo(contexts=tuple(contexts), before_nodes=tuple(static["before"]),
                         after_nodes=tuple(static["after"]))
