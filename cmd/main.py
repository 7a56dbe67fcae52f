"""`waypoint`: the command line entry point.

    waypoint demo                       the tour: an agent's approval, resumed by a new process
    waypoint chapter N [options]        quickstart chapter N (1-10); also python -m waypoint.cmd.chapters.chNN
    waypoint runs list|show|history|resume|delete [options]   stored runs
    waypoint worker --db URL --graphs module:attr[,...]     run queued work (docs/scale-out.md)
    waypoint serve --db URL --agents module:attr[,...]      the HTTP service and approval page (docs/service.md)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

CHAPTERS = range(1, 11)
COMMANDS = ("demo", "chapter", "runs", "worker", "serve")
CHAPTER_TITLES = {
    1: "one streamed answer from the model",
    2: "a chat loop",
    3: "sessions stored as checkpoint IDs (--session)",
    4: "filesystem and shell tools confined to PROJECT_ROOT",
    5: "safe-tool and retry middleware",
    6: "callbacks: a trace of the agent's boxes",
    7: "approval that survives quitting",
    8: "a RAG workflow graph as an approved tool",
    9: "crash recovery: finished calls do not run again",
    10: "agents made of agents: a researcher agent as a tool",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `waypoint` CLI; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Options written before the command (`waypoint --json runs list`) belong to it.
    at = next((i for i, word in enumerate(argv) if word in COMMANDS), 0)
    if at and all(word.startswith("-") or argv[i - 1] == "--db" for i, word in enumerate(argv[:at])):
        argv = [argv[at], *argv[:at], *argv[at + 1:]]
    # Commands with parsers of their own get their words untouched (argparse would split `runs --db X list`).
    if argv[:1] == ["worker"]:
        from .worker import main as worker_main

        return worker_main(argv[1:])
    if argv[:1] == ["serve"]:
        return _serve(argv[1:])
    if argv[:1] == ["runs"]:
        from .runs import main as runs_main

        return runs_main(argv[1:])
    if argv[:1] == ["chapter"] and len(argv) > 1 and argv[1].isdigit() and int(argv[1]) in CHAPTERS:
        module = importlib.import_module(f".chapters.ch{int(argv[1]):02d}", __package__)
        return module.main(argv[2:])
    args = _parser().parse_args(argv)  # the demo, help, and the usage errors of the others
    from .demo import run_demo

    return run_demo(args.db, triage=args.triage)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="waypoint", description="Waypoint: checkpointed graph execution.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="an agent's run paused for approval, resumed by a new process",
                          description="A tour in three processes on one SQLite file: an agent asks to run a shell "
                                      "command and its run pauses for approval (the process exits); a new process "
                                      "resumes it by its checkpoint ID and approves; then the run's stored history. "
                                      "Runs on the offline model unless OPENAI_API_KEY is set.")
    demo.add_argument("--db", default=None, help="the SQLite file (default: .waypoint/demo.db, or "
                                                 ".waypoint/triage-demo.db with --triage)")
    demo.add_argument("--triage", action="store_true", help="the plain-graph tour (no agent)")
    chapter = sub.add_parser("chapter", help="run a quickstart chapter (1-10)",
                             description="Run quickstart chapter N; `waypoint chapter N --help` shows its options.",
                             epilog="chapters:\n" + "\n".join(f"  {n:>2}  {t}" for n, t in CHAPTER_TITLES.items()),
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    chapter.add_argument("number", type=int, choices=CHAPTERS, metavar="N", help="the chapter, 1-10")
    for name, text in (("runs", "list, show, resume or delete stored runs"),
                       ("worker", "run queued work from a shared database"),
                       ("serve", "the HTTP service and approval page (the [service] extra)")):
        sub.add_parser(name, help=text, add_help=False).add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _serve(argv: list[str]) -> int:
    try:
        from waypoint.service.serve import main as serve_main
    except ModuleNotFoundError as err:
        print(f"waypoint serve needs the service extra: pip install '.[service]' ({err})", file=sys.stderr)
        return 2
    return serve_main(argv)


if __name__ == "__main__":
    sys.exit(main())
