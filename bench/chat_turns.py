"""Chat turns: the cost of one more turn of a chat on SQLite, through `Runner.run` on its checkpoint ID (each
turn reads the conversation the last one ended with, looks for inputs queued for it — double-texting — runs
one model answer, and writes). Figures: ms per turn, the median of each block of 10 turns, over 60 turns of one
chat; model time negligible (a scripted answer); with `--bytes`, the bytes of the blobs each turn writes (one
answer of ~310 characters to a message of ~310: deterministic), at turns 2, 10, 30 and 59.

    python -m bench.chat_turns [--turns 60] [--on-busy reject] [--bytes]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path


async def main(turns: int, on_busy: str | None, sizes: bool = False) -> None:
    from waypoint.engine import ChatModelAgent, Runner
    from waypoint.engine.models import ScriptedChatModel
    from waypoint.stores import SQLiteStore

    written: list[int] = []

    class Measured(SQLiteStore):
        async def put(self, meta, header, parts, blobs, **kw):  # type: ignore[no-untyped-def]
            written.append(sum(len(b.data) for b in blobs))
            return await super().put(meta, header, parts, blobs, **kw)

    words = " ".join(["word"] * 60)
    with tempfile.TemporaryDirectory() as tmp:
        store = (Measured if sizes else SQLiteStore)(Path(tmp) / "chat.db")
        answers = [f"answer {i} {words}" if sizes else f"answer {i}" for i in range(turns)]
        agent = ChatModelAgent(name="chat", model=ScriptedChatModel(answers))
        runner = Runner(agent, store=store)
        options = {} if on_busy is None else {"on_busy": on_busy}
        times = []
        per_turn = []
        for i in range(turns):
            start = time.perf_counter_ns()
            before = len(written)
            async for _ in runner.run(f"message {i} {words}" if sizes else f"message {i}", checkpoint_id="chat",
                                      **options):
                pass
            times.append((time.perf_counter_ns() - start) / 1e6)
            per_turn.append(sum(written[before:]))
        await store.close()
    if sizes:
        print("bytes a turn writes, turns 2 / 10 / 30 / 59:",
              " / ".join(f"{per_turn[t - 1]:,}" for t in (2, 10, 30, 59) if t <= turns))
    blocks = [statistics.median(times[i:i + 10]) for i in range(0, turns, 10)]
    print("ms per turn, median of each 10 turns:", " ".join(f"{b:.2f}" for b in blocks))
    print(f"ms per turn, median of turns 11-{turns}: {statistics.median(times[10:]):.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, default=60)
    p.add_argument("--on-busy", default=None, help="pass on_busy= to run (omit for a Runner without it)")
    p.add_argument("--bytes", action="store_true", help="measure the bytes each turn writes (a ~310-character message "
                                                        "and answer)")
    args = p.parse_args()
    asyncio.run(main(args.turns, args.on_busy, args.bytes))
