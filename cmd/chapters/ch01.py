"""Chapter 1: one streamed answer, no agent — the model's `stream()` called directly.

    waypoint chapter 1 "what is waypoint?"

The instruction goes first as a system message, the question after it as a user message; the answer is
printed as the model produces it, after `[assistant] `.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from waypoint.engine import Message

from .session import guarded
from ..console import Console, chapter_model, chapter_parser

USAGE = 'usage: waypoint chapter 1 "your question"'


async def answer(model: Any, instruction: str, question: str, console: Console) -> None:
    """Stream the model's answer to `question` onto the console, token by token."""
    started = False
    try:
        async for chunk in model.stream([Message.system(instruction), Message.user(question)]):
            if not chunk.content:
                continue
            if not started:
                console.write("[assistant] ", "cyan")
                started = True
            console.write(chunk.content)
    finally:
        if started:
            console.line()  # an error after some tokens starts on its own line


def main(argv: Sequence[str] | None = None) -> int:
    parser = chapter_parser(1, "One streamed answer from the model (no agent, nothing stored).", db=False)
    parser.add_argument("question", nargs="*", help="what to ask (quote it, or not)")
    args = parser.parse_args(argv)
    console = Console()
    question = " ".join(args.question).strip()
    if not question:
        console.note(USAGE)
        return 2

    def body() -> int:
        asyncio.run(answer(chapter_model(console), args.instruction, question, console))
        return 0

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
