"""`Worker`: claims queued work (stores/queue.py) and runs it, `concurrency` runs at a time.

The loop, box by box (docs/scale-out.md draws it):

1. **claim** — up to the free slots, oldest first (`FOR UPDATE SKIP LOCKED` on Postgres): new
   submissions, resumes with answers, and work whose worker died (its claim not renewed, the run's
   lease expired);
2. **plan** — a first attempt does what was asked (start with the input, resume with the answers).
   A later one (an earlier worker died, drained, or met the run held elsewhere) reads the run first
   (`get_run`): if nothing was written since the work was queued, it does what was asked; if an
   earlier attempt wrote versions, it continues the run from its last committed step (answers still
   pending are passed again); if the run already came to rest, it just records that;
3. **run** — `ainvoke` on the worker's compiled graph: the engine claims the run by compare-and-set,
   keeps its lease from its lease thread, and commits every step (`durability="step"`);
4. **record** — the outcome (completed with its output, interrupted with its interrupt IDs, failed,
   or an error) on the queue row, only if this worker still holds the claim;
5. **idle** — with no free slot or nothing to claim, sleep until a run ends, a Postgres NOTIFY says
   work was queued, or `poll` seconds pass (which is also how expired work is found).

Meanwhile a task renews the worker's claims every `lease_seconds / 3`. `stop()` stops claiming and
waits up to `drain_seconds` for the runs in flight; the ones still running are then cancelled — the
engine saves each at its last finished step — and their work is put back in the queue for another
worker. `stop(now=True)` cancels at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from waypoint.engine.errors import CheckpointConflict, CheckpointNotFound, GraphInterrupted

from .queue import QueueError, RunQueue

__all__ = ["Worker"]

log = logging.getLogger("waypoint.worker")


@dataclass(frozen=True)
class _Item:
    checkpoint_id: str
    graph: str
    kind: str
    payload: bytes
    base_version: int | None
    attempt: int


_NOTHING = object()


class Worker:
    """Runs queued work for `graphs` (compiled graphs on `store`, told apart by name) from `store`'s queue.

    `concurrency`: runs at once; `poll`: seconds between looks at the queue when idle (Postgres also
    wakes it by NOTIFY); `lease_seconds`: how long its claims last unrenewed (default: twice the graphs'
    longest lease — a claim only matters before a run's first write and after its last one, the run's
    own lease covers the rest); `drain_seconds`: how long `stop()` lets runs in flight finish before cancelling
    them; `max_attempts`: claims of one request after which it is recorded as an error instead of run
    again (a run that kills every worker that takes it must not take the fleet down one by one);
    `serializer`: the queue's codec (the one `RunQueue` used to submit)."""

    def __init__(self, store: Any, graphs: Sequence[Any] | Mapping[str, Any], *, concurrency: int = 8,
                 poll: float = 1.0, lease_seconds: float | None = None, drain_seconds: float = 30.0,
                 max_attempts: int = 10, serializer: Any = None, name: str | None = None) -> None:
        self.queue = RunQueue(store, serializer=serializer)
        self.store = store
        self.graphs = _by_name(store, graphs)
        if concurrency < 1 or poll <= 0:
            raise ValueError(f"Worker: concurrency must be >= 1 and poll > 0, got {concurrency} and {poll}")
        self.concurrency = concurrency
        self.poll = poll
        self.lease_seconds = lease_seconds or 2 * max(app.lease_seconds for app in self.graphs.values())
        self.drain_seconds = drain_seconds
        self.max_attempts = max_attempts
        self.name = name or f"worker:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._tasks: set[asyncio.Task] = set()
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._cancel_now = False
        self.finished = 0
        """Work items this worker recorded as done."""

    @property
    def active(self) -> int:
        """Runs in flight."""
        return len(self._tasks)

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming work; drain (or with `now=True`, cancel) the runs in flight. Call it on the
        worker's loop (a signal handler installed with `loop.add_signal_handler` is)."""
        self._stopping = True
        if now:
            self._cancel_now = True
            for task in self._tasks:
                task.cancel()
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Work until `stop()`; returns once every run in flight ended or was handed back to the queue."""
        self._wake = wake = asyncio.Event()
        unlisten = await self.queue._listen(wake.set)
        keeper = asyncio.create_task(self._keep_claims())
        try:
            while not self._stopping:
                wake.clear()
                free = self.concurrency - len(self._tasks)
                claimed = await self._claim(free) if free > 0 else []
                for row in claimed:
                    self._start(_Item(*row))
                if len(claimed) < free or free <= 0:
                    try:
                        await asyncio.wait_for(wake.wait(), self.poll)
                    except asyncio.TimeoutError:
                        pass
            await self._drain()
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            if unlisten is not None:
                await unlisten()

    # --- the loop's parts ------------------------------------------------------------------------------

    async def _claim(self, free: int) -> list[tuple]:
        try:
            return await self.queue._claim(self.name, sorted(self.graphs), free, self.lease_seconds)
        except Exception as err:  # noqa: BLE001 - the database may come back; look again after `poll`
            log.warning("worker %s: claiming work failed (%s: %s); trying again in %s s", self.name,
                        type(err).__name__, err, self.poll)
            return []

    def _start(self, item: _Item) -> None:
        task = asyncio.create_task(self._work(item), name=f"waypoint-work:{item.checkpoint_id}")
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if self._wake is not None:
            self._wake.set()

    async def _keep_claims(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            if self._tasks:
                try:
                    await self.queue._renew(self.name, self.lease_seconds)
                except Exception as err:  # noqa: BLE001 - the runs' own leases still protect them
                    log.warning("worker %s: renewing its claims failed (%s)", self.name, err)

    async def _drain(self) -> None:
        if self._tasks and not self._cancel_now:
            await asyncio.wait(set(self._tasks), timeout=self.drain_seconds)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- one work item ----------------------------------------------------------------------------------

    async def _work(self, item: _Item) -> None:
        cid, queue = item.checkpoint_id, self.queue
        if item.attempt > self.max_attempts:
            error = (f"run '{cid}': gave up after {self.max_attempts} attempts (each worker that took this work "
                     "died, drained or lost the run before recording an outcome); look at the run's history, fix "
                     "the cause, and queue it again")
            await queue._finish(cid, self.name, item.attempt, "error", error, None)
            return
        try:
            outcome, error, result = await self._do(item)
        except asyncio.CancelledError:  # draining: the engine saved the run; another worker continues it
            await _shielded(queue._release(cid, self.name, item.attempt, requeue=True))
            raise
        except CheckpointConflict as err:  # another process holds the run: take the work again once it lets go
            log.info("worker %s: run '%s' is held elsewhere (%s)", self.name, cid, err)
            await queue._release(cid, self.name, item.attempt, requeue=False)
            return
        if await queue._finish(cid, self.name, item.attempt, outcome, error, result):
            self.finished += 1

    async def _do(self, item: _Item) -> tuple[str, str | None, bytes | None]:
        """Plan and run one item: (outcome, error, encoded result)."""
        app = self.graphs[item.graph]
        cid = item.checkpoint_id
        try:
            value = self.queue.serializer.loads(item.payload)
            if item.attempt == 1:  # first try: nothing was written since it was queued (the engine checks)
                before = item.base_version
                input, resume = (value, None) if item.kind == "start" else (None, value)
            else:  # a worker died, drained or lost a race on it before: see where the run is
                snap = await app.get_run(cid)
                plan = _plan(item, value, snap)
                if plan is _NOTHING:
                    return self._resting(snap)
                input, resume = plan
                before = snap.meta.version if snap is not None else None
            try:
                output = await app.ainvoke(input, checkpoint_id=cid, resume=resume)
            except GraphInterrupted as paused:
                return "interrupted", None, self._encode({c.id: c.info for c in paused.info.contexts})
            except (CheckpointConflict, asyncio.CancelledError):
                raise
            except Exception as err:  # noqa: BLE001 - recorded on the queue row for whoever waits
                return await self._failed(cid, before, err)
            return "completed", None, self._encode(output)
        except (CheckpointConflict, asyncio.CancelledError):
            raise
        except CheckpointNotFound as err:
            return "error", str(err), None
        except Exception as err:  # noqa: BLE001 - unreadable run or payload: say so on the row
            return "error", f"{type(err).__name__}: {err}", None

    def _resting(self, snap: Any) -> tuple[str, str | None, bytes | None]:
        """An earlier attempt brought the run to rest but died before recording it."""
        if snap is None:
            return "error", "the run was deleted while its work was queued", None
        status = snap.meta.status
        if status == "completed":
            return status, None, self._encode(snap.output)
        if status == "interrupted":
            return status, None, self._encode({c.id: c.info for c in snap.interrupts.contexts})
        return status, snap.meta.error, None

    async def _failed(self, cid: str, before: int | None, err: Exception) -> tuple[str, str, None]:
        newest = await self.store.history(cid, limit=1)
        stored_failed = bool(newest) and newest[0].status == "failed" and newest[0].version != before
        return ("failed" if stored_failed else "error"), f"{type(err).__name__}: {err}", None

    def _encode(self, value: Any) -> bytes | None:
        try:
            return self.queue.serializer.dumps(value, root="result")
        except Exception as err:  # noqa: BLE001 - the run is fine; only the copy on the queue row is missing
            log.warning("worker %s: a result could not be encoded for the queue row: %s", self.name, err)
            return None


def _plan(item: _Item, value: Any, snap: Any) -> Any:
    """(input, resume) for `ainvoke`, or _NOTHING when the run already came to rest after this work."""
    newest = snap.meta.version if snap is not None else None
    if newest == item.base_version:  # nothing written since the work was queued: do what was asked
        if item.kind == "start":
            return value, None
        if snap is None:
            raise CheckpointNotFound(f"run '{item.checkpoint_id}' was deleted after its resume was queued")
        return None, value
    if snap is None:
        raise CheckpointNotFound(f"run '{item.checkpoint_id}' was deleted while its work was running")
    status, error = snap.meta.status, snap.meta.error
    if status == "running" or (status == "interrupted" and error == "cancelled"):  # crashed or drained
        pending = [c.id for c in snap.interrupts.contexts]
        answers = value if item.kind == "resume" else None
        return None, _still_pending(answers, pending)
    return _NOTHING


def _still_pending(answers: Any, pending: list[str]) -> Any:
    """The part of a resume's answers whose interrupts are still pending (None: continue plainly)."""
    if not pending or answers is None:
        return None
    if answers is True:
        return True
    if isinstance(answers, Mapping):
        kept = {k: v for k, v in answers.items() if k in pending}
    else:
        kept = [k for k in answers if k in pending]
    return kept or None


def _by_name(store: Any, graphs: Sequence[Any] | Mapping[str, Any]) -> dict[str, Any]:
    apps = list(graphs.values()) if isinstance(graphs, Mapping) else list(graphs)
    if not apps:
        raise QueueError("Worker: give it at least one compiled graph to run")
    named: dict[str, Any] = {}
    for app in apps:
        if getattr(app, "store", None) is None or repr(app.store) != repr(store):
            raise QueueError(f"Worker: graph '{getattr(app, 'name', app)}' must be compiled with the worker's store "
                             f"({store!r}), not {getattr(app, 'store', None)!r}")
        if app.name in named:
            raise QueueError(f"Worker: two graphs are named '{app.name}'; the queue tells graphs apart by name")
        named[app.name] = app
    return named


async def _shielded(coro: Any) -> Any:
    """Finish `coro` even though this task is being cancelled (a release must land)."""
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        return await task
    except Exception as err:  # noqa: BLE001 - the claim then expires by itself
        log.warning("releasing a claim failed: %s", err)
        return None
