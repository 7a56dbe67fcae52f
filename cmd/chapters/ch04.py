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

from ..console import Console, chapter_model, chapter_parser, open_store
from ..fstools import ProjectRoot
from .project import check_root, project_agent, project_instruction
from .session import ChatSession, add_session_options, guarded

AGENT_NAME = "ch04"


def build_agent(*, instruction: str | None = None, model: Any = None, root: ProjectRoot | None = None,
                ) -> ChatModelAgent:
    """The chapter's agent: the project's filesystem tools and `execute`, from the environment by default."""
    return project_agent(AGENT_NAME, model=model or model_from_env(), root=root or ProjectRoot(),
                         instruction=instruction)


def main(argv: Sequence[str] | None = None) -> int:
    root = ProjectRoot()
    parser = chapter_parser(4, "An agent with filesystem and shell tools, confined to PROJECT_ROOT.", session=True,
                            instruction=project_instruction(root))
    args = add_session_options(parser).parse_args(argv)
    console = Console()

    def body() -> int:
        check_root(root)
        agent = build_agent(instruction=args.instruction, model=chapter_model(console), root=root)
        runner = Runner(agent, store=open_store(args.db), streaming=True)
        return ChatSession(number=4, runner=runner, console=console, banners=[f"Project root: {root.root}"],
                           takeover=args.takeover, db=args.db).main(args.session)

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
