"""`waypoint worker`: a process that runs queued work from a shared database (docs/scale-out.md).

    waypoint worker --db postgresql+asyncpg://user@host/db --graphs myapp.flows:triage,myapp.agents:ops
        [--concurrency 8] [--poll 1.0] [--drain 30] [--pool 10] [--max-attempts 10] [--no-recover]

`--graphs` names objects as `module:attribute`: a `Graph` or a `ChatModelAgent` (compiled here on the
worker's store), a function taking the store and returning a compiled graph, or a graph compiled on an
equal store. `--db` is a SQLAlchemy URL, or a path to a SQLite file. SIGTERM (or Ctrl-C) stops taking
work and lets the runs in flight finish for `--drain` seconds; those still running are then saved at
their last finished step and handed back to the queue. A second signal cancels them at once. A database
that is down when the worker starts (or later) is tried again, as claims are; `--pool` must be at least 2
on Postgres (the LISTEN connection holds one for good). Every `--poll` seconds it also continues runs of its
graphs whose process died (automatic recovery, docs/scale-out.md); `--no-recover` turns that off.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import Any

from waypoint.engine.loading import load_object


def open_store(db: str, pool: int) -> Any:
    """`--db`: a SQLAlchemy URL (Postgres: `pool` connections per event loop, no overflow) or a SQLite path."""
    from waypoint.stores import open_store

    return open_store(db, **({"pool_size": pool, "max_overflow": 0} if db.startswith("postgresql") else {}))


def load_graph(spec: str, store: Any) -> Any:
    """`module:attribute` → a graph compiled on `store`."""
    from waypoint.engine import ChatModelAgent, CompiledGraph, Graph

    target = load_object(spec, option="--graphs", kinds=(ChatModelAgent, Graph, CompiledGraph), error=ValueError,
                         args=(store,))
    return target if isinstance(target, CompiledGraph) else target.compile(store=store)


async def serve(args: argparse.Namespace) -> int:
    from waypoint.stores import Worker

    store = open_store(args.db, args.pool)
    try:
        graphs = [load_graph(spec.strip(), store) for spec in args.graphs.split(",") if spec.strip()]
        worker = Worker(store, graphs, concurrency=args.concurrency, poll=args.poll, drain_seconds=args.drain,
                        max_attempts=args.max_attempts, recover=args.recover)
    except Exception as err:  # noqa: BLE001 - one clear line and a non-zero exit code
        await store.close()
        print(f"waypoint worker: {err}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()
    signals = {"count": 0}

    def on_signal() -> None:
        signals["count"] += 1
        worker.stop(now=signals["count"] > 1)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    print(f"waypoint worker {worker.name}: graphs {', '.join(sorted(worker.graphs))}; concurrency "
          f"{worker.concurrency}; {getattr(store, '_label', repr(store))}", file=sys.stderr, flush=True)
    try:
        await worker.run()
    finally:
        await store.close()
    print(f"waypoint worker {worker.name}: stopped after {worker.finished} work item(s)", file=sys.stderr, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="waypoint worker", description="Run queued work from a shared database.")
    p.add_argument("--db", required=True, help="SQLAlchemy URL (postgresql+asyncpg://...) or SQLite file path")
    p.add_argument("--graphs", required=True, help="module:attribute[,module:attribute...]")
    p.add_argument("--concurrency", type=int, default=8, help="runs at once (default 8)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between looks at the queue when idle")
    p.add_argument("--drain", type=float, default=30.0, help="seconds to let runs finish after SIGTERM")
    p.add_argument("--pool", type=int, default=10, help="Postgres connections per event loop (default 10)")
    p.add_argument("--max-attempts", type=int, default=10,
                   help="claims of one request that ended without an outcome (its worker died), or takeovers of a run "
                        "in a row without progress, before it is given up (stored failed)")
    p.add_argument("--no-recover", dest="recover", action="store_false",
                   help="do not continue runs of these graphs whose process died unless they are queued")
    return asyncio.run(serve(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
