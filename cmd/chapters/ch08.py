"""Chapter 8: a graph as a tool. A RAG workflow (a DAG: load, chunk, terms, score, filter, answer —
cmd/rag_workflow.py) becomes the tool `answer_from_document(document, question)`, which the agent calls
like any other — after you approve it, with chapter 7's prompt. `execute` still needs approval too.

    waypoint chapter 8 [--session ID]     (or python -m waypoint.cmd.chapters.ch08)
    you> ask notes.txt about when are the backups made?
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
from .rag_workflow import answer_from_document_tool

__all__ = ["AGENT_NAME", "build_agent", "main"]

AGENT_NAME = "ch08"
LEASE_SECONDS = 10.0
GUARDED = frozenset({"answer_from_document", "execute"})


def build_agent(*, model: Any = None, instruction: str | None = None, root: ProjectRoot | None = None) -> Any:
    """Chapter 8's agent, from the environment unless told otherwise (`waypoint runs resume` calls it bare)."""
    root = root or ProjectRoot()
    return project_agent(AGENT_NAME, model=model or model_from_env(), root=root, instruction=instruction,
                         tools=[answer_from_document_tool(root)],
                         middlewares=[ApprovalMiddleware(tools=GUARDED), SafeToolMiddleware()])


def main(argv: Sequence[str] | None = None) -> int:
    parser = project_parser(8, "Chapter 8: a RAG workflow graph as the tool answer_from_document, behind approval.")
    args = parse_project_args(parser, argv)
    console = Console()

    def body() -> int:
        model = chapter_model(console)
        session = project_chat(8, args, console,
                               lambda root: build_agent(model=model, instruction=args.instruction, root=root),
                               lease_seconds=LEASE_SECONDS, on_pause=approval_prompt)
        return session.main(args.session)

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
