"""Chapter 2: a chat loop — a `ChatModelAgent` run by a streaming `Runner`, one `you> ` turn at a time.

    waypoint chapter 2

Every turn runs the agent on the same checkpoint ID in a `MemoryStore`: a run that completed there is
continued by the next one, so the conversation is remembered for as long as the process lives. That is
the mechanism chapter 3 persists — only the store changes. An empty line or the end of input exits.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from waypoint.engine import ChatModelAgent, Runner
from waypoint.engine.models import model_from_env
from waypoint.stores import MemoryStore

from ..console import Console, chapter_model, chapter_parser
from .session import ChatSession, guarded

AGENT_NAME = "ch02"
INSTRUCTION = "You are a helpful assistant."
CHAT_ID = "chat"  # one conversation per process: any fixed ID will do


def build_agent(*, instruction: str = INSTRUCTION, model: Any = None) -> ChatModelAgent:
    """The chapter's agent: a model and an instruction, no tools."""
    return ChatModelAgent(name=AGENT_NAME, model=model or model_from_env(), instruction=instruction)


def main(argv: Sequence[str] | None = None) -> int:
    args = chapter_parser(2, "A chat loop: each turn continues the conversation (kept in memory).",
                          db=False).parse_args(argv)
    console = Console()

    def body() -> int:
        agent = build_agent(instruction=args.instruction, model=chapter_model(console))
        runner = Runner(agent, store=MemoryStore(), streaming=True)
        return ChatSession(number=2, runner=runner, console=console, stored=False).main(CHAT_ID)

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
