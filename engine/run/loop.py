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
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from ..errors import GraphRunError, LeaseLost, MaxStepsExceeded, ProcessStopping, RunCancelled, StoreUnavailable
from ..events import Emitter
from ..shape import END, START, CNode, GraphShape, StateJournal, apply_writes, assemble, to_chunks, to_value
from .calls import NodeCalls, RunInterrupted, _Done
from .interrupts import Interrupt, new_interrupt_id
from .merge import merge_values
from .node_calls import cancel_all
from .position import InterruptRecord, RunPosition
from .resume import has_static_pause, record_awaits, resumed_records
from .scope import _TASK, TaskScope, current_task

__all__ = ["Run", "RunInterrupted", "NestedProgress", "current_task"]


class Run(NodeCalls):
    """One execution of one compiled graph (the root, or a subgraph inside a parent's task)."""

    def __init__(
        self,
        graph: GraphShape,
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
        self.resume: Any = None  # the caller's ResumeRequest (set by restore: it is for paused tasks only)
        self.resumed: dict[str, InterruptRecord] = {}  # address -> what paused there; consumed by its task
        self.halted = False  # something paused during this execution: start no new DAG task
        self.before_step: Callable[[], None] | None = None  # raises to stop: the lease lost, the process stopping
        self.lease_check: Callable[[], None] | None = None  # raises once the lease is lost (`check_lease()`)
        self.safe_point: Callable[[Run], None] | None = None  # raises to stop here: a person's cancel (keep/cancel.py)
        self.ran: set[str] = set()  # the nodes that finished since the last step boundary
        self.settled = False  # stopped by `_before_step` with no task under way: the state is the last step's
        self.ledger: Callable[[], tuple] | None = None  # (store, serializer, id, epoch, holder, incarnation)
        self.checkpoint_id: str | None = None  # the stored run this executes in, if any
        self.step_key: Callable[[], tuple[str, int]] | None = None  # (checkpoint_id, ledger epoch) when stored
        self.version: Callable[[], int | None] | None = None  # the stored run's newest version
        self.token = os.urandom(8).hex()  # tells unstored runs apart (idempotency keys)
        self.place = self.address  # a subgraph's: its parent task's place (TaskScope.place)
        self.offload_sync = True  # sync node code runs on a thread (False under invoke(): the loop is the run's own)
        self.progress: NestedProgress | None = None  # the root's record of nested runs' steps (durability="step")
        self.reducers = graph.reducers  # a subgraph sharing its parent's state takes the parent's (and journal)
        self.journal = StateJournal(owned=graph.reducers.owned)
        self._writes: dict[str, list[dict[str, Any]]] = {}  # node -> the writes of its `Update`s, while it runs
        self._wrote = False  # some task of this step returned an `Update`
        self._pause_saved = False

    # --- phase 1: start or restore ---------------------------------------------------------------

    def start(self, input: Any, state: Any = None) -> None:
        """Begin a fresh run: new state (`state`, when given), START's output delivered (routing happens in
        `execute`)."""
        factory = self.graph.state_factory
        if state is None:
            state = factory() if factory is not None else self.parent_state
        self.pos = RunPosition(state=state)
        self.pos.pending[START] = input

    def restore(self, pos: RunPosition, resume: Any = None) -> None:
        """Continue from a stored position; `resume` is the caller's `ResumeRequest` (or None)."""
        self.pos = pos
        if self.graph.state_factory is None:
            pos.state = self.parent_state
        self.resume = resume
        self.resumed = resumed_records(pos)
        # A static pause is passed by any resume; the release is stored until the node has run.
        pos.released = [*pos.released, *(k for k in pos.paused_before if k not in pos.released)]
        pos.paused_before, pos.paused_after, pos.static_ids = [], [], {}
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
            await self._start()
            if START in pos.interrupts:  # a branch condition paused (now, or last time and not resumed)
                raise RunInterrupted(self)
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

    async def _start(self) -> None:
        """Route START's input. A branch condition may fail or pause: START then stays pending."""
        if not self._may_start(START):  # paused at START last time and not targeted now
            return
        node = self.graph.start
        value = self.pos.pending[START]
        token = _TASK.set(self._scope(node, self.path + (START,)))
        try:
            done = _Done(node, value, await self._route(node, value))
        except Interrupt as signal:
            done = _Done(node, None, (), interrupt=signal)
        finally:
            _TASK.reset(token)
        self._apply(done)
        if done.interrupt is not None:
            await self._checkpoint("pause")
        elif self.graph.trigger != "all":
            self._advance()

    # --- plan: which pending tasks may start ------------------------------------------------------

    def _may_start(self, key: str) -> bool | None:
        """True: start it. False: it stays paused. None: a static interrupt_before stops it."""
        pos = self.pos
        record = pos.interrupts.get(key)
        if record is not None:  # paused last time: runs again only if targeted (static pauses: always)
            if record.child is not None and has_static_pause(record.child):
                return True
            if not record_awaits(record):  # a nested run in it went on past its pause: continue it
                return True
            return self.resume is not None and self.resume.targets(record)
        if key in self.graph.interrupt_before and key not in pos.released:
            return None
        return True

    def _scope(self, node: CNode, path: tuple[str, ...]) -> TaskScope:
        """The task's scope; a paused task running again takes (consumes) what paused under it."""
        address = f"{self.address};node:{node.key}"
        # A subgraph's supersteps all run inside one step of its parent: its step number tells them apart
        # (a DAG runs each node once).
        if not self.path:
            place = address
        elif self.graph.trigger == "any":
            place = f"{self.place}@{self.pos.step};node:{node.key}"
        else:
            place = f"{self.place};node:{node.key}"
        if self.resume is None or node.key not in self.pos.interrupts:
            return TaskScope(self, node.key, path, address, place=place)
        below = address + ";"
        mine = {a: r for a, r in self.resumed.items() if a == address or a.startswith(below)}
        for a in mine:
            del self.resumed[a]
        return TaskScope(self, node.key, path, address, self.resume, mine, {}, place)

    def _pause_static(self, when: str, key: str) -> None:
        """A static interrupt_before / interrupt_after stops at `key`, under an ID of its own."""
        (self.pos.paused_before if when == "before" else self.pos.paused_after).append(key)
        self.pos.static_ids[f"{when}:{key}"] = new_interrupt_id()

    def _before_step(self, settled: bool = True) -> None:
        """The checks at a step boundary; `settled`: no task of this run is under way (a DAG may have some)."""
        try:
            if self.before_step is not None:
                self.before_step()
            if self.safe_point is not None:
                self.safe_point(self)
        except BaseException:
            self.settled = settled
            raise
        self.ran.clear()

    def _stops_run(self, err: Exception) -> bool:
        """This run's lost lease, its store failing, its process stopping or a person's cancel, raised inside a task
        (`check_lease()`, a ledger write, a nested run's step boundary): not the node's error — the run stops as
        it was last saved."""
        if isinstance(err, (LeaseLost, ProcessStopping, RunCancelled)):
            return err.checkpoint_id == self.checkpoint_id
        return isinstance(err, StoreUnavailable)

    # --- the two loops ----------------------------------------------------------------------------

    async def _loop_pregel(self) -> None:
        pos = self.pos
        while not pos.done:
            if not pos.pending:
                if not pos.inbox:
                    return
                self._advance()  # a step saved before its fan-in merged (the run failed there): merge now
                continue
            tasks, blocked = [], []
            for key, value in pos.pending.items():
                verdict = self._may_start(key)
                if verdict:
                    tasks.append((key, value))
                elif verdict is None:
                    blocked.append(key)
            if blocked:  # a superstep with a node under interrupt_before does not start at all
                for key in blocked:
                    self._pause_static("before", key)
                await self._checkpoint("pause")
                return
            if not tasks:
                return
            self._begin_superstep()
            results = await self._submit_all(tasks)
            if self._wrote:  # some task returned an Update: its writes first, in graph order
                self._write(results)
            for done in results:
                self._apply(done)
            if not pos.interrupts:
                pos.step += 1
                try:
                    self._advance()
                except GraphRunError:  # fan-in failed: keep the finished step, a resume merges again
                    await self._checkpoint("step")
                    raise
            await self._checkpoint("pause" if self.paused else "step")
            if self.paused:
                return

    async def _loop_dag(self) -> None:
        pos = self.pos
        running: dict[asyncio.Task, str] = {}
        try:
            for node in list(pos.inbox):  # inputs stored by a run that failed to merge them: retry
                if node not in pos.pending:
                    self._dag_try_ready(node)
            while True:
                startable = self._plan_dag(running)
                if startable:
                    self._before_step(settled=not running)
                if len(startable) == 1 and not running and not self.halted:  # linear case: no task object
                    key = startable[0]
                    error = self._apply_finished([await self._task(self.graph.nodes[key], pos.pending[key])])
                    await self._checkpoint("pause" if self.halted else "step")
                    if error is not None:
                        raise error
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
                batch = sorted(finished, key=lambda t: order[running[t]])
                for task in batch:
                    del running[task]
                error = self._apply_finished([t.exception() or t.result() for t in batch])
                await self._checkpoint("pause" if self.halted and not running else "step")
                if error is not None:  # the batch's other results are kept; running siblings are cancelled
                    raise error
        finally:
            await cancel_all(running)

    def _plan_dag(self, running: dict[asyncio.Task, str]) -> list[str]:
        """DAG: the pending tasks that may start now (none once something paused)."""
        if self.halted:
            return []
        startable = []
        busy = set(running.values())
        for key in self.pos.pending:
            if key in busy:
                continue
            verdict = self._may_start(key)
            if verdict:
                startable.append(key)
            elif verdict is None:
                self._pause_static("before", key)
                self.halted = True
        return startable

    def _apply_finished(self, outcomes: list[Any]) -> BaseException | None:
        """DAG: apply each finished task (in graph order); return the first failure, having kept the rest."""
        error: BaseException | None = None
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                error = error or outcome
                continue
            if outcome.writes:
                try:
                    self._write([outcome])
                except GraphRunError as err:  # its writes cannot be applied: the task counts as failed
                    error = error or err
                    continue
            try:
                self._apply(outcome)
            except GraphRunError as err:  # a fan-in could not merge: its inputs stay in the inbox
                error = error or err
            self.pos.step += 1
        return error

    def _begin_superstep(self) -> None:
        """Pregel: a superstep may start only within max_steps, and only while the run's lease holds."""
        if self.pos.step >= self.max_steps:
            raise MaxStepsExceeded(
                f"graph '{self.graph.name}' reached max_steps={self.max_steps} supersteps without reaching END "
                f"(still pending: {sorted(self.pos.pending)}); raise max_steps or check for an unintended cycle",
                max_steps=self.max_steps,
            )
        self._before_step()

    def _write(self, results: list[_Done]) -> None:
        """Apply the state writes of finished tasks in graph order, field by field through the reducers.

        A field without a reducer takes one write per Pregel superstep; in a DAG, a later writer must come
        after the earlier one in the graph (two tasks that may run in parallel cannot both write it)."""
        self._wrote = False
        writers = [d for d in results if d.writes]
        order = self.graph.order
        writes = [(d.node.key, values) for d in sorted(writers, key=lambda d: order[d.node.key]) for values in d.writes]
        if self.graph.trigger == "all":
            self._check_parallel_writes(writes)
        replaced = apply_writes(self.pos.state, writes, self.reducers, self.journal, self.graph.name)
        if self.graph.trigger == "all":
            self.pos.writers.update(replaced)

    def _check_parallel_writes(self, writes: list[tuple[str, dict[str, Any]]]) -> None:
        graph, writers = self.graph, self.pos.writers
        for node, values in writes:
            for name in values:
                before = writers.get(name)
                if name in self.reducers.by_field or before is None or before == node \
                        or graph.runs_before(before, node):
                    continue
                raise GraphRunError(
                    f"graph '{graph.name}': state field '{name}' is written by '{before}' and by '{node}', which "
                    f"may run in parallel (neither comes after the other), and it has no reducer to merge them; "
                    f"declare one (Annotated[..., append] or a function (current, update) -> new)")

    async def _submit_all(self, tasks: list[tuple[str, Any]]) -> list[_Done]:
        nodes = self.graph.nodes
        if len(tasks) == 1:
            key, value = tasks[0]
            return [await self._task(nodes[key], value)]
        futures = [asyncio.ensure_future(self._task(nodes[key], value)) for key, value in tasks]
        try:
            return await asyncio.gather(*futures)
        finally:
            await cancel_all(futures)

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
        self.ran.add(key)
        if key in pos.released:
            pos.released.remove(key)
        if key in self.graph.interrupt_after:
            self._pause_static("after", key)
            self.halted = True
        output = done.output
        inbox = pos.inbox
        control_only = done.node.control_only
        for target in done.targets:
            value = output if not control_only or target not in control_only else None  # workflow: no data
            slot = inbox.get(target)
            if slot is None:
                inbox[target] = {key: value}
            else:
                slot[key] = value
            if target == END and self.sink is not None and not done.node.live_end and self.graph.plan is None:
                for chunk in to_chunks(output):
                    self.sink(chunk)
        if self.graph.trigger == "all":
            self._dag_settle(key, done.targets)

    def _dag_settle(self, source: str, targets: tuple[str, ...]) -> None:
        """DAG: report `source` to every successor; queue what is ready, skip what cannot run.

        Every successor is settled even if one fan-in fails to merge; that error is raised at the end.
        """
        pos = self.pos
        error: GraphRunError | None = None
        todo = [(source, set(targets))]
        while todo:
            src, chosen = todo.pop()
            for succ in self.graph.successors_of(src):
                if succ not in chosen:
                    pos.skipped.setdefault(succ, []).append(src)
                try:
                    if self._dag_try_ready(succ) and succ != END:
                        todo.append((succ, set()))  # every predecessor skipped it: skip onwards
                except GraphRunError as err:
                    error = error or err
        if error is not None:
            raise error

    def _dag_try_ready(self, node: str) -> bool:
        """Once every predecessor of `node` reported: queue it with its merged input (END: finish).
        Returns True when all of them skipped it. A failed merge leaves the inputs in the inbox."""
        pos = self.pos
        got = pos.inbox.get(node, {})
        if len(got) + len(pos.skipped.get(node, ())) < len(self.graph.preds[node]):
            return False
        plan = self.graph.plan
        if not got or plan is not None and node in plan.control and not plan.control[node] & got.keys():
            pos.inbox.pop(node, None)  # every control predecessor skipped it (data may have arrived)
            pos.skipped.pop(node, None)
            return True
        value = self._merge(node, got) if plan is None else self._assemble(node, got)
        del pos.inbox[node]
        pos.skipped.pop(node, None)
        if node == END:
            pos.output, pos.done = self._final(value), True
            if plan is not None and self.sink is not None:  # a workflow's result is what END assembled
                for chunk in to_chunks(value):
                    self.sink(chunk)
        else:
            pos.pending[node] = value
        return False

    def _advance(self) -> None:
        """Pregel: the inbox becomes the next superstep's tasks; reaching END ends the run."""
        pos = self.pos
        inbox = pos.inbox
        if END in inbox:  # merged before anything changes: a failed merge leaves the inbox as it was
            pos.output, pos.done = self._final(self._merge(END, inbox[END])), True
            pos.inbox, pos.pending = {}, {}
            return
        pos.pending = {node: self._merge(node, values) for node, values in inbox.items()}
        pos.inbox = {}

    def _assemble(self, node: str, got: dict[str, Any]) -> Any:
        """Workflow: a node's input from its predecessors' fields (streams joined first) and static values."""
        if self.streaming:
            got = {s: to_value(v, where=f"node '{s}'") for s, v in got.items()}
        return assemble(self.graph.plan, self.graph.name, node, got)

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

    async def nested(self, graph: GraphShape, input: Any, *, path: tuple[str, ...], address: str,
                     place: str | None, paused: RunPosition | None, resume: Any, parent_state: Any) -> Any:
        """Run `graph` nested in one of this run's tasks (a subgraph node, or code in the task: engine/compose/nested.py).

        Its position is part of the root's checkpoint: while it runs, each of its finished steps is recorded
        (`NestedProgress`) and a task run again after a crash continues it from there; once it pauses, its
        position is the task's `InterruptRecord.child`. It starts from `paused` when the task runs again
        after that pause, else from `input`. Raises `RunInterrupted` when it pauses.
        """
        child = Run(graph, path=path, address=address, emitter=self.emitter, streaming=self.streaming,
                    parent_state=parent_state)
        child.ledger, child.checkpoint_id = self.ledger, self.checkpoint_id
        child.step_key, child.token, child.version = self.step_key, self.token, self.version
        child.before_step, child.lease_check, child.progress = self.before_step, self.lease_check, self.progress
        child.safe_point = self.safe_point
        child.offload_sync = self.offload_sync
        if graph.state_factory is None:  # it writes its parent's state: through the parent's reducers
            child.reducers, child.journal = self.reducers, self.journal
        if place is not None:
            child.place = place
        progress = self.progress
        resumed = progress.recall(address) if progress is not None else None
        if resumed is not None:  # it ran past its pause (or was never paused) before this process died
            child.restore(resumed, resume)
        elif paused is not None:
            child.restore(paused, resume)
        else:
            child.start(input)
        if progress is not None:
            child.checkpoint = _report_progress
        try:
            return await child.execute()
        finally:
            if progress is not None:  # finished, paused or failed: nothing of it to continue from
                progress.drop(address)

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


async def _report_progress(run: Run, reason: str) -> None:
    """A nested run's checkpoint callback: each finished step is recorded in the root's checkpoint."""
    if reason == "step" and run.progress is not None:
        pos = run.pos if run.graph.state_factory is not None else replace(run.pos, state=None)  # shared: the root's
        await run.progress.save(run.address, pos)


class NestedProgress(Protocol):
    """What the root run's lifecycle offers nested runs (engine/keep/lifecycle.py): record a finished step of the
    run at `address` (writes the root's checkpoint), forget it, or read back what was recorded."""

    async def save(self, address: str, pos: RunPosition) -> None: ...

    def drop(self, address: str) -> None: ...

    def recall(self, address: str) -> RunPosition | None: ...


def _record(signal: Interrupt, address: str) -> InterruptRecord:
    subs = [
        _record(sub, sub.address if sub.address and sub.address != address else f"{address};sub:{i}")
        for i, sub in enumerate(signal.subs)
    ]
    return InterruptRecord(address=address, id=signal.id, info=signal.info, state=signal.state,
                           has_state=signal.has_state, subs=subs, above=list(signal.above), child=signal.child,
                           deadline=signal.deadline, expires_in=signal.expires_in, on_deadline=signal.on_deadline,
                           has_on_deadline=signal.has_on_deadline)
