"""Running one node of a `Run` (engine/run/loop.py): its input key and handlers, a sync call on the pool, its
timeout and retries, a stream, a subgraph, the `Update` it returns, and where its output goes (edges and
branches). `NodeCalls` is the part of `Run` that does this; the loop decides when each task runs."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..errors import NodeError, WaypointError
from ..events import Emitter, Event
from ..shape import Chunks, CNode, GraphShape, Update, to_value
from .interrupts import Interrupt
from .node_calls import in_daemon_thread, maybe_await, raised_for, take_key
from .position import RunPosition
from .scope import _TASK, TaskScope, current_task

if TYPE_CHECKING:
    from collections.abc import Callable


class RunInterrupted(BaseException):
    """Internal: a (sub)graph run paused. Carries the run's position; the caller decides what to show."""

    def __init__(self, run: NodeCalls) -> None:
        super().__init__(run.graph.name)
        self.run = run


class _Done:
    """A finished task: its output, the targets its edges and branches chose, and its state writes."""

    __slots__ = ("node", "output", "targets", "interrupt", "writes")

    def __init__(self, node: CNode, output: Any, targets: tuple[str, ...], interrupt: BaseException | None = None,
                 writes: list[dict[str, Any]] | None = None):
        self.node = node
        self.output = output
        self.targets = targets
        self.interrupt = interrupt
        self.writes = writes


class NodeCalls:
    """How a `Run` calls one node and routes its output (the `Run` attributes it reads are declared below)."""

    graph: GraphShape
    path: tuple[str, ...]
    address: str
    emitter: Emitter
    streaming: bool
    sink: Callable[[Any], None] | None
    offload_sync: bool
    resume: Any
    pos: RunPosition
    _writes: dict[str, list[dict[str, Any]]]
    _wrote: bool

    def _scope(self, node: CNode, path: tuple[str, ...]) -> TaskScope:
        raise NotImplementedError

    def _stops_run(self, err: Exception) -> bool:
        raise NotImplementedError

    async def nested(self, graph: GraphShape, input: Any, *, path: tuple[str, ...], address: str,
                     place: str | None, paused: RunPosition | None, resume: Any, parent_state: Any) -> Any:
        raise NotImplementedError

    # --- one task -----------------------------------------------------------------------------------

    async def _task(self, node: CNode, value: Any) -> _Done:
        """Run one node on `value` and choose its targets. Never swallows an error; returns pauses."""
        path = self.path + (node.key,)
        emitter = self.emitter
        if emitter.active:
            await emitter.emit(Event("start", path, value, self.pos.step))
        token = _TASK.set(self._scope(node, path))
        try:
            output = await self._call(node, value, path)
            targets = await self._route(node, output)
        except (Interrupt, RunInterrupted) as signal:
            self._writes.pop(node.key, None)  # a paused task writes nothing
            if emitter.active and isinstance(signal, Interrupt):
                await emitter.emit(Event("interrupt", path, signal.info, self.pos.step))
            return _Done(node, None, (), interrupt=signal)
        except Exception as err:
            self._writes.pop(node.key, None)
            wrapped = err if raised_for(path, err) or self._stops_run(err) else NodeError(path, err)
            if emitter.active:
                await emitter.emit(Event("error", path, wrapped, self.pos.step))
            if wrapped is err:
                raise
            raise wrapped from err
        finally:
            _TASK.reset(token)
        if emitter.active:
            await emitter.emit(Event("end", path, output, self.pos.step))
        if self._writes:
            return _Done(node, output, targets, None, self._writes.pop(node.key, None))
        return _Done(node, output, targets)

    async def _call(self, node: CNode, value: Any, path: tuple[str, ...]) -> Any:
        """The node's output after its handlers; the state writes of an `Update` it (or `post`) returned
        wait in `self._writes` and are applied when the task is applied."""
        state = self.pos.state
        if node.input_key is not None:
            value = take_key(node, to_value(value, where=f"the input of node '{node.key}'"))
        if node.pre is not None:
            value = await maybe_await(node.pre.call(to_value(value, where=node.key), state))
        if node.subgraph is not None:
            async with asyncio.timeout(node.timeout):  # the whole subgraph run (retry= is refused at build)
                output = await self._subgraph(node, value, path)
        elif node.retry is not None or node.timeout is not None:
            output = await self._with_policy(node, value, path, state)
        elif self.streaming and node.runnable.streams:
            output = await self._stream(node, value, path, state)
        else:
            runnable = node.runnable
            fn = runnable.sync_fn
            if fn is not None:
                plain = to_value(value, where=node.key) if self.streaming else value
                output = await in_daemon_thread(fn.call, plain, state) if self.offload_sync else fn.call(plain, state)
            else:
                output = await runnable.invoke(runnable._value(value), state)
        return await self._sent(node, output, state)

    async def _sent(self, node: CNode, output: Any, state: Any) -> Any:
        """What a node sends on, from what it returned: an `Update`'s writes kept, `post`, `output_key`."""
        if type(output) is Update:
            output = self._took(node, output)
        if node.post is not None:
            output = await maybe_await(node.post.call(to_value(output, where=node.key), state))
            if type(output) is Update:
                output = self._took(node, output)
        if node.output_key is not None:
            k = node.output_key
            output = Chunks([{k: c} for c in output.items]) if type(output) is Chunks else {k: output}
        return output

    async def stand_in(self, key: str, returned: Any) -> _Done:
        """Node `key`'s task finished as if the node had returned `returned`, without running it (what
        `update_state(as_node=key)` writes): its `post` handler, `output_key` and branches as for a real return."""
        node = self.graph.nodes[key]
        path = self.path + (key,)
        token = _TASK.set(self._scope(node, path))
        try:
            output = await self._sent(node, returned, self.pos.state)
            targets = await self._route(node, output)
        except Exception as err:
            self._writes.pop(key, None)
            if raised_for(path, err):
                raise
            raise NodeError(path, err) from err
        finally:
            _TASK.reset(token)
        return _Done(node, output, targets, None, self._writes.pop(key, None))

    def _took(self, node: CNode, update: Update) -> Any:
        """Keep an `Update`'s writes for when the task is applied; what the node sends on is its output."""
        self._writes.setdefault(node.key, []).append(update.values)
        self._wrote = True
        return update.output

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
        """Run the node under its timeout and retry policy; a retried attempt is announced (`retry`)."""
        policy, timeout = node.retry, node.timeout
        attempt = 1
        while True:
            try:
                async with asyncio.timeout(timeout):
                    if self.streaming and node.runnable.streams:
                        return await self._stream(node, value, path, state)
                    fn = node.runnable.sync_fn
                    plain = to_value(value, where=node.key) if self.streaming else value
                    if fn is not None and (timeout is not None or self.offload_sync):  # the timeout can fire
                        return await in_daemon_thread(fn.call, plain, state)
                    return await node.runnable.invoke(plain, state)
            except Exception as err:
                if isinstance(err, WaypointError):
                    raise
                if policy is None or not policy.should_retry(err, attempt):
                    raise NodeError(path, err, attempts=attempt) from err
                if self.emitter.active:  # what this attempt streamed is void: say so before the next one
                    await self.emitter.emit(Event("retry", path, err, self.pos.step))
                await asyncio.sleep(policy.delay(attempt))
                attempt += 1

    async def _subgraph(self, node: CNode, value: Any, path: tuple[str, ...]) -> Any:
        saved = self.pos.interrupts.get(node.key)
        scope = current_task()
        return await self.nested(node.subgraph, value, path=path, address=f"{self.address};node:{node.key}",
                                 place=scope.place if scope is not None else None,
                                 paused=saved.child if saved is not None else None, resume=self.resume,
                                 parent_state=self.pos.state)

    # --- routing ------------------------------------------------------------------------------------

    async def _route(self, node: CNode, output: Any) -> tuple[str, ...]:
        if not node.branches:
            return node.edges
        targets = list(node.edges)
        for branch in node.branches:
            value = to_value(output, where=node.key) if self.streaming else output
            try:
                choice = await maybe_await(branch.condition.call(value, self.pos.state))
            except Exception as err:
                raise NodeError(self.path + (node.key,), err) from err
            for target in branch.resolve(choice, self.graph.name):
                if target not in targets:
                    targets.append(target)
        return tuple(targets)

