"""`RunQueue`: work for runs, queued in the checkpoint database, done by `Worker` processes (docs/scale-out.md).

The service that owns the runs asks; workers (`waypoint worker`, stores/worker.py) do:

    queue = RunQueue(SQLStore("postgresql+asyncpg://…"))
    await queue.submit(app, {"ticket": 42}, "ticket-42")    # start a run
    done = await queue.wait("ticket-42")                    # WorkStatus: paused, with its interrupts
    await queue.resume("ticket-42", {iid: ApprovalResult(approved=True)})
    done = await queue.wait("ticket-42")                    # completed, with its output

The queue lives in the store's database (table `waypoint_queue`), so a submit and the run it starts
share one database and one backup. It holds *requests*; the run's own record (its versions,
compare-and-set, lease) stays the one truth about where the run is and who runs it. It works on any
SQL store: `SQLStore` on Postgres (many worker machines), `SQLiteStore` or `SQLStore` on SQLite (many
worker processes on one machine). Inputs, answers and outputs are encoded with the queue's
`serializer` (the checkpoint codec: registered types only, never pickle).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from . import _queue_sql
from ._queue_sql import QueueError, QueueTimeout

__all__ = ["RunQueue", "WorkStatus", "QueueError", "QueueTimeout"]


@dataclass(frozen=True, kw_only=True)
class WorkStatus:
    """Where a run's queued work is: `state` "queued", "claimed" (a worker runs it) or "done"."""

    checkpoint_id: str
    graph: str
    kind: str
    """"start" (submit) or "resume"."""
    state: str
    outcome: str | None = None
    """Once done: the run's status ("completed", "interrupted", "failed"), or "error" when the work
    could not be done (unknown interrupt ID, run deleted meanwhile, ...; see `error`)."""
    error: str | None = None
    output: Any = None
    """The run's output, when it completed."""
    interrupts: dict[str, Any] = field(default_factory=dict)
    """When the run paused: `{interrupt id: info}` — the IDs `resume()` answers."""
    attempts: int = 0
    """How many times a worker claimed this work (more than 1: a worker died or drained meanwhile)."""
    submitted_at: float = 0.0
    finished_at: float | None = None
    worker: str | None = None
    run_status: str | None = None
    """The status of the run's newest version (None if it has none yet)."""

    @property
    def done(self) -> bool:
        return self.state == "done"


class RunQueue:
    """Queue runs for workers and follow them. `store` is an SQL store; `serializer` encodes inputs,
    answers and outputs (default: the checkpoint codec without a key — pass the one your workers use)."""

    def __init__(self, store: Any, *, serializer: Any = None) -> None:
        if not hasattr(store, "_call"):
            raise QueueError(f"RunQueue needs an SQL store (SQLStore or SQLiteStore) shared with the workers, not "
                             f"{type(store).__name__}: a MemoryStore lives and dies with one process")
        if serializer is None:
            from waypoint.engine.serde import Serializer

            serializer = Serializer()
        self.store = store
        self.serializer = serializer

    async def submit(self, graph: Any, input: Any, checkpoint_id: str) -> None:
        """Queue a new run of `graph` (a compiled graph, or its name) on `input` under `checkpoint_id`.

        Raises `QueueError` if the run exists and is not completed (resume it instead), or if work for
        it is already queued or running."""
        _check_id(checkpoint_id)
        payload = self.serializer.dumps(input, root="input")
        await self.store._call(_queue_sql.enqueue, checkpoint_id, _graph_name(graph), "start", payload, time.time(),
                               write=True)

    async def resume(self, checkpoint_id: str, answers: Any = None, *, graph: Any = None) -> None:
        """Queue the resume of a paused (or failed) run: `answers` is what `ainvoke(resume=...)` takes —
        `{interrupt_id: data}`, `[ids]`, `True` — or None to continue a run that waits on no answer.
        `graph` is needed only for a run that was not submitted through the queue."""
        _check_id(checkpoint_id)
        payload = self.serializer.dumps(answers, root="answers")
        name = _graph_name(graph) if graph is not None else None
        await self.store._call(_queue_sql.enqueue, checkpoint_id, name, "resume", payload, time.time(), write=True)

    async def status(self, checkpoint_id: str) -> WorkStatus | None:
        """The run's work as the queue knows it, or None if nothing was ever queued for it."""
        row = await self.store._call(_queue_sql.status, checkpoint_id)
        return None if row is None else self._status(row)

    async def wait(self, checkpoint_id: str, *, timeout: float | None = None) -> WorkStatus:
        """Wait until the run's queued work is done; raises `QueueTimeout` after `timeout` seconds and
        `QueueError` if nothing is queued for it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while True:
            current = await self.status(checkpoint_id)
            if current is None:
                raise QueueError(f"run '{checkpoint_id}': nothing was queued for it; submit() it first")
            if current.done:
                return current
            if deadline is not None and time.monotonic() + delay > deadline:
                raise QueueTimeout(f"run '{checkpoint_id}': its work is still {current.state} after {timeout} s "
                                   f"(attempt {current.attempts}); wait longer, or check that a worker serves "
                                   f"graph '{current.graph}'")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def _status(self, row: tuple) -> WorkStatus:
        (cid, graph, kind, state, outcome, error, result, attempts, submitted, finished, worker, _base,
         run_status) = row
        value = self.serializer.loads(result) if result is not None else None
        return WorkStatus(checkpoint_id=cid, graph=graph, kind=kind, state=state, outcome=outcome, error=error,
                          output=value if outcome == "completed" else None,
                          interrupts=dict(value) if outcome == "interrupted" and value else {},
                          attempts=attempts, submitted_at=submitted, finished_at=finished, worker=worker,
                          run_status=run_status)

    # --- for workers -----------------------------------------------------------------------------------

    async def _claim(self, worker: str, graphs: list[str], limit: int, hold: float) -> list[tuple]:
        now = time.time()
        return await self.store._call(_queue_sql.claim, worker, graphs, limit, now, now + hold, write=True)

    async def _renew(self, worker: str, hold: float) -> int:
        return await self.store._call(_queue_sql.renew, worker, time.time() + hold, write=True)

    async def _finish(self, checkpoint_id: str, worker: str, attempt: int, outcome: str, error: str | None,
                      result: bytes | None) -> bool:
        return await self.store._call(_queue_sql.finish, checkpoint_id, worker, attempt, outcome, error, result,
                                      time.time(), write=True)

    async def _release(self, checkpoint_id: str, worker: str, attempt: int, *, requeue: bool) -> bool:
        return await self.store._call(_queue_sql.release, checkpoint_id, worker, attempt, requeue, write=True)

    async def _listen(self, callback: Any) -> Any:
        listen = getattr(self.store, "_listen", None)
        return None if listen is None else await listen(_queue_sql.CHANNEL, callback)


def _graph_name(graph: Any) -> str:
    name = graph if isinstance(graph, str) else getattr(graph, "name", None)
    if not isinstance(name, str) or not name:
        raise QueueError(f"a graph to queue must be a compiled graph or its name, not {type(graph).__name__}")
    return name


def _check_id(checkpoint_id: Any) -> None:
    if not isinstance(checkpoint_id, str) or not checkpoint_id:
        raise QueueError(f"checkpoint_id={checkpoint_id!r} must be a non-empty string")
