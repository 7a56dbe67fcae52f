"""`waypoint demo --triage`: a plain graph's run paused for approval in one process is resumed by its
checkpoint ID in another (the tour before agents existed; the default demo is the agent tour).

The tour runs three processes on one SQLite file under ./.waypoint/:
1. `start`: a ticket that needs escalation runs until the review node pauses; the process exits.
2. `resume`: a new process loads the run by its checkpoint ID and resumes it with the reviewer's answer.
3. the run's history (versions, status, step) is printed from the database.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from .common import history_table, process_main

DEFAULT_DB = Path(".waypoint") / "triage-demo.db"


def run_triage_demo(db: Path = DEFAULT_DB) -> int:
    """The whole tour; returns the exit code."""
    checkpoint_id = f"ticket-{int(time.time())}"
    print("Waypoint demo: a ticket-triage graph with an approval step, stored in", db, "\n")
    print(_picture())
    print(f"1) process A starts run '{checkpoint_id}' for the ticket 'The site is down!'")
    step = _child("start", db, checkpoint_id, "The site is down!")
    if step.returncode != 2:
        return _fail(step)
    pending = json.loads(step.stdout.strip().splitlines()[-1])
    print(f"   process A exited; the run waits for interrupt {pending['id']}: {pending['question']}\n")
    print("2) process B resumes it by checkpoint ID with the reviewer's answer {approved: true}")
    step = _child("resume", db, checkpoint_id, json.dumps({pending["id"]: {"approved": True, "reviewer": "dana"}}))
    if step.returncode != 0:
        return _fail(step)
    print(step.stdout.rstrip() + "\n")
    print("3) the run's history, newest first:")
    print(asyncio.run(history_table(db, checkpoint_id, _meaning)))
    return 0


def _picture() -> str:
    from .triage import build_triage

    return build_triage().compile().to_mermaid()


def _child(action: str, db: Path, checkpoint_id: str, arg: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "waypoint.cmd.demo.triage_tour", action, str(db), checkpoint_id, arg]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _fail(step: subprocess.CompletedProcess) -> int:
    print(f"the demo failed (exit {step.returncode}):\n{step.stdout}\n{step.stderr}", file=sys.stderr)
    return 1


def _meaning(meta, older) -> str:
    if meta.status == "completed":
        return "the run finished; its output is stored"
    if meta.status == "interrupted":
        return "paused for the reviewer (process A exits here)"
    if older is None:
        return "process A claims the new run"
    if older.status == "interrupted":
        return "process B claims the paused run (exactly one resumer can)"
    return f"after superstep {meta.step}, before the next one starts"


async def _start(db: Path, checkpoint_id: str, ticket: str) -> int:
    from waypoint.engine import GraphInterrupted
    from waypoint.stores import SQLiteStore

    from .triage import build_triage

    store = SQLiteStore(db)
    app = build_triage().compile(store=store)
    try:
        await app.ainvoke(ticket, checkpoint_id=checkpoint_id)
    except GraphInterrupted as paused:
        (ctx,) = paused.info.contexts
        print(json.dumps({"id": ctx.id, "address": ctx.address, "question": ctx.info["question"]}))
        return 2
    finally:
        await store.close()
    return 0


async def _resume(db: Path, checkpoint_id: str, answers: str) -> int:
    from waypoint.stores import SQLiteStore

    from .triage import build_triage

    store = SQLiteStore(db)
    app = build_triage().compile(store=store)
    try:
        result = await app.ainvoke(None, checkpoint_id=checkpoint_id, resume=json.loads(answers))
        snapshot = await app.get_run(checkpoint_id)
    finally:
        await store.close()
    print(f"   result: {result}")
    print(f"   what happened: {'; '.join(snapshot.state.log)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return process_main("python -m waypoint.cmd.demo.triage_tour", {"start": _start, "resume": _resume}, argv)


if __name__ == "__main__":
    sys.exit(main())
