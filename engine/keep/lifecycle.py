"""A run's life against its store: start or resume, claim, save per durability mode, finish.

The rules (docs/resume.md):

1. No store, or no `checkpoint_id`: the run is not recorded (an interrupt cannot be resumed).
2. Unknown ID: a new run. Completed: a new run on the same ID (the old versions stay as history).
3. Interrupted, failed, or running under an expired lease: `input=None` resumes it; new input is
   `CheckpointExists` unless `force_new_run=True`.
4. Running under a live lease: `CheckpointConflict` naming the owner, unless `takeover=True` — which is
   refused too while the owner provably lives: this process still executing the run, or a live PID on
   this host (engine/keep/owners.py). An owner on this host whose PID is gone may be taken over at once.
5. Resuming first *claims* the run — writes version n+1 with status `running` and a lease, by
   compare-and-set — before any node runs; of two concurrent resumers exactly one succeeds.
6. `durability="step"` writes after every superstep / DAG task; `"interrupt"` only on a pause;
   `"exit"` on a pause, a failure and completion. A cancelled run is saved as `interrupted`.
7. A failed or cancelled run is stored at its last finished step, state included (never with the
   changes of the step that failed), so a resume re-runs that step once.
8. The lease is renewed from a thread (engine/keep/lease.py) and judged on the store's clock; a run that lost
   it starts nothing more (`LeaseLost` before its next step or tool call) and writes nothing: every write is
   fenced by the store, in its own transaction, on the lease this run holds (engine/keep/store.py, guarantee 11).
   A run deleted or expired while it runs stays deleted: its next write is `CheckpointNotFound`.
9. Handlers' `on_run_start` runs once the run is read and checked, before its claim; `on_run_end` once
   the call ends, however it ends (engine/events.py). What `on_run_start` puts in `RunInfo.trace` is
   written with every version of this run, and the run that continues from one of them reads it.
10. A store that cannot be reached while the run saves (`StoreUnavailable`) leaves the run as it was last
    saved — `running`, never stored as failed — and ends its lease if the store lets it (else the lease
    runs out): another process resumes it or takes it over.
11. Continuing a `running` run (its process stopped) counts a takeover in its position
    (`RunPosition.takeovers`): one more in a row when nothing was written since the previous takeover's
    claim, else the first. Automatic recovery (engine/keep/recovery.py) gives a run up at `max_attempts`.
12. A run started inside a `Shutdown` (engine/keep/shutdown.py) that its process stops — a deploy, SIGTERM — stops
    at its next step boundary (`ProcessStopping`), or where it is when cancelled for the shutdown; either way it
    is left `running` as last saved with its lease ended, never stored as cancelled: the next process
    continues it at once. Only a person's cancel is stored as cancelled.
13. A person's cancel request (engine/keep/cancel.py), read by this process's lease thread, stops the run where it
    asks — its task cancelled now, or at the next step boundary (after a named node) of the run or a run nested in
    it — and stores it cancelled at its last finished step with who asked; the caller gets `RunCancelled`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from ..errors import (
    CheckpointConflict,
    CheckpointNotFound,
    GraphInterrupted,
    ProcessStopping,
    RunCancelled,
    StoreUnavailable,
    WaypointError,
)
from ..events import Emitter, Event, RunInfo, clean_trace
from ..run import (
    ResumeRequest,
    Run,
    RunInterrupted,
    interrupt_info,
)
from ..shape import GraphShape
from .admission import Admission, start_state
from .cancel import cancelled, safe_point
from .checkpoint import Checkpointer, Loaded
from .lease import LeaseKeeper, reserve
from .owners import executing
from .shutdown import Shutdown, current_shutdown

__all__ = ["RunOptions", "run_graph"]

log = logging.getLogger("waypoint.run")


@dataclass(kw_only=True)
class RunOptions:
    """Per-run options of ainvoke / astream / aevents."""

    checkpoint_id: str | None = None
    resume: Any = None
    force_new_run: bool = False
    write_to: str | None = None
    version: int | None = None
    takeover: bool = False
    expected_version: int | None = None
    """The version the caller read: the run is claimed only while that is still its newest version
    (checked by the claim's compare-and-set); otherwise `CheckpointConflict`, and nothing runs."""
    max_steps: int | None = None
    migrate: Any = None
    """Called as `migrate(position, old_structure)` when the stored run was written by a different
    graph; it may edit the `RunPosition` (rename pending nodes, say) and return it. Without it, a
    different graph is a `GraphMismatch`."""
    turn: dict[str, int] | None = None
    """A new run's `RunPosition.turn` (the Runner's: which queued input it takes, how much conversation it keeps);
    None: the last queued input taken is carried from the run it replaces."""
    answered_at: float | None = None
    """When the answers in `resume` were given, on the store's clock (a run queue stamps it as it queues them):
    a pause whose deadline came after that still takes them, however late they are applied."""
    start_state: Any = None
    """A new run's run-local state, instead of a fresh one from the graph's state factory (an instance of the same
    type). The `Runner` starts a chat's next turn from the conversation this way, so the turn's first version holds
    only its new messages as input, not the conversation again. Refused where the call continues a stored run."""


async def run_graph(graph: GraphShape, input: Any, opts: RunOptions, *, emitter: Emitter,
                    streaming: bool, sink: Any, offload_sync: bool = True) -> Any:
    """Run `graph` on `input` (or resume it) under `opts`; returns the output or raises."""
    request = ResumeRequest.parse(opts.resume)
    run = Run(graph, emitter=emitter, streaming=streaming, sink=sink, max_steps=opts.max_steps)
    run.offload_sync = offload_sync
    _check_ids(graph, opts)
    if graph.store is None or opts.checkpoint_id is None:
        _refuse_without_store(graph, opts, request)
        run.start(input, start_state(graph, opts))
        return await _observed(emitter, RunInfo(graph=graph.name), lambda: _unstored(run, emitter), lambda: None)
    session = _Session(graph, opts, emitter)
    with executing(session.cp.owner):  # a takeover in this process can tell this run is alive here
        await session.prepare(run, input, request)
        loaded = session.resumed_from
        info = RunInfo(graph=graph.name, checkpoint_id=session.target, resumed=loaded is not None,
                       resumed_from=loaded.meta.version if loaded is not None else None,
                       resume_ids=tuple(sorted(request.ids)) if request is not None else (),
                       previous_trace=loaded.trace if loaded is not None else {})
        return await _observed(emitter, info, lambda: session.run(run, info), lambda: session.cp.version)


async def _unstored(run: Run, emitter: Emitter) -> Any:
    try:
        return await _execute(run, None)
    except GraphInterrupted as paused:
        await _announce(emitter, paused, run)
        raise


async def _observed(emitter: Emitter, info: RunInfo, body: Any, version: Any) -> Any:
    """`body()` between the handlers' `on_run_start` and `on_run_end` (which sees how it ended)."""
    if not emitter.observes_runs:
        return await body()
    await emitter.run_hook("on_run_start", info)
    try:
        output = await body()
    except GraphInterrupted as paused:
        info.status, info.interrupts = "interrupted", paused.info
        raise
    except (asyncio.CancelledError, RunCancelled):
        info.status = "cancelled"
        raise
    except BaseException as err:
        info.status, info.error = "failed", err
        raise
    else:
        info.status = "completed"
        return output
    finally:
        info.version = version()
        await emitter.run_hook("on_run_end", info)


def _check_ids(graph: GraphShape, opts: RunOptions) -> None:
    for name, value in (("checkpoint_id", opts.checkpoint_id), ("write_to", opts.write_to)):
        if value is not None and (not isinstance(value, str) or not value):
            raise WaypointError(f"graph '{graph.name}': {name}={value!r} must be a non-empty string")
        if value is not None and (len(value) > MAX_ID or "\x00" in value or not _encodable(value)):
            raise WaypointError(f"graph '{graph.name}': {name}={value[:80]!r} must be at most {MAX_ID} characters of "
                                "text without NUL or unpaired surrogates (every store must be able to keep it)")


MAX_ID = 512
"""The longest checkpoint ID a run accepts."""


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _refuse_without_store(graph: GraphShape, opts: RunOptions, request: ResumeRequest | None) -> None:
    if graph.store is None and opts.checkpoint_id is not None:
        raise WaypointError(
            f"graph '{graph.name}': checkpoint_id={opts.checkpoint_id!r} was given but the graph was "
            "compiled without a store; compile(store=MemoryStore() or SQLiteStore(path))"
        )
    for name, value in (("resume", request), ("write_to", opts.write_to), ("version", opts.version),
                        ("expected_version", opts.expected_version)):
        if value is not None:
            raise WaypointError(f"graph '{graph.name}': {name}= needs a store and a checkpoint_id")
    if opts.takeover or opts.force_new_run:
        raise WaypointError(f"graph '{graph.name}': takeover/force_new_run need a store and a checkpoint_id")


async def _execute(run: Run, session: _Session | None) -> Any:
    try:
        return await run.execute()
    except RunInterrupted as paused:
        info = interrupt_info(paused.run.pos, paused.run.address)
        cid = session.target if session is not None else None
        raise GraphInterrupted(info, checkpoint_id=cid) from None


async def _announce(emitter: Emitter, paused: GraphInterrupted, run: Run) -> None:
    """The run-level interrupt event: sent only once the pause is durably saved (if it is saved)."""
    if emitter.active:
        await emitter.emit(Event("interrupt", (), paused.info, run.pos.step))


class _Session(Admission):
    """One ainvoke with a store and a checkpoint ID."""

    def __init__(self, graph: GraphShape, opts: RunOptions, emitter: Emitter) -> None:
        self.graph = graph
        self.opts = opts
        self.emitter = emitter
        self.source = opts.checkpoint_id
        self.target = opts.write_to or opts.checkpoint_id
        self.durability = graph.durability
        self.cp: Checkpointer = Checkpointer(
            store=graph.store, serializer=graph.get_serializer(), checkpoint_id=self.target,
            graph_structure=graph.structure, lease_seconds=graph.lease_seconds, state_schema=graph.state_schema,
        )
        self.last_status: str | None = None
        self.lease: LeaseKeeper | None = None
        self.snapshot: bytes | None = None  # durability != "step": the last finished step, encoded
        self.claiming = False  # prepare() decided the run is claimed (written `running`) before it runs
        self.head_created: float | None = None  # the created_at of the run written to, when it held one
        self.resumed_from: Loaded | None = None  # the stored version a resume continues from
        self.writing = asyncio.Lock()  # nested runs record their steps while the loop may write its own

    async def run(self, run: Run, info: RunInfo) -> Any:
        """Claim the run (when prepare() decided so), with the trace carrier the hooks gave it, and execute it."""
        self.cp.trace = clean_trace(info.trace)
        if self.claiming:
            await reserve(self.cp.store)  # renewals have their connection before the run is taken (engine/keep/lease.py)
            await self._save(run, "running")
        return await self.execute(run)

    async def execute(self, run: Run) -> Any:
        shutdown = await self._arm(run)
        try:
            try:
                output = await _execute(run, self)
            finally:
                if self.lease is not None:
                    self.lease.disarm()  # a cancel "now" read from here on cancels nothing: the run is left
        except GraphInterrupted as paused:
            if self.last_status != "interrupted":
                await self._save(run, "interrupted")
            await _announce(self.emitter, paused, run)
            raise
        except asyncio.CancelledError:
            await self._cancelled(shutdown)
            asked = self.lease.cancel if self.lease is not None else None
            if asked is not None and asked.when == "now" and not (shutdown is not None and shutdown.cancelling) \
                    and _uncancel() == 0:  # this was the person's cancel, and only that: say it as theirs
                raise cancelled(asked, self.target) from None
            raise
        except RunCancelled:  # a person's cancel, at a safe point: stored cancelled with what finished (rule 13)
            await self._save_stopped("interrupted", "cancelled", settled=run.pos if run.settled else None)
            raise
        except ProcessStopping:  # stopped at a step boundary for the process's shutdown (rule 12)
            await self._stand_down(release=True, settled=run.pos if run.settled else None)
            raise
        except (CheckpointConflict, CheckpointNotFound):  # the run is not ours any more: write nothing
            raise
        except StoreUnavailable as err:  # the store, not the run, failed: leave the run as last saved (rule 9)
            await self._stand_down()
            raise StoreUnavailable(
                f"run '{self.target}' stopped: its store failed ({err}). The run is left as it was last saved "
                f"(version {self.cp.version}, not marked failed); resume it with ainvoke(None, "
                f"checkpoint_id={self.target!r}) once the store is back, or let a worker take it over"
            ) from err
        except Exception as err:
            if self.durability != "interrupt" or self.last_status == "running":
                await self._save_stopped("failed", f"{type(err).__name__}: {err}")
            raise
        finally:
            if self.lease is not None:
                self.lease.stop()
        if self.last_status != "completed" and (self.durability != "interrupt" or self.last_status):
            await self._save(run, "completed")
        return output

    async def _arm(self, run: Run) -> Shutdown | None:
        """Wire the run to this session: where its steps, ledger entries and nested runs are written, its lease
        (kept from the lease thread, checked before every step and call) and the shutdown it belongs to."""
        run.checkpoint = self._on_step if self.durability == "step" else self._remember
        run.checkpoint_id = self.target
        run.step_key = lambda: (f"{self.target}~{run.pos.lineage}" if run.pos.lineage else self.target, run.pos.ledger)
        run.version = lambda: self.cp.version
        if self.durability != "step":
            await self._remember(run, "start")
        else:
            cp, pos = self.cp, run.pos
            run.ledger = lambda: (cp.store, cp.serializer, cp.checkpoint_id, pos.ledger, cp.owner, cp.created_at)
            run.progress = _Progress(self, run)
        if self.last_status != "running":
            return None
        self.lease = lease = LeaseKeeper(self.cp.store, self.target, self.cp.owner, self.cp.lease_seconds,
                                         lambda: self.cp.version, held_from=self.cp.sent)
        lease.start()
        run.before_step = run.lease_check = lease.check
        run.safe_point = safe_point(lambda: lease.cancel, self.target)
        lease.busy = self.writing.locked  # a cancel "now" never cuts a write that may still land
        shutdown, target = current_shutdown(), self.target
        if shutdown is not None:  # the process may stop: the run stops at a step boundary (rule 12)
            run.before_step = lambda: (lease.check(), shutdown.check(target))
        return shutdown

    async def _cancelled(self, shutdown: Shutdown | None) -> None:
        """The run's task is cancelled: by the process's shutdown, left as last saved with its lease ended (rule
        12); by a person, stored cancelled at its last finished step, resumable (rules 6 and 7)."""
        if shutdown is not None and shutdown.cancelling:
            await _finish_despite_cancel(self._stand_down(release=True))
            return
        try:
            await self._save_stopped("interrupted", "cancelled", shield=True)
        except Exception as err:  # noqa: BLE001 - a cancelled task must end cancelled; the run stays resumable
            log.warning("run '%s' was cancelled but could not be stored as cancelled (%s: %s); it stays as last "
                        "saved and is continued once its lease runs out", self.target, type(err).__name__, err)

    async def _stand_down(self, *, release: bool = False, settled: Any = None) -> None:
        """Stop running the run, written as it was last saved: its lease is ended now if the store lets us, so
        another process may continue it at once (rules 10 and 12). `release`: by writing the last step again under
        a lease that has run out (a shutdown: the next process's continuation is no takeover of a dead owner);
        else by ending the lease in place (the store failed: a write would not get through either). `settled`: the
        position, stopped at a step boundary with nothing under way: written instead of the last step (`release`)."""
        if self.lease is None:
            return
        self.lease.stop()
        if not release or not self.cp.holding:
            await self.lease.let_go()
            return
        try:
            async with self.writing:  # a nested run's write in flight lands first
                await self._wrote(await self.cp.release(settled))
        except (CheckpointConflict, CheckpointNotFound):  # the run is not ours any more: nothing to give up
            pass
        except Exception as err:  # noqa: BLE001 - the lease then runs out by itself; said, naming the run
            log.warning("run '%s' could not be left for the next process at once (%s: %s); it is continued once its "
                        "lease runs out", self.target, type(err).__name__, err)

    async def _on_step(self, run: Run, reason: str) -> None:
        # A paused task's siblings may still run: the run is `interrupted` only once it stops.
        status = "interrupted" if reason == "pause" else "completed" if run.pos.done else "running"
        if self.graph.trigger == "any":  # a new step begins: a fresh ledger page (a DAG runs each node once)
            run.pos.ledger = (self.cp.version or 0) + 1
        await self._save(run, status)

    async def _remember(self, run: Run, reason: str) -> None:
        """durability != "step": keep the finished step in memory, for a failure or a cancel to store."""
        self.snapshot = self.cp.snapshot(run.pos)

    async def _save(self, run: Run, status: str) -> None:
        if self.lease is not None and self.cp.holding:
            self.lease.check()  # past its deadline this process writes nothing (the store would refuse it later)
        pos = run.pos
        if pos.answers is not None and (status != "running" or not pos.interrupts):
            pos.answers = None  # every paused task they were for has run (or paused anew)
        async with self.writing:
            await self._wrote(await self.cp.save(pos, status, journal=run.journal))

    async def _save_stopped(self, status: str, error: str, *, shield: bool = False, settled: Any = None) -> None:
        """Store a failed or cancelled run at its last finished step (never with that step's changes), with who
        cancelled it when a person's cancel request did. `settled`: the position, stopped at a step boundary with
        nothing under way — it is written, its lists compared in full (the last version may hold a list presumed to
        only grow, whose items were changed in place since)."""
        error = _storable(error)  # an error may quote a model's text: any text must be storable
        asked = self.lease.cancel if self.lease is not None else None
        if error == "cancelled" and asked is not None:
            self.cp.cancelled_by = {"by": asked.by, "when": asked.when, "at": asked.requested_at}
        if settled is not None and self.durability == "step":
            save = self.cp.save(settled, status, error=error)
        elif self.durability == "step" or self.snapshot is None:
            save = self.cp.mark(status, error=error)
        else:
            save = self.cp.save(self.cp.from_snapshot(self.snapshot), status, error=error)
        save = _after(self.writing, save)  # a nested run's write in flight lands first
        await self._wrote(await (_finish_despite_cancel(save) if shield else save))

    async def _wrote(self, meta: Any) -> None:
        if meta is None:
            return
        self.last_status = meta.status
        if self.lease is not None:
            self.lease.wrote(self.cp.sent if meta.status == "running" else None)
        if self.emitter.active:
            await self.emitter.emit(Event("checkpoint", (), meta.version, meta.step, meta=meta))


class _Progress:
    """Nested runs' steps, recorded in the root run's checkpoint (`RunPosition.nested`, durability="step").

    A nested run (a subgraph node's, or one started by code in a task: engine/compose/nested.py) reports each of its
    finished steps; the root's position then holds it, encoded as it was at that step in parts of its own (only what
    the step changed is new: engine/keep/nested_parts.py), and a new version is written — with the root's ledger
    page unchanged, since the root's step is still the same. A task run again after a crash continues its nested
    run from there: nothing it finished runs again.
    """

    def __init__(self, session: _Session, root: Run) -> None:
        self.session = session
        self.root = root

    async def save(self, address: str, pos: Any) -> None:
        self.root.pos.nested[address] = self.session.cp.nested(address, pos)
        await self.session._save(self.root, "running")

    def drop(self, address: str) -> None:
        self.session.cp.forget(self.root.pos.nested.pop(address, None))

    def recall(self, address: str) -> Any:
        entry = self.root.pos.nested.get(address)
        return None if entry is None else self.session.cp.recall(entry)


async def _after(lock: asyncio.Lock, save: Any) -> Any:
    async with lock:
        return await save


def _storable(text: str) -> str:
    """`text` as every store can keep it: valid UTF-8 (an unpaired surrogate as `\\udXXX`), no NUL, clipped."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return text if len(text) <= 4000 else text[:4000] + "..."


def _uncancel() -> int:
    """Take back one cancellation of the calling task (its remaining count: 0 when nothing else cancelled it)."""
    task = asyncio.current_task()
    return task.uncancel() if task is not None else 1


async def _finish_despite_cancel(coro: Any) -> Any:
    """Await `coro` to the end even if this task is cancelled meanwhile (the save must land)."""
    task = asyncio.ensure_future(coro)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()
