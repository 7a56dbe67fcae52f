"""`Worker`: claims queued work (stores/queue.py) and runs it, `concurrency` runs at a time.

The loop, box by box (docs/scale-out.md draws it):

1. **claim** — up to the free slots, oldest first (`FOR UPDATE SKIP LOCKED` on Postgres): new
   submissions, resumes with answers, work handed back, and work whose worker died (its claim not
   renewed, or its run written and the run's lease expired);
2. **plan** — a first attempt does what was asked (start with the input, resume with the answers), by
   compare-and-set on the version the request was queued for (`expected_version`). A later one (an
   earlier worker died, drained or handed it back) reads the run first (`get_run`): if nothing was
   written since the work was queued, it does what was asked; if an earlier attempt wrote versions, it
   continues the run from its last committed step (answers still pending are passed again); if the run
   already came to rest, it just records that;
3. **run** — `ainvoke` on the worker's compiled graph: the engine claims the run by compare-and-set,
   keeps its lease from its lease thread, and commits every step (`durability="step"`);
4. **record** — the outcome (completed with its output, interrupted with its interrupt IDs, failed, or
   an error) and the version it left the run at, on the queue row, only if this claim still holds it;
   a database error while recording is tried again, never dropped;
5. **idle** — with no free slot or nothing to claim, sleep until a run ends, a Postgres NOTIFY says
   work was queued, or `poll` seconds pass (which is also how expired work is found).

Meanwhile a task renews the claims of the work in flight (and only those) every `lease_seconds / 3`
and says which graphs this worker serves. Work ends in an outcome or is **handed back** — queued again
for any worker, its claim cleared — never left claimed by a task that died: when draining (`stop()`:
stop claiming, let each run in flight finish the step it is in, within `drain_seconds`, stop the rest where
they are — each left `running` at its last finished step with its lease ended, never stored as cancelled:
engine/keep/shutdown.py), when the run is held by another process, and when the database failed
(`StoreUnavailable`: after a backoff). A hand-back is not a failed attempt; `max_attempts` counts the
claims that ended in neither (the worker died, or lost its claim) *in a row without progress*: a claim that
finds the run at a newer version than the previous claim found it counts 1 again, so a long run whose
workers die now and then (preempted, a neighbour's OOM) goes on, while one that kills every worker at the
same place — or before it writes anything (a checkpoint too big to load, say) — is given up.

A LISTEN connection lost (a Postgres restart) is opened again; a database that is down when the worker
starts, or goes down later, is tried again as claims are, with a backoff up to `poll` seconds.

**Recovery** (unless `recover=False`): every `poll` seconds the worker also looks for runs of its graphs
whose process died — a worker, a service, a script — (`waypoint.engine.recover`, engine/keep/recovery.py) and
queues their continuation (`RunQueue.resume`, by compare-and-set on the version judged), so a run that
was never queued is continued by the fleet too; a run whose work is already queued or claimed is left to
the queue, which can claim it at once (recovery ends a dead owner's lease first). Work given up after
`max_attempts` also stores its run as failed, with why, so recovery does not continue it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from waypoint.engine.errors import (CheckpointConflict, CheckpointNotFound, GraphInterrupted, GraphMismatch,
                                   LeaseLost, ProcessStopping, RunCancelled, StoreUnavailable)
from waypoint.engine.agents.runner import going_on
from waypoint.engine.keep.lease import forget as forget_renewals
from waypoint.engine.keep.lease import lost as lost_lease
from waypoint.engine.keep.lease import reserve as reserve_renewals
from waypoint.engine.keep.recovery import give_up, recover
from waypoint.engine.keep.shutdown import Shutdown

from ._worker_turns import queue_next_input, runners_of, take_waiting_inputs
from ._backoff import SAY_EVERY, Backoff
from ._worker_plan import NOTHING, plan_retry
from .queue import QueueError, RunQueue
from .relay import Relay

__all__ = ["Worker"]

log = logging.getLogger("waypoint.worker")

_BACKOFF = (0.1, 5.0)
"""Seconds before a request that met an unavailable database is claimable again: the first, the most."""
_FOREIGN_SECONDS = 60.0
"""How long a worker leaves alone a run written by another version of its graph (then it looks once more:
the run may have been deleted and started again by this version)."""
_FOREIGN_MAX = 500
_RESERVE_SECONDS = 10.0
"""How long a worker waits for its connection for lease renewals before it says so and tries again later."""
_NOTES: set[asyncio.Task] = set()
_ABSENT_SECONDS = 3.0
"""How long a stopping worker tries to say it is gone before it exits anyway."""
_WHAT = {"start": "start", "start-over": "start over", "resume": "resume", "input": "the next queued input",
         "turn": "a chat's turn", "turn-over": "a chat's turn over a stopped one"}
_CHAT_TURNS = ("turn", "turn-over")
"""What a claimed item asks, as its log line says it."""


@dataclass(frozen=True)
class _Item:
    checkpoint_id: str
    graph: str
    kind: str
    payload: bytes
    base_version: int | None
    attempt: int
    handbacks: int
    token: str
    stalls: int
    """Claims of this work in a row that found the run where the previous one did (no progress between)."""
    submitted_at: float | None = None
    """When it was queued, on the store's clock: a resume's answers were given then (a pause's deadline after it
    still takes them, however long the work waited for a worker)."""




class _Progress:
    """What one attempt did to the run, followed by an `on_checkpoint` callback: the version it last wrote
    (None: it wrote nothing). Its first write — the claim — is also noted on the queue row, so whoever
    waits for the claim (the service) knows this worker wrote it, not another process answering the run."""

    def __init__(self, queue: Any = None, item: _Item | None = None) -> None:
        self.version: int | None = None
        self._queue, self._item = queue, item

    def on_checkpoint(self, event: Any) -> None:
        first = self.version is None
        self.version = event.data
        if first and self._queue is not None and self._item is not None:  # beside the run: it never waits
            task = asyncio.create_task(self._note(self._item, event.data))
            _NOTES.add(task)  # held until done (the loop keeps only weak references to tasks)
            task.add_done_callback(_NOTES.discard)

    async def _note(self, item: _Item, version: int) -> None:
        try:
            await self._queue._claimed(item.checkpoint_id, item.token, version)
        except Exception as err:  # noqa: BLE001 - a note for waiters only; the run goes on
            log.warning("run '%s': noting the claim on the queue row failed (%s)", item.checkpoint_id, err)


class Worker:
    """Runs queued work for `graphs` (compiled graphs on `store`, told apart by name) from `store`'s queue.

    `concurrency`: runs at once; `poll`: seconds between looks at the queue when idle (Postgres also
    wakes it by NOTIFY); `lease_seconds`: how long its claims last unrenewed (default: twice the graphs'
    longest lease — a claim only matters before a run's first write and after its last one, the run's
    own lease covers the rest); `drain_seconds`: how long `stop()` lets runs in flight finish their step before
    stopping them where they are; `max_attempts`: claims of one request that ended without an outcome or a hand-back (a worker died
    with it) in a row without the run moving on, after which it is recorded as an error instead of run
    again — a run that kills every worker that takes it must not take the fleet down one by one;
    `serializer`: the queue's codec (the one `RunQueue` used to submit); `recover`: also continue runs of
    `graphs` whose process died and that nobody queued (module docstring), giving a run up after
    `max_attempts` takeovers in a row without progress."""

    def __init__(self, store: Any, graphs: Sequence[Any] | Mapping[str, Any], *, concurrency: int = 8,
                 poll: float = 1.0, lease_seconds: float | None = None, drain_seconds: float = 30.0,
                 max_attempts: int = 10, serializer: Any = None, name: str | None = None,
                 recover: bool = True) -> None:
        self.queue = RunQueue(store, serializer=serializer)
        self.store = store
        self.graphs = _by_name(store, graphs)
        self.runners = runners_of(self.graphs, store)
        """The agents' Runners, by graph name: they take a chat's queued inputs (stores/_worker_turns.py)."""
        if concurrency < 1 or poll <= 0:
            raise ValueError(f"Worker: concurrency must be >= 1 and poll > 0, got {concurrency} and {poll}")
        self.concurrency = concurrency
        self.poll = poll
        self.lease_seconds = lease_seconds or 2 * max(app.lease_seconds for app in self.graphs.values())
        self.drain_seconds = drain_seconds
        self.max_attempts = max_attempts
        self.recover = recover
        self.name = name or f"worker:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        _check_pool(store, self.name)
        self._tasks: dict[asyncio.Task, _Item] = {}
        self._foreign: dict[str, float] = {}
        """Runs written by another version of a graph of this worker's, and until when (monotonic) they are
        left to the workers that serve that version."""
        self._wake: asyncio.Event | None = None
        self._let_go: set[str] = set()
        """Tokens of claims handed back while their work task still runs (its run's lease was lost)."""
        self._stopping = False
        self._cancel_now = False
        self.shutdown = Shutdown()
        """What the runs in flight belong to: stopping the worker stops them for a shutdown, not as a cancel."""
        self.finished = 0
        """Work items this worker recorded as done."""

    @property
    def active(self) -> int:
        """Runs in flight."""
        return len(self._tasks)

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming work; drain the runs in flight — each stops at its next step boundary, within
        `drain_seconds` (with `now=True` at once, where it is) — and hand their work back. A stop is no decision
        about a run: none is stored as cancelled, each is left `running` with its lease ended for the next worker
        (engine/keep/shutdown.py). Call it on the worker's loop (a signal handler installed with
        `loop.add_signal_handler` is)."""
        self._stopping = True
        self.shutdown.request()
        if now:
            self._cancel_now = True
            self.shutdown.cancel(self._tasks)
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Work until `stop()`; returns once every run in flight ended or was handed back to the queue."""
        self._wake = wake = asyncio.Event()
        listening: Any = None
        keeper = asyncio.create_task(self._keep_claims())
        recovery = asyncio.create_task(self._recover()) if self.recover else None
        claims, listens = Backoff(self.poll), Backoff(self.poll)
        try:
            while not self._stopping:
                wake.clear()
                free = self.concurrency - len(self._tasks)
                claimed: list[tuple] = []
                if free > 0 and await self._ready(claims):  # renewals first: no run is taken that could not be kept
                    if self.queue._notifies and (listening is None or not listening.alive()) and not self._stopping:
                        listening = await self._listen(listening, wake, listens)
                    # each of these may wait for a connection a starved database has none of: a stop asked for
                    # meanwhile is not kept waiting for one more
                    claimed = await self._claim(free, claims) if not self._stopping else []
                if claims.failing and not self._tasks:  # the database refuses us: give back what we hold, for others
                    listening = await self._give_back(listening)
                for row in claimed:
                    self._start(_Item(*row))
                if len(claimed) < free or free <= 0:
                    soon = [b.delay for b in (claims, listens) if b.failing]
                    await _wait(wake, min([self.poll, *soon]))
            await self._drain()
        finally:
            for task in (keeper, recovery):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (keeper, recovery) if t is not None), return_exceptions=True)
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(t for t in list(_NOTES) if t.get_loop() is loop), return_exceptions=True)
            if listening is not None:
                await listening.close()
            # only a courtesy (the row's hold expires by itself): a starved database does not hold the exit up
            await _quietly(asyncio.wait_for(self.queue._absent(self.name), _ABSENT_SECONDS))

    # --- the loop's parts ------------------------------------------------------------------------------

    async def _listen(self, old: Any, wake: asyncio.Event, backoff: Backoff) -> Any:
        """(Re)open the LISTEN connection; None while the database cannot be reached (tried again later)."""
        if old is not None:
            log.warning("worker %s: the LISTEN connection was lost (a database restart?); listening again", self.name)
            await old.close()
        try:
            listening = await self.queue._listen(wake.set)
        except Exception as err:  # noqa: BLE001 - the database may come back; claims are polled meanwhile
            delay = backoff.fail()
            if backoff.say():
                log.warning("worker %s: cannot listen for new work (%s: %s); trying again in %.1f s (said again "
                            "every %.0f s while it lasts)", self.name, type(err).__name__, err, delay, SAY_EVERY)
            return None
        backoff.ok()
        return listening

    async def _ready(self, backoff: Backoff) -> bool:
        """Whether this process can renew the leases of what it would claim: the store's connection for renewals
        is held (taken now if need be). False — said, and tried again after a backoff — when the database refuses
        it: a worker that could not keep a run's lease must not take the run."""
        try:
            await asyncio.wait_for(reserve_renewals(self.store), _RESERVE_SECONDS)
        except Exception as err:  # noqa: BLE001 - the database may come back or free a connection: look again soon
            delay = backoff.fail()
            if backoff.say():
                log.warning("worker %s: claiming work failed: it has no connection for lease renewals (%s: %s), and "
                            "a run it could not keep it must not take; trying again in %.1f s (said again every "
                            "%.0f s while it lasts)", self.name, type(err).__name__, err, delay, SAY_EVERY)
            return False
        return True

    async def _give_back(self, listening: Any) -> None:
        """Idle and refused by the database: close every connection this worker holds (its LISTEN, its pools, the
        one for renewals), so that a fleet short of connections gives them to a worker that can work."""
        if listening is not None:
            await listening.close()
        forget_renewals(self.store)
        try:
            await self.store.close()
        except Exception as err:  # noqa: BLE001 - closing what may already be gone
            log.warning("worker %s: closing its idle connections failed (%s)", self.name, err)
        return None

    async def _claim(self, free: int, backoff: Backoff) -> list[tuple]:
        try:
            claimed = await self.queue._claim(self.name, sorted(self.graphs), free, self.lease_seconds,
                                              self._skipped())
        except Exception as err:  # noqa: BLE001 - the database may come back; look again soon
            delay = backoff.fail()
            if backoff.say():
                log.warning("worker %s: claiming work failed (%s: %s); trying again in %.1f s (said again every "
                            "%.0f s while it lasts)", self.name, type(err).__name__, err, delay, SAY_EVERY)
            return []
        backoff.ok()
        return claimed

    def _skipped(self) -> list[str]:
        """Runs this worker does not claim now: those another shape of their graph wrote (for a while), and those
        it still has a task for — a claim handed back while its task is inside a node is for another worker,
        or for this one once that task ended."""
        now = time.monotonic()
        for cid in [c for c, until in self._foreign.items() if until <= now]:
            del self._foreign[cid]
        return [*self._foreign, *{item.checkpoint_id for item in self._tasks.values()}]

    def _start(self, item: _Item) -> None:
        log.info("worker %s: claimed run '%s': %s (graph '%s'), attempt %d", self.name, item.checkpoint_id,
                 _WHAT.get(item.kind, item.kind), item.graph, item.attempt)
        task = asyncio.create_task(self._work(item), name=f"waypoint-work:{item.checkpoint_id}",
                                   context=self.shutdown.context())
        self._tasks[task] = item
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        item = self._tasks.pop(task, None)
        if item is not None:
            self._let_go.discard(item.token)
        if self._wake is not None:
            self._wake.set()

    async def _keep_claims(self) -> None:
        """Renew the claims of the work in flight — only those whose run this process still holds — and say which
        graphs this worker serves. A claim whose run's lease this process lost (refused, or run out) is handed
        back at once, even while its task is still inside a node: the run goes on elsewhere (or already ended),
        and whoever claims the work next plans from where the run is."""
        while True:
            try:  # each part on its own: one that meets a busy database must not keep the others from trying
                await self.queue._present(self.name, sorted(self.graphs), self.lease_seconds)
            except Exception as err:  # noqa: BLE001 - said; the next look tries again
                log.warning("worker %s: saying which graphs it serves failed (%s)", self.name, err)
            for task, item in list(self._tasks.items()):
                lost = lost_lease(task)
                if lost is not None and item.token not in self._let_go:
                    self._let_go.add(item.token)
                    await self._hand_back(item, 0.0, str(lost), counts=not lost.database)
            tokens = [item.token for item in self._tasks.values() if item.token not in self._let_go]
            try:
                if tokens:
                    await self.queue._renew(tokens, self.lease_seconds)
            except Exception as err:  # noqa: BLE001 - the runs' own leases still protect them
                log.warning("worker %s: renewing its claims failed (%s)", self.name, err)
            await asyncio.sleep(self.lease_seconds / 3)

    async def _recover(self) -> None:
        """Queue the continuation of this worker's graphs' runs whose process died (engine/keep/recovery.py), and the
        turns of chats' inputs nobody took (stores/_worker_turns.py)."""
        async def execute(app: Any, meta: Any, *, resume: Any = None) -> str:
            try:
                await self.queue.resume(meta.checkpoint_id, resume, expected_version=meta.version, graph=app.name)
                said = "queued for the workers"
            except QueueError as err:  # work for it is queued or claimed already: the queue continues it
                if resume is not None:  # an answer queued for a due pause: the deadline is looked at again later
                    raise CheckpointConflict(f"run '{meta.checkpoint_id}' has work queued already ({err}); its "
                                             "due pause is looked at again once that work is done") from None
                said = f"left to the queue ({err})"
            if self._wake is not None:
                self._wake.set()
            return said

        def woke() -> None:
            if self._wake is not None:
                self._wake.set()

        await asyncio.gather(
            recover(list(self.graphs.values()), watch=True, every=self.poll, concurrency=self.concurrency,
                    max_attempts=self.max_attempts, execute=execute),
            take_waiting_inputs(self.queue, self.runners, lambda: {i.checkpoint_id for i in self._tasks.values()}, woke))

    async def _drain(self) -> None:
        if self._tasks and not self._cancel_now:
            await asyncio.wait(set(self._tasks), timeout=self.drain_seconds)
        self.shutdown.cancel(list(self._tasks))  # still inside a step: stopped where they are, not cancelled
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- one work item ----------------------------------------------------------------------------------

    async def _work(self, item: _Item) -> None:
        """One item, from claim to outcome or hand-back. Never dies silently with its row claimed."""
        cid, seen = item.checkpoint_id, _Progress(self.queue, item)
        try:
            await self._settle(item, seen)
        except asyncio.CancelledError:  # draining: the engine left the run as last saved; another worker continues it
            await _shielded(self._hand_back(item, 0.0, "this worker is stopping"))
            raise
        except Exception as err:  # noqa: BLE001 - a bug or an unexpected error: say so, let another try
            log.exception("worker %s: work for run '%s' failed unexpectedly (%s); handing it back", self.name, cid,
                          err)
            await self._hand_back(item, _BACKOFF[1], f"{type(err).__name__}: {err}", counts=True)

    async def _settle(self, item: _Item, seen: _Progress) -> None:
        cid = item.checkpoint_id
        if item.stalls > self.max_attempts:
            last = await self.queue.status(cid)  # the row keeps why the last claim was handed back, if it said
            why = last.error if last is not None else None
            cause = (f"the last one was handed back because: {why}" if why else
                     "each worker that took this work stopped (killed, crashed or cut off) before recording an "
                     "outcome")
            error = (f"run '{cid}': gave up after {self.max_attempts} attempts in a row without progress (none moved "
                     f"the run on past its claim; {cause}); look at the run's history, fix the cause, and queue it "
                     f"again (queue.resume({cid!r}) continues it)")
            await self._record(item, "error", error, None, None)
            await self._give_up_run(item, error)
            return
        try:
            outcome, error, result, version = await self._do(item, seen)
        except StoreUnavailable as err:  # the database, not the run: back in the queue after a backoff
            delay = min(_BACKOFF[0] * 2 ** item.handbacks, _BACKOFF[1])
            await self._hand_back(item, delay, str(err))
            return
        except LeaseLost as err:  # this worker lost the run it was running: a failed attempt, unless the database
            await self._hand_back(item, 0.0, str(err), counts=not err.database)  # failed to renew it
            return
        except CheckpointConflict as err:  # another process holds the run: taken again once it lets go
            await self._hand_back(item, 0.0, str(err))
            return
        except ProcessStopping as err:  # this worker is stopping: the run stopped at a step boundary, for the next
            await self._hand_back(item, 0.0, str(err))
            return
        except GraphMismatch as err:  # another shape of this graph wrote the run (a rolling deploy): not ours
            log.warning("worker %s: run '%s' was written by another version of graph '%s' than this worker's; "
                        "handed back for a worker that serves that version (this one leaves it alone for %.0f s)",
                        self.name, cid, item.graph, _FOREIGN_SECONDS)
            if len(self._foreign) >= _FOREIGN_MAX:
                del self._foreign[next(iter(self._foreign))]
            self._foreign[cid] = time.monotonic() + _FOREIGN_SECONDS
            await self._hand_back(item, 0.0, str(err))
            return
        await self._record(item, outcome, error, result, version)
        await self._next_input(item, outcome, version)

    async def _next_input(self, item: _Item, outcome: str, version: int | None) -> None:
        """Once an agent's turn is recorded: queue the turn of the chat's next queued input, for any worker. Not
        after an input's work that took none (or failed before its turn), which would queue the same again."""
        runner = self.runners.get(item.graph)
        if runner is None or (item.kind == "input" and (outcome == "error" or version == item.base_version)):
            return
        try:
            if await queue_next_input(self.queue, runner, item.graph, item.checkpoint_id) and self._wake is not None:
                self._wake.set()
        except Exception as err:  # noqa: BLE001 - said at once: the inputs wait until the chat's next turn ends
            log.error("worker %s: run '%s': its queued inputs could not be handed on (%s: %s); they run after the "
                      "chat's next turn", self.name, item.checkpoint_id, type(err).__name__, err)

    async def _give_up_run(self, item: _Item, error: str) -> None:
        """Store the run failed with why, if it is still `running` and nobody holds it — else recovery would
        continue what the queue gave up."""
        try:
            await give_up(self.graphs[item.graph], item.checkpoint_id, error)
        except Exception as err:  # noqa: BLE001 - the row says it was given up; recovery's own count still holds
            log.warning("worker %s: run '%s' was given up but could not be stored as failed (%s)", self.name,
                        item.checkpoint_id, err)

    async def _do(self, item: _Item, seen: _Progress) -> tuple[str, str | None, bytes | None, int | None]:
        """Plan and run one item: (outcome, error, encoded result, the version it left the run at). Every run
        is a compare-and-set on the version the plan was made from."""
        app = self.graphs[item.graph]
        cid = item.checkpoint_id
        try:
            value = self.queue.serializer.loads(item.payload)
            turn = None
            if item.kind in _CHAT_TURNS:  # a chat's turn: its messages, and how many came before the turn
                value, turn = value["messages"], {"kept": int(value["kept"])}
            if item.kind == "input":  # the chat's next queued input: its own turn (or the one a worker died in)
                taken = await self._turn(item, seen)
                if taken is not None:
                    return taken
                input, resume, before = None, None, (await self.store.history(cid, limit=1))[0].version
            elif item.attempt == 1:  # nothing touched the run for this request yet: do what was asked
                before = item.base_version
                input, resume = (None, value) if item.kind == "resume" else (value, None)
            else:  # a worker died, drained or handed it back after writing: see where the run is
                snap = await app.get_run(cid)
                plan = plan_retry(item, value, snap)
                if plan is NOTHING:
                    return self._resting(snap)
                input, resume = plan
                before = snap.meta.version if snap is not None else None
            # "start-over" (submit with force_new_run): a new run over a paused or failed one — until it wrote
            over = item.kind in ("start-over", "turn-over") and before == item.base_version
            if turn is not None and input is not None:  # where the turn began: what a rollback input goes back to
                kept = turn["kept"]
                input, start = going_on(app, input[:kept], input[kept:]) if 0 < kept <= len(input) else (input, {})
                given_turn = {"turn": turn, **start}
            else:
                given_turn = {}
            relay = Relay(self.store, cid, app.name)  # its tokens, for readers on any service
            try:
                given = {"answered_at": item.submitted_at} if resume is not None and item.kind == "resume" else {}
                output = await app.ainvoke(input, checkpoint_id=cid, resume=resume, expected_version=before,
                                           callbacks=[seen, relay], force_new_run=over, **given, **given_turn)
            except GraphInterrupted as paused:
                return ("interrupted", None, self._encode({c.id: c.info for c in paused.info.contexts}),
                        seen.version)
            except CheckpointConflict as err:
                return await self._conflict(item, err, seen)
            except RunCancelled as err:  # a person's cancel: the run is stored cancelled, and this work is done
                return "interrupted", str(err), None, seen.version
            except (StoreUnavailable, GraphMismatch, ProcessStopping, asyncio.CancelledError):
                raise
            except Exception as err:  # noqa: BLE001 - recorded on the queue row for whoever waits
                return await self._failed(cid, before, err)
            finally:
                await relay.aclose()
            return "completed", None, self._encode(output), seen.version
        except (CheckpointConflict, StoreUnavailable, GraphMismatch, ProcessStopping, asyncio.CancelledError):
            raise
        except CheckpointNotFound as err:
            return "error", str(err), None, None
        except Exception as err:  # noqa: BLE001 - unreadable run or payload: say so on the row
            return "error", f"{type(err).__name__}: {err}", None, None

    async def _turn(self, item: _Item, seen: _Progress) -> tuple[str, str | None, bytes | None, int | None] | None:
        """The turn of the chat's next queued input (`Runner.drain`, one turn), or None while the chat is `running`:
        a worker died inside a turn, which is continued first (as a resume with no answers)."""
        cid, app = item.checkpoint_id, self.graphs[item.graph]
        snap = await app.get_run(cid)
        if snap is None:
            raise CheckpointNotFound(f"run '{cid}' was deleted while its queued input waited")
        if snap.meta.status == "running":
            return None
        relay = Relay(self.store, cid, app.name)  # its tokens, for readers on any service
        try:
            async for event in self.runners[item.graph].drain(cid, turns=1, callbacks=[seen, relay]):
                err = event.error
                if isinstance(err, (StoreUnavailable, GraphMismatch, ProcessStopping, LeaseLost)):
                    raise err
                if isinstance(err, RunCancelled):  # a person's cancel: stored cancelled, and this work is done
                    return "interrupted", str(err), None, seen.version
                if err is not None:
                    return await self._failed(cid, snap.meta.version, err)
        finally:
            await relay.aclose()
        return self._resting(await app.get_run(cid))

    async def _conflict(self, item: _Item, err: CheckpointConflict, seen: _Progress) -> tuple[str, str, None, int]:
        """The run is not this worker's to run now. On a first attempt (nothing of this request ran yet) a run
        that moved past the version the request was queued for has moved on: an outcome — the request was not
        applied, so a late answer never answers a later pause. Otherwise someone holds the run (another process,
        or an earlier attempt of this very request whose worker lost its claim but lives): raise, and the work
        is handed back and planned again from the run once that process lets go."""
        newest = await self.store.history(item.checkpoint_id, limit=1)
        meta = newest[0] if newest else None
        if item.attempt > 1 or meta is None or meta.version == item.base_version or seen.version is not None:
            raise err
        return ("error", f"run '{item.checkpoint_id}' moved on since this {item.kind} was queued (at version "
                f"{item.base_version}; now {meta.status} at version {meta.version}): it was not applied. Read its "
                f"status and queue what it needs now ({err})", None, meta.version)

    def _resting(self, snap: Any) -> tuple[str, str | None, bytes | None, int | None]:
        """An earlier attempt brought the run to rest but died before recording it."""
        if snap is None:
            return "error", "the run was deleted while its work was queued", None, None
        status, version = snap.meta.status, snap.meta.version
        if status == "completed":
            return status, None, self._encode(snap.output), version
        if status == "interrupted":
            return status, None, self._encode({c.id: c.info for c in snap.interrupts.contexts}), version
        return status, snap.meta.error, None, version

    async def _failed(self, cid: str, before: int | None, err: Exception) -> tuple[str, str, None, int | None]:
        newest = await self.store.history(cid, limit=1)
        stored_failed = bool(newest) and newest[0].status == "failed" and newest[0].version != before
        version = newest[0].version if newest else None
        return ("failed" if stored_failed else "error"), f"{type(err).__name__}: {err}", None, version

    async def _record(self, item: _Item, outcome: str, error: str | None, result: bytes | None,
                      version: int | None) -> None:
        """The outcome on the row, while this claim holds it; a database error is tried again, never dropped."""
        recorded = await self._persist(
            f"recording the outcome of run '{item.checkpoint_id}'",
            lambda: self.queue._finish(item.checkpoint_id, item.token, outcome, error, result, version))
        if recorded:
            self.finished += 1

    async def _hand_back(self, item: _Item, delay: float, why: str, *, counts: bool = False) -> None:
        """Queue the work again for any worker after `delay` seconds; `counts`: as a failed attempt."""
        log.log(logging.WARNING if counts else logging.INFO, "worker %s: handing run '%s' back to the queue: %s",
                self.name, item.checkpoint_id, why)
        await self._persist(f"handing run '{item.checkpoint_id}' back", lambda: self.queue._release(
            item.checkpoint_id, item.token, delay=delay, counts=counts, why=why))

    async def _persist(self, what: str, write: Any) -> Any:
        """`write()`, tried again on `StoreUnavailable` while this worker's claim may still hold (its claims
        are renewed as long as this task lives); afterwards the claim lapses and the row is claimable."""
        backoff, started = Backoff(self.lease_seconds / 3), time.monotonic()
        for _ in range(64):
            try:
                return await write()
            except StoreUnavailable as err:
                delay = backoff.fail()
                if time.monotonic() - started + delay > self.lease_seconds:  # the tries' own waits count too
                    break
                log.warning("worker %s: %s failed (%s); trying again in %.1f s", self.name, what, err, delay)
                await asyncio.sleep(delay)
        log.error("worker %s: %s failed until its claim lapsed; another worker takes the work up", self.name, what)
        return None

    def _encode(self, value: Any) -> bytes | None:
        try:
            return self.queue.serializer.dumps(value, root="result")
        except Exception as err:  # noqa: BLE001 - the run is fine; only the copy on the queue row is missing
            log.warning("worker %s: a result could not be encoded for the queue row: %s", self.name, err)
            return None


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


def _check_pool(store: Any, name: str) -> None:
    """On Postgres the LISTEN connection holds one connection of the worker loop's pool for good: a pool
    of one leaves none for the runs, and the worker would run nothing."""
    options = getattr(store, "_options", None)
    if getattr(store, "dialect", None) != "postgresql" or options is None:
        return
    size = options.get("pool_size", 5) + options.get("max_overflow", 10)
    if size < 2:
        raise QueueError(f"worker {name}: a pool of {size} connection per event loop leaves none for runs (the "
                         "LISTEN connection holds one for good); give it at least 2 (waypoint worker --pool 2)")


async def _wait(event: asyncio.Event, timeout: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        pass


async def _quietly(coro: Any) -> None:
    try:
        await coro
    except Exception as err:  # noqa: BLE001 - stopping anyway; the row's hold expires by itself
        log.warning("worker: %s", err)


async def _shielded(coro: Any) -> Any:
    """Finish `coro` even though this task is being cancelled (a hand-back must land)."""
    task = asyncio.ensure_future(coro)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        return await task
    except Exception as err:  # noqa: BLE001 - the claim then expires by itself
        log.warning("handing a claim back failed: %s", err)
        return None
