"""Workflow agents: `SequentialAgent`, `ParallelAgent`, `LoopAgent` — agents made of agents (Eino's ADK
workflow agents), compiled to graphs whose nodes are the sub-agents' graphs (subgraph nodes).

    Sequential   START → prompt → a → b → c → END            (a BreakLoop inside ends it early)
    Parallel     START → prompt ─┬→ a ─┐
                                 ├→ b ─┼→ join → END
                                 └→ c ─┘
    Loop         START → prompt → a → b → c ─(again)→ a …     (max_iterations, or a BreakLoop → exit → END)

Their run-local state is a `Session` (engine/agents/session.py): the conversation (the input, then each
agent's answer) and session values (`output_key`). Each sub-agent gets the conversation so far — other
agents' answers as context — and its instruction reads session values as `{key}`. A workflow agent nested in
a sequential or loop agent shares the session (it has no `prompt` box and no state of its own); a branch of a
parallel agent that is itself a workflow agent gets a session of its own, seeded with the conversation at
the fork, so parallel branches never see each other's half-finished work.

Because every sub-agent is a subgraph node, the engine's rules for subgraphs are the guarantees here: a
pause inside the second of three sequential agents is stored with that agent's nested position and resumes
there (the first does not run again); in a parallel agent, the branches that finished while one paused keep
their results and do not run again; each finished step of a sub-agent is recorded in the run's checkpoint,
so a crash continues the sub-agent where it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..compose import Graph
from ..errors import GraphBuildError
from ..models.schema import Message, as_messages
from ..shape import END, START
from .session import Session, answer_of, conversation_for

__all__ = ["SequentialAgent", "ParallelAgent", "LoopAgent"]

_RESERVED = frozenset({"prompt", "join", "exit"})


class _WorkflowAgent:
    """What the three workflow agents share: checks, building, compiling."""

    def __init__(self, name: str, agents: Sequence[Any], *, description: str = "",
                 output_key: str | None = None) -> None:
        self.name = name
        self.agents = tuple(agents)
        self.description = description
        self.output_key = output_key
        self._check()

    # --- what Runner and composing agents use ------------------------------------------------------------

    def graph(self, *, streaming: bool = False) -> Graph:
        """The workflow as a graph builder (with its own session)."""
        return self._graph(streaming, root=True)

    def compile(self, *, streaming: bool = False, **options: Any) -> Any:
        """The workflow's graph, compiled (`store=`, `durability=`, `lease_seconds=`, `serializer=` ...)."""
        options.setdefault("max_steps", self._max_steps())
        durability = options.get("durability")
        if options.get("store") is not None and durability not in (None, "step") and self.uses_tools():
            raise GraphBuildError(
                f"agent '{self.name}': durability={durability!r} keeps no tool ledger, so a resume after a failed "
                "or cancelled tools step would run its finished calls again; agents with tools take "
                "durability='step' (the default with a store)")
        app = self._graph(streaming, root=True).compile(**options)
        app.agent = self
        return app

    def to_mermaid(self) -> str:
        """The workflow's graph as a Mermaid flowchart (each sub-agent is one box)."""
        return self._graph(False, root=True).to_mermaid()

    def uses_tools(self) -> bool:
        return any(a.uses_tools() for a in self.agents)

    def sub_agents(self) -> dict[str, Any]:
        """The agents that run as nodes of this workflow's graph, by node key."""
        return {a.name: a for a in self.agents}

    def tool_agents(self) -> dict[str, Any]:
        return {}

    # --- building --------------------------------------------------------------------------------------

    def _nested(self, streaming: bool) -> Any:
        """Compiled to run inside another workflow agent, sharing its session."""
        return self._graph(streaming, root=False).compile(max_steps=self._max_steps())

    def _graph(self, streaming: bool, *, root: bool) -> Graph:
        g = Graph(name=self.name, state=Session if root else None)
        entry = START
        if root:
            g.add_node("prompt", _prompt)
            g.add_edge(START, "prompt")
            entry = "prompt"
        self._body(g, entry, streaming)
        return g

    def _body(self, g: Graph, entry: str, streaming: bool) -> None:
        raise NotImplementedError

    def _max_steps(self) -> int:
        raise NotImplementedError

    def _add(self, g: Graph, agent: Any, streaming: bool, *, shared: bool = True, post: Any = None,
             output_key: str | None = None) -> None:
        """`agent` as a subgraph node named after it; `shared`: a workflow agent runs in this session."""
        nested = shared and isinstance(agent, _WorkflowAgent)
        graph = agent._nested(streaming) if nested else agent.compile(streaming=streaming)
        g.add_node(agent.name, graph, pre=_input_for(agent.name), post=post or _recorded(agent, append=not nested),
                   output_key=output_key)

    def _check(self) -> None:
        kind = type(self).__name__
        if not self.agents:
            raise GraphBuildError(f"{kind} '{self.name}' needs at least one agent")
        seen: set[str] = set()
        for agent in self.agents:
            name = getattr(agent, "name", None)
            if not isinstance(name, str) or not hasattr(agent, "compile") or not hasattr(agent, "uses_tools"):
                raise GraphBuildError(f"{kind} '{self.name}': {agent!r} is not an agent (ChatModelAgent, "
                                      "SequentialAgent, ParallelAgent or LoopAgent)")
            if name in seen or name in _RESERVED:
                raise GraphBuildError(f"{kind} '{self.name}': two sub-agents are named {name!r}, or it is one of "
                                      f"{sorted(_RESERVED)}; sub-agents are nodes named after them: rename one")
            seen.add(name)
        loops = [a.name for a in _sharing(self) if isinstance(a, LoopAgent)]
        twice = sorted({n for n in loops if loops.count(n) > 1})
        if twice:
            raise GraphBuildError(f"{kind} '{self.name}': loop agents sharing one session must have different names "
                                  f"(they count their iterations by name): {twice}")


class SequentialAgent(_WorkflowAgent):
    """Run `agents` one after the other; each gets the conversation so far (the input and the answers before
    it). The last answer is the workflow's. A `BreakLoop` in one of them ends the sequence after it (and the
    loop agent around it, if any)."""

    def _body(self, g: Graph, entry: str, streaming: bool) -> None:
        previous = entry
        for i, agent in enumerate(self.agents):
            self._add(g, agent, streaming)
            if i == 0:
                g.add_edge(previous, agent.name)
            else:
                g.add_branch(previous, _unless_breaking(agent.name), ends=[agent.name, END])
            previous = agent.name
        g.add_edge(previous, END)

    def _max_steps(self) -> int:
        return len(self.agents) + 3


class ParallelAgent(_WorkflowAgent):
    """Run `agents` at the same time on the conversation so far; when all have answered, their answers join the
    conversation in the order given and the workflow answers with all of them (`[name] answer` paragraphs).
    If one pauses, the others finish and keep their answers: resuming runs only the paused one."""

    def _body(self, g: Graph, entry: str, streaming: bool) -> None:
        for agent in self.agents:
            # its answer reaches `join` under its name; a workflow branch gets a session of its own (a fork)
            self._add(g, agent, streaming, shared=False, post=_valued(agent), output_key=agent.name)
            g.add_edge(entry, agent.name)
            g.add_edge(agent.name, "join")
        names = [a.name for a in self.agents]

        def join(answers: dict[str, Message], state: Session) -> Message:
            ordered = [answers[n] for n in names]
            state.messages.extend(ordered)
            return Message(role="assistant", name=self.name,
                           content="\n\n".join(f"[{m.name}] {m.content}" for m in ordered))

        g.add_node("join", join)
        g.add_edge("join", END)

    def _max_steps(self) -> int:
        return 6


class LoopAgent(_WorkflowAgent):
    """Run `agents` in order, again and again, `max_iterations` times at most; a tool raising `BreakLoop` ends
    the loop after its agent (the agents after it in that iteration do not run). Each pass sees the
    conversation so far, its own earlier answers included."""

    def __init__(self, name: str, agents: Sequence[Any], *, max_iterations: int = 10, description: str = "",
                 output_key: str | None = None) -> None:
        if not isinstance(max_iterations, int) or max_iterations < 1:
            raise GraphBuildError(f"LoopAgent '{name}': max_iterations must be a whole number >= 1, got {max_iterations!r}")
        self.max_iterations = max_iterations
        super().__init__(name, agents, description=description, output_key=output_key)

    def _body(self, g: Graph, entry: str, streaming: bool) -> None:
        first, last = self.agents[0].name, self.agents[-1]
        loop = self.name
        for agent in self.agents:
            post = _counted(agent, loop) if agent is last else None
            self._add(g, agent, streaming, post=post)
        g.add_edge(entry, first)
        for agent, after in zip(self.agents, self.agents[1:]):
            g.add_branch(agent.name, _unless_breaking(after.name, "exit"), ends=[after.name, "exit"])
        limit = self.max_iterations

        def again(_: Any, state: Session) -> str:
            return "exit" if state.breaking or state.iterations.get(loop, 0) >= limit else first

        g.add_branch(last.name, again, ends=[first, "exit"])

        def leave(answer: Any, state: Session) -> Any:
            state.breaking = False  # the BreakLoop is spent here: an enclosing loop goes on
            state.iterations.pop(loop, None)  # entered again later, the loop starts counting anew
            return answer

        g.add_node("exit", leave)
        g.add_edge("exit", END)

    def _max_steps(self) -> int:
        return self.max_iterations * len(self.agents) + 4


# --- node handlers -----------------------------------------------------------------------------------------

def _prompt(input: Any, state: Session) -> None:
    state.messages.extend(as_messages(input))


def _input_for(name: str) -> Any:
    def pre(_: Any, state: Session) -> list[Message]:
        return conversation_for(name, state.messages)

    return pre


def _recorded(agent: Any, *, append: bool) -> Any:
    """After a sub-agent: its answer joins the conversation (a shared workflow added its own) and its value."""
    def post(output: Any, state: Session) -> Message:
        answer = answer_of(agent.name, output)
        if append:
            state.messages.append(answer)
        if agent.output_key:
            state.values[agent.output_key] = answer.content
        return answer

    return post


def _valued(agent: Any) -> Any:
    """After a parallel branch: its value only (the join adds the answers in order)."""
    def post(output: Any, state: Session) -> Message:
        answer = answer_of(agent.name, output)
        if agent.output_key:
            state.values[agent.output_key] = answer.content
        return answer

    return post


def _counted(agent: Any, loop: str) -> Any:
    recorded = _recorded(agent, append=not isinstance(agent, _WorkflowAgent))

    def post(output: Any, state: Session) -> Message:
        state.iterations[loop] = state.iterations.get(loop, 0) + 1
        return recorded(output, state)

    return post


def _unless_breaking(next_node: str, stop: str = END) -> Any:
    def route(_: Any, state: Session) -> str:
        return stop if state.breaking else next_node

    return route


def _sharing(agent: _WorkflowAgent) -> list[Any]:
    """`agent` and the workflow agents that share its session (nested in it, except through a parallel fork)."""
    found = [agent]
    if isinstance(agent, ParallelAgent):
        return found
    for sub in agent.agents:
        if isinstance(sub, _WorkflowAgent):
            found.extend(_sharing(sub))
    return found
