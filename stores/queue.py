"""`RunQueue`: work for runs, queued in the checkpoint database, done by `Worker` processes (docs/scale-out.md).

The service that owns the runs asks; workers (`waypoint worker`, stores/worker.py) do:

    queue = RunQueue(SQLStore("postgresql+asyncpg://…"))
    await queue.submit(app, {"ticket": 42}, "ticket-42")    # start a run
    paused = await queue.wait("ticket-42")                  # WorkStatus: paused, with its interrupts
    await queue.resume("ticket-42", {iid: ApprovalResult(approved=True)}, expected_version=paused.version)
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
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _queue_sql
from ._queue_sql import QueueError, QueueTimeout

__all__ = ["RunQueue", "WorkStatus", "QueueError", "QueueTimeout"]

log = logging.getLogger("waypoint.queue")


@dataclass(frozen=True, kw_only=True)
class WorkStatus:
    """Where a run's queued work is: `state` "queued", "claimed" (a worker runs it) or "done"."""

    checkpoint_id: str
    graph: str
    kind: str
    """"start" (submit), "start-over" (submit with `force_new_run`), "turn" / "turn-over" (the same for an agent's
    chat, with where its turn began: `submit(kept=)`), "resume", or "input" (a worker queued the turn of a chat's
    next queued input, `Runner.run(on_busy=)`)."""
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
    """How many times a worker claimed this work (more than 1: a worker died, drained or handed it back)."""
    handbacks: int = 0
    """Claims of this work that ended in an orderly hand-back (a drain, the store unavailable, the run held
    by another process): they do not count towards a worker's `max_attempts`."""
    submitted_at: float = 0.0
    finished_at: float | None = None
    worker: str | None = None
    version: int | None = None
    """Once done: the run's version the outcome left it at. Answer a pause with
    `resume(..., expected_version=status.version)`: the answers then apply to that pause or to nothing.
    While claimed: the version the claim wrote (the run's claim by this work), None until it wrote."""
    run_status: str | None = None
    """The status of the run's newest version (None if it has none yet)."""
    workers: int = 0
    """Live workers serving this work's graph (0 while queued: nothing will run it until one starts)."""

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
            from waypoint.engine.codec.serde import Serializer

            serializer = Serializer()
        from waypoint.engine.keep.content import register_engine_types

        register_engine_types(serializer)  # answers may hold the engine's own (a due pause's `Expired`)
        self.store = store
        self.serializer = serializer

    async def submit(self, graph: Any, input: Any, checkpoint_id: str, *, force_new_run: bool = False,
                     expected_version: int | None = None, kept: int | None = None) -> int:
        """Queue a new run of `graph` (a compiled graph, or its name) on `input` under `checkpoint_id`.
        Returns how many live workers serve the graph (0: it waits until one starts; a warning is logged).

        Raises `QueueError` if the run exists and is not completed (resume it instead) — unless
        `force_new_run`, which starts a new run over a paused or failed one (not over one running under a
        live lease) — or if work for it is already queued or running. `expected_version`: the run's version
        the input was made for (a chat's conversation read from it, say): refused if the run has moved on,
        and the worker starts the run by compare-and-set on it (as it always does on the version at submit).
        `kept`: for an agent's chat, how many of `input`'s messages are the conversation before this turn (what
        `Runner.input_for` put first): a rollback input goes back to there."""
        _check_id(checkpoint_id)
        name = _graph_name(graph)
        if kept is None:
            payload = self.serializer.dumps(input, root="input")
            kind = "start-over" if force_new_run else "start"
        else:
            payload = self.serializer.dumps({"messages": input, "kept": int(kept)}, root="input")
            kind = "turn-over" if force_new_run else "turn"
        workers = await self.store._call(_queue_sql.enqueue, checkpoint_id, name, kind, payload, expected_version,
                                         write=True)
        return _said(checkpoint_id, name, workers)

    async def resume(self, checkpoint_id: str, answers: Any = None, *, expected_version: int | None = None,
                     graph: Any = None) -> int:
        """Queue the resume of a paused or failed run — or of one whose executor died (running, its lease
        expired): `answers` is what `ainvoke(resume=...)` takes — `{interrupt_id: data}`, `[ids]`, `True` —
        or None to continue a run that waits on no answer. Returns how many live workers serve its graph.

        `expected_version`: the version the answers were made for (`WorkStatus.version`, or a version the
        caller read): refused with `QueueError` if the run is no longer there, and the worker applies the
        answers only by compare-and-set on that version — a late duplicate never answers a later pause.
        Without it, the run's version at this call is the one the worker compares against.
        `graph` is needed only for a run that was not submitted through the queue."""
        _check_id(checkpoint_id)
        payload = self.serializer.dumps(answers, root="answers")
        name = _graph_name(graph) if graph is not None else None
        workers = await self.store._call(_queue_sql.enqueue, checkpoint_id, name, "resume", payload,
                                         expected_version, write=True)
        return _said(checkpoint_id, name, workers)

    async def _take_input(self, checkpoint_id: str, graph: str, version: int) -> int:
        """Queue the turn of the chat's next queued input (a worker does, once the turn before it ended at
        `version`): refused while work for the run is queued or running, or once it moved on."""
        return await self.store._call(_queue_sql.enqueue, checkpoint_id, graph, "input", self.serializer.dumps(None),
                                      version, write=True)

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
                serving = (f"no live worker serves graph '{current.graph}': start one (waypoint worker --graphs ...)"
                           if current.workers == 0 else
                           f"{current.workers} live worker(s) serve graph '{current.graph}'; wait longer")
                raise QueueTimeout(f"run '{checkpoint_id}': its work is still {current.state} after {timeout} s "
                                   f"(attempt {current.attempts}); {serving}")
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def _status(self, row: tuple) -> WorkStatus:
        (cid, graph, kind, state, outcome, error, result, attempts, submitted, finished, worker, _base, version,
         handbacks, run_status, workers) = row
        value = self.serializer.loads(result) if result is not None else None
        return WorkStatus(checkpoint_id=cid, graph=graph, kind=kind, state=state, outcome=outcome, error=error,
                          output=value if outcome == "completed" else None,
                          interrupts=dict(value) if outcome == "interrupted" and value else {},
                          attempts=attempts, handbacks=handbacks, submitted_at=submitted, finished_at=finished,
                          worker=worker, version=version, run_status=run_status, workers=workers)

    # --- for workers: claims (stores/_queue_sql.py says what a claim is) -------------------------------

    async def _claim(self, worker: str, graphs: list[str], limit: int, hold: float,
                     skip_ids: Sequence[str] = ()) -> list[tuple]:
        """Claim up to `limit` rows for `hold` seconds, none of the runs `skip_ids`: (id, graph, kind, payload,
        base_version, attempts, handbacks, claim token, stalls, submitted_at) each."""
        token = f"{uuid.uuid4().hex}:"
        return await self.store._call(_queue_sql.claim, worker, token, graphs, limit, hold, tuple(skip_ids),
                                      write=True)

    async def _claimed(self, checkpoint_id: str, token: str, version: int) -> bool:
        """Note on the row that the claim `token` wrote the run's version `version` (its claim)."""
        return await self.store._call(_queue_sql.claimed, checkpoint_id, token, version, write=True)

    async def _renew(self, tokens: list[str], hold: float) -> int:
        return await self.store._call(_queue_sql.renew, tokens, hold, write=True) if tokens else 0

    async def _finish(self, checkpoint_id: str, token: str, outcome: str, error: str | None, result: bytes | None,
                      version: int | None = None) -> bool:
        return await self.store._call(_queue_sql.finish, checkpoint_id, token, outcome, error, result, version,
                                      write=True)

    async def _release(self, checkpoint_id: str, token: str, *, delay: float = 0.0, counts: bool = False,
                       why: str | None = None) -> bool:
        return await self.store._call(_queue_sql.release, checkpoint_id, token, delay, counts, why, write=True)

    async def _present(self, worker: str, graphs: list[str], hold: float) -> None:
        await self.store._call(_queue_sql.present, worker, graphs, hold, write=True)

    async def _absent(self, worker: str) -> None:
        await self.store._call(_queue_sql.absent, worker, write=True)

    @property
    def _notifies(self) -> bool:
        """Whether the store delivers NOTIFY (Postgres): idle workers wake at once on new work."""
        return getattr(self.store, "dialect", None) == "postgresql" and hasattr(self.store, "_listen")

    async def _listen(self, callback: Any) -> Any:
        """Listen for new work (Postgres): a handle with `alive()` and `close()`, or None (SQLite)."""
        return await self.store._listen(_queue_sql.CHANNEL, callback) if self._notifies else None


def _said(checkpoint_id: str, graph: str | None, workers: int) -> int:
    if workers == 0:
        log.warning("run '%s': no live worker serves %s; its work stays queued until one starts "
                    "(waypoint worker --graphs ...)", checkpoint_id, f"graph '{graph}'" if graph else "its graph")
    return workers


def _graph_name(graph: Any) -> str:
    name = graph if isinstance(graph, str) else getattr(graph, "name", None)
    if not isinstance(name, str) or not name:
        raise QueueError(f"a graph to queue must be a compiled graph or its name, not {type(graph).__name__}")
    return name


def _check_id(checkpoint_id: Any) -> None:
    """The engine's rule for checkpoint IDs (engine/keep/lifecycle.py), before anything is queued."""
    from waypoint.engine.keep.lifecycle import MAX_ID

    if not isinstance(checkpoint_id, str) or not checkpoint_id:
        raise QueueError(f"checkpoint_id={checkpoint_id!r} must be a non-empty string")
    if len(checkpoint_id) > MAX_ID or "\x00" in checkpoint_id or any(0xD800 <= ord(c) <= 0xDFFF for c in checkpoint_id):
        raise QueueError(f"checkpoint_id={checkpoint_id[:80]!r} must be at most {MAX_ID} characters of text without "
                         "NUL or unpaired surrogates (every store must be able to keep it)")
