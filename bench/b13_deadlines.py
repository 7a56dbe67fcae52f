"""B13 (Waypoint only): pause deadlines with many paused runs in the store (issue 32).

    python -m bench.b13_deadlines [--paused 1000] [--due 20] [--every 1.0] [--db PATH]

Fills a SQLite file with `--paused` runs paused on an interrupt whose deadline is an hour away, plus `--due`
runs whose deadline is a few seconds away, then:

1. **a look for due deadlines**: `store.list_due()` with none due and with `--due` due (median of 200 looks), and
   the fallback a store without `list_due` pays (paging `list(status="interrupted")` and filtering);
2. **expiry latency**: `recover(watch=True, every=--every)` — what `waypoint serve` runs — from each due run's
   deadline (the store's clock) until its run is stored completed (its version's `updated_at`, same host).

Prints one JSON object. No peer has pause deadlines to compare with: docs/performance.md lists the figures alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

from waypoint.engine import END, START, Graph, GraphInterrupted, Interrupt, get_resume_context, recover
from waypoint.engine.keep.recovery import _due
from waypoint.stores import SQLiteStore


def _graph(store: SQLiteStore):
    def ask(x):
        if not get_resume_context()[1]:
            raise Interrupt({"question": "go on?"}, deadline=x, on_deadline="expired")
        return "answered"

    g = Graph(name="b13")
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g.compile(store=store)


async def _pause(app, cid: str, seconds: float) -> float:
    try:
        await app.ainvoke(seconds, checkpoint_id=cid)
    except GraphInterrupted as paused:
        return paused.info.contexts[0].deadline
    raise AssertionError("the run did not pause")


async def _looks(fn, n: int = 200) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


async def _expired_after(app, store: SQLiteStore, every: float, since: dict[str, float]) -> list[float]:
    """Recover (watching, every `every` s) until each run of `since` completed; how long after its time each did."""
    watcher = asyncio.create_task(recover([app], watch=True, every=every))
    try:
        while True:
            await asyncio.sleep(0.05)
            ended = [(await store.history(cid, limit=1))[0] for cid in since]
            if all(m.status == "completed" for m in ended):
                return [m.updated_at - since[m.checkpoint_id] for m in ended]
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def main(paused: int, due: int, every: float, db: Path) -> dict:
    logging.getLogger("waypoint.recovery").setLevel(logging.ERROR)  # one line per run otherwise
    store = SQLiteStore(db)
    app = _graph(store)
    t0 = time.perf_counter()
    for i in range(paused):
        await _pause(app, f"wait-{i:05d}", 3600.0)
    fill = time.perf_counter() - t0
    out: dict = {"paused": paused, "due": due, "every_s": every, "fill_s": round(fill, 2)}
    out["look_none_due_us"] = round(await _looks(lambda: store.list_due()), 1)
    lead = max(3.0, 0.02 * due)  # the due runs are all written before the first deadline passes
    deadlines = {f"due-{i:03d}": await _pause(app, f"due-{i:03d}", lead) for i in range(due)}
    while await store.clock() < max(deadlines.values()):
        await asyncio.sleep(0.01)
    out["look_due_us"] = round(await _looks(lambda: store.list_due()), 1)

    class NoListDue:  # what a store without list_due costs recovery: every paused run's newest version
        def __init__(self, inner): self.list = inner.list

    now = await store.clock()
    out["look_fallback_us"] = round(await _looks(lambda: _due(NoListDue(store), now), 20), 1)
    started = await store.clock()
    late = await _expired_after(app, store, every, dict.fromkeys(deadlines, started))
    # the due runs' deadlines had passed before recovery started: measure again with deadlines that pass while
    # it watches, which is what a service sees — spread over one look interval, so they fall anywhere between looks
    deadlines = {f"live-{i:03d}": await _pause(app, f"live-{i:03d}", lead + i * every / due) for i in range(due)}
    live = await _expired_after(app, store, every, deadlines)
    out["expiry_after_deadline_s"] = {"median": round(statistics.median(live), 3), "max": round(max(live), 3)}
    out["backlog_expired_s"] = round(max(late), 3)  # all `due` past their deadline when recovery starts
    await store.close()
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--paused", type=int, default=1000)
    parser.add_argument("--due", type=int, default=20)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--db", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(main(args.paused, args.due, args.every, args.db or Path(tmp) / "b13.db"))))
