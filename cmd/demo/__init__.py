"""`waypoint demo`: the tours `make demo` runs. Each step of a tour is a process of its own, so what the
tours show — a run paused in one process and resumed in another — is what really happens.

- `agent_tour`: an agent's tool call waits for approval; a new process approves it (the default).
- `triage_tour`: a plain graph's node pauses for a person (`--triage`).
- `common`: the history table both print, and the command line of their step processes.
"""

from __future__ import annotations

from pathlib import Path

from .agent_tour import AGENT_NAME, build_agent

__all__ = ["run_demo", "AGENT_NAME", "build_agent"]


def run_demo(db: str | Path | None = None, *, triage: bool = False) -> int:
    """The tour; returns the exit code."""
    if triage:
        from .triage_tour import run_triage_demo

        return run_triage_demo(Path(db) if db else Path(".waypoint") / "triage-demo.db")
    from .agent_tour import run_agent_tour

    return run_agent_tour(db)
