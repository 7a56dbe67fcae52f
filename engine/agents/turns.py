"""New input for a chat whose run is executing — double-texting (`Runner.run(on_busy=)`, docs/agents.md).

The input is queued in the store (engine/keep/store.py, guarantee 15), numbered in the order the store recorded it
whichever process sent it, and accepted only while the run executes (judged on the store's clock in the insert's
own transaction). Whoever ends a turn on the ID — the process executing it, here or elsewhere — then takes the
queued inputs one at a time, in their order, each as a turn of its own: a new run on the ID claimed by
compare-and-set on the version it read, with the input's number written in its position (`RunPosition.turn`), so
two processes never both take one and a crash never takes one twice.

- `enqueue`: the turn in flight goes on; the input runs after it ends (completed, failed or cancelled). While the
  turn waits for an answer it has not ended: the input waits too.
- `interrupt`: the turn in flight is cancelled at its next step boundary (what finished is kept) — or, paused, given
  up — and the input runs next.
- `rollback`: the turn in flight is cancelled now and dropped (the conversation goes back to where the turn began,
  its input included); a turn that completed before it could be stopped is kept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import NotRunning, WaypointError
from ..keep import ON_BUSY, QueuedInput, default_by, store_clock

__all__ = ["Look", "look", "queue", "check_on_busy", "keeps_inputs", "drainable", "rollback_to", "mark", "settled",
           "each_waiting"]

log = logging.getLogger("waypoint.run")


def check_on_busy(checkpoint_id: str | None, on_busy: Any, store: Any) -> str:
    if on_busy not in ON_BUSY:
        raise WaypointError(f"run '{checkpoint_id}': on_busy={str(on_busy)[:80]!r} must be one of {', '.join(ON_BUSY)}")
    if on_busy != "reject" and (checkpoint_id is None or not keeps_inputs(store)):
        raise WaypointError(f"run '{checkpoint_id}': on_busy={on_busy!r} queues input in the store for the run's "
                            "checkpoint ID; pass checkpoint_id= and use a store that keeps queued inputs "
                            "(MemoryStore, SQLiteStore, SQLStore)")
    return on_busy


def keeps_inputs(store: Any) -> bool:
    return store is not None and getattr(store, "queued_inputs", None) is not None


@dataclass
class Look:
    """A chat's newest version and what is queued for it."""

    snap: Any  # RunSnapshot | None
    active: bool = False
    """Running under a lease that has not expired on the store's clock: a process executes it."""
    waiting: list[QueuedInput] = field(default_factory=list)
    """Inputs queued after the last one a turn took, oldest first."""

    @property
    def version(self) -> int | None:
        return self.snap.meta.version if self.snap is not None else None

    @property
    def taken(self) -> int:
        return self.snap.turn.get("input", 0) if self.snap is not None else 0


async def look(app: Any, store: Any, checkpoint_id: str) -> Look:
    snap = await app.get_run(checkpoint_id)
    found = Look(snap)
    if snap is None:
        return found
    meta = snap.meta
    if meta.status == "running" and meta.lease_expires is not None:
        found.active = meta.lease_expires > await store_clock(store)
    if keeps_inputs(store):
        found.waiting = await store.queued_inputs(checkpoint_id, after=found.taken)
    return found


async def mark(store: Any, checkpoint_id: str, upto: int, state: str = "taken") -> None:
    """Mark the run's inputs up to `upto` taken (or input `upto` stuck) for `waiting_inputs`: a hint written after
    the fact (the run's position says what was taken), so a failure is said and the run goes on."""
    marking = getattr(store, "mark_inputs", None)
    if marking is None or upto <= 0:
        return
    try:
        await marking(checkpoint_id, upto, state=state)
    except Exception as err:  # noqa: BLE001 - the next look at the chat marks it
        log.warning("run '%s': marking its queued input(s) up to %d %s failed (%s: %s)", checkpoint_id, upto, state,
                    type(err).__name__, err)


async def settled(app: Any, store: Any, checkpoint_id: str) -> Look:
    """`look`, for a chat `waiting_inputs` listed: one whose inputs its position says were all taken (a crash came
    between a turn's claim and its mark) is marked so, and no longer listed."""
    found = await look(app, store, checkpoint_id)
    if found.snap is not None and not found.waiting and found.taken:
        await mark(store, checkpoint_id, found.taken)
    return found


async def each_waiting(store: Any, take: Any, fingerprints: Any, page: int = 100) -> None:
    """`await take(checkpoint_id)` for every chat of the graphs with these `fingerprints` that `store.waiting_inputs`
    lists, a page at a time (all of them: a page of chats that cannot start now never hides the ones after it)."""
    after = None
    while True:
        found = await store.waiting_inputs(limit=page, after=after, fingerprints=list(fingerprints))
        for checkpoint_id in found:
            await take(checkpoint_id)
        if len(found) < page:
            return
        after = found[-1]


def drainable(found: Look) -> bool:
    """Whether a queued input may start its turn now: the run's turn ended. A run stored `running` (executing, or its
    process gone: recovery continues it) has not; nor has one waiting for an answer, unless an input asks to
    interrupt it."""
    if found.snap is None or not found.waiting:
        return False
    meta = found.snap.meta
    if meta.status == "running":
        return False
    if meta.status == "interrupted" and found.snap.waits_for:
        return any(q.policy != "enqueue" for q in found.waiting)
    return True


async def queue(app: Any, store: Any, checkpoint_id: str, messages: list[Any], policy: str,
                by: str | None) -> QueuedInput | None:
    """Queue `messages` for the executing run (and, for `interrupt` / `rollback`, ask it to stop); None when it
    stopped executing before the store recorded them (the caller looks again)."""
    who = default_by() if by is None else by
    payload = app.get_serializer().dumps(list(messages), root=f"run '{checkpoint_id}': queued input")
    try:
        queued = await store.queue_input(checkpoint_id, payload, policy=policy, by=who)
    except NotRunning:
        return None
    if policy != "enqueue":
        try:
            await app.cancel(checkpoint_id, when="after_step" if policy == "interrupt" else "now",
                             by=f"{who} (new input, on_busy={policy})"[:200])
        except NotRunning:
            pass  # its turn ended meanwhile: whoever ended it takes the input next
    return queued


def rollback_to(found: Look) -> list[Any] | None:
    """The conversation a `rollback` input starts from: as the unfinished turn found it, before its input. None when
    the turn completed (it is kept) or the run does not say where its turn began (it is kept too, and logged)."""
    snap = found.snap
    kept = snap.turn.get("kept")
    if snap.meta.status == "completed":
        return None
    if kept is None or snap.state is None or kept > len(snap.state.messages):
        log.warning("run '%s': a rollback input cannot drop the unfinished turn (its version %s does not say where the "
                    "turn began): the turn is kept, closed, and the input runs after it", snap.meta.checkpoint_id,
                    snap.meta.version)
        return None
    return list(snap.state.messages[:kept])
