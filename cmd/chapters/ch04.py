"""Chapter 4: an agent with tools — the filesystem tools and `execute`, confined to the project root.

    PROJECT_ROOT=/path/to/project waypoint chapter 4      (default: the working directory)

`ls`, `read_file`, `write_file`, `edit_file`, `glob`, `grep` and `execute` (cmd/fstools.py) resolve every
path — `..` and symlinks followed — and refuse what lies outside the root; the refusal goes back to the
model as the call's result, so it can correct itself. Each call and result is printed as
`[tool call] ...` / `[tool result] ...`. Sessions work as in chapter 3.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from waypoint.engine import ChatModelAgent, Runner
from waypoint.engine.models import model_from_env

from .chat_v1 import ChapterError, guarded, session_chat
from ..console import Console, chapter_model, chapter_parser
from ..fstools import ProjectRoot, execute_tool, filesystem_tools

AGENT_NAME = "ch04"
MAX_ITERATIONS = 50  # a coding task takes many tool rounds; the bound only stops a model that loops


def default_instruction(root: ProjectRoot) -> str:
    return (f"You are a coding assistant working in the project at {root.root}. Use the tools to list, read, "
            "search and edit its files and to run commands in it. Paths are relative to the project root; "
            "nothing outside it can be reached. Say what you did and what you found.")


def check_root(root: ProjectRoot) -> None:
    """`PROJECT_ROOT` (default: the working directory, made absolute) must be a directory."""
    if not root.root.is_dir():
        raise ChapterError(f"the project root {root.root} is not a directory; set PROJECT_ROOT to your project's "
                         "directory (or unset it to use the working directory)")


def build_agent(*, instruction: str | None = None, model: Any = None, root: ProjectRoot | None = None,
                ) -> ChatModelAgent:
    """The chapter's agent: the project's filesystem tools and `execute`, from the environment by default."""
    root = root or ProjectRoot()
    return ChatModelAgent(name=AGENT_NAME, model=model or model_from_env(),
                          instruction=instruction or default_instruction(root),
                          tools=[*filesystem_tools(root), execute_tool(root)], max_iterations=MAX_ITERATIONS)


def main(argv: Sequence[str] | None = None) -> int:
    root = ProjectRoot()
    parser = chapter_parser(4, "An agent with filesystem and shell tools, confined to PROJECT_ROOT.", session=True,
                            instruction=default_instruction(root))
    args = parser.parse_args(argv)
    console = Console()

    def body() -> int:
        check_root(root)
        agent = build_agent(instruction=args.instruction, model=chapter_model(console), root=root)
        return session_chat(lambda store: Runner(agent, store=store, streaming=True), console, chapter=4,
                            session=args.session, db=args.db, banners=[f"Project root: {root.root}"])

    return guarded(console, body)

if __name__ == "__main__":
    sys.exit(main())
