"""`CompiledGraph`: a frozen, checked graph with the ways to run it.

`ainvoke` is the one real entry point; `invoke` bridges it for sync callers, `astream` yields
the output as chunks while nodes run in stream mode, and `aevents` yields node-level `Event`s.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import CheckpointNotFound, GraphInterrupted, WaypointError
from ..events import Emitter, Event
from ..keep import Checkpointer, RunOptions, cancel_point, request_cancel, run_graph, update_state
from ..run import (
    InterruptInfo,
    Pending,
    answered_ids,
    interrupt_info,
    pending_of,
    retire_failed_answers,
    standing_answers,
)
from ..shape import START, GraphShape
from .mermaid import render

__all__ = ["CompiledGraph", "RunSnapshot", "read_run"]

log = logging.getLogger("waypoint.run")


@dataclass(frozen=True, kw_only=True)
class RunSnapshot:
    """A stored run as `get_run` returns it."""

    meta: Any
    """The version's `CheckpointMeta`: status, step, version, timestamps, lease."""
    state: Any
    output: Any
    """The final output once the run completed, else None."""
    pending: tuple[str, ...]
    """Nodes that still have to run (or re-run)."""
    interrupts: InterruptInfo
    graph: str = ""
    """The name of the graph (or agent) that wrote it."""
    structure: dict[str, Any] = field(default_factory=dict)
    """That graph's structure as stored (nodes, edges, branches, trigger)."""
    trace: dict[str, str] = field(default_factory=dict)
    """The string map the run that wrote this version stored with it (`RunInfo.trace`: what its hooks put
    there, engine/events.py); empty when it stored none."""
    cancelled_by: Any = None
    """Who cancelled the run at this version, where and when (`CancelledBy`: `.by`, `.when`, `.at` on the store's
    clock), when a person's cancel stopped it (`cancel(...)`); None otherwise."""
    turn: dict[str, int] = field(default_factory=dict)
    """`{"input": n}`: the last queued input a turn on this ID took (`Runner.run(on_busy=)`); for an agent's turn,
    `"kept"`: how many messages of the conversation came before it. Empty when none was ever queued."""
    start_input: Any = None
    """The input the run was started with while none of its steps has finished yet (a run claimed, then stopped or
    its process killed before its first node ran): what a new turn that gives it up keeps. None after."""

    @property
    def waits_for(self) -> list[Pending]:
        """What the run waits for, one `Pending` per interrupt to answer (ID, tool, arguments, digest): empty once
        it completed, or when it waits for nothing (engine/run/pending.py)."""
        if self.meta.status == "completed":
            return []
        return [pending_of(ctx) for ctx in self.interrupts.contexts]


async def read_run(store: Any, checkpoint_id: str, *, version: int | None = None,
                   serializer: Any = None) -> RunSnapshot | None:
    """A stored run (newest or a given version), decoded without its graph; None if unknown.

    For tools that inspect a database (`waypoint runs`): the state's registered types must be importable
    (an agent's `AgentState` is), and a store written with a key needs that `serializer`. Raises
    `CheckpointCorrupted` when the record does not decode.
    """
    if serializer is None:
        from ..codec import default_serializer

        serializer = default_serializer
    reader = Checkpointer(store=store, serializer=serializer, checkpoint_id=checkpoint_id, graph_structure={})
    loaded = await reader.load(version)
    return None if loaded is None else _snapshot(loaded)


def _snapshot(loaded: Any) -> RunSnapshot:
    pos, structure = loaded.position, loaded.structure
    name = structure.get("name") if isinstance(structure, dict) else None
    graph = name if isinstance(name, str) else ""
    address, meta = f"runnable:{graph}", loaded.meta
    retire_failed_answers(pos, meta.status, address)
    answered = answered_ids(pos, standing_answers(pos, meta.status, meta.error), address)
    return RunSnapshot(meta=meta, state=pos.state, output=pos.output if pos.done else None,
                       pending=tuple(pos.pending), interrupts=interrupt_info(pos, address, answered),
                       graph=graph, structure=structure if isinstance(structure, dict) else {},
                       trace=dict(loaded.trace), cancelled_by=loaded.cancelled_by,
                       turn=dict(pos.turn), start_input=pos.pending.get(START))


class CompiledGraph:
    """A checked, immutable graph. Run it with `ainvoke` / `invoke` / `astream` / `aevents`."""

    agent: Any = None
    """The agent it was compiled from (`ChatModelAgent.compile`, a workflow agent's), else None: what takes a
    chat's queued input where only the compiled graph is at hand (`Runner.of`, a `waypoint worker`)."""

    def __init__(self, shape: GraphShape) -> None:
        self.shape = shape

    @property
    def name(self) -> str:
        return self.shape.name

    @property
    def store(self) -> Any:
        return self.shape.store

    @property
    def trigger(self) -> str:
        return self.shape.trigger

    @property
    def durability(self) -> str:
        return self.shape.durability

    @property
    def max_steps(self) -> int:
        return self.shape.max_steps

    @property
    def lease_seconds(self) -> float:
        return self.shape.lease_seconds

    @property
    def structure(self) -> dict[str, Any]:
        """The graph's shape as plain data (what a checkpoint's fingerprint is computed from)."""
        return self.shape.structure

    def get_serializer(self) -> Any:
        """The codec checkpoints are written with (the default one unless compile(serializer=...))."""
        return self.shape.get_serializer()

    # --- running ------------------------------------------------------------------------------------

    async def ainvoke(self, input: Any, *, callbacks: Sequence[Any] = (), **options: Any) -> Any:
        """Run the graph on `input` (or resume it) and return what reaches END.

        Options: `checkpoint_id`, `resume` ({id: data} | [ids] | True), `force_new_run`, `write_to`,
        `version`, `takeover`, `expected_version`, `max_steps`, `migrate` (docs/resume.md). Raises `NodeError` when a node fails,
        `GraphInterrupted` when the run pauses, `MaxStepsExceeded`, `GraphRunError`, and the
        checkpoint errors of `WaypointError`'s tree when the stored run does not allow it.

        Sync nodes run on a thread, so a blocking one never stalls the event loop (docs/architecture.md).
        """
        return await self._run(input, options, emitter=Emitter(callbacks), streaming=False, sink=None)

    def invoke(self, input: Any, *, callbacks: Sequence[Any] = (), **options: Any) -> Any:
        """`ainvoke` for synchronous callers. Refuses to run inside a running event loop. The run has its
        event loop to itself, so sync nodes run on it directly (no thread hop)."""
        return run_sync(lambda: self._run(input, options, emitter=Emitter(callbacks), streaming=False, sink=None,
                                          offload_sync=False), what=f"graph '{self.name}'.invoke()")

    async def astream(self, input: Any, *, callbacks: Sequence[Any] = (), **options: Any) -> AsyncIterator[Any]:
        """Run every node in stream mode and yield the output chunks that reach END, as they come.

        Takes the options of `ainvoke`; ends by raising what the run raised. Closing the stream
        (`aclose()`, or leaving the loop early and dropping it) cancels the run at once; with a store
        it is saved as cancelled at its last finished step."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        run = self._run(input, options, emitter=Emitter(callbacks), streaming=True, sink=queue.put_nowait)
        async with contextlib.aclosing(_drain(run, queue)) as items:  # closing this stream cancels the run now
            async for item in items:
                yield item

    async def aevents(self, input: Any, *, callbacks: Sequence[Any] = (), streaming: bool = True,
                      **options: Any) -> AsyncIterator[Event]:
        """Run the graph and yield every node-level `Event` (start, chunk, end, error, interrupt,
        checkpoint). Takes the options of `ainvoke`; ends by raising what the run raised.

        At most `EVENT_BUFFER` events other than chunks wait for the consumer: a consumer that stops reading
        (but keeps the iterator) holds the run at its next such event, so memory stays bounded by that and the
        chunks of the node in progress (part of its output anyway); the run keeps its lease meanwhile."""
        buffer = _EventBuffer(EVENT_BUFFER)
        run = self._run(input, options, emitter=Emitter(callbacks, sink=buffer.put),
                        streaming=streaming, sink=None)
        async with contextlib.aclosing(_drain(run, buffer)) as items:
            async for item in items:
                yield item

    async def _run(self, input: Any, options: dict[str, Any], *, emitter: Emitter, streaming: bool,
                   sink: Callable[[Any], None] | None, offload_sync: bool = True) -> Any:
        try:
            opts = RunOptions(**options)
        except TypeError:
            known = ", ".join(RunOptions.__dataclass_fields__)
            raise TypeError(f"graph '{self.name}': unknown run option(s) in {sorted(options)}; known: {known}") from None
        if opts.max_steps is not None and (self.trigger == "all" or opts.max_steps < 1):
            raise WaypointError(f"graph '{self.name}': max_steps={opts.max_steps!r} needs trigger='any' and a value >= 1")
        return await run_graph(self.shape, input, opts, emitter=emitter, streaming=streaming, sink=sink,
                               offload_sync=offload_sync)

    async def get_run(self, checkpoint_id: str, *, version: int | None = None) -> RunSnapshot | None:
        """What the store holds for a run (newest or a given version), decoded; None if unknown."""
        if self.store is None:
            raise WaypointError(f"graph '{self.name}': get_run() needs a graph compiled with a store")
        reader = Checkpointer(store=self.store, serializer=self.get_serializer(), checkpoint_id=checkpoint_id,
                              graph_structure=self.structure)
        loaded = await reader.load(version)
        return None if loaded is None else _snapshot(loaded)

    async def pending(self, checkpoint_id: str) -> list[Pending]:
        """What the stored run `checkpoint_id` waits for, without resuming it: one `Pending` per interrupt (its ID —
        what `resume={id: ...}` names —, the tool and arguments of the call it is about, the digest an answer binds
        to); empty when it waits for nothing (completed, running, failed or cancelled with nothing pending).
        Raises `CheckpointNotFound` when the store holds no such run."""
        if self.store is None:
            raise WaypointError(f"graph '{self.name}': pending() reads a stored run; compile the graph with a store")
        snap = await self.get_run(checkpoint_id)
        if snap is None:
            raise CheckpointNotFound(f"no run '{checkpoint_id}' in this store (graph '{self.name}'): check the ID, "
                                     "or start a run on it")
        return snap.waits_for

    async def update_state(self, checkpoint_id: str, values: Any, as_node: str | None = None, *,
                           version: int | None = None, expected_version: int | None = None,
                           goto: str | None = None, answer: dict[str, Any] | None = None) -> Any:
        """Edit a paused or finished run's state: `values` (a mapping of fields, or an `Update`) go through the
        fields' reducers and are written as the run's next version, by compare-and-set, with its origin
        (`"<id>@<version> update_state"`). `as_node` makes the edit that node's result: it does not run, and
        the run continues after it. `version` edits an older version. Returns the new `CheckpointMeta`.

        Under a later version of the graph than the one that wrote the run, the edit moves the run onto this one
        (origin `"<id>@<version> migrate ..."`): `goto="n"` continues it at node n where it is at a node this version
        no longer has; `answer={call_id: output}` answers a pending call whose tool this version removed (the tool
        never runs, the model reads `output`); `values` gives each state field that changed type its new value.

        Raises `CheckpointNotFound`, `CheckpointConflict` (a live lease, or a version written since
        `expected_version`), `GraphMismatch` (this version could not continue the run even so), and
        `GraphRunError` for a field the state does not have (docs/resume.md, "Editing a run's state", "Deploys")."""
        return await update_state(self.shape, checkpoint_id, values, as_node, version=version,
                                  expected_version=expected_version, goto=goto, answer=answer)

    async def cancel(self, checkpoint_id: str, *, when: str = "now", by: str | None = None) -> Any:
        """Ask whichever process executes the run `checkpoint_id` — this one or another, on this store — to stop it:
        `when="now"` where it is (a tool call in flight is abandoned; a continuation runs it again, flagged rerun),
        `"after_step"` at the next step boundary, `"after:<node>"` at the first one after that node finished (in this
        graph or a graph nested in it). It is then stored cancelled at its last finished step, with who asked (`by`,
        default `user@host`), and continues from there when resumed. Returns the recorded `CancelRequest` at once;
        the run stops within about half a second of it (engine/keep/cancel.py). Raises `NotRunning` when no process
        executes the run now, `CheckpointNotFound` for an unknown run."""
        if self.store is None:
            raise WaypointError(f"graph '{self.name}': cancel() stops a stored run; compile the graph with a store")
        when = cancel_point(checkpoint_id, when, self.structure)
        return await request_cancel(self.store, checkpoint_id, when=when, by=by)

    def with_store(self, store: Any, *, durability: str | None = None) -> CompiledGraph:
        """The same graph (nodes, options, codec) recording to `store` instead (`durability` defaults to
        the compiled one, or "step" when the graph was compiled without a store)."""
        shape = copy.copy(self.shape)
        shape.store = store
        if durability is not None or self.shape.store is None:
            shape.durability = durability or "step"
        other = CompiledGraph(shape)
        other.agent = self.agent
        return other

    # --- pictures -------------------------------------------------------------------------------------

    def to_mermaid(self) -> str:
        """A Mermaid flowchart of the graph: edges solid, branch routes dotted and labelled."""
        shape = self.shape
        return render({k: n.subgraph is not None for k, n in shape.nodes.items()}, shape.edges,
                      ((b.source, b.ends) for b in shape.branches))


EVENT_BUFFER = 1000
"""How many events `aevents()` holds for a consumer that has not read them yet."""


class _EventBuffer(asyncio.Queue):
    """The events waiting for an `aevents()` consumer: a chunk never waits (a live stream must reach its
    reader, who may be waiting for its end); any other event waits while `limit` of them are unread."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._space = asyncio.Semaphore(limit)

    async def put(self, event: Any) -> None:
        if event.kind != "chunk":
            await self._space.acquire()
        self.put_nowait(event)

    def get_nowait(self) -> Any:
        event = super().get_nowait()
        if event.kind != "chunk":
            self._space.release()
        return event


async def _drain(run: Any, queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """Yield what the run puts on `queue` while it runs; then re-raise what the run raised.

    The run is a task owned by this generator: if the consumer stops early, it is cancelled.
    """
    task = asyncio.ensure_future(run)
    getter: asyncio.Future | None = None
    read_to_end = False
    try:
        while True:
            while not queue.empty():
                yield queue.get_nowait()
            if task.done():
                break
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait((getter, task), return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
            getter = None
        read_to_end = True  # what the run raised reaches the consumer here
        task.result()
    finally:
        if getter is not None:
            getter.cancel()
        if not task.done():
            task.cancel()
            while not task.done():  # nobody reads any more: drop what the stopping run still emits
                while not queue.empty():
                    queue.get_nowait()
                await asyncio.wait((task,), timeout=0.05)
            await asyncio.gather(task, return_exceptions=True)
        elif not read_to_end and not task.cancelled() and (err := task.exception()) is not None:  # it left early:
            if not isinstance(err, GraphInterrupted):  # what it did not read is said here, not when the task is
                log.warning("a run ended in %s after its consumer stopped reading: %s",  # collected (a log line
                            type(err).__name__, err)                                   # at a random moment)


def run_sync(make: Callable[[], Any], *, what: str, instead: str = "await graph.ainvoke(...)") -> Any:
    """Run the coroutine `make()` to completion from sync code (the one sync bridge)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    raise WaypointError(f"{what} was called inside a running event loop; use the async form there: {instead}")
