"""B15 (Waypoint only; issue 34 §5): what `CompactionMiddleware` costs and saves on a long conversation.

One agent makes N iterations (a tool call each, whose result is 1,000 characters, then its answer) on a SQLite
file, per-step durable — with no compaction, and with `CompactionMiddleware(max_chars=20_000, keep_last=6)` and a
scripted summarizer that answers at once with 600 characters (so the figures are the engine's cost, not a model's).

Figures, for N = 100 and 200: ms per iteration; steps written (store versions) and database bytes per step (the
file, WAL included, after the run); summary calls (the extra model calls); and the characters the model was sent
in its last call and in all its calls together (what compaction saves — a real model bills them).

    python -m bench.b15_compaction [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path


def _db_bytes(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


async def one(n: int, compact: bool) -> dict[str, float]:
    from waypoint.engine import ChatModelAgent, Message, ToolCall, tool
    from waypoint.middleware import CompactionMiddleware
    from waypoint.stores import SQLiteStore

    @tool
    def work(i: int) -> str:
        """Do step i."""
        return f"done {i} " + "r" * 992

    sent: list[int] = []

    class Model:
        name = "b15-model"
        calls = 0

        async def generate(self, messages, **_):
            sent.append(sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages))
            self.calls += 1
            if self.calls <= n:
                return Message.assistant("step", tool_calls=[ToolCall(id=f"c{self.calls}", name="work",
                                                                      arguments=json.dumps({"i": self.calls}))])
            return Message.assistant(f"finished {n}")

        async def stream(self, messages, **kw):
            yield await self.generate(messages, **kw)

    class Summarizer:
        name = "b15-summarizer"
        calls = 0

        async def generate(self, messages, **_):
            self.calls += 1
            return Message.assistant(f"summary {self.calls}: " + "s" * 588)

    summarizer = Summarizer()
    middlewares = [CompactionMiddleware(summarizer, max_chars=20_000, keep_last=6)] if compact else []
    agent = ChatModelAgent(name="b15", model=Model(), instruction="You work.", tools=[work], max_iterations=n + 2,
                           middlewares=middlewares)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "b15.db"
        store = SQLiteStore(path)
        app = agent.compile(store=store)
        start = time.perf_counter()
        await app.ainvoke("go", checkpoint_id="r")
        wall = time.perf_counter() - start
        versions = len(await store.history("r"))
        await store.close()
        size = _db_bytes(path)
    return {"ms_per_iteration": 1000 * wall / n, "versions": versions, "bytes_per_step": size / versions,
            "summary_calls": summarizer.calls, "last_sent": sent[-1], "all_sent": sum(sent)}


async def main(runs: int) -> None:
    rows = []
    for n in (100, 200):
        for compact in (False, True):
            samples = [await one(n, compact) for _ in range(runs)]
            median = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
            low = min(s["ms_per_iteration"] for s in samples)
            high = max(s["ms_per_iteration"] for s in samples)
            rows.append((n, "compaction" if compact else "none", median, low, high))
    print("| N | compaction | ms/iteration (min–max) | steps written | bytes/step | summary calls | "
          "chars sent, last call | chars sent, all calls |")
    print("|---|---|---|---|---|---|---|---|")
    for n, kind, m, low, high in rows:
        print(f"| {n} | {kind} | {m['ms_per_iteration']:.2f} ({low:.2f}–{high:.2f}) | {m['versions']:.0f} | "
              f"{m['bytes_per_step']:,.0f} | {m['summary_calls']:.0f} | {m['last_sent']:,.0f} | {m['all_sent']:,.0f} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    asyncio.run(main(p.parse_args().runs))
