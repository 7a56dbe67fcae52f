"""Interrupt signals a node raises to pause a run, and what the caller sees when it pauses.

`Interrupt`, `StatefulInterrupt` and `CompositeInterrupt` derive from `BaseException`, not
`Exception`: a node's own `except Exception:` must not swallow a pause (LangGraph's
langgraph#8217). The run loop catches them around every task; the caller sees `GraphInterrupted`,
a normal `WaypointError`, carrying an `InterruptInfo`.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from ..errors import clip
from .scope import current_task

__all__ = [
    "Interrupt",
    "StatefulInterrupt",
    "CompositeInterrupt",
    "InterruptCtx",
    "InterruptInfo",
    "Expired",
    "new_interrupt_id",
]

_NO_ANSWER: Any = object()


@dataclass(frozen=True)
class Expired:
    """The answer a pause gets when its deadline passes with nobody answering and no `on_deadline` was given.

    `deadline`: when it passed, seconds since the epoch on the store's clock. Recovery (`waypoint serve`,
    `waypoint worker`, `recover(...)`) resumes a due pause with it; a resume may give it only once the pause is
    due, and a pause that is due takes no other answer (docs/resume.md, "Deadlines")."""

    deadline: float

    @property
    def when(self) -> str:
        """The deadline as people read it: `2026-12-02 14:03:11 UTC`."""
        return utc(self.deadline)


def utc(t: float) -> str:
    """A time (seconds since the epoch) as people read it, in UTC: `2026-12-02 14:03:11 UTC`."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


class Interrupt(BaseException):
    """Pause the run here; `info` is shown to whoever resumes it.

    `deadline`: when the pause stops waiting — a timezone-aware `datetime`, or a `timedelta` or a number of
    seconds counted from when the pause is stored, on the store's clock. At it, recovery resumes this point with
    `on_deadline` as its answer (an `Expired` when none is given). The same pause shown again keeps its first
    deadline."""

    def __init__(self, info: Any = None, *, deadline: datetime | timedelta | float | None = None,
                 on_deadline: Any = _NO_ANSWER) -> None:
        super().__init__(info)
        self.info = info
        self.state: Any = None
        self.has_state = False
        self.subs: tuple[Interrupt, ...] = ()
        self.child: Any = None
        """The position of a run nested here that paused (engine/compose/nested.py sets it); its pauses are the root causes."""
        scope = current_task()
        # Where it was raised (a tool call inside a node has a deeper address than the node).
        self.address: str | None = scope.address if scope is not None else None
        self.id = _pause_id(scope)
        self.above = _answered_above(scope)
        self.deadline, self.expires_in = _when(deadline)
        self.on_deadline, self.has_on_deadline = on_deadline, on_deadline is not _NO_ANSWER
        if self.has_on_deadline and self.deadline is None and self.expires_in is None:
            raise ValueError("Interrupt(on_deadline=...) needs a deadline= it applies at")
        _keep_deadline(self, scope)


class StatefulInterrupt(Interrupt):
    """Pause the run and persist `state`; `get_interrupt_state()` hands it back on resume (`deadline`,
    `on_deadline`: as for `Interrupt`)."""

    def __init__(self, info: Any, state: Any, *, deadline: datetime | timedelta | float | None = None,
                 on_deadline: Any = _NO_ANSWER) -> None:
        super().__init__(info, deadline=deadline, on_deadline=on_deadline)
        self.state = state
        self.has_state = True


class CompositeInterrupt(Interrupt):
    """Pause on behalf of several interrupted sub-tasks (`subs`); only the subs are root causes."""

    def __init__(self, info: Any, state: Any, subs: Sequence[Interrupt]) -> None:
        super().__init__(info)
        self.state = state
        self.has_state = True
        self.subs = tuple(subs)


MAX_WAIT = 100 * 365.25 * 86400.0
"""The longest a pause may wait, in seconds (100 years): a deadline past it is refused, not stored."""


def _when(deadline: Any) -> tuple[float | None, float | None]:
    """(an absolute deadline, or seconds from when the pause is stored): what `deadline=` said."""
    if deadline is None:
        return None, None
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None or deadline.utcoffset() is None:
            raise ValueError(f"Interrupt(deadline={deadline!r}): a datetime deadline needs a timezone (a moment such "
                             "as 2030-01-01 09:00 UTC); for a time from now give a timedelta or seconds, which are "
                             "counted on the store's clock")
        return deadline.timestamp(), None
    seconds = deadline.total_seconds() if isinstance(deadline, timedelta) else deadline
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not -MAX_WAIT <= seconds <= MAX_WAIT:
        raise ValueError(f"Interrupt(deadline={deadline!r}): give a timezone-aware datetime, a timedelta or a "
                         f"finite number of seconds (at most {MAX_WAIT:.0f}: 100 years)")
    return None, max(0.0, float(seconds))


def _keep_deadline(signal: Interrupt, scope: Any) -> None:
    """A pause shown again (same ID) keeps the deadline it was first stored with, and what happens at it."""
    old = scope.resumed.get(scope.address) if scope is not None and scope.resumed else None
    if old is None or old.id != signal.id or (old.deadline is None and old.expires_in is None):
        return
    signal.deadline, signal.expires_in = old.deadline, old.expires_in
    signal.on_deadline, signal.has_on_deadline = old.on_deadline, old.has_on_deadline


def new_interrupt_id() -> str:
    """A fresh interrupt ID: 16 hex digits, random, so no other run, turn or pause ever has it."""
    return os.urandom(8).hex()


def legacy_interrupt_id(address: str) -> str:
    """The ID of a pause stored before IDs were minted per pause (a hash of its address)."""
    return hashlib.blake2b(address.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _pause_id(scope: Any) -> str:
    """The same pause re-shown keeps its ID; anything else is a new pause with a new ID.

    "Re-shown": this address paused last time, runs again in the task that paused, and took no answer
    (a resume that did not target it, or targeted it without data). A pause at an address that consumed
    an answer in this pass, or that did not pause last time, is new.
    """
    if scope is None or not scope.resumed:
        return new_interrupt_id()
    old = scope.resumed.get(scope.address)
    if old is None or old.answered or (scope.consumed and scope.address in scope.consumed):
        return new_interrupt_id()
    request = scope.resume
    if request is not None and old.id in request.data and request.data[old.id] is not None:
        return new_interrupt_id()
    return old.id


def _answered_above(scope: Any) -> list[Any]:
    """The records, with their answers, of points above this one that an answer passed in this pass."""
    if scope is None or not scope.consumed:
        return []
    address = scope.address
    return [replace(record, answered=True, answer=answer, above=[], subs=[], child=None)
            for at, (record, answer) in scope.consumed.items() if address.startswith(at + ";")]


@dataclass(frozen=True, kw_only=True)
class InterruptCtx:
    """One interrupt point: where it is, what it said, and whether it is a root cause."""

    id: str
    address: str
    info: Any = None
    is_root_cause: bool = True
    parent: InterruptCtx | None = None
    deadline: float | None = None
    """When the pause stops waiting (seconds since the epoch, the store's clock), if it has a deadline."""


@dataclass(frozen=True, kw_only=True)
class InterruptInfo:
    """Why a run paused: root-cause `contexts`, and nodes paused by static before/after interrupts."""

    contexts: tuple[InterruptCtx, ...] = ()
    before_nodes: tuple[str, ...] = ()
    after_nodes: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        # info may come from a stored run: shown clipped, never unbounded
        parts = [f"{clip(c.address)} (id {c.id}): {clip(repr(c.info))}" for c in self.contexts]
        if self.before_nodes:
            parts.append(f"before nodes {list(self.before_nodes)}")
        if self.after_nodes:
            parts.append(f"after nodes {list(self.after_nodes)}")
        return "; ".join(parts) or "no interrupt points"
