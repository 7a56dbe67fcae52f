"""Chapter 3: sessions that outlive the process, in the same SQLite file as every other run.

    waypoint chapter 3                      Created new session: <id>
    waypoint chapter 3 --session <id>       Resuming session: <id>

A session is the agent run's checkpoint ID: each turn's run is stored under it, and the next turn — in
this process or in one started next week — continues the conversation the last run ended with. Nothing
else is saved; `waypoint runs show <id>` shows what the store holds.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from waypoint.engine import ChatModelAgent, Runner
from waypoint.engine.models import model_from_env

from ..console import Console, chapter_model, chapter_parser, open_store
from .session import ChatSession, add_session_options, guarded

AGENT_NAME = "ch03"
INSTRUCTION = "You are a helpful assistant."


def build_agent(*, instruction: str = INSTRUCTION, model: Any = None) -> ChatModelAgent:
    """The chapter's agent (chapter 2's): a model and an instruction, no tools."""
    return ChatModelAgent(name=AGENT_NAME, model=model or model_from_env(), instruction=instruction)


def main(argv: Sequence[str] | None = None) -> int:
    parser = chapter_parser(3, "A chat whose sessions are stored: resume one with --session.", session=True)
    args = add_session_options(parser).parse_args(argv)
    console = Console()

    def body() -> int:
        agent = build_agent(instruction=args.instruction, model=chapter_model(console))
        runner = Runner(agent, store=open_store(args.db), streaming=True)
        return ChatSession(number=3, runner=runner, console=console, takeover=args.takeover, db=args.db).main(args.session)

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
