"""`AgentTool`: an agent used as a tool by another agent (Eino's `NewAgentTool`).

The model calls it like any tool, with a `request` argument; the agent runs on that request (or on the
calling agent's conversation plus the request, with `full_history=True`) and its final answer is the tool's
result. The run is *nested* in the tool call (`run_nested`, engine/compose/nested.py), so it is part of the calling
run's checkpoint — never a run of its own in the store:

- each step it finishes is recorded there; a crash continues it from its last finished step;
- a pause inside it (a tool of its own under `ApprovalMiddleware`, say) pauses the calling run with that
  pause's own ID, address, info and state; answering it, in any process, resumes the call, which continues
  the agent exactly where it paused; then the calling agent goes on with the answer;
- its events reach the caller's `Runner` with `run_path` naming both agents; its tokens stream live;
- its ledger entries and idempotency keys are its own per call: two calls in one message, or in two turns,
  never share one (its places hang below the call's, which the tools node tells apart by position).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from ..compose import run_nested
from ..models.schema import Message
from ..tools.tool import Tool, ToolContext

__all__ = ["AgentTool", "calling_tools", "label_of", "publish_decisions"]


@dataclass(frozen=True)
class _Caller:
    messages: Sequence[Message]
    streaming: bool


_CALLER: ContextVar[_Caller | None] = ContextVar("waypoint_agent_caller", default=None)
_DECISIONS: ContextVar[list[Any] | None] = ContextVar("waypoint_agent_tool_decisions", default=None)
"""Inside an agent tool's run: where the agent it runs says every decision its run holds so far."""


def publish_decisions(decisions: Sequence[Any]) -> None:
    """(An agent's tools box, after each batch.) When this agent runs inside an `AgentTool` call, tell the call every
    decision the agent's run holds (its state's: those of earlier passes too), so the calling run records them."""
    into = _DECISIONS.get()
    if into is not None:
        into[:] = list(decisions)


@contextmanager
def calling_tools(messages: Sequence[Message], streaming: bool) -> Iterator[None]:
    """Set by an agent's tools box around its calls: what an `AgentTool` reads (the conversation, for
    `full_history`; whether the caller streams, so the nested agent streams too)."""
    token = _CALLER.set(_Caller(messages, streaming))
    try:
        yield
    finally:
        _CALLER.reset(token)


def label_of(agent_name: str, position: int) -> str:
    """How an agent tool's run is named in events' `node_path`: one message may call it twice, so the call's
    position tells the two runs apart (`researcher#0`, `researcher#1`)."""
    return f"{agent_name}#{position}"


class AgentTool(Tool):
    """`agent` as a tool named `name` (default: the agent's name) described by `description` (default: the
    agent's description). The model passes `request`; with `full_history=True` the agent also gets the calling
    agent's conversation (its user messages and its answers; not tool calls or the instruction)."""

    def __init__(self, agent: Any, *, name: str | None = None, description: str | None = None,
                 full_history: bool = False) -> None:
        self.agent = agent
        self.full_history = full_history
        self._shapes: dict[bool, Any] = {}

        async def call(request: str, ctx: ToolContext) -> str:
            """Ask the agent.

            Args:
                request: what to ask the agent, in full: it does not see this conversation
            """
            return await self._run(request, ctx)

        about = description or getattr(agent, "description", "") or f"Ask the agent '{agent.name}'."
        super().__init__(call, name=name or agent.name, description=about)

    def __repr__(self) -> str:
        return f"AgentTool({self.agent.name!r})"

    def resume_problem(self, below: str) -> str | None:
        """Why a pause of the agent's run nested in a call (`below`: `runnable:<agent>;node:<key>;...`) cannot be
        continued by this version of the agent, or None (engine/keep/admission.py asks it through the tools node)."""
        segments = below.split(";")
        if len(segments) < 2 or not segments[1].startswith("node:"):
            return None
        key = segments[1][len("node:"):]
        compiled = self._shape(False)
        node = getattr(compiled, "shape", compiled).nodes.get(key)
        if node is None:
            return f"in agent tool '{self.name}': node '{key}', where its run is, is gone"
        ask = getattr(getattr(getattr(node, "runnable", None), "source", None), "resume_problem", None)
        problem = ask(";".join(segments[2:])) if ask is not None and len(segments) > 2 else None
        return f"in agent tool '{self.name}': {problem}" if problem else None

    async def _run(self, request: str, ctx: ToolContext) -> str:
        caller = _CALLER.get()
        streaming = caller.streaming if caller is not None else False
        messages = [Message.user(request)]
        if self.full_history and caller is not None:
            messages = [*_history(caller.messages), *messages]
        decided: list[Any] = []
        token = _DECISIONS.set(decided)
        try:
            output = await run_nested(self._shape(streaming), messages, label=label_of(self.agent.name, ctx.position))
        finally:
            _DECISIONS.reset(token)
        ctx.nested_decisions = [replace(d, run_path=(self.agent.name, *d.run_path)) for d in decided]
        return output.content if isinstance(output, Message) else str(output)

    def _shape(self, streaming: bool) -> Any:
        shape = self._shapes.get(streaming)
        if shape is None:
            shape = self._shapes[streaming] = self.agent.compile(streaming=streaming)
        return shape


def _history(messages: Sequence[Message]) -> list[Message]:
    """The calling conversation as the agent tool is handed it: what the user said and the answers given."""
    return [m for m in messages if m.role == "user" or (m.role == "assistant" and not m.tool_calls and m.content)]
