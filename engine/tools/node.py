"""`ToolsNode`: runs the tool calls of one assistant message, each at most once per step.

Per call, in order: a finished call's result is taken from the task ledger or the saved pause state
(never run again); a paused call the resume did not target pauses again with its ID and state; bad
arguments or an unknown tool become an error result for the model; otherwise the tool runs through the
middlewares (first = outermost), a start marker and then the result going to the ledger the moment
each exists. Calls run concurrently unless `sequential=True`, which runs them in order and stops at the
first pause or failure (the calls after it wait, unstarted); results keep call order.

Pauses of several calls become one `CompositeInterrupt` (one root cause per call) whose state holds the
results of the calls that finished. A tool error other than `RetryAgentRun` / `StopAgentRun` fails the
node (wrap tools in `SafeToolMiddleware` to turn errors into results) — the finished calls stay in the
ledger, so a resume does not run them again.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import GraphBuildError, LeaseLost, WaypointError
from ..models.schema import Message, ToolCall, ToolInfo
from ..run import (
    CompositeInterrupt,
    Interrupt,
    TaskLedger,
    address_segment,
    answers_below,
    check_lease,
    collecting_attempts,
    current_checkpoint_id,
    current_task,
    emit_chunk,
    escape_part,
    get_interrupt_state,
    get_resume_context,
    idempotency_key,
    in_daemon_thread,
    ledger_epoch,
    pause_again,
    task_ledger,
    unescape_part,
)
from .tool import BreakLoop, HandOff, RetryAgentRun, StopAgentRun, Tool, ToolArgumentError, ToolContext, _text, as_tool
from .verbs import Decision, Respond, Restart

__all__ = ["ToolsNode", "ToolBatch", "ToolEvent"]

BREAK = "break_loop"
"""A finished call's `stopped` mark when it raised `BreakLoop` (True: `StopAgentRun`)."""
HANDOFF = "handoff:"
"""A finished call's `stopped` mark when it raised `HandOff`: `handoff:<agent>`."""

_STATE = 2
"""The paused state's format: 2 keys calls by slot (position and ID); 1 keyed them by the model's ID."""

_HOOKS = ("before_agent", "after_agent", "prepare_model", "needs_prepare", "before_model", "after_model", "wrap_model",
          "wrap_invokable_tool_call", "wrap_streamable_tool_call", "check_tools")
"""What makes an object a middleware (engine/agents/middleware.py): any one of these."""


@dataclass(frozen=True, kw_only=True)
class ToolEvent:
    """What the tools node publishes live (`emit_chunk`) about one call: it started (`data`: the
    arguments), produced a chunk of text, was decided on (`data`: a `Decision`), ended (`data`: the
    tool `Message`), stopped without a result (it paused or failed; `data`: the exception), or voided the
    chunks it produced so far (a retry started it over, or it raised `RetryAgentRun` / `StopAgentRun`:
    the result is what follows, not what came before).

    `call_id` is the model's; `index` is the call's position in its message and `ref` is unique to this
    execution of the call — a model may repeat IDs, so consumers pair events by `ref`."""

    kind: Literal["start", "chunk", "end", "stop", "decision", "void"]
    call_id: str
    name: str
    data: Any = None
    rerun: bool = False
    idempotency_key: str = ""
    index: int = 0
    ref: str = ""


@dataclass(kw_only=True)
class ToolBatch:
    """The tool messages of one batch, in call order; `stop` holds a `StopAgentRun` message."""

    messages: list[Message]
    stop: str | None = None
    break_loop: bool = False
    """A call raised `BreakLoop` (its message is `stop`)."""
    transfer: str | None = None
    """The agent the first call that really ran the handoff tool handed the conversation to (`HandOff`)."""
    names: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    """What resumes decided about paused calls in this batch (approved, rejected, responded, restarted)."""


@dataclass(frozen=True)
class _Call:
    """One call of the batch: the model's call, its position, and the slot that identifies it here.

    The slot (`<position>:<escaped ID>`) is minted by us: two calls never share it, whatever IDs the model
    wrote — it keys the ledger, the paused state, and (through the address) interrupts and idempotency keys.
    """

    call: ToolCall
    index: int
    slot: str
    ref: str


@dataclass
class _Step:
    """What this step already knows: finished results (ledger, pause state) and paused calls, by slot."""

    ledger: TaskLedger | None
    done: dict[str, list[Any]]
    paused: dict[str, Any]
    started: set[str]
    keys: dict[str, Any]
    """The ledger epoch each paused call got its idempotency key in: a call keeps its key when a resume
    runs it in a later step (a key stored by format 1 is kept as it was)."""
    decisions: list[Decision] = field(default_factory=list)
    inputs: dict[str, str] = field(default_factory=dict)
    """Arguments a `Restart` replaced, for calls that paused again: the next pass keeps them."""


STARTED_UNKNOWN = ("[abandoned] this call was started and its outcome is unknown (idempotency key {key}): its process "
                   "stopped before its result was recorded, and its turn was abandoned (force_new_run); it may have "
                   "taken effect — check before asking for it again")
"""What a model reads for a call of an abandoned turn that started and has no result (`results_so_far`)."""


class ToolsNode:
    """Run the tool calls of an assistant message (a node of its own, or the agent's tools box)."""

    def __init__(self, tools: Sequence[Any], *, sequential: bool = False,
                 unknown_tool_handler: Callable[[str, str], Any] | None = None,
                 middlewares: Sequence[Any] = (), where: str = "a tools node") -> None:
        self.tools: dict[str, Tool] = {}
        for t in map(as_tool, tools):
            if t.name in self.tools:
                raise ValueError(f"two tools are named '{t.name}'; tool names must be unique")
            self.tools[t.name] = t
        self.sequential = sequential
        self.unknown_tool_handler = unknown_tool_handler
        self.middlewares = tuple(middlewares)
        for mw in self.middlewares:
            if not any(callable(getattr(mw, hook, None)) for hook in _HOOKS):  # a list in the list, say: it
                raise GraphBuildError(                                           # would guard nothing, silently
                    f"{where}: middlewares= holds {type(mw).__name__} {mw!r:.120}, which is no middleware (it has "
                    f"none of the hooks {', '.join(_HOOKS)}); pass each middleware as an item of one flat list, "
                    "middlewares=[ApprovalMiddleware(...), ...]")
        for mw in self.middlewares:  # a middleware that cannot work with these tools is refused now (`where`)
            check = getattr(mw, "check_tools", None)
            if check is not None:
                check(list(self.tools), where)

    def resume_problem(self, below: str, answer: Any = None) -> str | None:
        """Why a pause at `below` (the address under this node, `tool:<name>:<call id>:<slot>...`) cannot be
        continued here, or None: its call's tool is not one of these (a deploy removed it), no
        `unknown_tool_handler` would answer it, and the resume's `answer` to it is no `Respond` (which gives the
        result without the tool). Read before a resume claims the run (engine/keep/admission.py)."""
        kind, _, rest = below.split(";", 1)[0].partition(":")
        if kind != "tool" or not rest or self.unknown_tool_handler is not None or isinstance(answer, Respond):
            return None
        parts = [unescape_part(p) for p in rest.split(":")]
        if parts[0] in self.tools:  # a run nested in the call (an agent as a tool) is asked in turn
            inner = getattr(self.tools[parts[0]], "resume_problem", None)
            deeper = below.split(";", 1)[1] if ";" in below else ""
            return inner(deeper) if inner is not None and deeper.startswith("runnable:") else None
        call = f" {parts[1]!r}" if len(parts) > 1 else ""
        return (f"its pending call{call} is to tool {parts[0]!r}, which this version does not have "
                f"(its tools: {', '.join(map(repr, self.tools)) or 'none'})")

    def answer_removed(self, below: str, output: Any) -> Respond:
        """The answer to the pending call at `below` whose tool this version removed, given on its behalf: a
        `Respond(output)` (the tool never runs; the model reads `output`). Raises ValueError when this node could
        still run the call (its tool is here, or an `unknown_tool_handler` is) — answer it by resuming instead."""
        problem = self.resume_problem(below)
        if problem is None:
            kind, _, rest = below.split(";", 1)[0].partition(":")
            name = unescape_part(rest.split(":")[0]) if kind == "tool" and rest else "?"
            why = ("its tool is answered by this version's unknown_tool_handler" if self.unknown_tool_handler is not None
                   else f"this version still has its tool {name!r}")
            raise ValueError(why)
        return Respond(output)

    @property
    def infos(self) -> list[ToolInfo]:
        return [t.info for t in self.tools.values()]

    async def ainvoke(self, message: Message) -> list[Message]:
        """The tool messages answering `message`'s calls (a node's value-in, value-out form)."""
        return (await self.run(message)).messages

    async def run(self, message: Message) -> ToolBatch:
        tool_calls = list(message.tool_calls) if isinstance(message, Message) else []
        if not tool_calls:
            raise ValueError("the tools node got a message without tool calls; route to it only when the "
                             "assistant asked for tools")
        calls = [_Call(c, i, f"{i}:{escape_part(c.id)}", os.urandom(6).hex()) for i, c in enumerate(tool_calls)]
        step = await self._step(calls)
        if self.sequential:  # in order; the first pause or failure stops the batch: later calls wait, unstarted
            outcomes = []
            for call in calls:
                try:
                    outcomes.append(await self._one(call, step))
                except (Exception, Interrupt) as err:
                    outcomes.append(err)
                    break
        else:
            outcomes = await asyncio.gather(*(self._one(c, step) for c in calls), return_exceptions=True)
        return self._finish(calls, outcomes, step)

    async def _step(self, calls: list[_Call]) -> _Step:
        ledger = task_ledger()
        if ledger is None and current_checkpoint_id() is not None:
            raise WaypointError(
                f"run '{current_checkpoint_id()}': a tools node runs only with durability='step' when its run is "
                "stored (the other modes keep no tool ledger, so a resume after a failed or cancelled step would run "
                "its finished calls again); compile the graph with durability='step'")
        recorded = await ledger.recorded() if ledger is not None else {}
        # A paused state of format 1 keyed calls by the model's ID: read it by the first call with that ID
        # (format 1 could not tell two calls with one ID apart anyway).
        legacy = {}
        for c in reversed(calls):
            legacy[c.call.id] = c.slot
        _, _, saved = get_interrupt_state()
        saved = saved if isinstance(saved, dict) else {}
        by_slot = (lambda k: k) if saved.get("v") == _STATE else legacy.get

        def keyed(name: str) -> dict[str, Any]:
            return {s: v for k, v in (saved.get(name) or {}).items() if (s := by_slot(k)) is not None}

        done = {k: list(v) for k, v in keyed("done").items()}
        started = set()
        for key, value in recorded.items():
            kind, _, slot = key.partition(":")
            if kind == "result":
                done.setdefault(slot, list(value))
            elif kind == "start":
                started.add(slot)
        return _Step(ledger=ledger, done=done, paused=keyed("paused"), started=started,
                     keys=keyed("keys"), decisions=list(saved.get("decisions") or []), inputs=keyed("inputs"))

    def _finish(self, calls: list[_Call], outcomes: list[Any], step: _Step) -> ToolBatch:
        errors = [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, Interrupt)]
        if errors:
            raise errors[0]
        # zip stops at the outcomes: calls a sequential batch did not reach are neither paused nor finished
        paused = [(c, o) for c, o in zip(calls, outcomes) if isinstance(o, Interrupt)]
        finished = {c.slot: o for c, o in zip(calls, outcomes) if not isinstance(o, BaseException)}
        if paused:
            raise CompositeInterrupt(
                {"paused_tool_calls": [c.call.id for c, _ in paused]},
                {"v": _STATE, "done": finished, "paused": {c.slot: o.info for c, o in paused},
                 "keys": {c.slot: step.keys[c.slot] for c, _ in paused if c.slot in step.keys},
                 "inputs": {c.slot: step.inputs[c.slot] for c, _ in paused if c.slot in step.inputs},
                 "decisions": list(step.decisions)},
                [o for _, o in paused],
            )
        stop = next((o[0] for o in finished.values() if o[1] is True or o[1] == BREAK), None)
        break_loop = any(o[1] == BREAK for o in finished.values())
        transfer = next((o[1][len(HANDOFF):] for c in calls if c.slot in finished and isinstance(
            (o := finished[c.slot])[1], str) and o[1].startswith(HANDOFF)), None)
        messages = [Message.tool(finished[c.slot][0], tool_call_id=c.call.id, name=c.call.name) for c in calls]
        # decisions of calls that paused again, then each finished call's own (kept with its result, so a
        # crash after the call does not lose it)
        done = [d for c in calls for d in _decisions_of(finished[c.slot])]
        return ToolBatch(messages=messages, stop=stop, break_loop=break_loop, transfer=transfer,
                         names=[c.call.name for c in calls],
                         decisions=[*step.decisions, *done])

    @staticmethod
    async def results_so_far(position: Any, address: str, ledger: TaskLedger | None) -> dict[int, str]:
        """What each call of the batch a stored run stopped in came to, by position, for a model to read: a
        finished call's result (from the paused state, `position.interrupts[...]`, or the tool ledger); a call
        that was started and has no result, `STARTED_UNKNOWN` with its idempotency key — its process stopped
        inside it, and it may have taken effect. Calls never started are absent. `address`: the tools node's."""
        node = address.rsplit(";node:", 1)[-1]
        record = position.interrupts.get(node)
        saved = record.state if record is not None and isinstance(record.state, dict) else {}
        outcomes = {slot: outcome[0] for slot, outcome in (saved.get("done") or {}).items()} if (
            saved.get("v") == _STATE) else {}
        started: dict[str, Any] = {}
        for key, value in (await ledger.recorded() if ledger is not None else {}).items():
            kind, _, slot = key.partition(":")
            if kind == "result":
                outcomes.setdefault(slot, value[0])
            elif kind == "start":
                started[slot] = value
        for slot, key in started.items():
            outcomes.setdefault(slot, STARTED_UNKNOWN.format(key=key if isinstance(key, str) else "not recorded"))
        return {int(slot.split(":", 1)[0]): text for slot, text in outcomes.items()}

    def _event(self, c: _Call, kind: str, **fields: Any) -> ToolEvent:
        return ToolEvent(kind=kind, call_id=c.call.id, name=c.call.name, index=c.index, ref=c.ref,  # type: ignore[arg-type]
                         **fields)

    async def _one(self, c: _Call, step: _Step) -> list[Any]:
        """[content, stopped (False, True or BREAK), decision] for one call, or raises its pause."""
        call = c.call
        if c.slot in step.done:  # finished before a pause or a crash: its result, announced again
            outcome = step.done[c.slot]
            await emit_chunk(self._event(c, "end", data=Message.tool(outcome[0], tool_call_id=call.id, name=call.name)))
            return outcome
        with address_segment("tool", call.name, call.id, str(c.index)):
            resumed = False
            data = None
            if c.slot in step.paused:
                is_target, _, data = get_resume_context()
                if not is_target:  # not targeted: pause again as it was (same address, ID and state), without running
                    raise pause_again()
                resumed = True
                if not isinstance(data, (Respond, Restart)):  # a verb may answer a question asked inside the call
                    data = next((d for d in answers_below() if isinstance(d, (Respond, Restart))), data)
            epoch = step.keys.setdefault(c.slot, ledger_epoch())
            ctx = ToolContext(
                name=call.name, call_id=call.id, checkpoint_id=current_checkpoint_id(),
                arguments=step.inputs.get(c.slot, call.arguments),
                idempotency_key=epoch if isinstance(epoch, str) else idempotency_key(epoch), resumed=resumed,
                rerun=c.slot in step.started, position=c.index,
                original_input=call.arguments if c.slot in step.inputs else None,
            )
            try:
                if isinstance(data, Respond):  # the resumer supplies the result: the tool does not run
                    ctx.decide("responded")
                    return await self._record(c, step, [_text(data.output), False, ctx.decision])
                if isinstance(data, Restart):
                    self._restart(c, ctx, data, step)
                return await self._execute(c, ctx, step)
            except Interrupt:  # a decision counts even when the call pauses again
                if ctx.decision is not None:
                    step.decisions.append(ctx.decision)
                raise
            finally:
                if ctx.decision is not None:
                    await emit_chunk(self._event(c, "decision", data=ctx.decision))

    @staticmethod
    def _restart(c: _Call, ctx: ToolContext, data: Restart, step: _Step) -> None:
        ctx.decide("restarted")
        ctx.resumed_metadata = data.metadata
        if data.replace_input is not None:
            ctx.original_input = c.call.arguments
            ctx.arguments = data.replace_input if isinstance(data.replace_input, str) else json.dumps(data.replace_input)
            step.inputs[c.slot] = ctx.arguments

    async def _execute(self, c: _Call, ctx: ToolContext, step: _Step) -> list[Any]:
        ledger = step.ledger
        check_lease()  # a process that may have lost the run starts nothing more
        if ledger is not None and not ctx.rerun and not await ledger.record(f"start:{c.slot}", ctx.idempotency_key):
            raise LeaseLost(f"run '{ctx.checkpoint_id}': tool call {c.call.id!r} was started by another process, which "
                            "runs this step now; this process starts nothing more", checkpoint_id=ctx.checkpoint_id)
        check_lease()  # the start's commit may have landed late (the process froze inside it): still ours to run?
        await emit_chunk(self._event(c, "start", data=c.call.arguments, rerun=ctx.rerun,
                                     idempotency_key=ctx.idempotency_key))
        stopped = False
        try:
            content = await self._content(c, ctx)
        except (RetryAgentRun, StopAgentRun) as err:  # its message is the result: whatever it streamed is void
            await emit_chunk(self._event(c, "void"))
            content = err.message
            stopped = (BREAK if isinstance(err, BreakLoop) else HANDOFF + err.agent if isinstance(err, HandOff)
                       else isinstance(err, StopAgentRun))
        except BaseException as err:  # it paused or failed: whoever watches its chunks stops waiting
            await emit_chunk(self._event(c, "stop", data=err))
            raise
        return await self._record(c, step, [content, stopped, ctx.decision, list(ctx.nested_decisions)])

    async def _record(self, c: _Call, step: _Step, outcome: list[Any]) -> list[Any]:
        """The call is done: ledger, then its result event."""
        ledger = step.ledger
        if ledger is not None:
            await ledger.record(f"result:{c.slot}", outcome)
        await emit_chunk(self._event(c, "end", data=Message.tool(outcome[0], tool_call_id=c.call.id,
                                                                 name=c.call.name)))
        return outcome

    async def _content(self, c: _Call, ctx: ToolContext) -> str:
        """The call's result, through the middlewares (first = outermost); a retry voids earlier chunks."""
        call = c.call
        tool = self.tools.get(call.name)
        args = ctx.arguments or "{}"
        if tool is None:
            if self.unknown_tool_handler is None:
                known = ", ".join(sorted(self.tools)) or "none"
                return f"[tool error] there is no tool named '{call.name}'; the tools are: {known}"
            endpoint: Any = _handler(self.unknown_tool_handler, call.name)  # guarded like any tool
        else:
            try:
                tool.parse(args)  # before any middleware: nobody approves a call that cannot run
            except ToolArgumentError as err:
                return f"[tool error] tool '{call.name}': {err}"
            endpoint = _streamable(tool, ctx) if tool.streams else _invokable(tool, ctx)
        kind = "wrap_streamable_tool_call" if tool is not None and tool.streams else "wrap_invokable_tool_call"
        for mw in reversed(self.middlewares):
            wrap = getattr(mw, kind, None)
            endpoint = wrap(endpoint, ctx) if wrap is not None else endpoint

        async def voided() -> None:
            await emit_chunk(self._event(c, "void"))

        with collecting_attempts(voided) as attempts:
            if kind == "wrap_invokable_tool_call":
                return await endpoint(args)
            pieces = []
            async for piece in endpoint(args):
                pieces.append((attempts.number, piece))
                await emit_chunk(self._event(c, "chunk", data=piece))
            return "".join(piece for n, piece in pieces if n == attempts.number)


def _handler(handler: Callable[[str, str], Any], name: str) -> Callable[[str], Any]:
    """`unknown_tool_handler(name, arguments_json)` as an invokable endpoint (a sync one off the loop, like
    a sync tool)."""
    is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None))

    async def endpoint(args_json: str) -> str:
        scope = current_task()
        if not is_async and scope is not None and scope.run.offload_sync:
            result = await in_daemon_thread(handler, name, args_json)
        else:
            result = handler(name, args_json)
        return _text(await result if inspect.isawaitable(result) else result)

    return endpoint


def _invokable(tool: Tool, ctx: ToolContext) -> Callable[[str], Any]:
    async def endpoint(args_json: str) -> str:
        return await tool.invoke(args_json, ctx)

    return endpoint


def _streamable(tool: Tool, ctx: ToolContext) -> Callable[[str], AsyncIterator[str]]:
    def endpoint(args_json: str) -> AsyncIterator[str]:
        return tool.stream(args_json, ctx)

    return endpoint


def _decisions_of(outcome: list[Any]) -> list[Any]:
    """A finished call's decisions, as its outcome keeps them: its own (third), then those made inside the agent it
    ran (fourth; outcomes recorded before there was one have three)."""
    own = [outcome[2]] if len(outcome) > 2 and outcome[2] is not None else []
    return [*own, *(outcome[3] if len(outcome) > 3 and outcome[3] else [])]
