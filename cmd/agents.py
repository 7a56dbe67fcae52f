"""Which agent wrote a stored run: `waypoint runs` resumes an agent's run with the agent that wrote it.

Every command module that builds an agent (the demo, the chapters) defines `AGENT_NAME` (the agent's
graph name, stored with each run) and `build_agent()` (a `ChatModelAgent`, built from the environment:
`model_from_env()`, `PROJECT_ROOT`). `find_agent(name)` looks through them.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["find_agent", "AGENT_MODULES"]

AGENT_MODULES = ("demo", *(f"chapters.ch{n:02d}" for n in range(1, 11)))


def find_agent(graph_name: str) -> Any:
    """The `ChatModelAgent` whose graph is named `graph_name`, or None if no command defines it."""
    for name in AGENT_MODULES:
        try:
            module = importlib.import_module(f".{name}", __package__)
        except ModuleNotFoundError as err:
            if err.name == f"{__package__}.{name}":
                continue
            raise
        if getattr(module, "AGENT_NAME", None) == graph_name and hasattr(module, "build_agent"):
            return module.build_agent()
    return None
