"""`waypoint`: the command line entry point.

    waypoint demo                       the tour: an agent's approval, resumed by a new process
    waypoint chapter N [options]        quickstart chapter N (1-9); also python -m waypoint.cmd.chNN
    waypoint runs list|show|history|resume|delete [options]   stored runs
    waypoint serve --db URL --agents module:attr[,...]          the HTTP service and approval page
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

CHAPTERS = range(1, 10)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `waypoint` CLI; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:  # its options go to it whole (argparse would reorder them around REMAINDER)
        return _serve(argv[1:])
    parser = argparse.ArgumentParser(prog="waypoint", description="Waypoint: checkpointed graph execution.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="an agent's run paused for approval, resumed by a new process")
    demo.add_argument("--db", default=None, help="SQLite file (default: .waypoint/demo.db)")
    demo.add_argument("--triage", action="store_true", help="the plain-graph tour (no agent)")
    chapter = sub.add_parser("chapter", help="run a quickstart chapter (1-9)", add_help=False)
    chapter.add_argument("number", type=int, choices=CHAPTERS, metavar="N")
    runs = sub.add_parser("runs", help="list, show, resume or delete stored runs", add_help=False)
    runs.add_argument("rest", nargs=argparse.REMAINDER)
    serve = sub.add_parser("serve", help="the HTTP service and approval page (the [service] extra)", add_help=False)
    serve.add_argument("rest", nargs=argparse.REMAINDER)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        from .demo import run_demo

        return run_demo(args.db, triage=args.triage)
    if args.command == "chapter":
        module = importlib.import_module(f".ch{args.number:02d}", __package__)
        return module.main(rest)
    from .runs import main as runs_main

    return runs_main([*args.rest, *rest])


def _serve(argv: list[str]) -> int:
    try:
        from waypoint.service.serve import main as serve_main
    except ModuleNotFoundError as err:
        print(f"waypoint serve needs the service extra: pip install 'waypoint-graph[service]' ({err})", file=sys.stderr)
        return 2
    return serve_main(argv)


if __name__ == "__main__":
    sys.exit(main())
