"""B11's graph, loaded by `waypoint serve --agents bench._b11_graph:for_serve` and `waypoint worker --graphs
bench._b11_graph:for_worker`: prepare -> hold -> END. "hold" creates the file $B11_INSIDE (the parent's cue to
SIGKILL the process) and waits until the file $B11_GATE exists, polling every 5 ms; the lease is $B11_LEASE
seconds (30 by default).

`python -m bench._b11_graph DB CHECKPOINT_ID HOST` runs the graph on the SQLite file DB in this process as if
its host were named HOST (the lease owner then names that host: "a process on another host").
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from waypoint.engine import END, START, Graph


def _lease() -> float:
    return float(os.environ.get("B11_LEASE", "30"))


def _graph() -> Graph:
    def prepare(x: str) -> str:
        return x

    async def hold(x: str) -> str:
        Path(os.environ["B11_INSIDE"]).touch()
        while not os.path.exists(os.environ["B11_GATE"]):
            await asyncio.sleep(0.005)
        return x + " done"

    g = Graph(name="b11")
    g.add_node("prepare", prepare)
    g.add_node("hold", hold)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "hold")
    g.add_edge("hold", END)
    return g


def for_serve():
    return _graph().compile(lease_seconds=_lease())


def for_worker(store):
    return _graph().compile(store=store, lease_seconds=_lease())


def _elsewhere(host: str) -> None:
    """Make this process name `host` as its host (lease owners are `host:pid:random`)."""
    real = os.uname

    class _Uname(tuple):
        nodename = property(lambda self: host)

    os.uname = lambda: _Uname(real())  # type: ignore[assignment]


async def _run(db: str, checkpoint_id: str) -> None:
    from waypoint.stores import SQLiteStore

    store = SQLiteStore(db)
    await for_worker(store).ainvoke("go", checkpoint_id=checkpoint_id)


if __name__ == "__main__":
    _elsewhere(sys.argv[3])
    asyncio.run(_run(sys.argv[1], sys.argv[2]))
