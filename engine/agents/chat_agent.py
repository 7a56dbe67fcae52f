"""`ChatModelAgent`: a ReAct loop compiled to a `Graph` (docs/agents.md draws it box by box).

    START → prompt → [prepare →] model ─(tool calls)→ tools ─→ [prepare →] model …
                                   └─(an answer)→ END     ├─(return_directly / StopAgentRun)→ END
                                                          └─(transfer_to_agent)→ <handoff agent> → END

The `prepare` box is there only when a middleware has a `prepare_model` hook (compaction's summary call, a step
of its own); without one the graph, and so a stored run's fingerprint, is what it always was.

Its run-local state is an `AgentState` (the conversation and the number of model calls), stored by
the engine like any state: the conversation is an append-only list, so a step writes its new messages
only. Nothing here saves or loads anything: persistence, pauses, crash recovery, leases and
compare-and-set are the engine's.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..codec import register_type
from ..compose import Graph
from ..errors import GraphBuildError, MaxIterationsExceeded
from ..models.base import ChatModel, ToolChoice
from ..models.schema import Message, ToolCall, as_messages, concat_messages
from ..run import collecting_attempts, current_checkpoint_id, emit_chunk, enclosing_state
from ..shape import END, START
from ..tools.node import ToolsNode
from ..tools.verbs import Decision
from .agent_tool import calling_tools, publish_decisions
from .handoff import check_handoffs, handoff_input, transfer_tool
from .middleware import AgentContext, StoredMessage, prepares_model
from .session import Session, answer_of, format_instruction
from .summary import Compaction, model_view

__all__ = ["ChatModelAgent", "AgentState"]

PREPARE = "prepare"
"""The box before the model box, when a middleware has a `prepare_model` hook."""


@register_type(name="waypoint.AgentState")
@dataclass
class AgentState:
    """An agent run's state: the conversation, and how many model calls it has made."""

    messages: list[Message] = field(default_factory=list)
    iterations: int = 0
    decisions: list[Decision] = field(default_factory=list)
    """What resumes decided about paused tool calls (approved, rejected, responded, restarted)."""
    stop: bool = False
    """Set by the tools box when the run must end after it (return_directly, StopAgentRun)."""
    transfer: str | None = None
    """Set by the tools box when the model handed the conversation to this agent's handoff of that name."""
    compaction: Compaction | None = None
    """A summary the model is sent in place of the first messages (`CompactionMiddleware`); `messages` keeps them."""


class ChatModelAgent:
    """An agent that answers with `model`, calling `tools` as the model asks, until it answers.

    `max_iterations` bounds the model calls of one run (`MaxIterationsExceeded` carries the last
    response); `tool_choice` is passed to every model call; calls to a tool in `return_directly` end the
    run with that tool's result; `return_tool_requests=True` ends the run at the first tool request and
    hands it to the caller instead of running it. `middlewares` hook in (first = outermost).

    In a workflow agent (engine/agents/workflow.py) `{key}` in `instruction` reads the session value `key`,
    and `output_key` names the session value its answer is stored under. `handoffs` are agents the model may
    hand the conversation to (`transfer_to_agent`, engine/agents/handoff.py).
    """

    def __init__(self, *, name: str, model: ChatModel, instruction: str = "", tools: Sequence[Any] = (),
                 middlewares: Sequence[Any] = (), max_iterations: int = 20, tool_choice: ToolChoice = "auto",
                 return_directly: Sequence[str] = (), return_tool_requests: bool = False,
                 sequential_tools: bool = False, unknown_tool_handler: Any = None, description: str = "",
                 output_key: str | None = None, handoffs: Sequence[Any] = ()) -> None:
        if max_iterations < 1:
            raise GraphBuildError(f"agent '{name}': max_iterations must be at least 1, got {max_iterations}")
        check_handoffs(name, handoffs)
        self.name = name
        self.description = description
        self.model = model
        self.instruction = instruction
        self.output_key = output_key
        self.handoffs = tuple(handoffs)
        self.middlewares = tuple(middlewares)
        self.preparing = tuple(mw for mw in self.middlewares if prepares_model(mw))
        if self.preparing and any(a.name == PREPARE for a in self.handoffs):
            raise GraphBuildError(f"agent '{name}': a handoff agent may not be named {PREPARE!r} (the box of its "
                                  "prepare_model middleware); rename it")
        extra = [transfer_tool(self.handoffs)] if self.handoffs else []
        self.tools_node = ToolsNode([*tools, *extra], sequential=sequential_tools,
                                    unknown_tool_handler=unknown_tool_handler, middlewares=self.middlewares,
                                    where=f"agent '{name}'")
        unknown = sorted(set(return_directly) - set(self.tools_node.tools))
        if unknown:
            raise GraphBuildError(f"agent '{name}': return_directly names tools it does not have: {unknown}")
        self.max_iterations = max_iterations
        self.tool_choice = tool_choice
        self.return_directly = frozenset(return_directly)
        self.return_tool_requests = return_tool_requests

    def graph(self, *, streaming: bool = False) -> Graph:
        """The agent as a graph builder; with `streaming=True` the model box streams its calls and
        publishes each chunk live (the structure, and so a stored run's fingerprint, is the same)."""
        return self._build(streaming)

    def compile(self, *, streaming: bool = False, **options: Any) -> Any:
        """The agent's graph, compiled (`store=`, `durability=`, `lease_seconds=`, `serializer=` ...)."""
        per_iteration = 3 if self.preparing else 2  # (prepare,) model, tools
        options.setdefault("max_steps", per_iteration * self.max_iterations + 4 + (1 if self.handoffs else 0))
        durability = options.get("durability")
        if options.get("store") is not None and durability not in (None, "step") and self.uses_tools():
            raise GraphBuildError(
                f"agent '{self.name}': durability={durability!r} keeps no tool ledger, so a resume after a failed "
                "or cancelled tools step would run its finished calls again; agents with tools take "
                "durability='step' (the default with a store)")
        app = self._build(streaming).compile(**options)
        app.agent = self
        return app

    def to_mermaid(self) -> str:
        """The agent's graph as a Mermaid flowchart."""
        return self._build(False).to_mermaid()

    def uses_tools(self) -> bool:
        """Whether this agent, or one it hands to, calls tools (then it needs durability="step" with a store)."""
        return bool(self.tools_node.tools) or any(a.uses_tools() for a in self.handoffs)

    def sub_agents(self) -> dict[str, Any]:
        """The agents that run as nodes of this agent's graph, by node key: its handoffs."""
        return {a.name: a for a in self.handoffs}

    def tool_agents(self) -> dict[str, Any]:
        """The agents this agent calls as tools (`AgentTool`), by agent name."""
        return {t.agent.name: t.agent for t in self.tools_node.tools.values() if hasattr(t, "agent")}

    # --- the graph ----------------------------------------------------------------------------------

    def _build(self, streaming: bool) -> Graph:
        async def model(_: Any, state: AgentState) -> Message:
            return await self._model(state, streaming)

        async def tools(message: Message, state: AgentState) -> Message:
            return await self._tools(message, state, streaming)

        tools.resume_problem = self.tools_node.resume_problem  # type: ignore[attr-defined]  # a deploy's check
        tools.answer_removed = self.tools_node.answer_removed  # type: ignore[attr-defined]  # and its migration

        g = Graph(name=self.name, state=AgentState)
        g.add_node("prompt", self._prompt)
        g.add_node("model", model)
        g.add_edge(START, "prompt")
        if self.preparing:  # only then: an agent without it keeps the graph its stored runs were made with
            g.add_node(PREPARE, self._prepare)
            g.add_edge(PREPARE, "model")
            g.add_branch("prompt", lambda _, state: self._next_model_box(state), ends=[PREPARE, "model"])
        else:
            g.add_edge("prompt", "model")
        if self.tools_node.tools and not self.return_tool_requests:
            g.add_node("tools", tools)
            g.add_branch("model", lambda m: "tools" if m.tool_calls else END, ends=["tools", END])

            def after_tools(_: Message, state: AgentState) -> str:
                if state.transfer is not None:
                    return state.transfer
                return END if state.stop else self._next_model_box(state)

            model_boxes = [PREPARE, "model"] if self.preparing else ["model"]
            g.add_branch("tools", after_tools, ends=[*model_boxes, END, *(a.name for a in self.handoffs)])
            with _building(self):
                for agent in self.handoffs:
                    g.add_node(agent.name, agent.compile(streaming=streaming), pre=_handoff_input,
                               post=_handoff_answer(agent.name))
                    g.add_edge(agent.name, END)
        else:
            g.add_edge("model", END)
        return g

    def _context(self, state: AgentState) -> AgentContext:
        return AgentContext(agent_name=self.name, state=state, checkpoint_id=current_checkpoint_id())

    def _wrapped(self, model: ChatModel, ctx: AgentContext) -> ChatModel:
        for mw in reversed(self.middlewares):
            wrap = getattr(mw, "wrap_model", None)
            model = wrap(model, ctx) if wrap is not None else model
        return model

    async def _prompt(self, input: Any, state: AgentState) -> None:
        """The conversation so far: the instruction first (once), then what the caller sent."""
        messages = as_messages(input)
        if self.instruction and not any(m.role == "system" for m in (*state.messages, *messages)):
            session = enclosing_state()
            values = session.values if isinstance(session, Session) else {}
            state.messages.append(Message.system(format_instruction(self.instruction, values)))
        state.messages.extend(messages)
        ctx = self._context(state)
        for mw in self.middlewares:
            await _call(getattr(mw, "before_agent", None), ctx)

    def _next_model_box(self, state: AgentState) -> str:
        """`prepare` when a `prepare_model` middleware has work before this model call (`needs_prepare`), else
        `model`: the step, and its checkpoint, is paid for only when there is something to do in it."""
        if state.iterations >= self.max_iterations:
            return "model"  # which ends the run; nothing to prepare a call for
        ctx = self._context(state)
        return PREPARE if any(_wants(mw, ctx) for mw in self.preparing) else "model"

    async def _prepare(self, _: Any, state: AgentState) -> None:
        """The `prepare_model` hooks, in a step of their own before the model box (what they set is stored first)."""
        ctx = self._context(state)
        ctx.model = self.model
        ctx.wrapped = lambda model: self._wrapped(model, ctx)
        for mw in self.preparing:
            if _wants(mw, ctx):
                await mw.prepare_model(ctx)
        return None

    async def _model(self, state: AgentState, streaming: bool) -> Message:
        """One model call: the answer (or tool requests) is appended to the conversation."""
        if state.iterations >= self.max_iterations:
            last = next((m for m in reversed(state.messages) if m.role == "assistant"), None)
            raise MaxIterationsExceeded(
                f"agent '{self.name}' made {state.iterations} model calls without an answer (max_iterations="
                f"{self.max_iterations}); raise max_iterations or check why the model keeps calling tools",
                last_response=last,
            )
        ctx = self._context(state)
        for mw in self.middlewares:
            await _call(getattr(mw, "before_model", None), ctx)
        streamed = await self._ask(self._wrapped(self.model, ctx), state, streaming)
        message = _with_call_ids(streamed, state.iterations)
        for mw in self.middlewares:
            rewritten = await _call(getattr(mw, "after_model", None), ctx, message)
            message = rewritten if isinstance(rewritten, Message) else message
        if streaming and _shown(message) != _shown(streamed):  # the live chunks are not what is stored
            await emit_chunk(StoredMessage(message))
        state.messages.append(message)
        state.iterations += 1
        publish_decisions(state.decisions)  # a run's last step may be this one (a pass that made no tools step)
        if not message.tool_calls or self.return_tool_requests:
            for mw in self.middlewares:
                await _call(getattr(mw, "after_agent", None), ctx)
        return message

    async def _ask(self, model: ChatModel, state: AgentState, streaming: bool) -> Message:
        tools = self.tools_node.infos or None
        choice = self.tool_choice if tools else "none"
        sent = model_view(state.messages, state.compaction)  # the originals stay in the state
        if not streaming:
            return await model.generate(sent, tools=tools, tool_choice=choice)
        chunks = []
        with collecting_attempts() as attempts:  # a retry voids the chunks of the attempts before it
            async for chunk in model.stream(sent, tools=tools, tool_choice=choice):
                chunks.append((attempts.number, chunk))
                await emit_chunk(chunk)  # live, while the model is still producing the rest
            return concat_messages([chunk for n, chunk in chunks if n == attempts.number])

    async def _tools(self, message: Message, state: AgentState, streaming: bool) -> Message:
        """Run the calls; their results join the conversation. Returns the message the run would end with."""
        with calling_tools(state.messages, streaming):  # what an agent used as a tool reads
            batch = await self.tools_node.run(message)
        state.messages.extend(batch.messages)
        state.decisions.extend(batch.decisions)
        publish_decisions(state.decisions)  # inside an agent tool's call: the calling run records them too
        direct = [m for m in batch.messages if m.name in self.return_directly]
        state.transfer = batch.transfer if self.handoffs else None
        if batch.break_loop:
            session = enclosing_state()
            if isinstance(session, Session):  # the loop agent running this one ends after it
                session.breaking = True
        state.stop = bool(direct) or batch.stop is not None or state.transfer is not None
        if state.stop:
            ctx = self._context(state)
            for mw in self.middlewares:
                await _call(getattr(mw, "after_agent", None), ctx)
        return direct[0] if direct else batch.messages[-1]


def _handoff_input(_: Any, state: AgentState) -> list[Message]:
    return handoff_input(state.messages)


def _handoff_answer(name: str) -> Any:
    def post(output: Any, state: AgentState) -> Any:
        state.messages.append(answer_of(name, output))  # the next turn's agent sees who answered, and what
        return output

    return post


_BUILDING: list[int] = []


class _building:
    """Building an agent's handoffs: an agent that would hand (directly or not) back to itself is refused."""

    def __init__(self, agent: ChatModelAgent) -> None:
        self.agent = agent

    def __enter__(self) -> None:
        if id(self.agent) in _BUILDING:
            raise GraphBuildError(f"agent '{self.agent.name}': its handoffs lead back to it; handoffs are one way "
                                  "within a run (the next turn starts at the first agent again)")
        _BUILDING.append(id(self.agent))

    def __exit__(self, *exc: Any) -> None:
        _BUILDING.remove(id(self.agent))


def _with_call_ids(message: Message, iteration: int) -> Message:
    """Every tool call gets an ID of its own and loses its stream index. The model's ID is kept when it is
    short printable ASCII and unique in the message; a missing, repeated or odd one (controls, bidi,
    surrogates, huge) is replaced by ours, so the conversation sent back stays valid and no two calls can
    be mistaken for each other (the tools node tells calls apart by position anyway)."""
    if not message.tool_calls:
        return message
    seen: set[str] = set()
    calls = []
    for i, c in enumerate(message.tool_calls):
        call_id = c.id
        if not _plain_id(call_id) or call_id in seen:
            call_id = f"call_{iteration}_{i}"
            while call_id in seen or any(o.id == call_id for o in message.tool_calls[i + 1:]):
                call_id += "_"
        seen.add(call_id)
        calls.append(ToolCall(id=call_id, name=c.name, arguments=c.arguments))
    return message.model_copy(update={"tool_calls": tuple(calls)})


def _shown(message: Message) -> tuple[Any, ...]:
    """What a reader of the message sees: its text and its calls (not stream indexes)."""
    return message.content, tuple((c.id, c.name, c.arguments) for c in message.tool_calls)


def _plain_id(call_id: str | None) -> bool:
    return bool(call_id) and len(call_id) <= 128 and call_id.isascii() and call_id.isprintable()


def _wants(mw: Any, ctx: AgentContext) -> bool:
    needs = getattr(mw, "needs_prepare", None)
    return True if needs is None else bool(needs(ctx))


async def _call(hook: Any, *args: Any) -> Any:
    if hook is None:
        return None
    result = hook(*args)
    return await result if inspect.isawaitable(result) else result
