"""The run loop: one `Run` executes one (sub)graph from a `RunPosition` until END or a pause.

The loop body names its phases in order (docs/architecture.md draws them):

    start or restore  → plan (which pending tasks can start) → submit → collect
    → apply writes (deliver outputs along edges/branches; sync, no awaits)
    → advance (Pregel: next superstep's tasks from the inbox) → checkpoint → paused?

Pregel (`trigger="any"`) runs lock-step supersteps: every pending task, then all their writes.
DAG (`trigger="all"`) is eager: each finished task is applied at once and whatever it made ready
starts while other tasks still run. Everything the loop knows lives in `self.pos`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import GraphRunError, MaxStepsExceeded, NodeError, WaypointError
from .events import Emitter, Event
from .graph import END, START
from .interrupts import Interrupt
from .merge import merge_values
from .position import InterruptRecord, RunPosition
from .scope import _TASK, TaskScope, current_task
from .streams import Chunks, to_chunks, to_value

if TYPE_CHECKING:
    from .compiled import CNode, CompiledGraph

__all__ = ["Run", "RunInterrupted", "current_task"]


class RunInterrupted(BaseException):
    """Internal: a (sub)graph run paused. Carries the run's position; the caller decides what to show."""

    def __init__(self, run: Run) -> None:
        super().__init__(run.graph.name)
        self.run = run


class _Done:
    """A finished task: its output and the targets its edges and branches chose."""

    __slots__ = ("node", "output", "targets", "interrupt")

    def __init__(self, node: CNode, output: Any, targets: tuple[str, ...], interrupt: BaseException | None = None):
        self.node = node
        self.output = output
        self.targets = targets
        self.interrupt = interrupt


class Run:
    """One execution of one compiled graph (the root, or a subgraph inside a parent's task)."""

    def __init__(
        self,
        graph: CompiledGraph,
        *,
        path: tuple[str, ...] = (),
        address: str | None = None,
        emitter: Emitter,
        streaming: bool = False,
        sink: Callable[[Any], None] | None = None,
        parent_state: Any = None,
        max_steps: int | None = None,
        checkpoint: Callable[[Run, str], Any] | None = None,
    ) -> None:
        self.graph = graph
        self.path = path
        self.address = address or f"runnable:{graph.name}"
        self.emitter = emitter
        self.streaming = streaming
        self.sink = sink
        self.parent_state = parent_state
        self.max_steps = max_steps or graph.max_steps
        self.checkpoint = checkpoint
        self.pos = RunPosition()
        self.resume: Any = None  # the caller's ResumeRequest, shared with nested runs
        self.resumed: dict[str, InterruptRecord] = {}  # address -> what paused there last time
        self.released: set[str] = set()
        self.halted = False  # something paused during this execution: start no new DAG task
        self._pause_saved = False

    # --- phase 1: start or restore ---------------------------------------------------------------

    def start(self, input: Any) -> None:
        """Begin a fresh run: new state, START's output delivered (routing happens in `execute`)."""
        factory = self.graph.state_factory
        self.pos = RunPosition(state=factory() if factory is not None else self.parent_state)
        self.pos.pending[START] = input

    def restore(self, pos: RunPosition, resume: Any = None) -> None:
        """Continue from a stored position; `resume` is the caller's `ResumeRequest` (or None)."""
        from .resume import resumed_records

        self.pos = pos
        if self.graph.state_factory is None:
            pos.state = self.parent_state
        self.resume = resume
        self.resumed = resumed_records(pos)
        self.released = set(pos.paused_before)  # a static pause is passed once resumed
        pos.paused_before, pos.paused_after = [], []
        if not self.streaming:  # paused while streaming, resumed with ainvoke: nodes get values
            pos.pending = {k: to_value(v, where=f"node '{k}'") for k, v in pos.pending.items()}
            pos.inbox = {k: {src: to_value(v, where=f"node '{src}'") for src, v in values.items()}
                         for k, values in pos.inbox.items()}

    @property
    def state(self) -> Any:
        return self.pos.state

    @property
    def paused(self) -> bool:
        pos = self.pos
        return bool(pos.interrupts or pos.paused_before or pos.paused_after)

    async def execute(self) -> Any:
        """Run to END and return the output; raises `RunInterrupted` when tasks paused."""
        pos = self.pos
        if START in pos.pending:
            value = pos.pending[START]
            targets = await self._route(self.graph.start, value)  # may fail: START stays pending
            self._apply(_Done(self.graph.start, value, targets))
            self._advance()
        if self.graph.trigger == "all":
            await self._loop_dag()
        else:
            await self._loop_pregel()
        if self.paused:
            raise RunInterrupted(self)
        if not pos.done:
            raise GraphRunError(
                f"graph '{self.graph.name}' stopped without reaching END (no node left to run); "
                "check that every branch can lead to END"
            )
        return pos.output

    # --- plan: which pending tasks may start ------------------------------------------------------

    def _may_start(self, key: str) -> bool | None:
        """True: start it. False: it stays paused. None: a static interrupt_before stops it."""
        record = self.pos.interrupts.get(key)
        if record is not None:  # paused last time: runs again only if the caller targeted it
            return self.resume is not None and self.resume.targets(record)
        if key in self.graph.interrupt_before and key not in self.released:
            return None
        self.released.discard(key)
        return True

    # --- the two loops ----------------------------------------------------------------------------

    async def _loop_pregel(self) -> None:
        pos = self.pos
        while pos.pending and not pos.done:
            tasks, blocked = [], []
            for key, value in pos.pending.items():
                verdict = self._may_start(key)
                if verdict:
                    tasks.append((key, value))
                elif verdict is None:
                    blocked.append(key)
            if blocked:  # a superstep with a node under interrupt_before does not start at all
                pos.paused_before = blocked
                await self._checkpoint("pause")
                return
            if not tasks:
                return
            if pos.step >= self.max_steps:
                raise MaxStepsExceeded(
                    f"graph '{self.graph.name}' reached max_steps={self.max_steps} supersteps without "
                    f"reaching END (still pending: {sorted(pos.pending)}); raise max_steps or check for an "
                    "unintended cycle",
                    max_steps=self.max_steps,
                )
            results = await self._submit_all(tasks)
            for done in results:
                self._apply(done)
            if not pos.interrupts:
                self._advance()
                pos.step += 1
            await self._checkpoint("pause" if self.paused else "step")
            if self.paused:
                return

    async def _loop_dag(self) -> None:
        pos = self.pos
        running: dict[asyncio.Task, str] = {}
        try:
            while True:
                startable = []
                if not self.halted:  # once anything paused, only running tasks finish
                    for key in pos.pending:
                        if key in running.values():
                            continue
                        verdict = self._may_start(key)
                        if verdict:
                            startable.append(key)
                        elif verdict is None:
                            pos.paused_before.append(key)
                            self.halted = True
                if len(startable) == 1 and not running and not self.halted:  # linear case: no task object
                    key = startable[0]
                    self._apply(await self._task(self.graph.nodes[key], pos.pending[key]))
                    pos.step += 1
                    await self._checkpoint("pause" if self.halted else "step")
                    continue
                for key in startable:
                    task = asyncio.ensure_future(self._task(self.graph.nodes[key], pos.pending[key]))
                    running[task] = key
                if not running:
                    if pos.paused_before and not self._pause_saved:
                        await self._checkpoint("pause")
                    return
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                order = self.graph.order
                for task in sorted(finished, key=lambda t: order[running[t]]):
                    del running[task]
                    self._apply(task.result())  # a NodeError propagates from here
                    pos.step += 1
                await self._checkpoint("pause" if self.halted and not running else "step")
        finally:
            await _cancel_all(running)

    async def _submit_all(self, tasks: list[tuple[str, Any]]) -> list[_Done]:
        nodes = self.graph.nodes
        if len(tasks) == 1:
            key, value = tasks[0]
            return [await self._task(nodes[key], value)]
        futures = [asyncio.ensure_future(self._task(nodes[key], value)) for key, value in tasks]
        try:
            return await asyncio.gather(*futures)
        finally:
            await _cancel_all(futures)

    # --- apply writes (sync) ----------------------------------------------------------------------

    def _apply(self, done: _Done) -> None:
        """Record one finished task: drop it from pending, deliver its output, update DAG readiness."""
        pos = self.pos
        key = done.node.key
        if done.interrupt is not None:
            pos.interrupts[key] = self._interrupt_record(done.node, done.interrupt)
            self.halted = True
            return
        pos.pending.pop(key, None)
        pos.interrupts.pop(key, None)
        if key in self.graph.interrupt_after:
            pos.paused_after.append(key)
            self.halted = True
        output = done.output
        inbox = pos.inbox
        for target in done.targets:
            slot = inbox.get(target)
            if slot is None:
                inbox[target] = {key: output}
            else:
                slot[key] = output
            if target == END and self.sink is not None and not done.node.live_end:
                for chunk in to_chunks(output):
                    self.sink(chunk)
        if self.graph.trigger == "all":
            self._dag_settle(key, done.targets)

    def _dag_settle(self, source: str, targets: tuple[str, ...]) -> None:
        """DAG: report `source` to every successor; start what is ready, skip what cannot run."""
        pos = self.pos
        graph = self.graph
        todo = [(source, set(targets))]
        while todo:
            src, chosen = todo.pop()
            for succ in graph.successors_of(src):
                if succ not in chosen:
                    pos.skipped.setdefault(succ, []).append(src)
                preds = graph.preds[succ]
                got = pos.inbox.get(succ, {})
                skipped = pos.skipped.get(succ, ())
                if len(got) + len(skipped) < len(preds):
                    continue
                pos.skipped.pop(succ, None)
                if not got:  # every predecessor skipped: skip this node too, and onwards
                    if succ == END:
                        continue
                    todo.append((succ, set()))
                    continue
                value = self._merge(succ, pos.inbox.pop(succ))
                if succ == END:
                    pos.output, pos.done = self._final(value), True
                else:
                    pos.pending[succ] = value

    def _advance(self) -> None:
        """Pregel: the inbox becomes the next superstep's tasks; reaching END ends the run."""
        pos = self.pos
        if self.graph.trigger == "all":
            return
        inbox = pos.inbox
        if END in inbox:
            pos.output, pos.done = self._final(self._merge(END, inbox.pop(END))), True
            pos.inbox, pos.pending = {}, {}
            return
        pos.pending = {node: self._merge(node, values) for node, values in inbox.items()}
        pos.inbox = {}

    def _final(self, value: Any) -> Any:
        """The run's output: a subgraph hands its parent the stream itself, the root run a value."""
        return value if self.path else to_value(value, where=f"the output of graph '{self.graph.name}'")

    def _merge(self, node: str, values: dict[str, Any]) -> Any:
        if len(values) == 1:
            for value in values.values():
                return value
        order = self.graph.order
        sources = sorted(values, key=lambda s: order[s])
        items = [values[s] for s in sources]
        if self.streaming:
            items = [to_value(v, where=f"node '{s}'") for s, v in zip(sources, items)]
        return merge_values(node, sources, items)

    # --- one task -----------------------------------------------------------------------------------

    async def _task(self, node: CNode, value: Any) -> _Done:
        """Run one node on `value` and choose its targets. Never swallows an error; returns pauses."""
        path = self.path + (node.key,)
        emitter = self.emitter
        if emitter.active:
            await emitter.emit(Event("start", path, value, self.pos.step))
        token = _TASK.set(TaskScope(self, node.key, path, f"{self.address};node:{node.key}"))
        try:
            output = await self._call(node, value, path)
            targets = await self._route(node, output)
        except (Interrupt, RunInterrupted) as signal:
            if emitter.active and isinstance(signal, Interrupt):
                await emitter.emit(Event("interrupt", path, signal.info, self.pos.step))
            return _Done(node, None, (), interrupt=signal)
        except WaypointError as err:
            if emitter.active:
                await emitter.emit(Event("error", path, err, self.pos.step))
            raise
        except Exception as err:
            wrapped = NodeError(path, err)
            if emitter.active:
                await emitter.emit(Event("error", path, wrapped, self.pos.step))
            raise wrapped from err
        finally:
            _TASK.reset(token)
        if emitter.active:
            await emitter.emit(Event("end", path, output, self.pos.step))
        return _Done(node, output, targets)

    async def _call(self, node: CNode, value: Any, path: tuple[str, ...]) -> Any:
        state = self.pos.state
        if node.input_key is not None:
            value = _take_key(node, to_value(value, where=f"the input of node '{node.key}'"))
        if node.pre is not None:
            value = await _maybe_await(node.pre.call(to_value(value, where=node.key), state))
        if node.subgraph is not None:
            output = await self._subgraph(node, value, path)
        elif node.retry is not None or node.timeout is not None:
            output = await self._with_policy(node, value, path, state)
        elif self.streaming and node.runnable.streams:
            output = await self._stream(node, value, path, state)
        else:
            runnable = node.runnable
            fn = runnable.sync_fn
            if fn is not None:
                output = fn.call(to_value(value, where=node.key) if self.streaming else value, state)
            else:
                output = await runnable.invoke(runnable._value(value), state)
        if node.post is not None:
            output = await _maybe_await(node.post.call(to_value(output, where=node.key), state))
        if node.output_key is not None:
            k = node.output_key
            output = Chunks([{k: c} for c in output.items]) if type(output) is Chunks else {k: output}
        return output

    async def _stream(self, node: CNode, value: Any, path: tuple[str, ...], state: Any) -> Chunks:
        chunks: list[Any] = []
        emitter = self.emitter
        wants = emitter.wants("chunk")
        live = self.sink if node.live_end else None
        key = node.output_key
        async for chunk in node.runnable.stream(value, state):
            chunks.append(chunk)
            if wants:
                await emitter.emit(Event("chunk", path, chunk, self.pos.step))
            if live is not None:
                live({key: chunk} if key is not None else chunk)
        return Chunks(chunks)

    async def _with_policy(self, node: CNode, value: Any, path: tuple[str, ...], state: Any) -> Any:
        """Run the node under its timeout and retry policy."""
        policy, timeout = node.retry, node.timeout
        attempt = 1
        while True:
            try:
                async with asyncio.timeout(timeout):
                    if self.streaming and node.runnable.streams:
                        return await self._stream(node, value, path, state)
                    fn = node.runnable.sync_fn
                    plain = to_value(value, where=node.key) if self.streaming else value
                    if fn is not None and timeout is not None:  # a thread, so the timeout can fire
                        return await asyncio.to_thread(fn.call, plain, state)
                    return await node.runnable.invoke(plain, state)
            except Exception as err:
                if isinstance(err, WaypointError) or policy is None or not policy.should_retry(err, attempt):
                    if isinstance(err, WaypointError):
                        raise
                    raise NodeError(path, err, attempts=attempt) from err
                await asyncio.sleep(policy.delay(attempt))
                attempt += 1

    async def _subgraph(self, node: CNode, value: Any, path: tuple[str, ...]) -> Any:
        child = Run(
            node.subgraph, path=path, address=f"{self.address};node:{node.key}", emitter=self.emitter,
            streaming=self.streaming, parent_state=self.pos.state,
        )
        child.resume = self.resume
        saved = self.pos.interrupts.get(node.key)
        if saved is not None and saved.child is not None:
            child.restore(saved.child, self.resume)
        else:
            child.start(value)
        return await child.execute()

    # --- routing ------------------------------------------------------------------------------------

    async def _route(self, node: CNode, output: Any) -> tuple[str, ...]:
        if not node.branches:
            return node.edges
        targets = list(node.edges)
        for branch in node.branches:
            value = to_value(output, where=node.key) if self.streaming else output
            try:
                choice = await _maybe_await(branch.condition.call(value, self.pos.state))
            except Exception as err:
                raise NodeError(self.path + (node.key,), err) from err
            for target in branch.resolve(choice, self.graph.name):
                if target not in targets:
                    targets.append(target)
        return tuple(targets)

    # --- checkpoint and interrupts -----------------------------------------------------------------

    async def _checkpoint(self, reason: str) -> None:
        self._pause_saved = reason == "pause"
        if self.checkpoint is not None:
            await self.checkpoint(self, reason)

    def _interrupt_record(self, node: CNode, signal: BaseException) -> InterruptRecord:
        address = f"{self.address};node:{node.key}"
        if isinstance(signal, RunInterrupted):
            return InterruptRecord(address=address, child=signal.run.pos)
        assert isinstance(signal, Interrupt)
        return _record(signal, signal.address or address)


def _record(signal: Interrupt, address: str) -> InterruptRecord:
    subs = [
        _record(sub, sub.address if sub.address and sub.address != address else f"{address};sub:{i}")
        for i, sub in enumerate(signal.subs)
    ]
    return InterruptRecord(address=address, info=signal.info, state=signal.state,
                           has_state=signal.has_state, subs=subs)


def _take_key(node: CNode, value: Any) -> Any:
    try:
        return value[node.input_key]
    except (KeyError, TypeError, IndexError) as err:
        raise GraphRunError(
            f"node '{node.key}' has input_key={node.input_key!r} but its input "
            f"({type(value).__name__}) has no such key; send it a dict with that key"
        ) from err


async def _maybe_await(value: Any) -> Any:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value


async def _cancel_all(tasks: Any) -> None:
    """Cancel tasks still running and wait for them, so no node outlives its run."""
    alive = [t for t in tasks if not t.done()]
    for task in alive:
        task.cancel()
    if alive:
        await asyncio.gather(*alive, return_exceptions=True)
