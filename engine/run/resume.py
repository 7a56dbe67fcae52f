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

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from .interrupts import (
    CompositeInterrupt,
    Expired,
    Interrupt,
    InterruptCtx,
    InterruptInfo,
    StatefulInterrupt,
    legacy_interrupt_id,
    new_interrupt_id,
)
from .position import InterruptRecord, RunPosition
from .scope import _TASK, current_task

__all__ = ["ResumeRequest", "get_interrupt_state", "get_interrupt_info", "get_resume_context", "address_segment",
           "segment_of", "escape_part", "unescape_part", "pause_again", "get_interrupt_id", "answers_below",
           "answered_earlier", "retire_failed_answers", "reissue_ids", "paused_records", "due_answers",
           "pending_interrupt_ids", "static_pauses", "awaits_answer", "record_awaits", "has_static_pause",
           "interrupt_info"]


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

    def to_plain(self) -> dict[str, Any]:
        """What the claim stores (RunPosition.answers)."""
        return {"data": dict(self.data), "ids": sorted(self.ids), "everything": self.everything}

    @staticmethod
    def from_plain(plain: Any) -> ResumeRequest | None:
        if not isinstance(plain, dict):
            return None
        data, ids = plain.get("data"), plain.get("ids")
        if not isinstance(data, dict) or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ValueError("the stored position's answers have the wrong type")
        return ResumeRequest(data=data, ids=frozenset(ids), everything=plain.get("everything") is True)

    def joined(self, other: ResumeRequest | None) -> ResumeRequest:
        """This request plus `other`'s answers for IDs this one does not answer (this one's stand)."""
        if other is None:
            return self
        return ResumeRequest(data={**other.data, **self.data}, ids=self.ids | other.ids,
                             everything=self.everything or other.everything)

    def targets(self, record: InterruptRecord) -> bool:
        """Whether this paused task (or anything paused inside it) was asked to resume."""
        return self.everything or any(i in self.ids for i in record_ids(record))


def static_pauses(pos: RunPosition, address: str) -> Iterator[tuple[str, str, str, str]]:
    """`(address, node, "before" | "after", id)` for each static pause of one run (not nested runs)."""
    for when, keys in (("before", pos.paused_before), ("after", pos.paused_after)):
        for key in keys:
            point = f"{address};node:{key};pause:{when}"
            yield point, key, when, pos.static_ids.get(f"{when}:{key}") or legacy_interrupt_id(point)


def record_ids(record: InterruptRecord) -> Iterator[str]:
    """Every root-cause interrupt ID in a paused task: its own (or its subs'), and a nested run's."""
    if record.child is not None:
        yield from position_ids(record.child, record.address)
        return
    if not record.subs:
        yield record.id
    for sub in record.subs:
        yield from record_ids(sub)


def position_ids(pos: RunPosition, address: str) -> Iterator[str]:
    """Every pending interrupt ID of a run at `address`: static pauses first, then paused tasks."""
    for *_, pause_id in static_pauses(pos, address):
        yield pause_id
    for record in pos.interrupts.values():
        yield from record_ids(record)


def pending_interrupt_ids(pos: RunPosition, address: str, answered: frozenset[str] = frozenset()) -> list[str]:
    """The IDs a resume may answer; `answered` (a claim's stored answers, docs/resume.md) are left out."""
    return [i for i in position_ids(pos, address) if i not in answered]


def awaits_answer(pos: RunPosition) -> bool:
    """True when some paused task (here or nested) needs `resume=`; static pauses need none."""
    return any(record_awaits(r) for r in pos.interrupts.values())


def record_awaits(record: InterruptRecord) -> bool:
    """Whether this paused task still waits for an answer. A run nested in it (a subgraph's, an agent tool's)
    that was answered and went on before its process stopped waits on nothing: the task continues it."""
    if record.child is not None:
        return awaits_answer(record.child)
    if record.subs:
        return any(record_awaits(s) for s in record.subs)
    return True


def has_static_pause(pos: RunPosition) -> bool:
    """True when this run or a nested one stopped at an interrupt_before / interrupt_after."""
    return bool(pos.paused_before or pos.paused_after) or any(
        r.child is not None and has_static_pause(r.child) for r in _with_subs(pos.interrupts.values()))


def paused_records(pos: RunPosition) -> Iterator[InterruptRecord]:
    """Every pause of a run that waits for an answer itself (a root cause), nested runs' included."""
    for record in _with_subs(pos.interrupts.values()):
        if record.child is not None:
            yield from paused_records(record.child)
        elif not record.subs:
            yield record


def due_answers(pos: RunPosition, now: float) -> dict[str, Any]:
    """`{interrupt id: Expired(deadline)}` for each pause of the run whose deadline is at or before `now`."""
    return {r.id: Expired(r.deadline) for r in paused_records(pos) if r.deadline is not None and r.deadline <= now}


def _with_subs(records: Any) -> Iterator[InterruptRecord]:
    """Each record and, below it, its sub-interrupts (a tools node's calls, one of them a nested run)."""
    for record in records:
        yield record
        yield from _with_subs(record.subs)


def _walk(records: dict[str, InterruptRecord]) -> Iterator[InterruptRecord]:
    """Each paused point of a run's tasks (a nested run's record, not the records inside it)."""
    for record in records.values():
        yield from record.above
        yield record
        for sub in record.subs:
            yield from sub.above
            yield sub


# --- addresses -----------------------------------------------------------------------------------------

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.~+=@/!$&'()*,[]")


def escape_part(text: str) -> str:
    """`text` as an address part: `%XX` for every byte of a character outside a small safe set (`;`, `:`,
    `%`, controls, bidi, surrogates...), so two different texts never give the same part."""
    if all(c in _SAFE for c in text):
        return text
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
                   for c in text)


def unescape_part(part: str) -> str:
    """`escape_part`'s inverse."""
    if "%" not in part:
        return part
    out, i = bytearray(), 0
    while i < len(part):
        if part[i] == "%":
            out.append(int(part[i + 1:i + 3], 16))
            i += 3
        else:
            out.extend(part[i].encode())
            i += 1
    return out.decode("utf-8", "surrogatepass")


@contextmanager
def address_segment(kind: str, *parts: str) -> Iterator[str]:
    """Run the body at a deeper address (`;<kind>[:<part>]...`), e.g. one tool call in a node.

    Each part is escaped (`escape_part`), so any text (a model's call ID, say) gives its own address.
    Interrupts raised inside get this address, and `get_interrupt_state` / `get_resume_context`
    answer for it. Yields the address.
    """
    scope = current_task()
    if scope is None:
        raise RuntimeError("address_segment() is only meaningful inside a running node")
    if not kind or escape_part(kind) != kind:
        raise ValueError(f"an address segment's kind must be a plain name (got {kind!r})")
    segment = ":".join((kind, *(escape_part(p) for p in parts if p is not None)))
    address = f"{scope.address};{segment}"
    token = _TASK.set(replace(scope, address=address, place=f"{scope.place or scope.address};{segment}"))
    try:
        yield address
    finally:
        try:
            _TASK.reset(token)
        except ValueError:  # an async generator closed from another context: restore by value
            _TASK.set(scope)


def segment_of(address: str, kind: str) -> tuple[str, ...] | None:
    """The parts of the innermost `;<kind>:...` segment of an address (`address_segment`'s inverse), or None.

    `segment_of(ctx.address, "tool")` is `(name, call_id, position)` for an interrupt raised inside a tool
    call; `segment_of(ctx.address, "pause")` is `("before",)` or `("after",)` for a static pause.
    """
    for segment in reversed(address.split(";")):
        name, _, rest = segment.partition(":")
        if name == kind:
            return tuple(unescape_part(p) for p in rest.split(":")) if rest else ()
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


def _own(scope: Any) -> InterruptRecord | None:
    return scope.resumed.get(scope.address) if scope.resumed else None


def get_interrupt_state(T: Any = None) -> tuple[bool, bool, Any]:
    """`(was_interrupted, has_state, state)` for the calling node or tool, from the last pause.

    Only a paused task that runs again sees its pause; a later pass through the same point does not.
    """
    record = _own(_scope_or_error("get_interrupt_state"))
    if record is None:
        return False, False, None
    if not record.has_state:
        return True, False, None
    return True, True, _convert(record.state, T)


def get_interrupt_info() -> Any:
    """What the calling point's last pause said (`Interrupt(info)`), when it runs again after it; else None."""
    record = _own(_scope_or_error("get_interrupt_info"))
    return None if record is None else record.info


def get_interrupt_id() -> str | None:
    """The ID of the calling point's last pause, when it runs again after it; else None."""
    record = _own(_scope_or_error("get_interrupt_id"))
    return None if record is None else record.id


def get_resume_context(T: Any = None) -> tuple[bool, bool, Any]:
    """`(is_target, has_data, data)`: whether the caller resumed this point, and with what data.

    The answer belongs to the paused task that runs again; a later pass is not a target. Data handed
    out here is *consumed* by this point: a pause raised below it in this pass gets its own ID, needs its
    own answer, and carries this answer along so that the next pass through this point gets it again.
    """
    scope = _scope_or_error("get_resume_context")
    request: ResumeRequest | None = scope.resume
    record = _own(scope)
    if record is not None and record.child is not None:  # a nested run paused here: a target if a pause in it is
        if not record_awaits(record):  # it went on past its pause before its process stopped: continue it
            return True, False, None
        return request is not None and request.targets(record), False, None
    if request is None:
        return False, False, None
    if record is not None and record.answered:  # answered in an earlier pass of this call: still its answer
        if not _targets_below(scope, request):
            return False, False, None
        return True, True, _consumed(scope, record, record.answer, T)
    if record is not None and record.id in request.data:
        data = request.data[record.id]
        if data is None:
            return True, False, None
        return True, True, _consumed(scope, record, data, T)
    if record is not None and (request.everything or record.id in request.ids):
        return True, False, None
    if _targets_below(scope, request):
        return True, False, None
    return False, False, None


def answers_below() -> list[Any]:
    """The data a resume gave to points paused below the calling one (in address order): what a tools node
    reads to honour `Respond` / `Restart` sent to a question asked inside an approved call."""
    scope = _scope_or_error("answers_below")
    request: ResumeRequest | None = scope.resume
    if request is None:
        return []
    below = scope.address + ";"
    found = sorted((a, r) for a, r in (scope.resumed or {}).items()
                   if a.startswith(below) and not r.answered and request.data.get(r.id) is not None)
    return [request.data[r.id] for _, r in found]


def answered_earlier() -> bool:
    """True when the calling point's answer was given in an earlier pass of its call (it is carried with a
    pause below it, not new): a decision about it was recorded then."""
    record = _own(_scope_or_error("answered_earlier"))
    return record is not None and record.answered


def _targets_below(scope: Any, request: ResumeRequest) -> bool:
    below = scope.address + ";"
    return any(a.startswith(below) and not r.answered and (request.targets(r) if r.child is not None
                                                             else request.everything or r.id in request.ids)
               for a, r in (scope.resumed or {}).items())


def _consumed(scope: Any, record: InterruptRecord, data: Any, T: Any) -> Any:
    if scope.consumed is not None:
        scope.consumed[scope.address] = (record, data)
    return _convert(data, T)


def pause_again() -> Interrupt:
    """The pause(s) at or below the calling point, exactly as they were (address, ID, info, state), for a
    point the resume did not target: `raise pause_again()`."""
    scope = _scope_or_error("pause_again")
    here, below = scope.address, scope.address + ";"
    found = [r for a, r in (scope.resumed or {}).items() if not r.answered and (a == here or a.startswith(below))]
    tops = [r for r in found if not any(o is not r and r.address.startswith(o.address + ";") for o in found)]
    if len(tops) == 1:
        return _rebuilt(tops[0])
    if not tops:
        raise RuntimeError(f"pause_again(): nothing paused at or below {here}")
    return CompositeInterrupt(None, None, [_rebuilt(r) for r in tops])


def _rebuilt(record: InterruptRecord) -> Interrupt:
    signal = (CompositeInterrupt(record.info, record.state, [_rebuilt(s) for s in record.subs]) if record.subs
              else StatefulInterrupt(record.info, record.state) if record.has_state else Interrupt(record.info))
    signal.address, signal.id, signal.above = record.address, record.id, list(record.above)
    signal.child = record.child
    signal.deadline, signal.expires_in = record.deadline, record.expires_in
    signal.on_deadline, signal.has_on_deadline = record.on_deadline, record.has_on_deadline
    return signal


def resumed_records(pos: RunPosition) -> dict[str, InterruptRecord]:
    """Address -> record of every pause point in this run's own tasks (not nested runs), and of the
    points above them that an answer already passed (`InterruptRecord.above`)."""
    return {r.address: r for r in _walk(pos.interrupts)}


def interrupt_info(pos: RunPosition, address: str, answered: frozenset[str] = frozenset()) -> InterruptInfo:
    """The caller's view of a paused run: every root-cause interrupt, nested runs included.

    Static pauses (`interrupt_before` / `interrupt_after`) are listed too, at `<node>;pause:before`
    (or `after`), and their nodes by path (`sub/b` inside subgraph node `sub`) in `before_nodes` /
    `after_nodes`. IDs in `answered` (a claim's stored answers) are not listed: nobody must answer them.
    """
    contexts: list[InterruptCtx] = []
    static: dict[str, list[str]] = {"before": [], "after": []}

    def add(ctx: InterruptCtx) -> None:
        if ctx.id not in answered:
            contexts.append(ctx)

    def walk(pos: RunPosition, address: str, prefix: tuple[str, ...]) -> None:
        for key, record in pos.interrupts.items():
            if record.child is not None:
                walk(record.child, record.address, (*prefix, key))
                continue
            ctx = InterruptCtx(id=record.id, address=record.address, info=record.info,
                               is_root_cause=not record.subs, parent=None, deadline=record.deadline)
            for sub in record.subs:
                if sub.child is not None:  # a run nested in one call (an agent used as a tool): its own pauses
                    walk(sub.child, sub.address, (*prefix, key))
                    continue
                add(InterruptCtx(id=sub.id, address=sub.address, info=sub.info, is_root_cause=True, parent=ctx,
                                 deadline=sub.deadline))
            if not record.subs:
                add(ctx)
        for point, key, when, pause_id in static_pauses(pos, address):
            node = "/".join((*prefix, key))
            static[when].append(node)
            add(InterruptCtx(id=pause_id, address=point, info={"pause": when, "node": node}))

    walk(pos, address, ())
    return InterruptInfo(contexts=tuple(contexts), before_nodes=tuple(static["before"]),
                         after_nodes=tuple(static["after"]))


def standing_answers(pos: RunPosition, status: str, error: str | None) -> ResumeRequest | None:
    """The answers a claim stored that still stand: a run that stopped without finishing its resume (its
    process died, or it was cancelled) continues with them. A run that failed does not: its pauses are
    asked again."""
    if pos.answers is None or not (status == "running" or (status == "interrupted" and error == "cancelled")):
        return None
    return ResumeRequest.from_plain(pos.answers)


def retire_failed_answers(pos: RunPosition, status: str, address: str) -> None:
    """A run that failed after a resume's claim asks its answered pauses again — under new IDs, so the same
    answer sent again (a client retry) answers nothing — and without their deadlines (they were answered in time). The new ID is derived from the old one, so every
    reader of the stored run (get_run, the resume itself) sees the same."""
    if status != "failed" or pos.answers is None:
        return
    answered = answered_ids(pos, ResumeRequest.from_plain(pos.answers), address)

    def walk(p: RunPosition) -> None:
        for r in _with_subs(p.interrupts.values()):
            if r.child is not None:
                walk(r.child)
            if r.id in answered:
                r.id = hashlib.blake2b(f"{r.id}/asked again".encode(), digest_size=8).hexdigest()
                r.deadline, r.has_on_deadline, r.on_deadline = None, False, None  # it was answered in time

    walk(pos)


def reissue_ids(pos: RunPosition, keep: frozenset[str] = frozenset()) -> None:
    """A branch (a fork, time travel, an edit of an older version) re-opens the pauses of the version it
    starts from: each gets a new ID there, nested runs' too, except those in `keep` (the ones the branching
    call itself answers, by the ID it read at that version). An answer replayed to the old line never answers
    a re-opened pause; the new IDs are read from the stored branch (`get_run`) or the pause it raises."""
    for when, keys in (("before", pos.paused_before), ("after", pos.paused_after)):
        for key in keys:
            pos.static_ids[f"{when}:{key}"] = new_interrupt_id()
    for record in _with_subs(pos.interrupts.values()):
        if record.child is not None:
            reissue_ids(record.child, keep)
        elif record.id not in keep:
            record.id = new_interrupt_id()


def answered_ids(pos: RunPosition, request: ResumeRequest | None, address: str) -> frozenset[str]:
    """The pending IDs `request` answers (all of them when it resumes everything)."""
    if request is None:
        return frozenset()
    if request.everything:
        return frozenset(position_ids(pos, address))
    return frozenset(i for i, d in request.data.items() if d is not None) | request.ids
