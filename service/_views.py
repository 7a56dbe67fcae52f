"""Stored runs as JSON: what `GET /runs/{id}`, the list, the approvals and the SSE snapshots return.

Stored values are shown, never executed: models and dataclasses become maps, bytes `"<N bytes>"`, what
JSON does not know its clipped `repr`. Times are Unix seconds (float).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from waypoint.engine import CheckpointMeta, InterruptCtx, RunSnapshot
from waypoint.engine.codec.jsonable import jsonable, message_json, output_json, tool_arguments
from waypoint.engine.run.resume import unescape_part

__all__ = ["plain", "lease_alive", "meta_view", "run_view", "pending_view", "message_view", "run_path_of",
           "time_left"]


def plain(value: Any) -> Any:
    """`value` as JSON data (engine/codec/jsonable.py)."""
    return jsonable(value, limit=2000)


def lease_alive(meta: CheckpointMeta, now: float) -> bool:
    """Whether `meta`'s lease is unexpired at `now`, the store's clock (`store_clock(store)`), never this
    process's own."""
    return meta.lease_expires is not None and meta.lease_expires > now


def meta_view(meta: CheckpointMeta, now: float) -> dict[str, Any]:
    """One version's row; `now`: the store's clock, which judges its lease."""
    out: dict[str, Any] = {
        "checkpoint_id": meta.checkpoint_id, "version": meta.version, "status": meta.status, "step": meta.step,
        "created_at": meta.created_at, "updated_at": meta.updated_at, "error": meta.error, "origin": meta.origin,
    }
    if meta.status == "running":
        out["lease"] = {"owner": meta.lease_owner, "expires": meta.lease_expires, "alive": lease_alive(meta, now)}
    return out


def run_path_of(address: str) -> list[str]:
    """The agents (or graphs) an interrupt's address passes through, outermost first: `runnable:boss;...;
    runnable:researcher;...` -> ["boss", "researcher"] (an agent called as a tool, a sub-agent, a subgraph)."""
    return [unescape_part(part[len("runnable:"):]) for part in address.split(";") if part.startswith("runnable:")]


def message_view(message: Any) -> dict[str, Any]:
    """A chat message as JSON data; each tool call also with `arguments_json`, its arguments exactly as the
    model wrote them (what the tool is given: `arguments` is that text parsed, and a reader that parses
    JSON into doubles would show 12345678901234567891 as 12345678901234567000)."""
    out = message_json(message)
    for shown, call in zip(out.get("tool_calls", ()), message.tool_calls or ()):
        if isinstance(call.arguments, str):
            shown["arguments_json"] = call.arguments
    return out


def pending_view(ctx: InterruptCtx, version: int | None, paused_at: float | None) -> dict[str, Any]:
    """One interrupt the run waits on: `kind` "approval" (ApprovalMiddleware), "pause" (a static
    interrupt_before / interrupt_after), "sleep" (`sleep_until`) or "interrupt"; `paused_at` is when the pause
    was written; `run_path` the agents it was raised in, outermost first; `deadline`, when it has one (the
    store's clock; `time_left` adds the seconds left)."""
    from waypoint.middleware import classify_interrupt

    p = classify_interrupt(ctx)
    out: dict[str, Any] = {"id": p.id, "kind": p.kind, "address": p.address, "run_path": run_path_of(p.address),
                           "paused_at": paused_at, "version": version}
    if p.deadline is not None:
        out["deadline"] = p.deadline
    if p.tool is not None:
        out.update(tool=p.tool, call_id=p.call_id)
    if p.kind == "approval":
        out.update(arguments=tool_arguments(p.arguments), arguments_json=p.arguments, digest=p.digest)
    else:
        out["info"] = plain(p.info)
    return out


def time_left(item: dict[str, Any], now: float) -> dict[str, Any]:
    """A pending view with `expires_in`: seconds until its deadline at `now`, the store's clock (0 once due)."""
    deadline = item.get("deadline")
    return item if deadline is None else {**item, "expires_in": max(0.0, round(deadline - now, 3))}


def run_view(snap: RunSnapshot, history: Sequence[CheckpointMeta], *, newest: int, history_next: int | None,
             active: bool, now: float) -> dict[str, Any]:
    """A decoded version with a page of the run's history (newest first; `history_next` is the
    `history_before=` of the next page, None on the last)."""
    from waypoint.engine.agents import AgentState

    meta = snap.meta
    is_agent = isinstance(snap.state, AgentState)
    out = {**meta_view(meta, now), "graph": snap.graph, "kind": "agent" if is_agent else "graph",
           "newest_version": newest, "active": active,
           "interrupts": [time_left(pending_view(c, meta.version, meta.updated_at), now)
                          for c in snap.interrupts.contexts] if meta.status != "completed" else [],
           "pending_nodes": list(snap.pending),
           "cancelled_by": snap.cancelled_by.plain() if snap.cancelled_by is not None else None}
    if is_agent:
        out["input_taken"] = snap.turn.get("input", 0)
        out["messages"] = [message_view(m) for m in snap.state.messages]
        out["decisions"] = plain(snap.state.decisions)
    else:
        out["state"] = plain(snap.state)
    out["output"] = output_json(snap.output)
    out["history"] = [meta_view(m, now) for m in history]
    out["history_next"] = history_next
    return out
