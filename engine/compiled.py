"""`CompiledGraph`: a frozen, checked graph with the ways to run it.

`ainvoke` is the one real entry point; `invoke` bridges it for sync callers, `astream` yields
the output as chunks while nodes run in stream mode, and `aevents` yields node-level `Event`s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import GraphBuildError, GraphRunError, WaypointError
from .events import Emitter, Event
from .graph import END, START
from .interrupts import InterruptCtx, InterruptInfo, interrupt_id
from .nodes import NodeRunnable, _Fn, as_runnable
from .position import RunPosition
from .resume import static_pauses
from .retry import RetryPolicy

if TYPE_CHECKING:
    from .graph import Graph

__all__ = ["CompiledGraph", "RunSnapshot"]


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


@dataclass(frozen=True, slots=True)
class CBranch:
    """A compiled branch: resolves what the condition returned into target node keys."""

    condition: _Fn
    ends: dict[Any, str]
    source: str

    def resolve(self, choice: Any, graph: str) -> tuple[str, ...]:
        if isinstance(choice, (str, int)) or choice is None:
            choices = (choice,)
        else:
            try:
                choices = tuple(choice)
            except TypeError:
                choices = (choice,)
        targets = []
        for c in choices:
            try:
                targets.append(self.ends[c])
            except (KeyError, TypeError):
                raise GraphRunError(
                    f"graph '{graph}': branch after '{self.source}' chose {c!r}, which is not one of its "
                    f"ends {list(self.ends)}; return one of those or add it to ends"
                ) from None
        return tuple(targets)


@dataclass(slots=True, eq=False)
class CNode:
    """A compiled node: the runnable, its options, and where its output goes."""

    key: str
    runnable: NodeRunnable | None
    subgraph: CompiledGraph | None
    pre: _Fn | None
    post: _Fn | None
    input_key: str | None
    output_key: str | None
    retry: RetryPolicy | None
    timeout: float | None
    edges: tuple[str, ...]
    branches: tuple[CBranch, ...]
    live_end: bool = False


class CompiledGraph:
    """A checked, immutable graph. Run it with `ainvoke` / `invoke` / `astream` / `aevents`."""

    def __init__(
        self,
        g: Graph,
        *,
        store: Any,
        durability: str,
        interrupt_before: tuple[str, ...],
        interrupt_after: tuple[str, ...],
        max_steps: int | None,
        trigger: str,
        serializer: Any,
        lease_seconds: float = 30.0,
    ) -> None:
        self.name = g.name
        self.state_factory = g.state_factory
        self.trigger = trigger
        self.max_steps = max_steps or len(g.nodes) + 10
        self.store = store
        self.durability = durability
        self.interrupt_before = interrupt_before
        self.interrupt_after = interrupt_after
        self.serializer = serializer
        self.lease_seconds = lease_seconds
        self._structure: dict[str, Any] | None = None
        self._edges = tuple(g.edges)
        self._branches = tuple(g.branches)
        self.order = {START: -1, **{k: i for i, k in enumerate(g.nodes)}, END: len(g.nodes)}
        self.nodes = {key: self._compile_node(g, spec) for key, spec in g.nodes.items()}
        self.start = self._make_node(START, None, None, g)
        self._successors = {k: self._successor_list(k) for k in (START, *g.nodes)}
        preds: dict[str, list[str]] = {k: [] for k in (*g.nodes, END)}
        for src, succs in self._successors.items():
            for s in succs:
                preds[s].append(src)
        self.preds = {k: tuple(v) for k, v in preds.items()}

    # --- compile helpers ----------------------------------------------------------------------------

    def _compile_node(self, g: Graph, spec: Any) -> CNode:
        from .graph import Graph as _Graph

        obj = spec.runnable
        sub = None
        runnable = None
        if isinstance(obj, _Graph):
            try:
                sub = obj.compile()
            except GraphBuildError as err:
                raise GraphBuildError(f"graph '{g.name}': subgraph node '{spec.key}': {err}") from err
        elif isinstance(obj, CompiledGraph):
            sub = obj
        else:
            try:
                runnable = as_runnable(spec.key, obj)
            except TypeError as err:
                raise GraphBuildError(f"graph '{g.name}': {err}") from None
        if sub is not None and spec.retry is not None:
            raise GraphBuildError(
                f"graph '{g.name}': subgraph node '{spec.key}' cannot take retry= (a retried subgraph would run "
                "again from its start, repeating what its finished nodes did); set retry= on its nodes instead"
            )
        node = self._make_node(spec.key, runnable, sub, g)
        node.pre = _Fn(spec.pre) if spec.pre else None
        node.post = _Fn(spec.post) if spec.post else None
        node.input_key, node.output_key = spec.input_key, spec.output_key
        node.retry, node.timeout = spec.retry, spec.timeout
        node.live_end = (
            runnable is not None and runnable.streams and node.edges == (END,) and not node.branches
            and spec.retry is None and spec.post is None
        )
        return node

    def _make_node(self, key: str, runnable: Any, sub: Any, g: Graph) -> CNode:
        edges = tuple(b for a, b in g.edges if a == key)
        branches = tuple(
            CBranch(condition=_Fn(b.condition), ends=dict(b.ends), source=key) for b in g.branches if b.source == key
        )
        return CNode(key=key, runnable=runnable, subgraph=sub, pre=None, post=None, input_key=None,
                     output_key=None, retry=None, timeout=None, edges=edges, branches=branches)

    def _successor_list(self, key: str) -> tuple[str, ...]:
        node = self.start if key == START else self.nodes[key]
        out = list(node.edges)
        for br in node.branches:
            out.extend(t for t in br.ends.values() if t not in out)
        return tuple(out)

    def successors_of(self, key: str) -> tuple[str, ...]:
        return self._successors[key]

    # --- running ------------------------------------------------------------------------------------

    async def ainvoke(self, input: Any, *, callbacks: Sequence[Any] = (), **options: Any) -> Any:
        """Run the graph on `input` (or resume it) and return what reaches END.

        Options: `checkpoint_id`, `resume` ({id: data} | [ids] | True), `force_new_run`, `write_to`,
        `version`, `takeover`, `max_steps` (docs/resume.md). Raises `NodeError` when a node fails,
        `GraphInterrupted` when the run pauses, `MaxStepsExceeded`, `GraphRunError`, and the
        checkpoint errors of `WaypointError`'s tree when the stored run does not allow it.
        """
        return await self._run(input, options, emitter=Emitter(callbacks), streaming=False, sink=None)

    def invoke(self, input: Any, **options: Any) -> Any:
        """`ainvoke` for synchronous callers. Refuses to run inside a running event loop."""
        return run_sync(lambda: self.ainvoke(input, **options), what=f"graph '{self.name}'.invoke()")

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
        checkpoint). Takes the options of `ainvoke`; ends by raising what the run raised."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        run = self._run(input, options, emitter=Emitter(callbacks, sink=queue.put_nowait),
                        streaming=streaming, sink=None)
        async with contextlib.aclosing(_drain(run, queue)) as items:
            async for item in items:
                yield item

    async def _run(self, input: Any, options: dict[str, Any], *, emitter: Emitter, streaming: bool,
                   sink: Callable[[Any], None] | None) -> Any:
        from .lifecycle import RunOptions, run_graph

        try:
            opts = RunOptions(**options)
        except TypeError:
            known = ", ".join(RunOptions.__dataclass_fields__)
            raise TypeError(f"graph '{self.name}': unknown run option(s) in {sorted(options)}; known: {known}") from None
        if opts.max_steps is not None and (self.trigger == "all" or opts.max_steps < 1):
            raise WaypointError(f"graph '{self.name}': max_steps={opts.max_steps!r} needs trigger='any' and a value >= 1")
        return await run_graph(self, input, opts, emitter=emitter, streaming=streaming, sink=sink)

    async def get_run(self, checkpoint_id: str, *, version: int | None = None) -> RunSnapshot | None:
        """What the store holds for a run (newest or a given version), decoded; None if unknown."""
        if self.store is None:
            raise WaypointError(f"graph '{self.name}': get_run() needs a graph compiled with a store")
        from .checkpoint import Checkpointer

        reader = Checkpointer(store=self.store, serializer=self.get_serializer(), checkpoint_id=checkpoint_id,
                              graph_structure=self.structure)
        loaded = await reader.load(version)
        if loaded is None:
            return None
        pos = loaded.position
        return RunSnapshot(meta=loaded.meta, state=pos.state, output=pos.output if pos.done else None,
                           pending=tuple(pos.pending), interrupts=interrupt_info(pos, f"runnable:{self.name}"))

    # --- what checkpoints need ----------------------------------------------------------------------

    @property
    def structure(self) -> dict[str, Any]:
        """The graph's shape as plain data (what a checkpoint's fingerprint is computed from)."""
        if self._structure is None:
            from .checkpoint import graph_structure

            self._structure = graph_structure(self)
        return self._structure

    def get_serializer(self) -> Any:
        """The codec checkpoints are written with (the default one unless compile(serializer=...))."""
        if self.serializer is None:
            from .serde import default_serializer

            self.serializer = default_serializer
        return self.serializer

    # --- pictures -------------------------------------------------------------------------------------

    def to_mermaid(self) -> str:
        """A Mermaid flowchart of the graph: edges solid, branch routes dotted and labelled."""
        from .mermaid import render

        return render({k: n.subgraph is not None for k, n in self.nodes.items()}, self._edges,
                      ((b.source, b.ends) for b in self._branches))


def interrupt_info(pos: RunPosition, address: str) -> InterruptInfo:
    """The caller's view of a paused run: every root-cause interrupt, nested runs included.

    Static pauses (`interrupt_before` / `interrupt_after`) are listed too, at `<node>;pause:before`
    (or `after`), and their nodes by path (`sub/b` inside subgraph node `sub`) in `before_nodes` /
    `after_nodes`.
    """
    contexts: list[InterruptCtx] = []
    static: dict[str, list[str]] = {"before": [], "after": []}

    def walk(pos: RunPosition, address: str, prefix: tuple[str, ...]) -> None:
        for key, record in pos.interrupts.items():
            if record.child is not None:
                walk(record.child, record.address, (*prefix, key))
                continue
            ctx = InterruptCtx(id=interrupt_id(record.address), address=record.address, info=record.info,
                               is_root_cause=not record.subs, parent=None)
            if record.subs:
                for sub in record.subs:
                    contexts.append(InterruptCtx(id=interrupt_id(sub.address), address=sub.address,
                                                 info=sub.info, is_root_cause=True, parent=ctx))
            else:
                contexts.append(ctx)
        for point, key, when in static_pauses(pos, address):
            node = "/".join((*prefix, key))
            static[when].append(node)
            contexts.append(InterruptCtx(id=interrupt_id(point), address=point, info={"pause": when, "node": node}))

    walk(pos, address, ())
    return InterruptInfo(contexts=tuple(contexts), before_nodes=tuple(static["before"]),
                         after_nodes=tuple(static["after"]))


async def _drain(run: Any, queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """Yield what the run puts on `queue` while it runs; then re-raise what the run raised.

    The run is a task owned by this generator: if the consumer stops early, it is cancelled.
    """
    task = asyncio.ensure_future(run)
    getter: asyncio.Future | None = None
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
        task.result()
    finally:
        if getter is not None:
            getter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def run_sync(make: Callable[[], Any], *, what: str) -> Any:
    """Run the coroutine `make()` to completion from sync code (the one sync bridge)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    raise WaypointError(f"{what} was called inside a running event loop; use its async form there "
                        "(await graph.ainvoke(...) instead of graph.invoke(...))")
