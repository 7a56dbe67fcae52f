"""What the two demo tours (`waypoint demo`, `waypoint demo --triage`) share: the run's history as a
table, and the command line of the processes a tour starts."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["history_table", "process_main"]


async def history_table(db: Path, checkpoint_id: str, meaning: Callable[[Any, Any], str]) -> str:
    """Every stored version of the run, newest first; `meaning(meta, older)` says what each one is."""
    from waypoint.stores import SQLiteStore

    store = SQLiteStore(db)
    try:
        history = await store.history(checkpoint_id)
    finally:
        await store.close()
    lines = ["   version  status       step  written   what it is"]
    for i, meta in enumerate(history):
        older = history[i + 1] if i + 1 < len(history) else None
        written = time.strftime("%H:%M:%S", time.localtime(meta.updated_at))
        lines.append(f"   {meta.version:>7}  {meta.status:<11}  {meta.step:>4}  {written}  {meaning(meta, older)}")
    return "\n".join(lines)


def process_main(prog: str, steps: dict[str, Callable[[Path, str, str], Awaitable[int]]],
                 argv: Sequence[str] | None) -> int:
    """`<step> DB CHECKPOINT_ID ARG`: one process of a tour; its exit code."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("action", choices=list(steps))
    parser.add_argument("db", type=Path)
    parser.add_argument("checkpoint_id")
    parser.add_argument("arg")
    args = parser.parse_args(argv)
    return asyncio.run(steps[args.action](args.db, args.checkpoint_id, args.arg))
