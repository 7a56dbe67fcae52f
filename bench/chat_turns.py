"""Chat turns: the cost of one more turn of a chat on SQLite, through `Runner.run` on its checkpoint ID (each
turn reads the conversation the last one ended with, looks for inputs queued for it — double-texting — runs
one model answer, and writes). Figure: ms per turn, the median of each block of 10 turns, over 60 turns of one
chat; model time negligible (a scripted answer).

    python -m bench.chat_turns [--turns 60] [--on-busy reject]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path


async def main(turns: int, on_busy: str | None) -> None:
    from waypoint.engine import ChatModelAgent, Runner
    from waypoint.engine.models import ScriptedChatModel
    from waypoint.stores import SQLiteStore

    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "chat.db")
        agent = ChatModelAgent(name="chat", model=ScriptedChatModel([f"answer {i}" for i in range(turns)]))
        runner = Runner(agent, store=store)
        options = {} if on_busy is None else {"on_busy": on_busy}
        times = []
        for i in range(turns):
            start = time.perf_counter_ns()
            async for _ in runner.run(f"message {i}", checkpoint_id="chat", **options):
                pass
            times.append((time.perf_counter_ns() - start) / 1e6)
        await store.close()
    blocks = [statistics.median(times[i:i + 10]) for i in range(0, turns, 10)]
    print("ms per turn, median of each 10 turns:", " ".join(f"{b:.2f}" for b in blocks))
    print(f"ms per turn, median of turns 11-{turns}: {statistics.median(times[10:]):.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=60)
    p.add_argument("--on-busy", default=None, help="pass on_busy= to run (omit for a Runner without it)")
    args = p.parse_args()
    asyncio.run(main(args.turns, args.on_busy))
