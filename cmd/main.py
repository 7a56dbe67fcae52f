"""`waypoint`: the command line entry point.

    waypoint demo                       the tour: an agent's approval, resumed by a new process
    waypoint chapter N [options]        quickstart chapter N (1-9); also python -m waypoint.cmd.chNN
    waypoint runs list|show|history|resume|delete [options]   stored runs
    waypoint worker --db URL --graphs module:attr[,...]     run queued work (docs/scale-out.md)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

CHAPTERS = range(1, 10)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `waypoint` CLI; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="waypoint", description="Waypoint: checkpointed graph execution.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="an agent's run paused for approval, resumed by a new process")
    demo.add_argument("--db", default=None, help="SQLite file (default: .waypoint/demo.db)")
    demo.add_argument("--triage", action="store_true", help="the plain-graph tour (no agent)")
    chapter = sub.add_parser("chapter", help="run a quickstart chapter (1-9)", add_help=False)
    chapter.add_argument("number", type=int, choices=CHAPTERS, metavar="N")
    runs = sub.add_parser("runs", help="list, show, resume or delete stored runs", add_help=False)
    runs.add_argument("rest", nargs=argparse.REMAINDER)
    worker = sub.add_parser("worker", help="run queued work from a shared database", add_help=False)
    worker.add_argument("rest", nargs=argparse.REMAINDER)
    argv = list(sys.argv[1:] if argv is None else argv)
    # Commands with their own parsers get their words untouched (argparse would split `runs --db X list`).
    if argv[:1] == ["worker"]:
        from .worker import main as worker_main

        return worker_main(argv[1:])
    if argv[:1] == ["runs"]:
        from .runs import main as runs_main

        return runs_main(argv[1:])
    if argv[:1] == ["chapter"] and len(argv) > 1 and argv[1].isdigit() and int(argv[1]) in CHAPTERS:
        module = importlib.import_module(f".ch{int(argv[1]):02d}", __package__)
        return module.main(argv[2:])
    args = parser.parse_args(argv)  # demo, help, and the usage errors of the others
    from .demo import run_demo

    return run_demo(args.db, triage=args.triage)


if __name__ == "__main__":
    sys.exit(main())
