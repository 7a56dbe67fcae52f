"""The project agent chapters 4–10 build on: filesystem tools and `execute`, confined to PROJECT_ROOT, plus
whatever tools and middlewares a chapter adds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from waypoint.engine import ChatModelAgent

from ..fstools import ProjectRoot, execute_tool, filesystem_tools
from .session import ChapterError

__all__ = ["project_instruction", "project_agent", "check_root", "MAX_ITERATIONS"]

MAX_ITERATIONS = 50
"""A coding task takes many tool rounds; the bound only stops a model that loops."""


def check_root(root: ProjectRoot) -> None:
    """`PROJECT_ROOT` (default: the working directory, made absolute) must be a directory."""
    if not root.root.is_dir():
        raise ChapterError(f"the project root {root.root} is not a directory; set PROJECT_ROOT to your project's "
                           "directory (or unset it to use the working directory)")


def project_instruction(root: ProjectRoot) -> str:
    """The default `--instruction` from chapter 4 on: where the project is and how to name paths."""
    return (f"You are a helpful coding assistant working in the project at {root.root}. Use the tools to list, "
            "read, write and search its files and to run commands there; give paths relative to that directory "
            "(or absolute paths inside it). Answer briefly.")


def project_agent(name: str, *, model: Any, root: ProjectRoot, instruction: str | None = None,
                  tools: Sequence[Any] = (), middlewares: Sequence[Any] = (), execute: Any = None,
                  **options: Any) -> ChatModelAgent:
    """A `ChatModelAgent` named `name` with the project tools (`ls`, `read_file`, `write_file`, `edit_file`,
    `glob`, `grep`, and `execute` — or the `execute` tool given) and `tools`; `options` go to `ChatModelAgent`."""
    options.setdefault("max_iterations", MAX_ITERATIONS)
    return ChatModelAgent(name=name, model=model, instruction=instruction or project_instruction(root),
                          tools=[*filesystem_tools(root), execute or execute_tool(root), *tools],
                          middlewares=middlewares, **options)
