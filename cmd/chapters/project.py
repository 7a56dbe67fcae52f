"""The agent chapters 6–10 build on (chapter 4's): filesystem tools and `execute`, confined to PROJECT_ROOT,
plus whatever tools and middlewares a chapter adds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from waypoint.engine import ChatModelAgent

from ..fstools import ProjectRoot, execute_tool, filesystem_tools

__all__ = ["project_instruction", "project_agent"]


def project_instruction(root: ProjectRoot) -> str:
    """The default `--instruction` from chapter 4 on: where the project is and how to name paths."""
    return (f"You are a helpful coding assistant working in the project at {root.root}. Use the tools to list, "
            "read, write and search its files and to run commands there; give paths relative to that directory "
            "(or absolute paths inside it). Answer briefly.")


def project_agent(name: str, *, model: Any, root: ProjectRoot, instruction: str | None = None,
                  tools: Sequence[Any] = (), middlewares: Sequence[Any] = (), **options: Any) -> ChatModelAgent:
    """A `ChatModelAgent` named `name` with the project tools (`ls`, `read_file`, `write_file`, `edit_file`,
    `glob`, `grep`, `execute`) and `tools`; `options` go to `ChatModelAgent`."""
    return ChatModelAgent(name=name, model=model, instruction=instruction or project_instruction(root),
                          tools=[*filesystem_tools(root), execute_tool(root), *tools],
                          middlewares=middlewares, **options)
