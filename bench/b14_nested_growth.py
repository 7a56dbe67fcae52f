"""B14 (Waypoint only; issue 34 §1's "new B13" — B13 is the deadlines bench): does an agent tool's inner run
cost more per step as it grows? A supervisor whose one tool is an agent that makes N inner iterations (a tool
call each, then its answer), on a SQLite file, per-step durable — against the same inner agent run at top level.

Figures, for N = 100 and 200: database bytes per inner step (the file, WAL included, after the run; a step is a
model call or a tools call), and ms per inner iteration, the last 10 ÷ the first 10 (each iteration timed from
one tool call to the next; also each window's median iteration).

    python -m bench.b14_nested_growth [--runs 3]
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


async def one(n: int, nested: bool) -> dict[str, float]:
    from waypoint.engine import AgentTool, ChatModelAgent, Message, ToolCall, tool
    from waypoint.stores import SQLiteStore

    stamps: list[float] = []

    @tool
    def work(i: int) -> str:
        """Do step i."""
        stamps.append(time.perf_counter())
        return f"done {i} " + "r" * 200

    class Inner:
        async def generate(self, messages, **_):
            done = sum(1 for m in messages if m.role == "tool")
            if done < n:
                return Message.assistant("step " + "t" * 200, tool_calls=[ToolCall(
                    id=f"c{done}", name="work", arguments=json.dumps({"i": done}))])
            return Message.assistant(f"finished {done}")

        async def stream(self, messages, **kw):
            yield await self.generate(messages, **kw)

    class Outer:
        async def generate(self, messages, **_):
            if messages[-1].role == "tool":
                return Message.assistant(f"boss: {messages[-1].content}")
            return Message.assistant(tool_calls=[ToolCall(id="b", name="inner", arguments='{"request": "go"}')])

        async def stream(self, messages, **kw):
            yield await self.generate(messages, **kw)

    inner = ChatModelAgent(name="inner", model=Inner(), tools=[work], max_iterations=n + 2)
    agent = ChatModelAgent(name="boss", model=Outer(), tools=[AgentTool(inner)]) if nested else inner
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "b14.db"
        store = SQLiteStore(path)
        app = agent.compile(store=store)
        start = time.perf_counter()
        await app.ainvoke("go", checkpoint_id="r")
        wall = time.perf_counter() - start
        await store.close()
        size = _db_bytes(path)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"bytes_per_step": size / (2 * n + 1), "ms_per_iteration": 1000 * wall / n,
            "last10_over_first10": sum(gaps[-10:]) / sum(gaps[:10]),
            # the same windows, each iteration's median: one pause of the machine (a WAL checkpoint, the garbage
            # collector) inside a ~15 ms window does not decide it
            "median_last10_over_first10": statistics.median(gaps[-10:]) / statistics.median(gaps[:10])}


async def main(runs: int) -> None:
    rows = []
    for n in (100, 200):
        for nested in (True, False):
            samples = [await one(n, nested) for _ in range(runs)]
            median = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
            rows.append((n, "agent tool (nested)" if nested else "top level", median))
    print("| N | run | bytes/step | ms/iteration | last 10 ÷ first 10 | the same, median iteration |")
    print("|---|---|---|---|---|---|")
    for n, kind, m in rows:
        print(f"| {n} | {kind} | {m['bytes_per_step']:,.0f} | {m['ms_per_iteration']:.2f} | "
              f"{m['last10_over_first10']:.2f} | {m['median_last10_over_first10']:.2f} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    asyncio.run(main(p.parse_args().runs))
