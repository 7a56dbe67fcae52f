"""The run queue's SQL (table `waypoint_queue`, migrations 3 and 4 in stores/_sql.py), for SQLite and Postgres.

One row per run: the work last asked for it (`kind` "start" with an input, "start-over" with an input for a
new run over a paused or failed one (`force_new_run`), "turn" / "turn-over" the same for an agent's chat (with
where its turn began), "resume" with answers, or "input": take the chat's next queued input,
engine/agents/turns.py),
its `state` ("queued", "claimed" by a worker, "done") and, once done, the outcome. Every function runs
inside one store transaction (`store._call`). The row never decides who runs the run: the run's own
record does (compare-and-set on its versions, its lease).

**A claim** is one worker's hold on a row, named by a token unique to that claim (`claim`): renewing,
finishing and handing back name the token, so a claim that lapsed and was taken again — even by the same
worker, even after the row was queued anew — changes nothing any more. **A row is claimable** when the run
holds no live lease and either it is queued (and its backoff, `not_before`, has passed), or its claim
lapsed (`claimed_until` passed: its worker stopped renewing it), or the claim's worker executed the run
(it wrote a running version whose lease was live when the claim was taken) and stopped renewing the run's
lease — once a run has written, its lease alone decides a takeover, so a dead worker's run is continued one
run lease after its last renewal, not one claim later. A claim taken to take a run over is protected by its
own `claimed_until` until its first write.
A worker whose event loop is blocked inside a long node keeps its run (the engine renews the run's lease
from its own thread). A hand-back puts the row back in the queue with the claim cleared, so nothing can
renew it any more; it counts in `handbacks`, not as a failed attempt.

Every "now" that writes or compares `claimed_until`, `not_before` or a run's `lease_expires`, and every time
stamped on a row (`submitted_at`, which orders the queue; `finished_at`), is the store's clock (`now_sql`: the
database server's on Postgres; on SQLite the host's as SQLite reads it), never the calling process's own.

Postgres claims with `FOR UPDATE SKIP LOCKED`: claimers skip each other's rows instead of waiting.
SQLite needs no such clause: a write transaction holds the database's only write lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from waypoint.engine.errors import WaypointError

from ._sql import now_sql

CHANNEL = "waypoint_queue"
"""Postgres NOTIFY channel: a submit, resume or hand-back wakes idle workers at once."""

COLUMNS = ("checkpoint_id, graph, kind, state, outcome, error, result, attempts, submitted_at, finished_at, worker, "
           "base_version, version, handbacks")

_LIVE_LEASE = (
    "SELECT 1 FROM waypoint_checkpoints c WHERE c.checkpoint_id = q.checkpoint_id AND c.status = 'running' "
    "AND c.lease_expires > {now} AND c.version = (SELECT MAX(m.version) FROM waypoint_checkpoints m "
    "WHERE m.checkpoint_id = q.checkpoint_id)")
_EXECUTOR_GONE = (  # the run's newest version is running, was written for this request, and its lease was live
    # when the claim was taken — so the claim's worker executed it (a claim taken after that lease had run out
    # is a takeover still on its way to its first write: its own claim protects it)
    "SELECT 1 FROM waypoint_checkpoints c WHERE c.checkpoint_id = q.checkpoint_id AND c.status = 'running' "
    "AND c.version > COALESCE(q.base_version, 0) AND c.lease_expires > q.claimed_at "
    "AND c.version = (SELECT MAX(m.version) FROM waypoint_checkpoints m WHERE m.checkpoint_id = q.checkpoint_id)")


class QueueError(WaypointError):
    """The run queue refused a request (the message names the run and what to do instead)."""


class QueueTimeout(QueueError):
    """`RunQueue.wait` gave up before the run's work was done."""


_NEWEST = ("SELECT {what} FROM waypoint_checkpoints c WHERE c.checkpoint_id = {run} "
           "ORDER BY c.version DESC LIMIT 1")
_SERVING = "SELECT COUNT(*) FROM waypoint_workers w WHERE w.graph = {graph} AND w.until > {now}"


def _refusal(checkpoint_id: str, kind: str, status: str | None, live: bool) -> str | None:
    run = f"run '{checkpoint_id}'"
    kind = {"turn": "start", "turn-over": "start-over"}.get(kind, kind)  # a chat's: a start that says where it began
    if kind == "start-over" and (status != "running" or not live):
        return None
    if kind == "input":  # the turn that took the queue's last work has ended (or its executor died)
        if status is None:
            return f"{run} does not exist: its queued inputs went with it"
        return None if status != "running" or not live else f"{run} is running: its turn takes its inputs after it"
    if kind in ("start", "start-over"):
        if status in (None, "completed"):
            return None
        how = "continues it" if status != "running" or not live else "continues it once it stops"
        return (f"{run} is {status}: submit() starts runs, it does not continue them; "
                f"queue.resume({checkpoint_id!r}, answers) {how}, or delete the run to start over")
    if status in ("interrupted", "failed") or (status == "running" and not live):  # not live: its executor died
        return None
    if status is None:
        return f"{run} does not exist, so there is nothing to resume; submit() it first"
    if status == "completed":
        return f"{run} has completed; submit() starts a new run on its ID"
    return (f"{run} is running under a live lease (another process executes it); wait({checkpoint_id!r}) for it "
            "to pause, or resume it once that process is gone and its lease has expired")


def enqueue(db: Any, checkpoint_id: str, graph: str | None, kind: str, payload: bytes,
            expected_version: int | None = None) -> int:
    """Queue work for a run: refused while the run (or earlier work for it) does not allow it, or when
    `expected_version` is given and the run is no longer at that version. Returns how many live workers
    serve the run's graph."""
    params: dict[str, Any] = {"c": checkpoint_id, "g": graph}
    clock = now_sql(db)
    named = "COALESCE(:g, (SELECT q.graph FROM waypoint_queue q WHERE q.checkpoint_id = :c))"
    live = f"CASE WHEN c.lease_expires > {clock} THEN 1 ELSE 0 END"
    (version, status, is_live, known, serving), = db.rows(
        f"SELECT ({_NEWEST.format(what='c.version', run=':c')}), ({_NEWEST.format(what='c.status', run=':c')}), "
        f"({_NEWEST.format(what=live, run=':c')}), {named}, ({_SERVING.format(graph=named, now=clock)})", params)
    problem = _refusal(checkpoint_id, kind, status, bool(is_live))
    if problem is not None:
        raise QueueError(problem)
    if expected_version is not None and version != expected_version:
        now_at = f"it is at version {version} ({status})" if version is not None else "it does not exist"
        raise QueueError(f"run '{checkpoint_id}' moved on: {now_at}, and this {kind} was made for version "
                         f"{expected_version}; read its status again and answer what it holds now")
    if known is None:
        raise QueueError(f"run '{checkpoint_id}' was not submitted through the queue, so it is not known which "
                         "graph runs it; pass graph=<the compiled graph or its name> to resume()")
    graph = known
    written = db.run(
        "INSERT INTO waypoint_queue (checkpoint_id, graph, kind, payload, base_version, state, attempts, "
        f"submitted_at) VALUES (:c, :g, :k, :p, :b, 'queued', 0, {clock}) ON CONFLICT (checkpoint_id) DO UPDATE SET "
        "graph = excluded.graph, kind = excluded.kind, payload = excluded.payload, base_version = "
        "excluded.base_version, state = 'queued', worker = NULL, claim = NULL, attempts = 0, handbacks = 0, "
        "stalls = 0, seen = NULL, "
        "not_before = NULL, submitted_at = excluded.submitted_at, claimed_at = NULL, claimed_until = NULL, "
        "finished_at = NULL, outcome = NULL, error = NULL, result = NULL, version = NULL "
        "WHERE waypoint_queue.state = 'done'",
        {"c": checkpoint_id, "g": graph, "k": kind, "p": payload, "b": version})
    if written != 1:
        raise QueueError(f"run '{checkpoint_id}' already has work queued or running; wait({checkpoint_id!r}) "
                         "for it before queueing more")
    if db.dialect == "postgresql":  # delivered when this transaction commits
        db.rows(f"SELECT pg_notify('{CHANNEL}', :c)", {"c": checkpoint_id})
    return int(serving)


_NEWEST_VERSION = "(SELECT MAX(m.version) FROM waypoint_checkpoints m WHERE m.checkpoint_id = waypoint_queue.checkpoint_id)"


def claim(db: Any, worker: str, token: str, graphs: Sequence[str], limit: int, hold: float,
          skip_ids: Sequence[str] = ()) -> list[tuple]:
    """Claim up to `limit` claimable rows for `graphs` (none of the runs `skip_ids`), oldest first, each under
    the token `token` + its checkpoint ID: (id, graph, kind, payload, base_version, attempts, handbacks, claim,
    stalls) each. The row's `error` keeps why the previous claim was handed back, if it said.

    `stalls` counts the claims in a row that found the run where the previous claim left it, give or take that
    claim's own first write: an attempt's first write is its claim of the run (a takeover writes one too), so
    only a second one is progress. A claim after progress counts 1 again; a hand-back takes its claim back off
    the count."""
    names = ", ".join(f":g{i}" for i in range(len(graphs)))
    skip = " FOR UPDATE SKIP LOCKED" if db.dialect == "postgresql" else ""
    params: dict[str, Any] = {f"g{i}": g for i, g in enumerate(graphs)}
    params.update(w=worker, t=token, hold=float(hold), n=limit)
    params.update({f"x{i}": x for i, x in enumerate(skip_ids)})
    skipped = f" AND q.checkpoint_id NOT IN ({', '.join(f':x{i}' for i in range(len(skip_ids)))})" if skip_ids else ""
    now = now_sql(db)
    return db.rows(
        f"UPDATE waypoint_queue SET state = 'claimed', worker = :w, claim = :t || checkpoint_id, claimed_at = {now}, "
        f"claimed_until = {now} + :hold, not_before = NULL, attempts = attempts + 1, "
        f"stalls = CASE WHEN COALESCE({_NEWEST_VERSION}, 0) > COALESCE(seen, 0) + 1 THEN 1 ELSE stalls + 1 END, "
        f"seen = {_NEWEST_VERSION}, version = NULL WHERE checkpoint_id IN ("
        f" SELECT q.checkpoint_id FROM waypoint_queue q WHERE q.graph IN ({names}){skipped} AND ("
        f"  (q.state = 'queued' AND (q.not_before IS NULL OR q.not_before <= {now})) OR"
        f"  (q.state = 'claimed' AND (q.claimed_until < {now} OR EXISTS ({_EXECUTOR_GONE}))))"
        f"  AND NOT EXISTS ({_LIVE_LEASE.format(now=now)})"
        f" ORDER BY q.submitted_at LIMIT :n{skip}) "
        "RETURNING checkpoint_id, graph, kind, payload, base_version, attempts, handbacks, claim, stalls, "
        "submitted_at", params)


def claimed(db: Any, checkpoint_id: str, token: str, version: int) -> bool:
    """While the claim `token` holds the row: note that it wrote the run's version `version`."""
    return db.run("UPDATE waypoint_queue SET version = :v WHERE checkpoint_id = :c AND state = 'claimed' "
                  "AND claim = :k", {"v": version, "c": checkpoint_id, "k": token}) == 1


_TOKENS_PER_QUERY = 500


def renew(db: Any, tokens: Sequence[str], hold: float) -> int:
    """Extend the claims named by `tokens` (the work a worker is still doing); returns how many still hold."""
    held = 0
    for start in range(0, len(tokens), _TOKENS_PER_QUERY):
        chunk = tokens[start:start + _TOKENS_PER_QUERY]
        params: dict[str, Any] = {f"t{i}": t for i, t in enumerate(chunk)}
        params["hold"] = float(hold)
        names = ", ".join(f":t{i}" for i in range(len(chunk)))
        held += db.run(f"UPDATE waypoint_queue SET claimed_until = {now_sql(db)} + :hold "
                       f"WHERE state = 'claimed' AND claim IN ({names})", params)
    return held


def finish(db: Any, checkpoint_id: str, token: str, outcome: str, error: str | None, result: bytes | None,
           version: int | None) -> bool:
    """Record the outcome, if the claim `token` still holds the row. `version`: the run's version the outcome
    left it at (None: its newest now)."""
    return db.run(
        f"UPDATE waypoint_queue SET state = 'done', finished_at = {now_sql(db)}, outcome = :o, error = :e, result = :r, "
        "version = COALESCE(:v, (SELECT MAX(m.version) FROM waypoint_checkpoints m WHERE m.checkpoint_id = :c)), "
        "claimed_until = NULL, claim = NULL WHERE checkpoint_id = :c AND state = 'claimed' AND claim = :k",
        {"o": outcome, "e": error, "r": result, "v": version, "c": checkpoint_id, "k": token}) == 1


def release(db: Any, checkpoint_id: str, token: str, delay: float, counts: bool = False,
            why: str | None = None) -> bool:
    """Hand a claim back (a drain, the store unavailable, the run held elsewhere): the row is queued again,
    claimable after `delay` seconds (and, as always, once the run holds no live lease), its owner cleared so
    nothing renews it. A hand-back is not a failed attempt unless it `counts` (an unexpected error, a lease
    lost). `why` is kept on the row (`error`) until the next outcome: what a give-up names as the cause."""
    params: dict[str, Any] = {"c": checkpoint_id, "k": token, "d": float(delay), "h": 0 if counts else 1,
                              "why": why[:2000] if why else None}
    done = db.run(
        "UPDATE waypoint_queue SET state = 'queued', worker = NULL, claim = NULL, claimed_until = NULL, error = :why, "
        "handbacks = handbacks + :h, stalls = stalls - :h, not_before = CASE WHEN CAST(:d AS DOUBLE PRECISION) > 0 THEN "
        f"{now_sql(db)} + CAST(:d AS DOUBLE PRECISION) ELSE NULL END "
        "WHERE checkpoint_id = :c AND state = 'claimed' AND claim = :k", params) == 1
    if done and delay <= 0 and db.dialect == "postgresql":
        db.rows(f"SELECT pg_notify('{CHANNEL}', :c)", {"c": checkpoint_id})
    return done


def status(db: Any, checkpoint_id: str) -> tuple | None:
    """The row (COLUMNS), the run's newest status and the live workers serving its graph, in one statement;
    None without a row."""
    params: dict[str, Any] = {"c": checkpoint_id}
    found = db.rows(
        f"SELECT {', '.join('q.' + c.strip() for c in COLUMNS.split(','))}, "
        f"({_NEWEST.format(what='c.status', run='q.checkpoint_id')}), "
        f"({_SERVING.format(graph='q.graph', now=now_sql(db))}) "
        "FROM waypoint_queue q WHERE q.checkpoint_id = :c", params)
    return tuple(found[0]) if found else None


# --- the workers serving each graph ------------------------------------------------------------------------

def present(db: Any, worker: str, graphs: Sequence[str], hold: float) -> None:
    """`worker` serves `graphs` for the next `hold` seconds (written at start and with each renewal)."""
    rows = [{"w": worker, "g": g, "hold": float(hold)} for g in graphs]
    db.many(f"INSERT INTO waypoint_workers (name, graph, until) VALUES (:w, :g, {now_sql(db)} + :hold) "
            "ON CONFLICT (graph, name) DO UPDATE SET until = excluded.until", rows)


def absent(db: Any, worker: str) -> None:
    """`worker` stopped (and workers gone for an hour are forgotten)."""
    params: dict[str, Any] = {"w": worker}
    db.run(f"DELETE FROM waypoint_workers WHERE name = :w OR until < {now_sql(db)} - 3600", params)
