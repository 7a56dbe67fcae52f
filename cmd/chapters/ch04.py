"""Chapter 4: an agent with tools — the filesystem tools and `execute`, confined to the project root.

    PROJECT_ROOT=/path/to/project waypoint chapter 4      (default: the working directory)

`ls`, `read_file`, `write_file`, `edit_file`, `glob`, `grep` and `execute` (cmd/fstools.py) resolve every
path — `..` and symlinks followed — and refuse what lies outside the root; the refusal goes back to the
model as the call's result, so it can correct itself. Each call and result is printed as
`[tool call] ...` / `[tool result] ...`. Sessions work as in chapter 3, and keep their project root: a stored
session's tools stay confined to the root it was started with, whoever continues it and from wherever
(cmd/chapters/project.py).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from waypoint.engine import ChatModelAgent
from waypoint.engine.models import model_from_env

from ..console import Console, chapter_model
from ..fstools import ProjectRoot
from .project import parse_project_args, project_agent, project_chat, project_parser
from .session import guarded

AGENT_NAME = "ch04"


def build_agent(*, instruction: str | None = None, model: Any = None, root: ProjectRoot | None = None,
                ) -> ChatModelAgent:
    """The chapter's agent: the project's filesystem tools and `execute`, from the environment by default."""
    return project_agent(AGENT_NAME, model=model or model_from_env(), root=root or ProjectRoot(),
                         instruction=instruction)


def main(argv: Sequence[str] | None = None) -> int:
    parser = project_parser(4, "An agent with filesystem and shell tools, confined to PROJECT_ROOT.")
    args = parse_project_args(parser, argv)
    console = Console()

    def body() -> int:
        model = chapter_model(console)
        return project_chat(4, args, console,
                            lambda root: build_agent(instruction=args.instruction, model=model, root=root),
                            ).main(args.session)

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
