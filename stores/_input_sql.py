"""Queued inputs in SQL (engine/keep/store.py, guarantee 15): new input for a running run, numbered per run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from waypoint.engine.errors import CheckpointCorrupted
from waypoint.engine.keep.store import MAX_INPUT_BYTES, QueuedInput

from ._common import RESTORE, check_cancellable, check_input
from ._sql import DB, _lock_run, now_sql

__all__ = ["queue_input", "queued_inputs", "waiting_inputs", "mark_inputs", "InputMethods"]

T = TypeVar("T")

_COLUMNS = "checkpoint_id, n, policy, queued_by, queued_at, payload"
_PAGE = 100


def queue_input(db: DB, checkpoint_id: str, payload: bytes, policy: str, by: str) -> QueuedInput:
    check_input(checkpoint_id, payload, policy, by)
    params: dict[str, Any] = {"c": checkpoint_id}
    _lock_run(db, checkpoint_id)  # the run's final write cannot slip between the look and the insert
    now = now_sql(db)
    head = db.rows(f"SELECT version, status, lease_expires - {now} FROM waypoint_checkpoints WHERE checkpoint_id = :c "
                   "ORDER BY version DESC LIMIT 1", params)
    check_cancellable(checkpoint_id, head[0] if head else None, doing="new input cannot be queued for it (start it "
                      "with the input instead)")
    (last,), = db.rows("SELECT MAX(n) FROM waypoint_inputs WHERE checkpoint_id = :c", params)
    params.update(n=(last or 0) + 1, p=policy, b=by, d=payload)
    db.run(f"INSERT INTO waypoint_inputs ({_COLUMNS}) VALUES (:c, :n, :p, :b, {now}, :d)", params)
    return _input(db.rows(f"SELECT {_COLUMNS} FROM waypoint_inputs WHERE checkpoint_id = :c AND n = :n", params)[0])


def queued_inputs(db: DB, checkpoint_id: str, after: int) -> list[QueuedInput]:
    rows = db.rows(f"SELECT {_COLUMNS} FROM waypoint_inputs WHERE checkpoint_id = :c AND n > :a ORDER BY n LIMIT :k",
                   {"c": checkpoint_id, "a": int(after), "k": _PAGE})
    return [_input(row) for row in rows]


def waiting_inputs(db: DB, limit: int, after: str | None, fingerprints: Sequence[str] | None) -> list[str]:
    # at rest (not running), an input not marked taken, none stuck; a pause's enqueued inputs wait for its answer
    params: dict[str, Any] = {"a": after or "", "k": int(limit)}
    only = ""
    if fingerprints is not None:
        names = [f"f{i}" for i in range(len(fingerprints))]
        params.update(zip(names, fingerprints))
        only = f"AND c.fingerprint IN ({', '.join(':' + n for n in names)}) " if names else "AND 1 = 0 "
    rows = db.rows(
        "SELECT i.checkpoint_id FROM waypoint_inputs i JOIN waypoint_checkpoints c ON c.checkpoint_id = i.checkpoint_id "
        "AND c.version = (SELECT MAX(m.version) FROM waypoint_checkpoints m WHERE m.checkpoint_id = i.checkpoint_id) "
        "WHERE i.state = 'waiting' AND c.status <> 'running' AND i.checkpoint_id > :a "
        "AND NOT (c.status = 'interrupted' AND COALESCE(c.error, '') <> 'cancelled' AND i.policy = 'enqueue') "
        "AND NOT EXISTS (SELECT 1 FROM waypoint_inputs s WHERE s.checkpoint_id = i.checkpoint_id AND s.state = 'stuck') "
        f"{only}GROUP BY i.checkpoint_id ORDER BY i.checkpoint_id LIMIT :k", params)
    return [row[0] for row in rows]


def mark_inputs(db: DB, checkpoint_id: str, upto: int, state: str) -> int:
    if state not in ("taken", "stuck"):
        raise ValueError(f"run '{checkpoint_id}': an input is marked 'taken' or 'stuck', not {str(state)[:40]!r}")
    # taken: every one up to `upto`, a stuck one too (it was run after all: restored, or decoded by another process)
    which = "n <= :u AND state <> 'taken'" if state == "taken" else "n = :u AND state = 'waiting'"
    return db.run(f"UPDATE waypoint_inputs SET state = :s WHERE checkpoint_id = :c AND {which}",
                  {"c": checkpoint_id, "u": int(upto), "s": state})


def _input(row: Sequence) -> QueuedInput:
    cid, n, policy, by, at, payload = row
    payload = bytes(payload) if isinstance(payload, (bytes, bytearray, memoryview)) else payload
    if type(cid) is not str or type(n) is not int or type(policy) is not str or type(by) is not str \
            or type(at) not in (int, float) or type(payload) is not bytes or len(payload) > MAX_INPUT_BYTES:
        raise CheckpointCorrupted(f"run {str(cid)[:120]!r}: its queued input {str(n)[:20]} has the wrong types; "
                                  f"{RESTORE}")
    return QueuedInput(checkpoint_id=cid, n=n, policy=policy, by=by, queued_at=float(at), payload=payload)


class InputMethods:
    """Guarantee 15 for the SQL stores: each method is one `_call` of the function above."""

    async def _call(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T:
        raise NotImplementedError

    async def queue_input(self, checkpoint_id: str, payload: bytes, *, policy: str = "enqueue",
                          by: str = "") -> QueuedInput:
        return await self._call(queue_input, checkpoint_id, payload, policy, by, write=True)

    async def queued_inputs(self, checkpoint_id: str, *, after: int = 0) -> list[QueuedInput]:
        """The run's inputs numbered above `after`, oldest first (at most 100 at a time)."""
        return await self._call(queued_inputs, checkpoint_id, after)

    async def waiting_inputs(self, *, limit: int = 100, after: str | None = None,
                             fingerprints: Sequence[str] | None = None) -> list[str]:
        """Runs at rest with an input not marked taken (guarantee 15), by checkpoint ID, after `after`; of the graphs
        with these `fingerprints` only, when given."""
        return await self._call(waiting_inputs, limit, after, None if fingerprints is None else list(fingerprints))

    async def mark_inputs(self, checkpoint_id: str, upto: int, *, state: str = "taken") -> int:
        """Mark the run's waiting inputs up to `upto` taken (or input `upto` stuck); how many it marked."""
        return await self._call(mark_inputs, checkpoint_id, upto, state, write=True)
