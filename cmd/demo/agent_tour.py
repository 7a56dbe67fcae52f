"""`waypoint demo`: the agent tour. An agent asks to run a shell command; the approval request is shown
and the process exits. A *new* process resumes the run by its checkpoint ID and approves; the tool runs,
the agent answers. Then the run's history (every stored version) and the agent's graph.

    waypoint demo [--db PATH]          the tour (three processes on one SQLite file)
    waypoint demo --triage             the older tour: a plain graph with a reviewer's approval

Runs on the offline model unless OPENAI_API_KEY is set. `python -m waypoint.cmd.demo start|approve ...`
are the two processes the tour starts.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..console import Console, print_events
from .common import history_table, process_main

__all__ = ["run_agent_tour", "build_agent", "AGENT_NAME"]

AGENT_NAME = "waypoint-demo"
DEFAULT_DB = Path(".waypoint") / "demo.db"
REQUEST = "please run the command echo hello from waypoint"
INSTRUCTION = ("You are an operations assistant. To run a shell command, call the execute tool; "
               "a person approves each command before it runs.")


def build_agent() -> Any:
    """The demo's agent: `execute` (in the working directory) behind an approval."""
    from waypoint.engine import ChatModelAgent
    from waypoint.engine.models import model_from_env
    from waypoint.middleware import ApprovalMiddleware, SafeToolMiddleware

    from ..fstools import ProjectRoot, execute_tool

    return ChatModelAgent(name=AGENT_NAME, model=model_from_env(), instruction=INSTRUCTION,
                          tools=[execute_tool(ProjectRoot())],
                          middlewares=[ApprovalMiddleware(tools={"execute"}), SafeToolMiddleware()])


def run_agent_tour(db: str | Path | None = None) -> int:
    """The whole tour; returns the exit code."""
    db = Path(db) if db else DEFAULT_DB
    console = Console()
    checkpoint_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    console.line("Waypoint demo: an agent's tool call waits for approval, and a new process approves it", "bold")
    console.line(f"runs are stored in {db}; the run's checkpoint ID is {checkpoint_id}", "dim")
    console.line(_model_banner() + "\n", "dim")
    console.line(f"1) process A asks the agent: \"{REQUEST}\"", "bold")
    step = _child(console, "start", db, checkpoint_id, REQUEST)
    if step.returncode != 2:
        return _failed(console, step)
    pending = json.loads(step.stdout.strip().splitlines()[-1])
    console.line(f"   process A exited; the run waits, stored, for interrupt {pending['id']}\n", "dim")
    console.line("2) process B resumes the run by its checkpoint ID and approves the call", "bold")
    step = _child(console, "approve", db, checkpoint_id, pending["id"])
    if step.returncode != 0:
        return _failed(console, step)
    console.line()
    console.line("3) the run's history, newest first (every version is a stored checkpoint)", "bold")
    console.line(asyncio.run(history_table(db, checkpoint_id, _meaning)))
    console.line("\n4) the agent is a graph (Mermaid):", "bold")
    console.line(build_agent().to_mermaid().rstrip(), "dim")
    console.line(f"\nsee it again: waypoint runs show {checkpoint_id} --db {db}", "dim")
    return 0


def _model_banner() -> str:
    from waypoint.engine.models import OfflineModel, model_from_env

    model = model_from_env()
    return model.banner if isinstance(model, OfflineModel) else f"model: {model.name} (OPENAI_API_KEY is set)"


def _child(console: Console, action: str, db: Path, checkpoint_id: str, arg: str) -> subprocess.CompletedProcess:
    """Run one process of the tour, showing its output indented as it was printed."""
    cmd = [sys.executable, "-m", "waypoint.cmd.demo.agent_tour", action, str(db), checkpoint_id, arg]
    env = {**os.environ, **({"FORCE_COLOR": "1"} if console.color else {})}
    step = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    for line in step.stdout.splitlines():
        if not line.startswith("{"):  # the JSON line is for the tour itself
            console.line("   " + line)
    return step


def _failed(console: Console, step: subprocess.CompletedProcess) -> int:
    console.note(f"the demo failed (exit {step.returncode}):\n{step.stdout}\n{step.stderr}", "red")
    return 1


def _meaning(meta: Any, older: Any) -> str:
    if meta.status == "completed":
        return "the agent answered; the conversation is stored"
    if meta.status == "interrupted":
        return "paused for approval (process A exits here)"
    if older is None:
        return "process A claims the new run"
    if older.status == "interrupted":
        return "process B claims the paused run (exactly one resumer can)"
    if meta.step == 1:
        return "after the prompt box: the request is in the conversation"
    if meta.step % 2 == 0:
        return "after the model box: the model asked to run a command"
    return "after the tools box: the command ran, its result is in the conversation"


# --- the two processes -------------------------------------------------------------------------------

async def _start(db: Path, checkpoint_id: str, request: str) -> int:
    from waypoint.engine import Runner
    from waypoint.stores import SQLiteStore

    console = Console(color=_color())
    store = SQLiteStore(db)
    try:
        runner = Runner(build_agent(), store=store, streaming=True)
        summary = await print_events(runner.run(request, checkpoint_id=checkpoint_id), console)
    finally:
        await store.close()
    if summary.interrupted is None:
        console.note("the agent did not ask to run anything", "red")
        return 1
    (ctx,) = summary.interrupted.contexts
    info = ctx.info
    console.line("⚠️  Approval Required ⚠️", "yellow", "bold")
    console.line(f"Tool: {info.tool_name}")
    console.line(f"Arguments: {info.arguments_json}")
    print(json.dumps({"id": ctx.id}))
    return 2


async def _approve(db: Path, checkpoint_id: str, interrupt_id: str) -> int:
    from waypoint.engine import Runner
    from waypoint.middleware import ApprovalResult
    from waypoint.stores import SQLiteStore

    console = Console(color=_color())
    console.line("✓ Approved, executing...", "green")
    store = SQLiteStore(db)
    try:
        runner = Runner(build_agent(), store=store, streaming=True)
        events = runner.resume_with_params(checkpoint_id, {interrupt_id: ApprovalResult(approved=True)})
        summary = await print_events(events, console)
    finally:
        await store.close()
    return 1 if summary.error is not None or summary.interrupted is not None else 0


def _color() -> bool:
    return os.environ.get("FORCE_COLOR") == "1"


def main(argv: list[str] | None = None) -> int:
    return process_main("python -m waypoint.cmd.demo.agent_tour", {"start": _start, "approve": _approve}, argv)


if __name__ == "__main__":
    sys.exit(main())
