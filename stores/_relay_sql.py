"""Relayed events in SQL: the short log of live events (a model's tokens) that the process executing a run
writes for readers on any service (stores/relay.py writes, service/_watch.py reads; docs/decisions.md).

One row per event, numbered `n` per checkpoint ID (1, 2, 3, … with no gap: each batch takes the numbers after the
newest under the run's lock), so a reader's cursor is the same number on every service, and a reader whose cursor
is older than the oldest row kept knows it fell behind. `base` is the version the executor had written last when
the event happened (the event belongs to the step after it). A batch is written only while the writer holds the
run, judged in the same transaction on the database's clock (`_HELD_OR_ENDED`), and the log is trimmed to the
newest `KEEP` rows of the run in that transaction. On Postgres the batch also wakes the services that follow the
run: a NOTIFY on `waypoint_runs` ("0 events <id>"), delivered at commit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from waypoint.engine.errors import CheckpointCorrupted, LeaseLost

from ._common import RESTORE
from ._sql import _NOTIFY_ID_BYTES, DB, RUNS_CHANNEL, _lock_run, now_sql

__all__ = ["append_events", "read_events", "RelayMethods", "KEEP", "ENDED_GRACE", "check_batch"]

T = TypeVar("T")

KEEP = 2000
"""Relayed events kept per checkpoint ID (older ones are trimmed as new ones come)."""
ENDED_GRACE = 10.0
"""Seconds after a run stopped during which the process that held it last may still add its last events (the
tail of the step it wrote last, flushed after that write)."""
MAX_BATCH = 1000
MAX_DATA = 64 * 1024
"""Characters of one event's JSON (stores/relay.py splits longer text into several events)."""

_HELD_OR_ENDED = (
    "EXISTS (SELECT 1 FROM waypoint_checkpoints h WHERE h.checkpoint_id = :c AND h.created_at = :i AND h.version = "
    "(SELECT MAX(m.version) FROM waypoint_checkpoints m WHERE m.checkpoint_id = :c) AND ("
    "(h.status = 'running' AND h.lease_owner = :o AND h.lease_expires > {now}) OR "
    "(h.status <> 'running' AND h.updated_at > {now} - :grace AND :o = (SELECT p.lease_owner FROM "
    "waypoint_checkpoints p WHERE p.checkpoint_id = :c AND p.lease_owner IS NOT NULL ORDER BY p.version DESC "
    "LIMIT 1))))")
"""The run's newest version is `running` under :o's unexpired lease in incarnation :i — or it stopped less than
`ENDED_GRACE` seconds ago and :o held it last (no other process executed it since)."""


def check_batch(checkpoint_id: str, events: Sequence[tuple[str, str]]) -> None:
    if not isinstance(checkpoint_id, str) or not checkpoint_id:
        raise ValueError("append_events: checkpoint_id must be a non-empty string")
    if len(events) > MAX_BATCH:
        raise ValueError(f"run '{checkpoint_id[:120]}': at most {MAX_BATCH} relayed events per batch, got {len(events)}")
    for kind, data in events:
        if type(kind) is not str or not 0 < len(kind) <= 32 or type(data) is not str or len(data) > MAX_DATA:
            raise ValueError(f"run '{checkpoint_id[:120]}': a relayed event is (kind: str of 1-32 characters, "
                             f"data: JSON text of at most {MAX_DATA} characters)")


def append_events(db: DB, checkpoint_id: str, incarnation: float, base: int, holder: str,
                  events: Sequence[tuple[str, str]]) -> list[int]:
    """Add `events` ((kind, JSON text) each) to the run's relayed log; returns their numbers. `LeaseLost` when
    `holder` does not hold the run (then nothing is written)."""
    check_batch(checkpoint_id, events)
    params: dict[str, Any] = {"c": checkpoint_id, "i": incarnation, "o": holder, "grace": ENDED_GRACE}
    _lock_run(db, checkpoint_id)  # a put (a takeover's claim) cannot slip between the check and the inserts
    now = now_sql(db)
    (held, top), = db.rows(f"SELECT CASE WHEN {_HELD_OR_ENDED.format(now=now)} THEN 1 ELSE 0 END, "
                           "(SELECT MAX(n) FROM waypoint_run_events WHERE checkpoint_id = :c)", params)
    if not held:
        raise LeaseLost(f"run '{checkpoint_id[:120]}': this process does not hold the run any more; its live events "
                        "were not relayed", checkpoint_id=checkpoint_id)
    if not events:
        return []
    first = (top or 0) + 1
    db.many(f"INSERT INTO waypoint_run_events (checkpoint_id, n, incarnation, base, kind, data, at) "
            f"VALUES (:c, :n, :i, :b, :k, :d, {now})",
            [{"c": checkpoint_id, "n": first + j, "i": incarnation, "b": int(base), "k": kind, "d": data}
             for j, (kind, data) in enumerate(events)])
    last = first + len(events) - 1
    db.run("DELETE FROM waypoint_run_events WHERE checkpoint_id = :c AND n <= :cut", {"c": checkpoint_id,
                                                                                      "cut": last - KEEP})
    if db.dialect == "postgresql":
        named = checkpoint_id if len(checkpoint_id.encode("utf-8", "surrogatepass")) <= _NOTIFY_ID_BYTES else ""
        db.rows(f"SELECT pg_notify('{RUNS_CHANNEL}', :a)", {"a": f"0 events {named}"})
    return list(range(first, last + 1))


def read_events(db: DB, checkpoint_id: str, incarnation: float, after: int, limit: int
                ) -> tuple[int | None, int | None, list[tuple[int, int, str, str]]]:
    """(the numbers of the oldest and the newest row kept for the run — None: none —, the events of incarnation
    `incarnation` numbered after `after`, oldest first, at most `limit`: (n, base, kind, data) each)."""
    params = {"c": checkpoint_id, "i": incarnation, "a": int(after), "l": int(limit)}
    (oldest, newest), = db.rows("SELECT MIN(n), MAX(n) FROM waypoint_run_events WHERE checkpoint_id = :c", params)
    rows = db.rows("SELECT n, base, kind, data FROM waypoint_run_events WHERE checkpoint_id = :c AND n > :a "
                   "AND incarnation = :i ORDER BY n LIMIT :l", params)
    for n, base, kind, data in rows:
        if type(n) is not int or type(base) is not int or type(kind) is not str or type(data) is not str:
            raise CheckpointCorrupted(f"run {checkpoint_id[:120]!r}: a relayed event has the wrong types; {RESTORE}")
    return oldest, newest, [tuple(r) for r in rows]  # type: ignore[misc]


class RelayMethods:
    """The relayed-event log for the SQL stores: each method is one `_call` of the function above."""

    async def _call(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T:
        raise NotImplementedError

    async def append_events(self, checkpoint_id: str, events: Sequence[tuple[str, str]], *, incarnation: float,
                            base: int, holder: str) -> list[int]:
        return await self._call(append_events, checkpoint_id, incarnation, base, holder, list(events), write=True)

    async def read_events(self, checkpoint_id: str, *, incarnation: float, after: int = 0, limit: int = 500
                          ) -> tuple[int | None, int | None, list[tuple[int, int, str, str]]]:
        return await self._call(read_events, checkpoint_id, incarnation, after, limit)
