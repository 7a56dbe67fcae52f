"""`Runner`: runs an agent's compiled graph and speaks in `AgentEvent`s.

The runner reads the engine's events (`aevents`) and turns them into agent events (engine/agents/agent_events.py):
assistant messages
(their chunks fed live into `AgentOutput.stream` by a callback inside the run, so a consumer reads the
first token while the model still produces the rest), tool results, an interrupt once its checkpoint is
durably saved, calls re-run after a crash, the end of the run, or its error. Everything stored is the
engine's doing; a chat continues on its checkpoint ID by starting a new run with the conversation the
completed one ended with (read back with `get_run`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..compose import run_sync
from ..keep import AGENT_POINTS
from ..errors import CheckpointConflict, CheckpointExists, GraphInterrupted, WaypointError
from ..models.schema import Message, as_messages
from ..run import Pending
from .agent_events import AgentAction, AgentEvent, AgentOutput, ToolRerun, _Live
from .chat_agent import AgentState
from .summary import standing
from .turns import Look, check_on_busy, drainable, keeps_inputs, look, mark, queue, rollback_to

__all__ = ["Runner", "AgentEvent", "AgentOutput", "AgentAction", "ToolRerun", "going_on"]

log = logging.getLogger("waypoint.run")

_LOOKS = 20
"""How many times new input looks at a chat that moves on under it (a turn claimed between the look and the claim)
before it gives up: each look follows a write by another process, so this bounds a race, not a wait."""


class Runner:
    """Runs `agent` (a `ChatModelAgent`, or a workflow agent) on `store` (None: nothing recorded, nothing
    resumable); `streaming=True` streams
    the model's answers live; `callbacks` are graph callback handlers (`on_start` / `on_end` / ... per
    node: a trace of the agent's boxes). Compile options (`durability=`, `lease_seconds=`, `serializer=`)
    pass on."""

    def __init__(self, agent: Any, *, store: Any = None, streaming: bool = False,
                 callbacks: Sequence[Any] = (), **compile_options: Any):
        self.agent = agent
        self.store = store
        self.streaming = streaming
        self.callbacks = tuple(callbacks)
        self.app = agent.compile(streaming=streaming, store=store, **compile_options)

    @classmethod
    def of(cls, app: Any, *, callbacks: Sequence[Any] = ()) -> Runner:
        """A Runner over `app`, a graph an agent compiled (`agent.compile(store=...)`), as it was compiled: what a
        process holding only the compiled graph (a `waypoint worker`) runs a chat's turns with."""
        agent = getattr(app, "agent", None)
        if agent is None:
            raise WaypointError(f"graph '{getattr(app, 'name', app)}' was not compiled from an agent: a Runner runs "
                                "agents (compile it with agent.compile(...), or give the agent itself)")
        runner = cls.__new__(cls)
        runner.agent, runner.store, runner.streaming, runner.callbacks, runner.app = (
            agent, app.store, False, tuple(callbacks), app)
        return runner

    # --- async iterators ----------------------------------------------------------------------------

    def with_store(self, store: Any) -> Runner:
        """The same agent, streaming, callbacks and compile options, recording to `store`."""
        other = copy.copy(self)
        other.store, other.app = store, self.app.with_store(store)
        return other

    async def run(self, messages: str | Message | Sequence[Message], *, checkpoint_id: str | None = None,
                  force_new_run: bool = False, on_busy: str = "reject", by: str | None = None,
                  take_queued: bool = True, callbacks: Sequence[Any] = ()) -> AsyncIterator[AgentEvent]:
        """Run the agent on a new message (or messages). On a `checkpoint_id` whose run completed, the
        conversation continues: the new run starts from the messages the last one ended with. A run that
        is paused or failed refuses new input (`CheckpointExists`) unless `force_new_run=True`, which
        abandons its unfinished turn and goes on from the conversation as it was stored. A run that is executing
        — here or in any process — takes new input by `on_busy` (engine/agents/turns.py): `"reject"`
        (`CheckpointConflict`), or queued in the store (`"enqueue"`, `"interrupt"`, `"rollback"`; `by` says who
        sent it): then the one event is an action whose `queued` is the `QueuedInput`, and the process executing
        the run runs it. Inputs queued meanwhile run after the turn, each as a turn of its own (an action whose
        `taken` names it, then its events) — unless `take_queued=False`: then the caller runs them (`drain`).
        `callbacks` are added to the Runner's for this run."""
        policy = check_on_busy(checkpoint_id, on_busy, self.store)
        new = as_messages(messages)
        if checkpoint_id is None or self.store is None:
            first = await self.input_for(new, checkpoint_id=checkpoint_id, force_new_run=force_new_run)
            options = {"checkpoint_id": checkpoint_id, "force_new_run": force_new_run}
            async with contextlib.aclosing(self._events(first, options, callbacks)) as events:
                async for event in events:  # closing this iterator (or cancelling its consumer) cancels the run
                    yield event
            return
        root = (self.agent.name,)
        for _ in range(_LOOKS):
            found = await look(self.app, self.store, checkpoint_id)
            over = force_new_run or policy in ("interrupt", "rollback")  # this input may give the stopped turn up
            if drainable(found) or (over and found.waiting and not found.active):
                # inputs queued before a turn that ended (or is given up now) without taking them: theirs come first
                log.warning("run '%s': %d queued input(s) waited after its last turn ended; running them first",
                            checkpoint_id, len(found.waiting))
                failed = False
                async with contextlib.aclosing(self._drain(checkpoint_id, callbacks, None, None, over=over)) as events:
                    async for event in events:
                        failed = failed or event.error is not None
                        yield event
                if failed:  # said in the event; running this input now would jump the one that failed
                    return
                continue
            if policy != "reject" and found.active:
                queued = await queue(self.app, self.store, checkpoint_id, new, policy, by)
                if queued is None:
                    continue  # its turn ended before the store took the input: look again
                yield AgentEvent(agent_name=self.agent.name, run_path=root, action=AgentAction(queued=queued))
                return
            try:  # closing this iterator (or cancelling its consumer) cancels the run
                async with contextlib.aclosing(self._turn(checkpoint_id, found, new, force_new_run, policy,
                                                          callbacks)) as events:
                    async for event in events:
                        yield event
            except _LookAgain:
                continue
            break
        else:
            raise CheckpointConflict(f"run '{checkpoint_id}' moved on at each of {_LOOKS} looks while this input waited "
                                     "to start or be queued; send it again")
        if take_queued:
            async with contextlib.aclosing(self.drain(checkpoint_id, callbacks=callbacks, after=found.taken)) as events:
                async for event in events:
                    yield event

    async def _turn(self, checkpoint_id: str, found: Any, new: list[Message], force_new_run: bool, policy: str,
                    callbacks: Sequence[Any]) -> AsyncIterator[AgentEvent]:
        """A new turn of the chat `found` on `new`, claimed by compare-and-set on the version looked at; `_LookAgain`
        when another turn began meanwhile (and the input may still be queued for it)."""
        stopped = _stopped(found)
        if policy in ("interrupt", "rollback") and stopped:  # paused, cancelled or failed: given up for this input
            force_new_run = True
        history = await self._before_turn(found, force_new_run, policy == "rollback" and stopped)
        options = {"checkpoint_id": checkpoint_id, "force_new_run": force_new_run, "expected_version": found.version,
                   "turn": {"input": found.taken, "kept": len(history)}}
        started = False
        try:
            async with contextlib.aclosing(self._events(*self._going_on(found, history, new, options), callbacks)) as events:
                async for event in events:
                    started = True
                    yield event
        except CheckpointConflict:
            if started or policy == "reject":
                raise
            raise _LookAgain() from None  # the run moved on between the look and the claim (another turn began)
        except CheckpointExists as err:
            if started:
                raise
            raise CheckpointExists(f"{err} (a chat's new input: on_busy='interrupt' gives that turn up for it, "
                                   "'rollback' drops it; Runner.resume(checkpoint_id, takeover=True) continues it "
                                   "when its process is gone)") from None

    async def drain(self, checkpoint_id: str, *, callbacks: Sequence[Any] = (), turns: int | None = None,
                    after: int | None = None) -> AsyncIterator[AgentEvent]:
        """Run the inputs queued for the run (`run(on_busy=)`), one turn each, in their order, while its turn has
        ended — at most `turns` of them (None: all). Each turn begins with an action whose `taken` names its input.
        Nothing when none waits, or the run executes or waits for an answer. `after`: the last input taken when the
        turn that just ended began (nothing queued after it: nothing more to read)."""
        async with contextlib.aclosing(self._drain(checkpoint_id, callbacks, turns, after)) as events:
            async for event in events:
                yield event

    async def _drain(self, checkpoint_id: str, callbacks: Sequence[Any], turns: int | None, after: int | None, *,
                     over: bool = False) -> AsyncIterator[AgentEvent]:
        """`drain`; `over`: the first input may also give up a turn that stopped without ending (paused, or its
        process gone), as a new input with `force_new_run` would — the inputs queued before it go first."""
        if not keeps_inputs(self.store):
            return
        if after is not None and not await self.store.queued_inputs(checkpoint_id, after=after):
            return
        root = (self.agent.name,)
        done = 0
        while turns is None or done < turns:
            done += 1
            found = await look(self.app, self.store, checkpoint_id)
            if not drainable(found) and not (over and done == 1 and found.waiting and not found.active):
                return
            taken = found.waiting[0]
            try:
                new = as_messages(self.app.get_serializer().loads(taken.payload))
            except Exception as err:  # noqa: BLE001 - stored bytes that do not decode: said, never guessed at
                error = WaypointError(f"run '{checkpoint_id}': queued input {taken.n} does not decode "
                                      f"({type(err).__name__}: {err}); it and the inputs after it wait: delete the run "
                                      "or restore the store")
                log.error("%s", error)
                await mark(self.store, checkpoint_id, taken.n, "stuck")  # no service or worker takes it up again
                yield AgentEvent(agent_name=self.agent.name, run_path=root, error=error)
                return
            # a rollback queued behind this input stopped the turn too: the turn is dropped for the first input after it
            history = await self._before_turn(found, True, any(q.policy == "rollback" for q in found.waiting))
            options = {"checkpoint_id": checkpoint_id, "force_new_run": True, "expected_version": found.version,
                       "turn": {"input": taken.n, "kept": len(history)}}
            started = False
            try:
                async with contextlib.aclosing(self._events(*self._going_on(found, history, new, options), callbacks)) as events:
                    async for event in events:
                        if not started:  # its claim is written: the input is this turn's
                            started = True
                            await mark(self.store, checkpoint_id, taken.n)
                            yield AgentEvent(agent_name=self.agent.name, run_path=root,
                                             action=AgentAction(taken=taken))
                        yield event
            except (CheckpointConflict, CheckpointExists):
                if started:
                    raise
                return  # another process took it (or began a turn of its own): its end takes the rest

    def _going_on(self, found: Any, history: list[Message], new: list[Message], options: dict[str, Any]
                  ) -> tuple[Any, dict[str, Any]]:
        """`going_on` for this Runner's graph, with the last turn's summary while it still stands."""
        last = found.snap.state if found.snap is not None else None
        input, start = going_on(self.app, history, new, standing(last, history))
        return input, {**options, **start}

    async def _before_turn(self, found: Any, force_new_run: bool, drop: bool) -> list[Message]:
        """The conversation a new turn on the chat `found` starts from: as `_history` gives it, the unfinished
        turn's calls closed — or, `drop`, as it was before that turn began (`rollback_to`)."""
        history = rollback_to(found) if drop else None
        if history is not None:
            return history
        snap = found.snap
        history = self._history(snap, force_new_run) if snap is not None else []
        if history and snap.meta.status != "completed" and hasattr(self.agent, "tools_node"):
            history = _close_abandoned(history, await self._finished_calls(snap.meta.checkpoint_id))
        return history

    def _history(self, snap: Any, force_new_run: bool) -> list[Message]:
        """The conversation a new turn goes on from: the last run's when it completed (or, with `force_new_run`,
        as it was stored, its unfinished turn still open — with that turn's input when it stopped before its first
        step finished: the input is in no state yet, only in the run's claim)."""
        usable = snap.state is not None and (force_new_run or snap.meta.status == "completed")
        if not usable:
            return []
        history = list(snap.state.messages)
        if snap.meta.status != "completed" and snap.start_input is not None:
            history += as_messages(snap.start_input)
        return history

    async def input_for(self, messages: str | Message | Sequence[Message], *, checkpoint_id: str | None = None,
                        force_new_run: bool = False, rollback: bool = False) -> list[Message]:
        """The messages a new run on `checkpoint_id` starts from, as `run` gives them to the agent's graph: the
        conversation the last run ended with when it completed (or, with `force_new_run`, as it was stored,
        its unfinished turn closed — with `rollback` too, as it was before that turn began), then `messages`.
        What to submit to a `RunQueue` so a chat goes on in a worker as it would here."""
        history: list[Message] = []
        if checkpoint_id is not None and self.store is not None:
            last = await self.app.get_run(checkpoint_id)
            if last is not None:
                history = await self._before_turn(Look(last), force_new_run, rollback and force_new_run)
        return [*history, *as_messages(messages)]

    async def _finished_calls(self, checkpoint_id: str) -> dict[int, str]:
        """What the abandoned turn's calls that ran came to (by position in their message): the results of those
        that finished, "started, outcome unknown" for those its process stopped inside (`results_so_far`). A
        workflow agent's conversation holds its agents' answers, never their calls: it has none to close."""
        from ..keep import Checkpointer
        from ..run import TaskLedger

        app = self.app
        reader = Checkpointer(store=self.store, serializer=app.get_serializer(), checkpoint_id=checkpoint_id,
                              graph_structure=app.structure)
        loaded = await reader.load()
        if loaded is None:
            return {}
        address = f"runnable:{self.agent.name};node:tools"
        ledger = TaskLedger(self.store, app.get_serializer(), checkpoint_id, loaded.position.ledger, address,
                            incarnation=loaded.meta.created_at)
        return await self.agent.tools_node.results_so_far(loaded.position, address, ledger)

    async def resume(self, checkpoint_id: str, *, takeover: bool = False, expected_version: int | None = None,
                     take_queued: bool = True, callbacks: Sequence[Any] = ()) -> AsyncIterator[AgentEvent]:
        """Resume a stored run: every pending interrupt, with no data; a run that crashed with nothing
        pending continues from its last step. `takeover=True` takes over a run whose process died
        before its lease expired; `expected_version` resumes only while that is the run's newest version
        (docs/resume.md)."""
        snap = await self.app.get_run(checkpoint_id) if self.store is not None else None
        pending = snap is not None and bool(snap.interrupts.contexts)
        options = {"checkpoint_id": checkpoint_id, "resume": True if pending else None, "takeover": takeover,
                   "expected_version": expected_version}
        async with contextlib.aclosing(self._events(None, options, callbacks)) as events:
            async for event in events:
                yield event
        if take_queued:  # inputs queued while the resumed turn ran go on after it
            after = snap.turn.get("input", 0) if snap else None
            async with contextlib.aclosing(self.drain(checkpoint_id, callbacks=callbacks, after=after)) as events:
                async for event in events:
                    yield event

    async def resume_with_params(self, checkpoint_id: str, targets: dict[str, Any], *, takeover: bool = False,
                                 expected_version: int | None = None, take_queued: bool = True,
                                 callbacks: Sequence[Any] = ()) -> AsyncIterator[AgentEvent]:
        """Resume the interrupts named in `targets` (`{interrupt_id: data}`); the others pause again."""
        options = {"checkpoint_id": checkpoint_id, "resume": dict(targets), "takeover": takeover,
                   "expected_version": expected_version}
        async with contextlib.aclosing(self._events(None, options, callbacks)) as events:
            async for event in events:
                yield event
        if take_queued:  # inputs queued while the resumed turn ran go on after it
            async with contextlib.aclosing(self.drain(checkpoint_id, callbacks=callbacks)) as events:
                async for event in events:
                    yield event

    async def pending(self, checkpoint_id: str) -> list[Pending]:
        """What the stored run waits for, without resuming it: one `Pending` per paused call (`id`, `tool`,
        `arguments`, `digest`), from any process with the agent and the store — so an answer needs no
        interrupt ID passed by hand (`resume_with_params(cid, {p.id: ApprovalResult(approved=True) ...})`).
        Empty when it waits for nothing; `CheckpointNotFound` for an unknown ID."""
        return await self.app.pending(checkpoint_id)

    async def update_state(self, checkpoint_id: str, values: Any, as_node: str | None = None, **options: Any) -> Any:
        """The agent's graph's `update_state` (`CompiledGraph.update_state`): edit a stored run's state, or move a
        run a deploy refused onto this version of the agent (`goto=`, `answer={call_id: output}`)."""
        return await self.app.update_state(checkpoint_id, values, as_node, **options)

    async def cancel(self, checkpoint_id: str, *, when: str = "now", by: str | None = None) -> Any:
        """Ask whichever process executes the run — this one or another, a worker, a service — to stop it: `"now"`
        (a tool call in flight is abandoned: a continuation runs it again, flagged rerun), `"after_tool_calls"` (the
        calls in flight finish and are recorded; no model call follows) or `"after_model_call"` (the answer in
        flight is kept; none of its tool calls starts). Agents nested in it, as tools or in a workflow, stop at the
        same point. The run is stored cancelled with who asked (`by`) and continues when resumed or given new
        messages. Returns the `CancelRequest`; `NotRunning` when nothing executes the run (`CompiledGraph.cancel`)."""
        if when not in AGENT_POINTS:
            raise WaypointError(f"run '{checkpoint_id}': cancel when={when!r} must be one of {', '.join(AGENT_POINTS)}")
        return await self.app.cancel(checkpoint_id, when=AGENT_POINTS[when], by=by)

    # --- sync helpers ---------------------------------------------------------------------------------

    def run_sync(self, messages: Any, *, checkpoint_id: str | None = None) -> list[AgentEvent]:
        """`run` for scripts: every event, as a list (outputs read whole); raises the run's error."""
        return run_sync(lambda: _collect(self.run(messages, checkpoint_id=checkpoint_id)), what="Runner.run_sync()",
                        instead="async for event in runner.run(...)")

    def resume_sync(self, checkpoint_id: str, *, takeover: bool = False) -> list[AgentEvent]:
        return run_sync(lambda: _collect(self.resume(checkpoint_id, takeover=takeover)), what="Runner.resume_sync()",
                        instead="async for event in runner.resume(...)")

    def resume_with_params_sync(self, checkpoint_id: str, targets: dict[str, Any], *,
                                takeover: bool = False) -> list[AgentEvent]:
        return run_sync(lambda: _collect(self.resume_with_params(checkpoint_id, targets, takeover=takeover)),
                        what="Runner.resume_with_params_sync()", instead="async for event in runner.resume_with_params(...)")

    # --- engine events -> agent events ------------------------------------------------------------------

    async def _events(self, input: Any, options: dict[str, Any], callbacks: Sequence[Any] = ()
                      ) -> AsyncIterator[AgentEvent]:
        live = _Live(self.agent, self.streaming)
        root = (self.agent.name,)
        events = self.app.aevents(input, callbacks=[live, *self.callbacks, *callbacks], streaming=False, **options)
        started = False
        try:
            async for event in events:
                started = True  # the first event is the claim (or, unstored, the first node): the run is on
                for out in live.translate(event):
                    yield out
        except GraphInterrupted:
            return  # already announced as an action, after the pause was saved
        except Exception as err:
            live.close_all()
            if not started:  # nothing ran (refused, lost the compare-and-set, unknown ID): impossible to miss
                raise
            yield AgentEvent(agent_name=self.agent.name, run_path=root, error=err)
            return
        finally:
            await events.aclose()
        yield AgentEvent(agent_name=self.agent.name, run_path=root, action=AgentAction(exit=True))


def going_on(app: Any, history: list[Message], new: list[Message], compaction: Any = None
             ) -> tuple[Any, dict[str, Any]]:
    """The input and run options of a chat's turn that goes on from `history` (the conversation before it) with
    `new`: a chat agent's run starts with the conversation as its state, so the turn's first version holds only
    `new` as input (the conversation is already stored, as the chain its state part goes on: issue 34 §2), with
    `compaction` (a summary that still stands for its first messages); other agents are given the whole
    conversation as input. What `Runner` and a worker running a queued chat turn both start a turn with."""
    if history and app.shape.state_factory is AgentState:
        return new, {"start_state": AgentState(messages=list(history), compaction=compaction)}
    return [*history, *new], {}


ABANDONED = "[abandoned] this call did not run: its turn was abandoned (force_new_run) before it started"
"""The result given to a tool call of an abandoned turn that never started, so the conversation stays valid for
the model (one that started reads `STARTED_UNKNOWN`, engine/tools/node.py)."""


def _close_abandoned(messages: list[Message], finished: dict[int, str]) -> list[Message]:
    """Every tool call gets a tool message, right after the answers its message did get (chat-completions
    servers refuse a history without them): a call of the abandoned turn that ran gets what it came to
    (`finished`, by position in the last message with calls: its result, or "started, outcome unknown"), any
    other `ABANDONED`."""
    last = max((i for i, m in enumerate(messages) if m.role == "assistant" and m.tool_calls), default=-1)
    out: list[Message] = []
    open_calls: list[tuple[int, Any]] = []
    opened_at = -1

    def close() -> None:
        for at, c in open_calls:
            text = finished.get(at, ABANDONED) if opened_at == last else ABANDONED
            out.append(Message.tool(text, tool_call_id=c.id, name=c.name))

    for i, message in enumerate(messages):
        if message.role != "tool" and open_calls:
            close()
            open_calls = []
        out.append(message)
        if message.role == "assistant" and message.tool_calls:
            open_calls, opened_at = list(enumerate(message.tool_calls)), i
        elif message.role == "tool":
            open_calls = [(at, c) for at, c in open_calls if c.id != message.tool_call_id]
    close()
    return out


async def _collect(events: AsyncIterator[AgentEvent]) -> list[AgentEvent]:
    collected = []
    async for event in events:
        if event.output is not None and event.output.stream is not None:
            await event.output.get_message()
        if event.error is not None:
            raise event.error
        collected.append(event)
    return collected


def _stopped(found: Any) -> bool:
    """The chat's newest turn stopped without completing and no process executes it: paused for an answer,
    cancelled, failed, or its process gone."""
    snap = found.snap
    return snap is not None and not found.active and snap.meta.status != "completed"


class _LookAgain(Exception):
    """A turn's claim lost to another turn that began after the look: look again (the input may be queued now)."""
