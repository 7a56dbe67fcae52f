"""Starts and resumes handed to the run queue (`RunQueue`, stores/queue.py) for `waypoint worker` processes
to execute, when the service is given a queue (`queue=`, `waypoint serve --queue`).

A `Submission` answers the endpoints as an `Execution` does: `claimed` resolves once the worker's claim —
the run's first version of this start or resume, written by compare-and-set on the version the service
checked (the queue's `expected_version`) — is in the store, or with the error that refused it (the queue's
refusal at submit, or the worker's recorded outcome when its compare-and-set lost), turned into the engine's
error so that the service answers the same 409 / 404 as when it executes runs itself. While no worker
serving the graph is alive, or none has claimed the work after `CLAIM_WAIT` seconds, it resolves as
"queued" (the work waits in the queue). `finished` waits for the worker's outcome. The run's events reach
its log from the store (service/_watch.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from waypoint.engine import (
    CheckpointConflict,
    CheckpointExists,
    CheckpointNotFound,
    GraphMismatch,
    UnknownInterrupt,
    WaypointError,
)
from waypoint.engine.agents.turns import look
from waypoint.engine.agents.turns import queue as queue_input
from waypoint.engine.keep.store import store_clock
from waypoint.engine.models.schema import as_messages

from ._events import EventLog, Logs
from ._execution import Outcome
from ._targets import Target
from ._views import lease_alive
from ._watch import Watcher

__all__ = ["Dispatcher", "Submission", "WorkQueued", "CLAIM_WAIT"]

CLAIM_WAIT = 10.0
"""Seconds a start or resume waits for a worker's claim before it answers "queued"."""
_LOOK = (0.02, 0.2)
"""Seconds between looks for the claim where the store announces nothing: the first, the most."""


class WorkQueued(WaypointError):
    """Work for the run is already in the queue (waiting for a worker, or being executed by one)."""


_KNOWN = {cls.__name__: cls for cls in (CheckpointConflict, CheckpointExists, CheckpointNotFound, GraphMismatch,
                                        UnknownInterrupt)}


class Submission:
    """One start or resume in the queue, as the endpoints see it (like an `Execution`)."""

    def __init__(self, dispatcher: Dispatcher, checkpoint_id: str, target: Target, how: str, log: EventLog,
                 base: int | None) -> None:
        self.dispatcher, self.checkpoint_id, self.target, self.how = dispatcher, checkpoint_id, target, how
        self.log, self.base = log, base
        self.first_event = log.last_id
        """The event ID just before this submission's first event (what `last_event_id` answers)."""
        self.claimed: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()

    @property
    def finished(self) -> Any:
        """Waits until the worker recorded the outcome (an awaitable): None, or the error of work that was not
        done (the run moved on before a worker claimed it, say) as the engine's error."""
        return self._finished()

    async def _finished(self) -> BaseException | None:
        status = await self.dispatcher.queue.wait(self.checkpoint_id)
        return _engine_error(self.checkpoint_id, status.error or "") if status.outcome == "error" else None


class Dispatcher:
    """Submits starts and resumes to `queue` (whose store is the service's)."""

    def __init__(self, queue: Any, logs: Logs, watcher: Watcher) -> None:
        self.queue, self.store, self.logs, self.watcher = queue, queue.store, logs, watcher

    async def start(self, target: Target, checkpoint_id: str, input: Any, *, force_new_run: bool,
                    head: Any, on_busy: str = "reject", by: str = "") -> Submission:
        """Submit a new run of `target` on `input` (an agent's: the messages, which are put after the
        conversation a completed chat on the ID ended with, as the agent's `Runner` does). `head` is the run's
        newest version as the service looked (None: no run). An agent's chat whose turn a worker executes takes
        the input by `on_busy` instead: queued in the store, for the worker that ends the turn."""
        base = head.version if head is not None else None
        log = EventLog()  # the new run's: made its log at its claim, as a start executed here does
        sub = Submission(self, checkpoint_id, target, "start", log, base)
        if on_busy != "reject" and target.runner is not None:
            queued = await self._queue_input(target, checkpoint_id, input, on_busy, by)
            if queued is not None:
                sub.claimed.set_result(Outcome(status="queued", queued=queued))
                return sub
            found = await self.store.history(checkpoint_id, limit=1)  # not executing: a start after all
            head = found[0] if found else None
            base = sub.base = head.version if head is not None else None
            if on_busy in ("interrupt", "rollback") and head is not None and head.status != "completed":
                force_new_run = True  # paused, cancelled or failed: the new input gives that turn up
        self.watcher.expect(checkpoint_id, log, base)
        try:
            kept = None
            if target.runner is not None:
                new = as_messages(input)
                input = await target.runner.input_for(new, checkpoint_id=checkpoint_id, force_new_run=force_new_run,
                                                      rollback=on_busy == "rollback")
                kept = len(input) - len(new)
            workers = await self.queue.submit(target.app.name, input, checkpoint_id, force_new_run=force_new_run,
                                              expected_version=base, kept=kept)
        except Exception as err:  # noqa: BLE001 - refused: answered as a start executed here would be
            self.watcher.unexpect(checkpoint_id, log)
            sub.claimed.set_result(Outcome(error=await self._refusal(checkpoint_id, err, "start", force_new_run)))
            return sub
        self._await_claim(sub, workers)
        return sub

    async def _queue_input(self, target: Target, checkpoint_id: str, input: Any, on_busy: str, by: str) -> Any:
        """The `QueuedInput` if the chat's turn executes (anywhere) and the store took the input, else None. While
        work for the chat waits in the run queue (its next turn, not claimed yet), it waits up to `CLAIM_WAIT` for
        that turn to begin: then the chat is busy, and the input is queued after it."""
        runner, loop, delay = target.runner, asyncio.get_running_loop(), _LOOK[0]
        deadline = loop.time() + CLAIM_WAIT
        while True:
            found = await look(runner.app, self.store, checkpoint_id)
            if found.active:
                queued = await queue_input(runner.app, self.store, checkpoint_id, as_messages(input), on_busy, by)
                if queued is not None:
                    return queued
                continue  # its turn ended before the store took the input: look again
            work = await self.queue.status(checkpoint_id)
            if work is None or work.done or loop.time() >= deadline:
                return None  # not busy: a start (refused while work waits, as any start is)
            await self.watcher.changed(checkpoint_id, delay)
            delay = min(delay * 1.5, _LOOK[1])

    async def resume(self, target: Target, checkpoint_id: str, answers: Any, *, seen: Any) -> Submission:
        """Submit the resume of the run at version `seen` (the one the answers were checked against) with
        `answers` (what `ainvoke(resume=...)` takes)."""
        kept = self.logs.runs.get(checkpoint_id)
        log = self.logs.current(checkpoint_id, seen.created_at)
        self.watcher.follow(checkpoint_id, seen, fresh=log is not kept)  # events from `seen` on go to its log
        sub = Submission(self, checkpoint_id, target, "resume", log, seen.version)
        try:
            workers = await self.queue.resume(checkpoint_id, answers, expected_version=seen.version,
                                              graph=target.app.name)
        except Exception as err:  # noqa: BLE001 - refused: answered as a resume executed here would be
            sub.claimed.set_result(Outcome(error=await self._refusal(checkpoint_id, err, "resume", False)))
            return sub
        self._await_claim(sub, workers)
        return sub

    def _await_claim(self, sub: Submission, workers: int) -> None:
        task = asyncio.create_task(self._claim(sub, workers), name=f"waypoint-service:queued:{sub.checkpoint_id}")

        def done(t: asyncio.Task) -> None:
            if not sub.claimed.done():
                error = t.exception() if not t.cancelled() else asyncio.CancelledError()
                sub.claimed.set_result(Outcome(error=error))

        task.add_done_callback(done)

    async def _claim(self, sub: Submission, workers: int) -> None:
        """Resolve `sub.claimed`: the worker's claim, the worker's refusal, or "queued"."""
        loop = asyncio.get_running_loop()
        deadline, delay, cid = loop.time() + CLAIM_WAIT, _LOOK[0], sub.checkpoint_id
        claim = (sub.base or 0) + 1
        while True:
            status = await self.queue.status(cid)
            if status is None:  # the run (and its queued work) was deleted meanwhile
                sub.claimed.set_result(Outcome(error=CheckpointNotFound(f"run '{cid}' was deleted")))
                return
            if status.done:
                if status.outcome == "error":
                    self.watcher.unexpect(cid, sub.log)
                    sub.claimed.set_result(Outcome(error=_engine_error(cid, status.error or "")))
                else:
                    await self.watcher.look(cid)
                    sub.claimed.set_result(Outcome(version=claim))
                return
            # the worker notes its claim on the row: a version another process wrote (an answer by hand
            # to the same pause) is not this work's claim
            if status.state == "claimed" and status.version is not None and status.version >= claim:
                await self.watcher.look(cid)  # a start's log is the run's from here: a reader finds its events
                sub.claimed.set_result(Outcome(version=status.version))
                return
            if status.workers == 0 or workers == 0 or loop.time() >= deadline:
                sub.claimed.set_result(Outcome(status="queued"))
                return
            await self.watcher.changed(cid, delay)
            delay = min(delay * 1.5, _LOOK[1])

    async def _refusal(self, cid: str, err: BaseException, how: str, force_new_run: bool) -> BaseException:
        """The engine's error for a submission the queue refused (its messages give Python advice)."""
        from waypoint.stores import QueueError

        if not isinstance(err, QueueError):
            return err
        status = await self.queue.status(cid)
        if status is not None and not status.done:
            return WorkQueued(f"run '{cid}' already has work in the queue")
        found = await self.store.history(cid, limit=1)
        head = found[0] if found else None
        if head is None:
            return CheckpointNotFound(f"run '{cid}' does not exist") if how == "resume" else err
        if head.status == "running" and lease_alive(head, await store_clock(self.store)):
            return CheckpointConflict(f"run '{cid}' is running")
        if how == "start" and head.status != "completed" and not force_new_run:
            return CheckpointExists(f"run '{cid}' is {head.status}")
        return CheckpointConflict(str(err))


def _engine_error(cid: str, text: str) -> BaseException:
    """The error a worker recorded for work it could not do, as the engine's error it was."""
    name, _, message = text.partition(": ")
    if name in _KNOWN:
        return _KNOWN[name](message)
    if "moved on" in text:
        return CheckpointConflict(text)
    if "deleted" in text or "does not exist" in text:
        return CheckpointNotFound(text)
    return WaypointError(text)
