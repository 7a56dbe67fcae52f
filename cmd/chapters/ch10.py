"""Chapter 10: agents made of agents. A supervisor answers the user; it has one tool, `researcher` — a whole
agent (`AgentTool`) with chapter 8's project tools and `answer_from_document`. The researcher's own tool
calls need approval (chapter 7's prompt), and the question reaches the top: the supervisor's run pauses,
with the researcher's call, its arguments and its own interrupt ID. Approve it — now, or from another
process days later — and the researcher goes on from where it paused, then the supervisor answers.

    waypoint chapter 10 [--session ID]    (or python -m waypoint.cmd.chapters.ch10)
    you> ask the researcher to ask notes.txt about when do the backups run?
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from waypoint.engine import AgentTool, ChatModelAgent
from waypoint.engine.models import model_from_env
from waypoint.middleware import ApprovalMiddleware, SafeToolMiddleware

from .approval_prompt import approval_prompt
from .session import guarded
from ..console import Console, chapter_model
from ..fstools import ProjectRoot
from .project import parse_project_args, project_agent, project_chat, project_parser
from .rag_workflow import answer_from_document_tool

__all__ = ["AGENT_NAME", "build_agent", "main"]

AGENT_NAME = "ch10"
LEASE_SECONDS = 10.0
GUARDED = frozenset({"answer_from_document", "execute"})
SUPERVISOR = ("You are a supervisor. You do not read files or run commands yourself: ask the researcher, in full "
              "sentences (it does not see this conversation), then answer the user from what it reports.")


def build_researcher(*, model: Any, root: ProjectRoot) -> ChatModelAgent:
    """Chapter 8's agent, as the researcher: project tools and `answer_from_document`, guarded by approval."""
    return project_agent("researcher", model=model, root=root, tools=[answer_from_document_tool(root)],
                         middlewares=[ApprovalMiddleware(tools=GUARDED), SafeToolMiddleware()],
                         description="Reads the project's files and documents and runs commands in it; "
                                     "give it the whole request.")


def build_agent(*, model: Any = None, instruction: str | None = None, root: ProjectRoot | None = None) -> Any:
    """Chapter 10's supervisor, from the environment unless told otherwise (`waypoint runs resume` calls it bare)."""
    root = root or ProjectRoot()
    model = model or model_from_env()
    researcher = build_researcher(model=model, root=root)
    return ChatModelAgent(name=AGENT_NAME, model=model, instruction=instruction or SUPERVISOR,
                          tools=[AgentTool(researcher)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = project_parser(10, "Chapter 10: a supervisor with a researcher agent as its tool; the researcher's "
                                "tools need approval.", instruction=SUPERVISOR)
    args = parse_project_args(parser, argv)
    console = Console()

    def body() -> int:
        model = chapter_model(console)
        session = project_chat(10, args, console,
                               lambda root: build_agent(model=model, instruction=args.instruction, root=root),
                               lease_seconds=LEASE_SECONDS, on_pause=approval_prompt)
        return session.main(args.session)

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
