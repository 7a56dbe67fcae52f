"""Handoffs: a `ChatModelAgent(handoffs=[...])` lets its model transfer the conversation to a named agent
(Eino's `transfer_to_agent`, the OpenAI Agents SDK's handoffs).

The agent gets a tool `transfer_to_agent(agent_name)` that lists the agents it may hand to. When a call to it
really runs and succeeds (it raises `HandOff`: a call answered without running — `Respond`, a rejected
approval — hands nothing over, whatever its text says), the agent's turn ends after the batch and the named agent — a subgraph node of the agent's graph,
named after it — gets the conversation (without the instruction: it brings its own) and answers from there;
its answer joins the conversation under its name and is the run's output. A handoff is one way within a run:
the next turn of a chat starts at the first agent again, which sees the other agent's answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import GraphBuildError
from ..models.schema import Message
from ..tools.tool import HandOff, Tool

__all__ = ["TRANSFER", "transfer_tool", "check_handoffs", "handoff_input"]

TRANSFER = "transfer_to_agent"
"""The name of the handoff tool."""

RESERVED = frozenset({"prompt", "model", "tools"})


def check_handoffs(owner: str, agents: Sequence[Any]) -> None:
    """Handoff agents become nodes of `owner`'s graph: their names must be unique and not its own nodes'."""
    seen: set[str] = set()
    for agent in agents:
        name = getattr(agent, "name", None)
        if not isinstance(name, str) or not hasattr(agent, "compile"):
            raise GraphBuildError(f"agent '{owner}': handoffs= takes agents (ChatModelAgent, SequentialAgent, ...), "
                                  f"got {agent!r}")
        if name in RESERVED or name == owner or name in seen:
            raise GraphBuildError(f"agent '{owner}': a handoff agent may not be named {name!r} (its own name, another "
                                  f"handoff's, or one of {sorted(RESERVED)}); rename it")
        seen.add(name)


def transfer_tool(agents: Sequence[Any]) -> Tool:
    """The tool the model calls to hand the conversation to one of `agents`."""
    names = [a.name for a in agents]
    listing = "; ".join(f"'{a.name}': {getattr(a, 'description', '') or 'no description'}" for a in agents)

    def transfer_to_agent(agent_name: str) -> str:
        """Hand the conversation to another agent.

        Args:
            agent_name: the agent to hand to
        """
        if agent_name not in names:
            return f"[tool error] there is no agent named {agent_name!r}; the agents are: {', '.join(names)}"
        raise HandOff(agent_name, _done(agent_name))  # what ran decides the handoff, never the result's text

    return Tool(transfer_to_agent, name=TRANSFER,
                description=f"Hand this conversation to another agent, which answers the user from here on. "
                            f"The agents: {listing}.")


def _done(name: str) -> str:
    return f"Transferred to agent '{name}'."


def handoff_input(messages: Sequence[Message]) -> list[Message]:
    """The conversation a handoff agent gets: everything but the instruction (it brings its own)."""
    return [m for m in messages if m.role != "system"]
