"""A run's life against its store: start or resume, claim, save per durability mode, finish.

The rules (docs/resume.md):

1. No store, or no `checkpoint_id`: the run is not recorded (an interrupt cannot be resumed).
2. Unknown ID: a new run. Completed: a new run on the same ID (the old versions stay as history).
3. Interrupted, failed, or running under an expired lease: `input=None` resumes it; new input is
   `CheckpointExists` unless `force_new_run=True`.
4. Running under a live lease: `CheckpointConflict` naming the owner, unless `takeover=True`.
5. Resuming first *claims* the run — writes version n+1 with status `running` and a lease, by
   compare-and-set — before any node runs; of two concurrent resumers exactly one succeeds.
6. `durability="step"` writes after every superstep / DAG task; `"interrupt"` only on a pause;
   `"exit"` on a pause, a failure and completion. A cancelled run is saved as `interrupted`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import (
    CheckpointConflict,
    CheckpointError,
    CheckpointExists,
    CheckpointNotFound,
    GraphInterrupted,
    GraphMismatch,
    SerializationError,
    UnknownInterrupt,
    WaypointError,
)
from .events import Emitter, Event
from .resume import ResumeRequest, pending_interrupt_ids
from .graph import END, START
from .runner import Run, RunInterrupted

if TYPE_CHECKING:
    from .checkpoint import Checkpointer, Loaded
    from .compiled import CompiledGraph

__all__ = ["RunOptions", "run_graph"]


@dataclass(kw_only=True)
class RunOptions:
    """Per-run options of ainvoke / astream / aevents."""

    checkpoint_id: str | None = None
    resume: Any = None
    force_new_run: bool = False
    write_to: str | None = None
    version: int | None = None
    takeover: bool = False
    max_steps: int | None = None
    migrate: Any = None
    """Called as `migrate(position, old_structure)` when the stored run was written by a different
    graph; it may edit the `RunPosition` (rename pending nodes, say) and return it. Without it, a
    different graph is a `GraphMismatch`."""


async def run_graph(graph: CompiledGraph, input: Any, opts: RunOptions, *, emitter: Emitter,
                    streaming: bool, sink: Any) -> Any:
    """Run `graph` on `input` (or resume it) under `opts`; returns the output or raises."""
    request = ResumeRequest.parse(opts.resume)
    run = Run(graph, emitter=emitter, streaming=streaming, sink=sink, max_steps=opts.max_steps)
    if graph.store is None or opts.checkpoint_id is None:
        _refuse_without_store(graph, opts, request)
        run.start(input)
        try:
            return await _execute(run, None)
        except GraphInterrupted as paused:
            await _announce(emitter, paused, run)
            raise
    session = _Session(graph, opts, emitter)
    await session.prepare(run, input, request)
    return await session.execute(run)


def _refuse_without_store(graph: CompiledGraph, opts: RunOptions, request: ResumeRequest | None) -> None:
    if graph.store is None and opts.checkpoint_id is not None:
        raise WaypointError(
            f"graph '{graph.name}': checkpoint_id={opts.checkpoint_id!r} was given but the graph was "
            "compiled without a store; compile(store=MemoryStore() or SQLiteStore(path))"
        )
    for name, value in (("resume", request), ("write_to", opts.write_to), ("version", opts.version)):
        if value is not None:
            raise WaypointError(f"graph '{graph.name}': {name}= needs a store and a checkpoint_id")
    if opts.takeover or opts.force_new_run:
        raise WaypointError(f"graph '{graph.name}': takeover/force_new_run need a store and a checkpoint_id")


async def _execute(run: Run, session: _Session | None) -> Any:
    try:
        return await run.execute()
    except RunInterrupted as paused:
        from .compiled import interrupt_info

        info = interrupt_info(paused.run.pos, paused.run.address)
        cid = session.target if session is not None else None
        raise GraphInterrupted(info, checkpoint_id=cid) from None


async def _announce(emitter: Emitter, paused: GraphInterrupted, run: Run) -> None:
    """The run-level interrupt event: sent only once the pause is durably saved (if it is saved)."""
    if emitter.active:
        await emitter.emit(Event("interrupt", (), paused.info, run.pos.step))


class _Session:
    """One ainvoke with a store and a checkpoint ID."""

    def __init__(self, graph: CompiledGraph, opts: RunOptions, emitter: Emitter) -> None:
        from .checkpoint import Checkpointer

        self.graph = graph
        self.opts = opts
        self.emitter = emitter
        self.source = opts.checkpoint_id
        self.target = opts.write_to or opts.checkpoint_id
        self.durability = graph.durability
        self.cp: Checkpointer = Checkpointer(
            store=graph.store, serializer=graph.get_serializer(), checkpoint_id=self.target,
            graph_structure=graph.structure, lease_seconds=graph.lease_seconds,
        )
        self.last_status: str | None = None
        self._renewer: asyncio.Task | None = None

    # --- start or resume ---------------------------------------------------------------------------

    async def prepare(self, run: Run, input: Any, request: ResumeRequest | None) -> None:
        """Decide new run vs resume, check everything, and claim the run when resuming."""
        opts, cp = self.opts, self.cp
        loaded = await self._load_source()
        newest = None
        if self.target != self.source or opts.version is not None:
            found = await self.graph.store.history(self.target, limit=1)
            newest = found[0] if found else None
            cp.version = newest.version if newest is not None else None
        head = newest if newest is not None else (loaded.meta if loaded else None)
        if head is not None:
            self._check_lease(head)
        if loaded is not None and loaded.meta.status == "completed" and opts.version is None \
                and input is None and request is None and not opts.force_new_run:
            raise CheckpointError(
                f"run '{self.source}' has completed; pass an input to start a new run on this ID "
                "(or force_new_run=True to start one with input None)"
            )
        if loaded is None or (loaded.meta.status == "completed" and opts.version is None and not request):
            if request is not None:
                raise CheckpointNotFound(
                    f"run '{self.source}' has no paused checkpoint to resume (it does not exist); "
                    "start it with an input instead of resume="
                )
            run.start(input)
            if loaded is not None:  # a completed run: a new run on the same ID, old versions kept
                cp.created_at = None
            if self.durability == "step":
                await self._save(run, "running")
            return
        meta = loaded.meta
        if opts.force_new_run:
            run.start(input)
            await self._save(run, "running")
            return
        if input is not None:
            raise CheckpointExists(
                f"run '{self.source}' is {meta.status} at version {meta.version} (step {meta.step}); "
                f"resume it with ainvoke(None, checkpoint_id={self.source!r}) or pass force_new_run=True "
                "to start over on this ID"
            )
        if meta.status == "completed" and opts.version is None:
            raise CheckpointError(f"run '{self.source}' has completed; there is nothing to resume")
        self._check_graph(loaded)
        self._check_resume(loaded, request)
        run.restore(loaded.position, request)
        await self._save(run, "running")  # the claim: compare-and-set before any node runs

    async def _load_source(self) -> Loaded | None:
        from .checkpoint import Checkpointer

        if self.source == self.target:
            loaded = await self.cp.load(self.opts.version)
        else:
            reader = Checkpointer(store=self.graph.store, serializer=self.cp.serializer,
                                  checkpoint_id=self.source, graph_structure=self.graph.structure)
            loaded = await reader.load(self.opts.version)
            self.cp.version = None
        if loaded is None and self.opts.version is not None:
            raise CheckpointNotFound(f"run '{self.source}' has no version {self.opts.version}")
        return loaded

    def _check_lease(self, head: Any) -> None:
        if head.status != "running" or self.opts.takeover:
            return
        if head.lease_expires is not None and head.lease_expires > time.time():
            raise CheckpointConflict(
                f"run '{head.checkpoint_id}' is running in another process (lease held by "
                f"{head.lease_owner} until {time.strftime('%H:%M:%S', time.localtime(head.lease_expires))}); "
                "wait for it, or pass takeover=True if you know that process is dead"
            )

    def _check_graph(self, loaded: Loaded) -> None:
        if loaded.meta.fingerprint == self.cp.fingerprint:
            return
        from .checkpoint import describe_difference

        change = describe_difference(loaded.structure, self.graph.structure)
        if self.opts.migrate is None:
            raise GraphMismatch(
                f"run '{self.source}' was written by a different graph: {change}; resume it with the graph "
                "that wrote it, pass migrate= to adapt it, or start a new run (force_new_run=True)"
            )
        migrated = self.opts.migrate(loaded.position, loaded.structure)
        if migrated is not None:
            loaded.position = migrated
        pos, nodes = loaded.position, self.graph.nodes
        unknown = sorted({*pos.pending, *pos.inbox, *pos.interrupts} - set(nodes) - {START, END})
        if unknown:
            raise GraphMismatch(
                f"run '{self.source}': after migrate=, the position still names node(s) {unknown} that the "
                f"graph does not have ({change})"
            )

    def _check_resume(self, loaded: Loaded, request: ResumeRequest | None) -> None:
        pos = loaded.position
        pending = pending_interrupt_ids(pos)
        if request is not None and request.ids:
            unknown = sorted(request.ids - set(pending))
            if unknown:
                raise UnknownInterrupt(
                    f"run '{self.source}': no pending interrupt has ID {', '.join(unknown)}; "
                    f"pending: {', '.join(pending) or 'none'}"
                )
        if request is None and pos.interrupts:
            raise UnknownInterrupt(
                f"run '{self.source}' is paused on interrupts {', '.join(pending)}; say which to resume: "
                "resume={id: data}, resume=[ids] or resume=True"
            )

    # --- running and saving ------------------------------------------------------------------------

    async def execute(self, run: Run) -> Any:
        run.checkpoint = self._on_step if self.durability == "step" else None
        if self.last_status == "running":
            self._start_renewer()
        try:
            output = await _execute(run, self)
        except GraphInterrupted as paused:
            if self.last_status != "interrupted":
                await self._save(run, "interrupted")
            await _announce(self.emitter, paused, run)
            raise
        except asyncio.CancelledError:  # resumable, with the cause recorded
            try:
                await self._save(run, "interrupted", error="cancelled", shield=True)
            except Exception:  # noqa: S110 - a cancelled task must end cancelled; the run stays resumable
                pass  # from its last saved step (its lease expires, or takeover=True)
            raise
        except CheckpointConflict:
            raise
        except Exception as err:
            if self.durability != "interrupt" or self.last_status == "running":
                await self._save(run, "failed", error=f"{type(err).__name__}: {err}")
            raise
        finally:
            self._stop_renewer()
        if self.last_status != "completed" and (self.durability != "interrupt" or self.last_status):
            await self._save(run, "completed")
        return output

    async def _on_step(self, run: Run, reason: str) -> None:
        # A paused task's siblings may still run: the run is `interrupted` only once it stops.
        status = "completed" if run.pos.done else "interrupted" if reason == "pause" else "running"
        await self._save(run, status)

    async def _save(self, run: Run, status: str, *, error: str | None = None, shield: bool = False) -> None:
        save = self._save_or_mark(run, status, error)
        meta = await (_finish_despite_cancel(save) if shield else save)
        if meta is None:
            return
        self.last_status = status
        if self.emitter.active:
            await self.emitter.emit(Event("checkpoint", (), meta.version, run.pos.step))

    async def _save_or_mark(self, run: Run, status: str, error: str | None) -> Any:
        try:
            return await self.cp.save(run.pos, status, error=error)
        except SerializationError:
            if status != "failed":
                raise
            # The position itself cannot be written: record the failure on the last good content.
            return await self.cp.mark(status, error=error)

    def _start_renewer(self) -> None:
        async def renew() -> None:
            interval = max(self.cp.lease_seconds / 3, 0.05)
            while True:
                await asyncio.sleep(interval)
                if self.cp.version is not None:
                    await self.cp.store.renew_lease(self.target, self.cp.version, self.cp.owner,
                                                    time.time() + self.cp.lease_seconds)

        self._renewer = asyncio.ensure_future(renew())

    def _stop_renewer(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None


async def _finish_despite_cancel(coro: Any) -> Any:
    """Await `coro` to the end even if this task is cancelled meanwhile (the save must land)."""
    task = asyncio.ensure_future(coro)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()
