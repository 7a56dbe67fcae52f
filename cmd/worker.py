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
At the default `--log-level info` it logs one line per run it claims (what it was asked, which attempt); a
`--db` it cannot use (its driver not installed, say) is one line on stderr and exit code 2, at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from waypoint.engine.codec.loading import load_object


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

    try:
        store = open_store(args.db, args.pool)
    except Exception as err:  # noqa: BLE001 - one clear line and a non-zero exit code (a driver not installed, ...)
        print(f"waypoint worker: {err}", file=sys.stderr)
        return 2
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
    p = argparse.ArgumentParser(prog="waypoint worker", description="Run queued work from a shared database: claim "
                                "it, run it, record its outcome; continue the runs of these graphs whose process "
                                "died. SIGTERM (or Ctrl-C) drains.")
    p.add_argument("--db", required=True, help="the database: a SQLAlchemy URL (postgresql+asyncpg://..., the "
                                               "[postgres] extra) or a SQLite file path")
    p.add_argument("--graphs", required=True, metavar="MODULE:ATTR[,...]",
                   help="the graphs or agents to run (a Graph, a ChatModelAgent, a CompiledGraph, or a function "
                        "taking the store and returning one)")
    p.add_argument("--concurrency", type=int, default=8, help="runs at once (default: %(default)s)")
    p.add_argument("--poll", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between looks at the queue when idle, and for runs to recover (default: %(default)s)")
    p.add_argument("--drain", type=float, default=30.0, metavar="SECONDS",
                   help="seconds to let runs finish the step they are in after SIGTERM (default: %(default)s)")
    p.add_argument("--pool", type=int, default=10, help="Postgres connections per event loop, at least 2 "
                                                        "(default: %(default)s)")
    p.add_argument("--max-attempts", type=int, default=10, metavar="N",
                   help="claims of one request that ended without an outcome (its worker died), or takeovers of a run "
                        "in a row without progress, before it is given up (stored failed) (default: %(default)s)")
    p.add_argument("--no-recover", dest="recover", action="store_false",
                   help="do not continue runs of these graphs whose process died unless they are queued")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="info (the default) says each run claimed; warning only what goes wrong")
    args = p.parse_args(argv)
    _log_to_stderr(args.log_level)
    return asyncio.run(serve(args))


def _log_to_stderr(level: str) -> None:
    """Waypoint's log lines on stderr, one line each, from `level` up (other libraries keep Python's default)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("waypoint")
    logger.addHandler(handler)
    logger.setLevel(level.upper())


if __name__ == "__main__":
    sys.exit(main())
