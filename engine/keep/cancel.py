"""A person's cancel of a run, wherever it executes (docs/resume.md, "Cancelling a run").

`CompiledGraph.cancel(checkpoint_id, when=...)` — and `Runner.cancel`, `POST /runs/{id}/cancel`, `waypoint runs
cancel` on top of it — records a request in the store (engine/keep/store.py, guarantee 14), accepted only while
the run is `running` under a live lease on the store's clock. The process executing the run reads its runs'
requests from its lease thread (engine/keep/lease.py) every `POLL` seconds and stops the run where asked:

- `"now"`: the run's task is cancelled where it is. The step in flight is not written; a tool call in flight is
  abandoned, its ledger saying it started with its outcome unknown, so a continuation runs it again, flagged
  `rerun`, with the same idempotency key.
- `"after_step"`: at the next step boundary of the run, or of a run nested in it (a subgraph, an agent used as a
  tool), with everything finished written.
- `"after:<node>"`: at the first step boundary after `node` finished, in the run or a run nested in it. The
  agents' model and tool calls are their "model" and "tools" nodes: `Runner.cancel(when="after_model_call" |
  "after_tool_calls")`.

Either way the run is stored `interrupted` with `error="cancelled"` at its last finished step, with who asked
(`RunSnapshot.cancelled_by`), and raises `RunCancelled` to whoever runs it. It continues from there when resumed
or given new input. A request names the run's newest version when it was made: a continuation claimed after it
is not stopped by it.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Callable
from typing import Any

from ..errors import RunCancelled, WaypointError
from .store import CANCEL_WHEN, CancelRequest

__all__ = ["POLL", "AGENT_POINTS", "request_cancel", "cancel_point", "safe_point", "cancelled", "default_by"]

POLL = 0.5
"""Seconds between two looks of a process for cancel requests of the runs it executes."""

AGENT_POINTS = {"now": "now", "after_tool_calls": "after:tools", "after_model_call": "after:model"}
"""An agent's points (`Runner.cancel`), as its graph names them (engine/agents/chat_agent.py)."""


def cancel_point(checkpoint_id: str, when: Any, structure: dict[str, Any], *, agent: bool = False) -> str:
    """The `when` to record for a point a caller named — an agent's names mapped (with `agent`) — checked against the
    graph's stored `structure`: a point that names no node of it (or of a graph nested in it) would never stop the
    run, so it is refused."""
    if agent and when in AGENT_POINTS:
        when = AGENT_POINTS[when]
    node = when[len("after:"):] if isinstance(when, str) and when.startswith("after:") else None
    if node is None and when not in CANCEL_WHEN:
        points = [*AGENT_POINTS, "after_step"] if agent else [*CANCEL_WHEN]
        raise WaypointError(f"run '{checkpoint_id}': cancel when={str(when)[:80]!r} must be one of {', '.join(points)} "
                            "or 'after:<node>'")
    if node is not None and node not in _nodes(structure):
        raise WaypointError(f"run '{checkpoint_id}': cancel when={when[:80]!r} names no node of graph "
                            f"'{structure.get('name')}' or of a graph nested in it (its nodes: "
                            f"{', '.join(sorted(_nodes(structure)))[:300]}); a cancel that names no node would never "
                            "stop the run")
    return when


def _nodes(structure: Any) -> set[str]:
    nodes = structure.get("nodes") if isinstance(structure, dict) else None
    if not isinstance(nodes, dict):
        return set()
    return {k for k in nodes if isinstance(k, str)} | {n for sub in nodes.values() for n in _nodes(sub)}


async def request_cancel(store: Any, checkpoint_id: str, *, when: str = "now", by: str | None = None) -> CancelRequest:
    """Record a cancel request for `checkpoint_id` in `store` (see above; `when` as `cancel_point` gives it);
    `NotRunning` when nothing runs it."""
    if getattr(store, "request_cancel", None) is None:
        raise WaypointError(f"run '{checkpoint_id}': its store ({type(store).__name__}) keeps no cancel requests, so "
                            "a run another process executes cannot be told to stop; use MemoryStore, SQLiteStore or "
                            "SQLStore, or cancel the run's task in the process that executes it")
    return await store.request_cancel(checkpoint_id, when=when, by=default_by() if by is None else by)


def default_by() -> str:
    """Who asks, when the caller does not say: `user@host`."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (a container without one): name the uid
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"[:200]


def safe_point(request: Callable[[], CancelRequest | None], checkpoint_id: str) -> Callable[[Any], None]:
    """The check a run (and every run nested in it) makes at each step boundary: raise `RunCancelled` once the run's
    cancel request (`request()`) asks to stop here. `run.ran`: the nodes that finished since the last boundary. A
    cancel "now" stops here too, should code in the run have caught the task's cancellation."""
    def check(run: Any) -> None:
        asked = request()
        if asked is None:
            return
        if asked.when in CANCEL_WHEN or asked.when[len("after:"):] in run.ran:
            raise cancelled(asked, checkpoint_id)

    return check


def cancelled(request: CancelRequest, checkpoint_id: str) -> RunCancelled:
    """The error a run the request stopped raises."""
    where = {"now": "where it was", "after_step": "at a step boundary"}.get(
        request.when, f"after node '{request.when[len('after:'):]}' ran")
    return RunCancelled(
        f"run '{checkpoint_id}' was cancelled by {request.by or 'an unnamed caller'} and stopped {where}; it is stored "
        "cancelled at its last finished step: continue it with ainvoke(None, checkpoint_id=...) or give it new input",
        checkpoint_id=checkpoint_id, by=request.by, when=request.when)
