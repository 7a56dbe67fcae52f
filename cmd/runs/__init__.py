"""`waypoint runs`: list, show, resume, cancel and delete the runs stored in a database (a SQLite file or a URL).

    waypoint runs list    [--status S] [--limit N]          the newest version of each run
    waypoint runs show    ID [--version N] [--graph M:A]    one version, decoded and readable
    waypoint runs history ID                                every version, newest first
    waypoint runs resume  ID [--approve IID] [--reject IID --reason R] [--respond IID JSON]
                             [--graph M:A] [--takeover] [--project-root DIR]
                                                            continue it in this process
    waypoint runs migrate ID --graph M:A [--goto NODE] [--answer CALL_ID JSON] [--values JSON] [--dry-run]
                                                            move it onto the version deployed now
    waypoint runs cancel  ID [--when W] [--by WHO] [--wait S]
                                                            stop it wherever it executes
    waypoint runs delete  ID [--yes]                        remove it (asks on a terminal)

Every command takes `--db PATH|URL` (default `$WAYPOINT_DB`, else `.waypoint/waypoint.db`) and `--json`.
Exit codes: 0 done; 1 an error the message explains (unknown run, missing or foreign database, a damaged
record, a refused or failed resume); 2 a usage error (from argparse); 130 interrupted by Ctrl-C.
Reading commands never create or change a database: a missing file is an error. docs/cli.md has samples.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from waypoint.engine import CheckpointCorrupted, WaypointError
from waypoint.engine.errors import describe
from waypoint.engine.keep.store import store_clock

from ..console import Console, default_db, visible
from .read import RunsError, opened_store, read_run, read_version
from .render import clock, lease_alive, meta_json, run_json, show_run, table

__all__ = ["main", "build_parser"]

STATUSES = ("running", "interrupted", "completed", "failed")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The parser of `waypoint runs`; `--db` and `--json` are accepted before or after the subcommand."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS,
                        help="the database: a SQLite file, or a URL (sqlite:///path, postgresql+asyncpg://...) "
                             "(default: $WAYPOINT_DB or .waypoint/waypoint.db)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts")
    parser = argparse.ArgumentParser(prog="waypoint runs", parents=[common],
                                     description="Inspect, resume and delete stored runs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="list|show|history|resume|migrate|cancel|delete")
    p = sub.add_parser("list", parents=[common], help="the newest version of each run, most recent first")
    p.add_argument("--status", choices=STATUSES, help="only runs with this status")
    p.add_argument("--limit", type=_positive, default=50, help="at most N runs (default: %(default)s)")
    p = sub.add_parser("show", parents=[common], help="one run, decoded: status, lease, messages, interrupts")
    p.add_argument("id", help="the run's checkpoint ID")
    p.add_argument("--version", type=_positive, help="an older version (default: the newest)")
    p.add_argument("--graph", metavar="MODULE:ATTR", help="import the graph that wrote it (its types, its codec)")
    p = sub.add_parser("history", parents=[common], help="every version of a run, newest first")
    p.add_argument("id")
    p = sub.add_parser("resume", parents=[common], help="resume a run in this process, answering its interrupts")
    p.add_argument("id")
    p.add_argument("--approve", action="append", metavar="IID", help="approve interrupt IID (repeatable)")
    p.add_argument("--reject", action="append", metavar="IID", help="reject interrupt IID (repeatable)")
    p.add_argument("--reason", help="why the rejected calls were rejected (the model reads it)")
    p.add_argument("--respond", action="append", nargs=2, metavar=("IID", "JSON"),
                   help="answer interrupt IID with JSON (for an agent's tool: its result; the tool does not run)")
    p.add_argument("--graph", metavar="MODULE:ATTR",
                   help="the ChatModelAgent, Graph or CompiledGraph that wrote the run (or a function returning one)")
    p.add_argument("--takeover", action="store_true", help="take over a run whose process died before its lease ran out")
    p.add_argument("--project-root", type=Path, metavar="DIR",
                   help="for a chapter session (chapters 4-10) stored without its project root, or whose root is no "
                        "longer a directory: the directory its tools are confined to (otherwise the stored one is)")
    p = sub.add_parser("migrate", parents=[common],
                       help="move a run a deploy refused onto the version deployed now (it is written, not resumed)")
    p.add_argument("id")
    p.add_argument("--graph", metavar="MODULE:ATTR", required=True,
                   help="the new version: a ChatModelAgent, Graph or CompiledGraph (or a function returning one)")
    p.add_argument("--goto", metavar="NODE",
                   help="continue the run at NODE of the new version, where it is at a node that version does not have")
    p.add_argument("--answer", action="append", nargs=2, metavar=("CALL_ID", "JSON"),
                   help="answer a pending call whose tool the new version removed with JSON as its result (the tool "
                        "never runs); CALL_ID is the model's call ID or the interrupt ID (repeatable)")
    p.add_argument("--values", metavar="JSON",
                   help="a JSON object of state fields: a new value for each field whose type changed")
    p.add_argument("--dry-run", action="store_true", help="show what it would write, and write nothing")
    p = sub.add_parser("cancel", parents=[common], help="stop a running run wherever it executes, now or at a safe point")
    p.add_argument("id")
    p.add_argument("--when", default="now", metavar="W",
                   help="now (default; a tool call in flight runs again when the run is continued), after_step, "
                        "after_tool_calls or after_model_call (an agent), or after:NODE")
    p.add_argument("--by", metavar="WHO", help="who asks, as the run's record shows it (default: user@host)")
    p.add_argument("--wait", type=float, metavar="S", help="wait up to S seconds for the run to stop")
    p = sub.add_parser("delete", parents=[common], help="delete a run: every version, its blobs and its ledger")
    p.add_argument("id")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `waypoint runs ...`; returns the exit code. Errors are one line on stderr, never a traceback."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # usage errors (2) and --help (0)
        return exit.code if isinstance(exit.code, int) else 2
    args.db = str(getattr(args, "db", None) or default_db())
    args.json = getattr(args, "json", False)
    console = Console()
    same = "://" not in str(args.db) and Path(args.db) == default_db()
    hint = "waypoint runs" + ("" if same else f" --db {shlex.quote(str(args.db))}")
    try:
        return asyncio.run(COMMANDS[args.command](args, console, hint))
    except CheckpointCorrupted as err:
        return _fail(console, f"{err}{_unreadable_hint(err, getattr(args, 'id', None), hint)}")
    except (RunsError, WaypointError) as err:
        return _fail(console, str(err))
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except sqlite3.Error as err:
        return _fail(console, f"the database {args.db!r} cannot be used: {err}")
    except OSError as err:
        return _fail(console, describe(err))
    except KeyboardInterrupt:
        return _fail(console, "interrupted (a run being resumed is saved at its last finished step)", 130)
    except Exception as err:  # a bug: still one line, and what to report
        return _fail(console, f"unexpected {describe(err)} (a bug in waypoint; please report it)")


def _unreadable_hint(err: BaseException, checkpoint_id: str | None, hint: str) -> str:
    """What to do about a run that cannot be decoded: name its graph, or look at its other versions."""
    from waypoint.engine.codec.serde import UnknownType

    if isinstance(err, UnknownType) or "Serializer" in str(err):  # a type or a key only its module has
        return (f"; `{hint} show|resume {checkpoint_id or 'ID'} --graph MODULE:ATTR` reads it with the graph "
                "that wrote it (its module registers the run's types; its serializer holds the signing key)")
    if checkpoint_id is None or not isinstance(err, CheckpointCorrupted):
        return ""
    return (f"; `{hint} history {checkpoint_id}` lists its versions (`{hint} show {checkpoint_id} --version N` "
            f"reads an older one, `{hint} delete {checkpoint_id}` removes the run)")


def _fail(console: Console, message: str, code: int = 1) -> int:
    console.note("error: " + visible(" ".join(message.split()), strict=True), "red")  # it may quote a run ID
    return code


async def _list(args: Any, console: Console, hint: str) -> int:
    async with opened_store(args.db) as store:
        metas = await store.list(status=args.status, limit=args.limit)
        now = await store_clock(store)
        found = []
        for meta in metas:
            try:
                found.append((meta, await read_version(store, meta.checkpoint_id, meta.version), None))
            except WaypointError as err:  # one damaged run does not hide the others
                found.append((meta, None, str(err) + _unreadable_hint(err, meta.checkpoint_id, hint)))
    if args.json:
        console.line(json.dumps([_list_json(meta, run, problem, now) for meta, run, problem in found],
                                ensure_ascii=True))
        return 0
    if not found:
        console.line("no runs" + (f" with status {args.status}" if args.status else "") + f" in {args.db}")
        return 0
    rows = []
    for meta, run, problem in found:
        status = meta.status + (" (lease expired)" if meta.status == "running" and not lease_alive(meta, now) else "")
        pending = "?" if run is None else str(len(run.pending)) if run.pending else "-"
        graph = "(unreadable)" if run is None else run.graph + (" (agent)" if run.is_agent else "")
        rows.append((visible(meta.checkpoint_id, strict=True), status, str(meta.version), str(meta.step), pending,
                     clock(meta.updated_at), visible(graph, strict=True)))
    for line in table(("ID", "STATUS", "VERSION", "STEP", "PENDING", "UPDATED", "GRAPH"), rows):
        console.line(line)
    for meta, _, problem in found:
        if problem:
            console.note(visible(" ".join(problem.split()), strict=True), "yellow")
    return 0


def _list_json(meta: Any, run: Any, problem: str | None, now: float) -> dict[str, Any]:
    out = meta_json(meta, now)
    out["graph"] = run.graph if run is not None else None
    out["kind"] = None if run is None else "agent" if run.is_agent else "graph"
    out["interrupts"] = None if run is None else [p.id for p in run.pending]
    if problem:
        out["problem"] = problem
    return out


async def _show(args: Any, console: Console, hint: str) -> int:
    serializer = None
    if args.graph:  # its module registers the state's types; a signed codec needs its key
        from .resume import build_app, load_target

        target = load_target(args.graph)
    async with opened_store(args.db) as store:
        if args.graph:
            serializer = build_app(target, store)[1].get_serializer()
        run = await read_run(store, args.id, args.version, serializer=serializer, hint=hint)
    if args.json:
        console.line(json.dumps(run_json(run), ensure_ascii=True))
    else:
        show_run(run, console, hint=hint)
    return 0


async def _history(args: Any, console: Console, hint: str) -> int:
    async with opened_store(args.db) as store:
        metas = await store.history(args.id)
        now = await store_clock(store)
    if not metas:
        raise RunsError(f"no run {args.id!r} in this database; `{hint} list` shows the runs")
    if args.json:
        console.line(json.dumps([meta_json(m, now, newest=i == 0) for i, m in enumerate(metas)], ensure_ascii=True))
        return 0
    rows = [(str(m.version), m.status, str(m.step), clock(m.updated_at), visible(_origin(m), strict=True),
             visible(" ".join((m.error or "-").split()), strict=True)) for m in metas]
    for line in table(("VERSION", "STATUS", "STEP", "WRITTEN", "ORIGIN", "ERROR"), rows):
        console.line(line)
    return 0


def _origin(meta: Any) -> str:
    return f"from {meta.origin}" if meta.origin else "-"


async def _resume(args: Any, console: Console, hint: str) -> int:
    from .resume import resume_command

    return await resume_command(args, console, hint)


async def _migrate(args: Any, console: Console, hint: str) -> int:
    from .migrate import migrate_command

    return await migrate_command(args, console, hint)


async def _cancel(args: Any, console: Console, hint: str) -> int:
    from .cancel import cancel_command

    return await cancel_command(args, console, hint)


async def _delete(args: Any, console: Console, hint: str) -> int:
    async with opened_store(args.db) as store:
        metas = await store.history(args.id)
        if not metas:
            raise RunsError(f"no run {args.id!r} in this database; `{hint} list` shows the runs")
        newest = metas[0]
        if not args.yes:
            _confirm(args.id, newest, len(metas), console, await store_clock(store))
        deleted = await store.delete(args.id)
    if args.json:
        console.line(json.dumps({"checkpoint_id": args.id, "deleted": deleted}))
    else:
        console.line(f"deleted run {args.id} ({len(metas)} version{'s' if len(metas) > 1 else ''})")
    return 0


def _confirm(checkpoint_id: str, newest: Any, versions: int, console: Console, now: float) -> None:
    """Ask on a terminal; refuse without one (a script must say --yes)."""
    if not sys.stdin.isatty():
        raise RunsError(f"refusing to delete run {checkpoint_id!r} without confirmation: not a terminal; "
                        "pass --yes")
    live = " It is RUNNING in a live process, which will fail at its next write." \
        if newest.status == "running" and lease_alive(newest, now) else ""
    console.write(f"Delete run {checkpoint_id} ({newest.status}, {versions} version(s)) for good?{live} [y/N] ")
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise RunsError(f"run {checkpoint_id!r} was not deleted")


COMMANDS = {"list": _list, "show": _show, "history": _history, "resume": _resume, "migrate": _migrate,
            "cancel": _cancel, "delete": _delete}


if __name__ == "__main__":
    sys.exit(main())
