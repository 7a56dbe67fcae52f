"""Chapter 7: approval. Chapter 4's agent, with `execute` behind `ApprovalMiddleware`: the run pauses before
any command runs, the chapter asks `Approve this action? (y/n): `, and the answer resumes the run. The
pause is stored: quit at the prompt (Ctrl-D) and start the chapter again with the same `--session` — the
same question comes back first, and an approved command runs once.

    waypoint chapter 7 [--session ID]     (or python -m waypoint.cmd.chapters.ch07)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from waypoint.engine.models import model_from_env
from waypoint.middleware import ApprovalMiddleware, SafeToolMiddleware

from .approval_prompt import approval_prompt
from .session import guarded
from ..console import Console, chapter_model
from ..fstools import ProjectRoot
from .project import parse_project_args, project_agent, project_chat, project_parser

__all__ = ["AGENT_NAME", "build_agent", "main"]

AGENT_NAME = "ch07"
LEASE_SECONDS = 10.0


def build_agent(*, model: Any = None, instruction: str | None = None, root: ProjectRoot | None = None) -> Any:
    """Chapter 7's agent, from the environment unless told otherwise (`waypoint runs resume` calls it bare).
    The approval layer comes first (outermost), so the safe-tool layer never turns a pause into a result."""
    return project_agent(AGENT_NAME, model=model or model_from_env(), root=root or ProjectRoot(),
                         instruction=instruction,
                         middlewares=[ApprovalMiddleware(tools={"execute"}), SafeToolMiddleware()])


def main(argv: Sequence[str] | None = None) -> int:
    parser = project_parser(7, "Chapter 7: commands run only once you approve them; a pending approval survives "
                            "a restart.")
    args = parse_project_args(parser, argv)
    console = Console()

    def body() -> int:
        model = chapter_model(console)
        session = project_chat(7, args, console,
                               lambda root: build_agent(model=model, instruction=args.instruction, root=root),
                               lease_seconds=LEASE_SECONDS, on_pause=approval_prompt)
        return session.main(args.session)

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
