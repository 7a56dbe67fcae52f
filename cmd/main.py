"""`waypoint`: the command line entry point."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `waypoint` CLI; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="waypoint", description="Waypoint: checkpointed graph execution.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a run paused for approval, resumed by a new process")
    demo.add_argument("--db", default=".waypoint/demo.db", help="SQLite file (default: .waypoint/demo.db)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from pathlib import Path

        from .demo import run_demo

        return run_demo(Path(args.db))
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
