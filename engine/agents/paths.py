"""Which agent an engine event came from: `run_path` (the agents it came through) from its `node_path`.

A composition nests agents' graphs in two ways, and both show in `node_path`:

- as a subgraph node named after the agent — a workflow agent's sub-agents, a `ChatModelAgent`'s handoffs:
  `("writer", "model")` is the `model` box of agent `writer`;
- as a run nested in a tool call (`AgentTool`): `("tools", "researcher#0", "model")` is the `model` box of the
  agent `researcher` called as a tool at position 0 of its message.

`AgentPaths(root).resolve(node_path)` walks the composition from the root agent and returns the agents
entered, how the last one was entered, and what is left (the box inside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AgentPaths", "Where"]


@dataclass(frozen=True, slots=True)
class Where:
    """An event's place in a composition."""

    run_path: tuple[str, ...]
    """The agents, outermost first, whose run the event belongs to."""
    rest: tuple[str, ...]
    """The node path inside the innermost agent's graph (`("model",)`, `("tools",)`, `()` for the agent's node)."""
    via: str = "root"
    """How the innermost agent was entered: "root", "node" (a workflow's sub-agent), "handoff", "tool"."""
    key: tuple[str, ...] = ()
    """The node path up to the innermost agent's graph: one key per run of an agent (two calls of one agent
    tool in a message have two keys)."""


class AgentPaths:
    """Resolves node paths against one root agent (results are cached: a run repeats few paths)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self._cache: dict[tuple[str, ...], Where] = {}

    def resolve(self, node_path: tuple[str, ...]) -> Where:
        found = self._cache.get(node_path)
        if found is None:
            found = self._cache[node_path] = self._walk(node_path)
        return found

    def _walk(self, node_path: tuple[str, ...]) -> Where:
        agent, names, via, i = self.root, [self.root.name], "root", 0
        while i < len(node_path):
            element = node_path[i]
            sub = _call(agent, "sub_agents").get(element)
            if sub is not None:
                via = "handoff" if any(sub is h for h in getattr(agent, "handoffs", ())) else "node"
                agent, i = sub, i + 1
                names.append(sub.name)
                continue
            if element == "tools" and i + 1 < len(node_path):
                name, _, position = node_path[i + 1].rpartition("#")
                tool_agent = _call(agent, "tool_agents").get(name) if position.isdigit() else None
                if tool_agent is not None:
                    agent, via, i = tool_agent, "tool", i + 2
                    names.append(tool_agent.name)
                    continue
            break
        return Where(run_path=tuple(names), rest=node_path[i:], via=via, key=node_path[:i])


def _call(agent: Any, method: str) -> dict[str, Any]:
    fn = getattr(agent, method, None)
    return fn() if fn is not None else {}
