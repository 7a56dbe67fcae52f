"""`waypoint runs migrate`: move a stored run onto the version of its graph deployed now, which refuses to resume it
(docs/resume.md, "Deploys"; docs/cli.md, "migrate").

    waypoint runs migrate ID --graph MODULE:ATTR [--goto NODE] [--answer CALL_ID JSON]... [--values JSON]
                             [--dry-run]

It loads the new version (`--graph`, as `runs resume` does), works out the version it would write — the engine's
`update_state` with `goto=`, `answer=` and the state `values` — and prints what that changes; then it writes it
by compare-and-set on the version it worked from (a run that moved on since is refused, nothing written). Anything
the engine refuses (a node the graph does not have, an unknown call, a tool that is still there, a live lease, a
run this version still could not continue) is one line and exit code 1, with nothing written.
"""

from __future__ import annotations

import json
from typing import Any

from waypoint.engine.errors import clip
from waypoint.engine.keep import update_state

from ..console import Console, visible
from .read import RunsError, opened_store
from .resume import build_app, load_target

__all__ = ["migrate_command", "parse_migration"]


def parse_migration(args: Any) -> dict[str, Any]:
    """`update_state`'s `values`, `goto` and `answer` from `--values`, `--goto` and `--answer` (JSON checked here);
    with none of them the run is moved only if this version can continue it as it is (a compatible deploy)."""
    values: Any = {}
    if args.values is not None:
        try:
            values = json.loads(args.values)
        except ValueError:
            raise RunsError(f"--values: {clip(args.values, 80)!r} is not JSON; give an object of state fields, e.g. "
                            "--values '{\"count\": \"3\"}'") from None
        if not isinstance(values, dict):
            raise RunsError("--values takes a JSON object of state fields and their new values, e.g. "
                            "--values '{\"count\": \"3\"}'")
    answer: dict[str, Any] = {}
    for call, text in args.answer or ():
        if call in answer:
            raise RunsError(f"call {call} is answered twice; give one --answer per call")
        try:
            answer[call] = json.loads(text)
        except ValueError:
            raise RunsError(f"--answer {call}: {clip(text, 80)!r} is not JSON; quote text as a JSON string, e.g. "
                            "--answer call_1 '\"done by hand\"'") from None
    return {"values": values, "goto": args.goto, "answer": answer or None}


async def migrate_command(args: Any, console: Console, hint: str) -> int:
    """Move one run onto `--graph`; 0 when written (or planned, with `--dry-run`), 1 when refused."""
    change = parse_migration(args)
    cid = args.id
    async with opened_store(args.db) as store:
        _, app = build_app(load_target(args.graph), store)
        planned = await update_state(app.shape, cid, change["values"], goto=change["goto"], answer=change["answer"],
                                     dry_run=True)
        shown = visible(cid, strict=True)
        if " migrate" not in (planned.origin or ""):
            raise RunsError(f"run {cid!r} needs no migration: --graph {args.graph} can continue it as it is (and "
                            f"--values alone edits its state: `update_state`); resume it with `{hint} resume {cid} "
                            f"--graph {args.graph}`; nothing was written")
        what = planned.origin.split(" ", 1)[1] if planned.origin and " " in planned.origin else "migrate"
        if not args.json:
            console.line(f"run {shown} (version {planned.version - 1}) onto --graph {visible(args.graph, strict=True)} "
                         f"(graph {visible(app.name, strict=True)}): {visible(what, strict=True)}", "dim")
        written = None
        if not args.dry_run:
            written = await update_state(app.shape, cid, change["values"], goto=change["goto"],
                                         answer=change["answer"], expected_version=planned.version - 1)
    meta = written or planned
    if args.json:
        console.line(json.dumps({"checkpoint_id": cid, "version": meta.version, "status": meta.status,
                                 "origin": meta.origin, "written": written is not None}, ensure_ascii=True))
        return 0
    if written is None:
        console.line(f"nothing written (--dry-run): it would be version {meta.version}, {meta.status}", "yellow")
        return 0
    graph = visible(args.graph, strict=True)
    console.line(f"run {shown} migrated at version {meta.version} ({meta.status}, from {visible(meta.origin or '', strict=True)}); "
                 f"continue it with `{hint} resume {shown} --graph {graph}`", "green")
    return 0
