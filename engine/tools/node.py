"""`ToolsNode`: runs the tool calls of one assistant message, each at most once per step.

Per call, in order: a finished call's result is taken from the task ledger or the saved pause state
(never run again); a paused call the resume did not target pauses again with its ID and state; bad
arguments or an unknown tool become an error result for the model; otherwise the tool runs through the
middlewares (first = outermost), a start marker and then the result going to the ledger the moment
each exists. Calls run concurrently unless `sequential=True`; results keep call order.

Pauses of several calls become one `CompositeInterrupt` (one root cause per call) whose state holds the
results of the calls that finished. A tool error other than `RetryAgentRun` / `StopAgentRun` fails the
node (wrap tools in `SafeToolMiddleware` to turn errors into results) — the finished calls stay in the
ledger, so a resume does not run them again.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import LeaseLost
from ..interrupts import CompositeInterrupt, Interrupt, StatefulInterrupt
from ..models.schema import Message, ToolCall, ToolInfo
from ..resume import address_segment, get_interrupt_state, get_resume_context
from ..task import TaskLedger, check_lease, current_checkpoint_id, emit_chunk, idempotency_key, task_ledger
from .tool import RetryAgentRun, StopAgentRun, Tool, ToolArgumentError, ToolContext, _text, as_tool
from .verbs import Decision, Respond, Restart

__all__ = ["ToolsNode", "ToolBatch", "ToolEvent"]


@dataclass(frozen=True, kw_only=True)
class ToolEvent:
    """What the tools node publishes live (`emit_chunk`) about one call: it started (`data`: the
    arguments), produced a chunk of text, was decided on (`data`: a `Decision`), ended (`data`: the
    tool `Message`), or stopped without a result (it paused or failed; `data`: the exception)."""

    kind: Literal["start", "chunk", "end", "stop", "decision"]
    call_id: str
    name: str
    data: Any = None
    rerun: bool = False
    idempotency_key: str = ""


@dataclass(kw_only=True)
class ToolBatch:
    """The tool messages of one batch, in call order; `stop` holds a `StopAgentRun` message."""

    messages: list[Message]
    stop: str | None = None
    names: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    """What resumes decided about paused calls in this batch (approved, rejected, responded, restarted)."""


@dataclass
class _Step:
    """What this step already knows: finished results (ledger, pause state) and paused calls."""

    ledger: TaskLedger | None
    done: dict[str, list[Any]]
    paused: dict[str, Any]
    started: set[str]
    keys: dict[str, str]
    """Idempotency keys of paused calls: a call keeps its key when a resume runs it in a later step."""
    decisions: list[Decision] = field(default_factory=list)
    inputs: dict[str, str] = field(default_factory=dict)
    """Arguments a `Restart` replaced, for calls that paused again: the next pass keeps them."""


class ToolsNode:
    """Run the tool calls of an assistant message (a node of its own, or the agent's tools box)."""

    def __init__(self, tools: Sequence[Any], *, sequential: bool = False,
                 unknown_tool_handler: Callable[[str, str], Any] | None = None,
                 middlewares: Sequence[Any] = ()) -> None:
        self.tools: dict[str, Tool] = {}
        for t in map(as_tool, tools):
            if t.name in self.tools:
                raise ValueError(f"two tools are named '{t.name}'; tool names must be unique")
            self.tools[t.name] = t
        self.sequential = sequential
        self.unknown_tool_handler = unknown_tool_handler
        self.middlewares = tuple(middlewares)

    @property
    def infos(self) -> list[ToolInfo]:
        return [t.info for t in self.tools.values()]

    async def ainvoke(self, message: Message) -> list[Message]:
        """The tool messages answering `message`'s calls (a node's value-in, value-out form)."""
        return (await self.run(message)).messages

    async def run(self, message: Message) -> ToolBatch:
        calls = list(message.tool_calls) if isinstance(message, Message) else []
        if not calls:
            raise ValueError("the tools node got a message without tool calls; route to it only when the "
                             "assistant asked for tools")
        step = await self._step()
        if self.sequential:
            outcomes = []
            for call in calls:
                try:
                    outcomes.append(await self._one(call, step))
                except BaseException as err:  # noqa: BLE001 - sorted out below, after every call had its turn
                    if isinstance(err, asyncio.CancelledError):
                        raise
                    outcomes.append(err)
        else:
            outcomes = await asyncio.gather(*(self._one(c, step) for c in calls), return_exceptions=True)
        return self._finish(calls, outcomes, step)

    async def _step(self) -> _Step:
        ledger = task_ledger()
        recorded = await ledger.recorded() if ledger is not None else {}
        _, _, saved = get_interrupt_state()
        saved = saved if isinstance(saved, dict) else {}
        done = {k: list(v) for k, v in (saved.get("done") or {}).items()}
        for key, value in recorded.items():
            if key.startswith("result:"):
                done.setdefault(key[7:], list(value))
        started = {key[6:] for key in recorded if key.startswith("start:")}
        return _Step(ledger=ledger, done=done, paused=dict(saved.get("paused") or {}), started=started,
                     keys=dict(saved.get("keys") or {}), decisions=list(saved.get("decisions") or []),
                     inputs=dict(saved.get("inputs") or {}))

    def _finish(self, calls: list[ToolCall], outcomes: list[Any], step: _Step) -> ToolBatch:
        errors = [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, Interrupt)]
        if errors:
            raise errors[0]
        paused = [(c, o) for c, o in zip(calls, outcomes) if isinstance(o, Interrupt)]
        finished = {c.id: o for c, o in zip(calls, outcomes) if not isinstance(o, BaseException)}
        if paused:
            raise CompositeInterrupt(
                {"paused_tool_calls": [c.id for c, _ in paused]},
                {"done": finished, "paused": {c.id: o.info for c, o in paused},
                 "keys": {c.id: step.keys[c.id] for c, _ in paused if c.id in step.keys},
                 "inputs": {c.id: step.inputs[c.id] for c, _ in paused if c.id in step.inputs},
                 "decisions": list(step.decisions)},
                [o for _, o in paused],
            )
        stop = next((content for content, stopped in finished.values() if stopped), None)
        messages = [Message.tool(finished[c.id][0], tool_call_id=c.id, name=c.name) for c in calls]
        return ToolBatch(messages=messages, stop=stop, names=[c.name for c in calls], decisions=list(step.decisions))

    async def _one(self, call: ToolCall, step: _Step) -> list[Any]:
        """[content, stopped] for one call, or raises its pause."""
        if call.id in step.done:  # finished before a pause or a crash: its result, announced again
            outcome = step.done[call.id]
            await emit_chunk(ToolEvent(kind="end", call_id=call.id, name=call.name,
                                       data=Message.tool(outcome[0], tool_call_id=call.id, name=call.name)))
            return outcome
        with address_segment("tool", _segment(call.name or "unknown"), _segment(call.id)):
            was, has_state, state = get_interrupt_state()
            resumed = False
            key = step.keys.setdefault(call.id, idempotency_key())
            data = None
            if was or call.id in step.paused:
                is_target, _, data = get_resume_context()
                if not is_target:  # not targeted: pause again as it was, without running
                    info = step.paused.get(call.id)
                    raise StatefulInterrupt(info, state) if has_state else Interrupt(info)
                resumed = True
            ctx = ToolContext(
                name=call.name, call_id=call.id, checkpoint_id=current_checkpoint_id(),
                arguments=step.inputs.get(call.id, call.arguments), idempotency_key=key, resumed=resumed,
                rerun=call.id in step.started,
                original_input=call.arguments if call.id in step.inputs else None,
            )
            try:
                if isinstance(data, Respond):  # the resumer supplies the result: the tool does not run
                    ctx.decide("responded")
                    return await self._record(call, ctx, step, [_text(data.output), False])
                if isinstance(data, Restart):
                    self._restart(call, ctx, data, step)
                return await self._execute(call, ctx, step)
            finally:  # a decision counts even when the call pauses again
                if ctx.decision is not None:
                    step.decisions.append(ctx.decision)
                    await emit_chunk(ToolEvent(kind="decision", call_id=call.id, name=call.name, data=ctx.decision))

    @staticmethod
    def _restart(call: ToolCall, ctx: ToolContext, data: Restart, step: _Step) -> None:
        ctx.decide("restarted")
        ctx.resumed_metadata = data.metadata
        if data.replace_input is not None:
            ctx.original_input = call.arguments
            ctx.arguments = data.replace_input if isinstance(data.replace_input, str) else json.dumps(data.replace_input)
            step.inputs[call.id] = ctx.arguments

    async def _execute(self, call: ToolCall, ctx: ToolContext, step: _Step) -> list[Any]:
        ledger = step.ledger
        check_lease()  # a process that lost the run starts no call
        if ledger is not None and not ctx.rerun and not await ledger.record(f"start:{call.id}", True):
            raise LeaseLost(f"run '{ctx.checkpoint_id}': tool call {call.id!r} was started by another process, which "
                            "runs this step now; this process starts nothing more", checkpoint_id=ctx.checkpoint_id)
        await emit_chunk(ToolEvent(kind="start", call_id=call.id, name=call.name, data=call.arguments,
                                   rerun=ctx.rerun, idempotency_key=ctx.idempotency_key))
        stopped = False
        try:
            content = await self._content(call, ctx)
        except RetryAgentRun as err:
            content = err.message
        except StopAgentRun as err:
            content, stopped = err.message, True
        except BaseException as err:  # it paused or failed: whoever watches its chunks stops waiting
            await emit_chunk(ToolEvent(kind="stop", call_id=call.id, name=call.name, data=err))
            raise
        return await self._record(call, ctx, step, [content, stopped])

    async def _record(self, call: ToolCall, ctx: ToolContext, step: _Step, outcome: list[Any]) -> list[Any]:
        """The call is done: ledger, decision and result events."""
        content = outcome[0]
        ledger = step.ledger
        if ledger is not None:
            await ledger.record(f"result:{call.id}", outcome)
        await emit_chunk(ToolEvent(kind="end", call_id=call.id, name=call.name,
                                   data=Message.tool(content, tool_call_id=call.id, name=call.name)))
        return outcome

    async def _content(self, call: ToolCall, ctx: ToolContext) -> str:
        tool = self.tools.get(call.name)
        if tool is None:
            return await self._unknown(call)
        args = ctx.arguments or "{}"
        try:
            tool.parse(args)  # before any middleware: nobody approves a call that cannot run
        except ToolArgumentError as err:
            return f"[tool error] tool '{call.name}': {err}"
        if not tool.streams:
            endpoint: Any = _invokable(tool, ctx)
            for mw in reversed(self.middlewares):
                wrap = getattr(mw, "wrap_invokable_tool_call", None)
                endpoint = wrap(endpoint, ctx) if wrap is not None else endpoint
            return await endpoint(args)
        stream: Any = _streamable(tool, ctx)
        for mw in reversed(self.middlewares):
            wrap = getattr(mw, "wrap_streamable_tool_call", None)
            stream = wrap(stream, ctx) if wrap is not None else stream
        pieces = []
        async for piece in stream(args):
            pieces.append(piece)
            await emit_chunk(ToolEvent(kind="chunk", call_id=call.id, name=call.name, data=piece))
        return "".join(pieces)

    async def _unknown(self, call: ToolCall) -> str:
        if self.unknown_tool_handler is None:
            known = ", ".join(sorted(self.tools)) or "none"
            return f"[tool error] there is no tool named '{call.name}'; the tools are: {known}"
        result = self.unknown_tool_handler(call.name, call.arguments)
        return await result if inspect.isawaitable(result) else str(result)


def _invokable(tool: Tool, ctx: ToolContext) -> Callable[[str], Any]:
    async def endpoint(args_json: str) -> str:
        return await tool.invoke(args_json, ctx)

    return endpoint


def _streamable(tool: Tool, ctx: ToolContext) -> Callable[[str], AsyncIterator[str]]:
    def endpoint(args_json: str) -> AsyncIterator[str]:
        return tool.stream(args_json, ctx)

    return endpoint


def _segment(text: str) -> str:
    """Address parts may not hold ';' or ':' (a server's call IDs sometimes do)."""
    return text.replace(";", "_").replace(":", "_")

