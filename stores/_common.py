"""Checks and messages every store shares."""

from __future__ import annotations

import dataclasses
import random
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from waypoint.engine.errors import (CheckpointConflict, CheckpointCorrupted, CheckpointNotFound, LeaseLost, NotRunning,
                                   StoreUnavailable, clip)
from waypoint.engine.keep.store import (CANCEL_WHEN, MAX_CHAIN, MAX_INPUT_BYTES, ON_BUSY, STATUSES, Blob, CheckpointMeta)

RESTORE = "restore the database from a backup or delete this run"

LEDGER_NEEDED = ("running", "failed")
"""While a run's newest version has one of these statuses, a step may be re-run and need its ledger:
`prune` keeps the ledger of such a run (the ledger page of a step is keyed by an older version)."""


# Postgres SQLSTATEs that may pass: connection exceptions (08…), insufficient resources (53…: too many
# connections, out of memory or disk), operator intervention (57…: shutdown, restart, cannot connect now),
# serialization failure and deadlock (40001, 40P01), lock not available (55P03).
_PASSING_CLASSES = ("08", "53", "57")
_PASSING_STATES = ("40001", "40P01", "55P03")


def passing(err: BaseException) -> bool:
    """True for a database error that may pass if the operation is tried again later: the database is
    unreachable or restarting, has no connection to spare, or did not grant a lock in time."""
    if isinstance(err, (OSError, TimeoutError)):  # refused, reset, no route, no socket, timed out
        return True
    sa = sys.modules.get("sqlalchemy.exc")
    if sa is not None:
        if isinstance(err, sa.TimeoutError):  # no connection left in the pool within its timeout
            return True
        if isinstance(err, sa.DBAPIError):
            if err.connection_invalidated:
                return True
            err = err.orig if err.orig is not None else err
    code = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
    if isinstance(code, str):
        return code[:2] in _PASSING_CLASSES or code in _PASSING_STATES
    text = str(err).lower()  # sqlite3 / aiosqlite: a lock held past the busy timeout
    return type(err).__name__ == "OperationalError" and ("locked" in text or "busy" in text)


def no_spare_connection(err: BaseException) -> bool:
    """True for a refused connection that another one given back can make good: Postgres has no connection to
    spare for this role or database (SQLSTATE 53300) or is still starting up (57P03)."""
    sa = sys.modules.get("sqlalchemy.exc")
    if sa is not None and isinstance(err, sa.DBAPIError) and err.orig is not None:
        err = err.orig
    code = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
    return code in ("53300", "57P03")


def unavailable(store: str, err: BaseException) -> StoreUnavailable:
    """The `StoreUnavailable` a store raises for `err` (chain it: `raise unavailable(...) from err`): the driver's
    own error first (what went wrong), then the store (where)."""
    inner = getattr(err, "orig", None) or err  # SQLAlchemy's DBAPIError wraps the driver's error
    text = str(inner).strip().splitlines()
    return StoreUnavailable(
        f"the database could not do this now ({type(inner).__name__}: {clip(text[0] if text else '', 200)}; "
        f"{store}); nothing was written. It may pass: try again later (a run that met this is left at its last "
        "saved step)"
    )


def check_due_by(checkpoint_id: str, due_by: float | None, now: float) -> None:
    """`put(..., due_by=)`: the write lands only before that deadline on the store's clock `now` (guarantee 13)."""
    if due_by is not None and now >= due_by:
        from waypoint.engine.errors import PauseExpired

        raise PauseExpired(f"run '{checkpoint_id}': a pause this resume answers expired (by the store's clock, "
                           f"{now - due_by:.3f} s ago) before the resume could claim the run, so the answer was not "
                           "taken and nothing was written; the pause takes the answer its deadline gives")


def check_put(meta: CheckpointMeta, expected_version: int | None) -> None:
    """Reject a put whose version does not follow the expected one (a caller bug, not a conflict)."""
    want = (expected_version or 0) + 1
    if meta.version != want:
        raise ValueError(
            f"run '{meta.checkpoint_id}': put of version {meta.version} with expected_version="
            f"{expected_version}; the new version must be {want}"
        )
    check_status(meta.status)


def check_newest(checkpoint_id: str, newest: int | None, expected_version: int | None,
                 newest_created: float | None = None, created_at: float | None = None, fresh: bool = False) -> None:
    """Compare-and-set on the run's newest version; a version that vanished means the run was deleted. A
    newest version of another incarnation than the writer's (`newest_created` != `created_at`, for a write that
    does not start a new run, `fresh`) means the same: the writer's run was deleted and a new run on the ID
    reached its version number. (Incarnations are stamped by the store, from its clock: `incarnation`.)"""
    if expected_version is not None and newest_created is not None and created_at is not None and not fresh and (
            created_at != newest_created):
        raise CheckpointNotFound(
            f"run '{checkpoint_id}' at version {newest} is a run started after the one this process was running: "
            "that run was deleted while this process ran it, and its ID was used again; it stays deleted"
        )
    if expected_version is None:
        if newest is not None:
            raise CheckpointConflict(conflict_message(checkpoint_id, None))
        return
    if newest is None or newest < expected_version:
        raise CheckpointNotFound(
            f"run '{checkpoint_id}' no longer has version {expected_version}: it was deleted or expired while "
            "this process was running it, and it stays deleted; start it again with an input to run it anew"
        )
    if newest > expected_version:
        raise CheckpointConflict(conflict_message(checkpoint_id, expected_version))


def incarnation(now: float, newest_created: float | None) -> float:
    """The `created_at` a store stamps on a new run's first version (`put(..., fresh=True)`): its own clock,
    and always after the run it is written over — so a writer of a deleted run is told apart from the new run on
    its ID whatever any writer's clock says. Unique too: strictly after every incarnation this process stamped,
    and a random part below the clock's resolution (SQLite's is a millisecond) tells apart two stamped in the
    same instant by two processes."""
    global _LAST_INCARNATION
    with _INCARNATION_LOCK:
        floor = _LAST_INCARNATION if newest_created is None else max(_LAST_INCARNATION, newest_created)
        stamp = max(now, floor + 1e-6) + random.randint(1, 999) * 1e-6
        _LAST_INCARNATION = stamp
    return stamp


_LAST_INCARNATION = 0.0
_INCARNATION_LOCK = threading.Lock()


def stamped(meta: CheckpointMeta, now: float, newest_created: float | None, fresh: bool) -> CheckpointMeta:
    """`meta` as the store writes it, on its clock `now`: a lease is the duration the writer asked for from now
    (`lease_expires - updated_at`, both on the writer's clock), a new run's `created_at` its `incarnation`."""
    changes: dict[str, Any] = {}
    if meta.lease_expires is not None:
        changes["lease_expires"] = now + (meta.lease_expires - meta.updated_at)
    if fresh:
        changes["created_at"] = incarnation(now, newest_created)
    return dataclasses.replace(meta, **changes) if changes else meta


def check_holder(checkpoint_id: str, status: str | None, owner: str | None, live: bool, holder: str | None,
                 takeover: bool) -> None:
    """The write's fence (engine/keep/store.py, guarantee 11), given the newest version's status, lease owner and
    whether its lease is unexpired on the store's clock, all read in the write's own transaction."""
    running = status == "running" and owner is not None
    if holder is not None:
        if running and owner == holder and live:
            return
        raise LeaseLost(lost_message(checkpoint_id, running and owner == holder), checkpoint_id=checkpoint_id)
    if running and live and not takeover:
        raise CheckpointConflict(
            f"run '{checkpoint_id}' is running under a live lease held by {owner} (by the store's clock); wait for "
            "it to pause or finish, or pass takeover=True if you know that process is dead")


def check_idle(checkpoint_id: str, running: Sequence[tuple]) -> None:
    """`delete(force=False)`: refuse a run whose newest version is running under an unexpired lease, given
    `[(lease owner, seconds left on the store's clock)]` for that version (empty when it is not running)."""
    for owner, left in running:
        if left is not None and left > 0:
            raise CheckpointConflict(
                f"run '{checkpoint_id}' is running (lease held by {owner} for another {left:.1f} s by the store's "
                "clock); delete it with force to stop it anyway (its process then writes nothing more for it)")


def lost_message(checkpoint_id: str, expired: bool) -> str:
    """Why a fenced write was refused to the process that had held the run."""
    why = ("its lease ran out on the store's clock before it was renewed" if expired else
           "another process took the run over, or the run was deleted (and perhaps started again)")
    return (f"run '{checkpoint_id}': this process no longer holds the run ({why}); it writes nothing more for it "
            "and starts nothing more. The run continues wherever it is taken over")


def needed_blobs(parts: Mapping[str, str], blobs: Sequence[Blob]) -> set[str]:
    """Blobs a put points at (part heads, parents of new segments) without carrying them."""
    carried = {b.hash for b in blobs}
    needed = {h for h in parts.values() if h not in carried}
    for b in blobs:
        if b.parent is not None and b.parent not in carried:
            needed.add(b.parent)
    return needed


def check_limit(limit: int | None, what: str) -> None:
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"{what}: limit must be None or an integer >= 0, got {limit!r}")


def cursor(before: float | CheckpointMeta | tuple[float, str] | None) -> tuple[float, str | None] | None:
    """`list(before=...)` as (updated_at, checkpoint_id or None): the last row of the previous page, or a time."""
    if before is None:
        return None
    if isinstance(before, CheckpointMeta):
        return before.updated_at, before.checkpoint_id
    if isinstance(before, tuple):
        return float(before[0]), str(before[1])
    return float(before), None


def check_status(status: str | None) -> None:
    if status is not None and status not in STATUSES:
        raise ValueError(f"unknown run status {status!r}; use one of {', '.join(STATUSES)}")


def conflict_message(checkpoint_id: str, expected_version: int | None) -> str:
    if expected_version is None:
        return (f"run '{checkpoint_id}' already exists (another writer created it first); "
                "load it and resume, or use another checkpoint_id")
    return (f"run '{checkpoint_id}' moved past version {expected_version} (another writer got there "
            "first); reload it before writing again")


class Expiry:
    """`ttl`: how long an interrupted run may wait before the store deletes it (None: forever).

    With a ttl, `expire()` needs no argument, and the store sweeps by itself after writes, at most
    every `min(ttl / 10, 60)` seconds.
    """

    def __init__(self, ttl: float | None) -> None:
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
        self.ttl = ttl
        self._next = 0.0

    def older_than(self, older_than: float | None) -> float:
        if older_than is not None:
            return older_than
        if self.ttl is None:
            raise ValueError("expire() needs older_than= (seconds) when the store has no ttl")
        return self.ttl

    def due(self) -> bool:
        if self.ttl is None:
            return False
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + min(self.ttl / 10, 60.0)
        return True


def chain_from(blobs: Mapping[str, Blob], head: str, where: str, name: str) -> list[Blob]:
    """The chain of blobs ending at `head`, root first, following parent links through `blobs`.

    A missing link ends the chain early (the engine then reports the part as incomplete). A parent
    link back into the chain, or a chain longer than MAX_CHAIN, is `CheckpointCorrupted`: the walk
    never loops and never holds more than MAX_CHAIN blobs.
    """
    chain: list[Blob] = []
    seen: set[str] = set()
    current: str | None = head
    while current is not None:
        blob = blobs.get(current)
        if blob is None:
            break
        if current in seen:
            raise CheckpointCorrupted(
                f"{where}: the blobs of part {clip(repr(name), 80)} form a cycle (a parent link points back into "
                f"its own chain), which Waypoint never writes; {RESTORE}"
            )
        if len(chain) >= MAX_CHAIN:
            raise CheckpointCorrupted(
                f"{where}: part {clip(repr(name), 80)} has a chain of more than {MAX_CHAIN} blobs, which Waypoint "
                f"never writes; {RESTORE}"
            )
        seen.add(current)
        chain.append(blob)
        current = blob.parent
    chain.reverse()
    return chain


def reachable(parents: Mapping[str, str | None], heads: Iterable[str]) -> set[str]:
    """Every hash reachable from `heads` through `parents` (hash -> parent); terminates on cycles."""
    live: set[str] = set()
    for head in heads:
        current: str | None = head
        while current is not None and current not in live and current in parents:
            live.add(current)
            current = parents[current]
    return live


MAX_CANCEL_BY = 200
"""Characters of a cancel request's `by`."""


def check_cancel(checkpoint_id: str, when: Any, by: Any) -> None:
    """A cancel request's `when` and `by`, before anything is read: bad input is refused, never stored."""
    node = when[len("after:"):] if isinstance(when, str) and when.startswith("after:") else None
    if not isinstance(when, str) or (when not in CANCEL_WHEN and not node) or len(when) > 300:
        raise ValueError(f"run '{checkpoint_id}': cancel when={str(when)[:80]!r} must be one of {', '.join(CANCEL_WHEN)} "
                         "or 'after:<node>'")
    if not isinstance(by, str) or len(by) > MAX_CANCEL_BY or "\x00" in by:
        raise ValueError(f"run '{checkpoint_id}': cancel by= must be text of at most {MAX_CANCEL_BY} characters")


def check_input(checkpoint_id: str, payload: Any, policy: Any, by: Any) -> None:
    """A queued input's bytes, policy and sender, before anything is read: bad input is refused, never stored."""
    if type(payload) is not bytes or not payload or len(payload) > MAX_INPUT_BYTES:
        raise ValueError(f"run '{checkpoint_id}': a queued input is the engine's encoded bytes, 1 to {MAX_INPUT_BYTES} "
                         "of them")
    if policy not in ON_BUSY[1:]:
        raise ValueError(f"run '{checkpoint_id}': a queued input's policy={str(policy)[:80]!r} must be one of "
                         f"{', '.join(ON_BUSY[1:])}")
    if not isinstance(by, str) or len(by) > MAX_CANCEL_BY or "\x00" in by:
        raise ValueError(f"run '{checkpoint_id}': a queued input's by= must be text of at most {MAX_CANCEL_BY} "
                         "characters")


def check_cancellable(checkpoint_id: str, head: tuple[Any, Any, Any] | None, *,
                      doing: str = "there is nothing to cancel") -> int:
    """The version a cancel request (or a queued input) names, given the newest version's (version, status, seconds its
    lease has left on the store's clock); raises when no process executes the run now."""
    if head is None:
        raise CheckpointNotFound(f"run '{checkpoint_id}' is not in the store: {doing} (a run of a "
                                 "graph compiled with durability='exit' or 'interrupt' is stored only once it stops, so "
                                 "no other process can reach it while it runs)")
    version, status, left = head
    if status != "running":
        what = {"interrupted": "it is paused or was stopped already (answer it, or leave it: nothing runs)",
                "completed": "it completed", "failed": "it failed"}.get(status, f"its status is {status}")
        raise NotRunning(f"run '{checkpoint_id}' is not running: {what}; {doing}",
                         checkpoint_id=checkpoint_id, status=status)
    if left is None or left <= 0:
        raise NotRunning(f"run '{checkpoint_id}' is stored running but its lease ran out {-(left or 0):.1f} s ago: "
                         "the process that ran it is gone, so nothing runs it now; continue it (recovery, a worker, "
                         "or ainvoke(None, checkpoint_id=...)) or delete it", checkpoint_id=checkpoint_id,
                         status="running")
    return int(version)
