"""The run queue's SQL (table `waypoint_queue`, migration 3 in stores/_sql.py), for SQLite and Postgres.

One row per run: the work last asked for it (`kind` "start" with an input, or "resume" with answers),
its `state` ("queued", "claimed" by a worker, "done") and, once done, the outcome. Every function runs
inside one store transaction (`store._call`). The row never decides who runs the run: the run's own
record does (compare-and-set on its versions, its lease). A claimed row may be claimed again once its
worker stopped renewing it (`claimed_until` passed) *and* the run holds no live lease — so a worker
that died is replaced, and a worker whose event loop is blocked inside a long node (its run lease is
renewed by the engine's lease thread) is not.

Postgres claims with `FOR UPDATE SKIP LOCKED`: claimers skip each other's rows instead of waiting.
SQLite needs no such clause: a write transaction holds the database's only write lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from waypoint.engine.errors import WaypointError

CHANNEL = "waypoint_queue"
"""Postgres NOTIFY channel: a submit or resume wakes idle workers at once."""

COLUMNS = ("checkpoint_id, graph, kind, state, outcome, error, result, attempts, submitted_at, finished_at, worker, "
           "base_version")


class QueueError(WaypointError):
    """The run queue refused a request (the message names the run and what to do instead)."""


class QueueTimeout(QueueError):
    """`RunQueue.wait` gave up before the run's work was done."""


def _newest(db: Any, checkpoint_id: str) -> tuple[int | None, str | None]:
    found = db.rows("SELECT version, status FROM waypoint_checkpoints WHERE checkpoint_id = :c "
                    "ORDER BY version DESC LIMIT 1", {"c": checkpoint_id})
    return (found[0][0], found[0][1]) if found else (None, None)


def _refusal(checkpoint_id: str, kind: str, status: str | None) -> str | None:
    run = f"run '{checkpoint_id}'"
    if kind == "start":
        if status in (None, "completed"):
            return None
        return (f"{run} is {status}: submit() starts runs, it does not continue them; "
                f"queue.resume({checkpoint_id!r}, answers) continues it, or delete the run to start over")
    if status in ("interrupted", "failed"):
        return None
    if status is None:
        return f"{run} does not exist, so there is nothing to resume; submit() it first"
    if status == "completed":
        return f"{run} has completed; submit() starts a new run on its ID"
    return f"{run} is running; wait({checkpoint_id!r}) for it to pause before resuming it"


def enqueue(db: Any, checkpoint_id: str, graph: str | None, kind: str, payload: bytes, now: float) -> None:
    """Queue work for a run: refused while the run (or earlier work for it) does not allow it."""
    version, status = _newest(db, checkpoint_id)
    problem = _refusal(checkpoint_id, kind, status)
    if problem is not None:
        raise QueueError(problem)
    if graph is None:
        known = db.rows("SELECT graph FROM waypoint_queue WHERE checkpoint_id = :c", {"c": checkpoint_id})
        if not known:
            raise QueueError(f"run '{checkpoint_id}' was not submitted through the queue, so it is not known which "
                             "graph runs it; pass graph=<the compiled graph or its name> to resume()")
        graph = known[0][0]
    written = db.run(
        "INSERT INTO waypoint_queue (checkpoint_id, graph, kind, payload, base_version, state, attempts, "
        "submitted_at) VALUES (:c, :g, :k, :p, :b, 'queued', 0, :t) ON CONFLICT (checkpoint_id) DO UPDATE SET "
        "graph = excluded.graph, kind = excluded.kind, payload = excluded.payload, base_version = "
        "excluded.base_version, state = 'queued', worker = NULL, attempts = 0, submitted_at = excluded.submitted_at, "
        "claimed_at = NULL, claimed_until = NULL, finished_at = NULL, outcome = NULL, error = NULL, result = NULL "
        "WHERE waypoint_queue.state = 'done'",
        {"c": checkpoint_id, "g": graph, "k": kind, "p": payload, "b": version, "t": now})
    if written != 1:
        raise QueueError(f"run '{checkpoint_id}' already has work queued or running; wait({checkpoint_id!r}) "
                         "for it before queueing more")
    if db.dialect == "postgresql":  # delivered when this transaction commits
        db.rows(f"SELECT pg_notify('{CHANNEL}', :c)", {"c": checkpoint_id})


def claim(db: Any, worker: str, graphs: Sequence[str], limit: int, now: float, until: float) -> list[tuple]:
    """Claim up to `limit` runnable rows for `graphs`, oldest first: (id, graph, kind, payload,
    base_version, attempts) each. Runnable: queued, or claimed by a worker that stopped renewing it
    while the run holds no live lease."""
    names = ", ".join(f":g{i}" for i in range(len(graphs)))
    skip = " FOR UPDATE SKIP LOCKED" if db.dialect == "postgresql" else ""
    params: dict[str, Any] = {f"g{i}": g for i, g in enumerate(graphs)}
    params.update(w=worker, now=now, until=until, n=limit)
    return db.rows(
        "UPDATE waypoint_queue SET state = 'claimed', worker = :w, claimed_at = :now, claimed_until = :until, "
        "attempts = attempts + 1 WHERE checkpoint_id IN ("
        f" SELECT q.checkpoint_id FROM waypoint_queue q WHERE q.graph IN ({names}) AND (q.state = 'queued' OR"
        "  (q.state = 'claimed' AND q.claimed_until < :now AND NOT EXISTS ("
        "    SELECT 1 FROM waypoint_checkpoints c WHERE c.checkpoint_id = q.checkpoint_id AND c.status = 'running'"
        "     AND c.lease_expires >= :now AND c.version = (SELECT MAX(m.version) FROM waypoint_checkpoints m"
        "     WHERE m.checkpoint_id = q.checkpoint_id))))"
        f" ORDER BY q.submitted_at LIMIT :n{skip}) "
        "RETURNING checkpoint_id, graph, kind, payload, base_version, attempts", params)


def renew(db: Any, worker: str, until: float) -> int:
    """Extend every claim `worker` holds; returns how many it still holds."""
    return db.run("UPDATE waypoint_queue SET claimed_until = :u WHERE worker = :w AND state = 'claimed'",
                  {"u": until, "w": worker})


def finish(db: Any, checkpoint_id: str, worker: str, attempt: int, outcome: str, error: str | None,
           result: bytes | None, now: float) -> bool:
    """Record the outcome, if this claim (worker and attempt) still holds the row."""
    return db.run(
        "UPDATE waypoint_queue SET state = 'done', finished_at = :t, outcome = :o, error = :e, result = :r, "
        "claimed_until = NULL WHERE checkpoint_id = :c AND state = 'claimed' AND worker = :w AND attempts = :a",
        {"t": now, "o": outcome, "e": error, "r": result, "c": checkpoint_id, "w": worker, "a": attempt}) == 1


def release(db: Any, checkpoint_id: str, worker: str, attempt: int, requeue: bool) -> bool:
    """Give a claim back: `requeue` puts the row back in the queue at once (a draining worker); otherwise
    it stays claimed but may be taken as soon as the run holds no live lease (another process has it)."""
    change = "state = 'queued', worker = NULL, claimed_until = NULL" if requeue else "claimed_until = 0"
    done = db.run(f"UPDATE waypoint_queue SET {change} WHERE checkpoint_id = :c AND state = 'claimed' "
                  "AND worker = :w AND attempts = :a", {"c": checkpoint_id, "w": worker, "a": attempt}) == 1
    if done and requeue and db.dialect == "postgresql":
        db.rows(f"SELECT pg_notify('{CHANNEL}', :c)", {"c": checkpoint_id})
    return done


def status(db: Any, checkpoint_id: str) -> tuple | None:
    """The row (COLUMNS) plus the run's newest status, or None when the queue has no row for it."""
    found = db.rows(f"SELECT {COLUMNS} FROM waypoint_queue WHERE checkpoint_id = :c", {"c": checkpoint_id})
    if not found:
        return None
    return (*found[0], _newest(db, checkpoint_id)[1])
