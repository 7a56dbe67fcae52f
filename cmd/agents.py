"""Which agent wrote a stored run: `waypoint runs` resumes an agent's run with the agent that wrote it.

Every command module that builds an agent (the demo, the chapters) defines `AGENT_NAME` (the agent's
graph name, stored with each run) and `build_agent()` (a `ChatModelAgent`, built from the environment:
`model_from_env()`, `PROJECT_ROOT`). `find_agent(name)` looks through them. A `build_agent` that takes
`root` (chapters 4–10) confines the agent's tools to that project root: `confines_tools(name)` says so, and
`find_agent(name, root=...)` builds it confined to the root its run stored.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["find_agent", "confines_tools", "AGENT_MODULES"]

AGENT_MODULES = ("demo", *(f"chapters.ch{n:02d}" for n in range(1, 11)))


def _builder(graph_name: str) -> Callable[..., Any] | None:
    """The `build_agent` of the command whose agent's graph is named `graph_name`, or None."""
    for name in AGENT_MODULES:
        try:
            module = importlib.import_module(f".{name}", __package__)
        except ModuleNotFoundError as err:
            if err.name == f"{__package__}.{name}":
                continue
            raise
        if getattr(module, "AGENT_NAME", None) == graph_name and hasattr(module, "build_agent"):
            return module.build_agent
    return None


def confines_tools(graph_name: str) -> bool:
    """Whether the command that defines agent `graph_name` confines its tools to a project root."""
    build = _builder(graph_name)
    return build is not None and "root" in inspect.signature(build).parameters


def find_agent(graph_name: str, *, root: Any = None) -> Any:
    """The `ChatModelAgent` whose graph is named `graph_name`, or None if no command defines it; `root` (a
    `ProjectRoot`, for an agent that `confines_tools`) is where its tools are confined."""
    build = _builder(graph_name)
    if build is None:
        return None
    return build() if root is None else build(root=root)
