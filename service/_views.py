"""Stored runs as JSON: what `GET /runs/{id}`, the list, the approvals and the SSE snapshots return.

Stored values are shown, never executed: models and dataclasses become maps, bytes `"<N bytes>"`, what
JSON does not know its clipped `repr`. Times are Unix seconds (float).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from waypoint.engine import CheckpointMeta, InterruptCtx, RunSnapshot
from waypoint.engine.jsonable import jsonable

__all__ = ["plain", "meta_view", "run_view", "pending_view", "message_view", "parsed"]


def plain(value: Any) -> Any:
    """`value` as JSON data (engine/jsonable.py)."""
    return jsonable(value, limit=2000)


def parsed(arguments: str) -> Any:
    """Tool arguments as JSON data when they are JSON (else the text the model wrote)."""
    try:
        return json.loads(arguments)
    except (ValueError, TypeError, RecursionError):
        return arguments


def lease_alive(meta: CheckpointMeta) -> bool:
    return meta.lease_expires is not None and meta.lease_expires > time.time()


def meta_view(meta: CheckpointMeta) -> dict[str, Any]:
    """One version's row."""
    out: dict[str, Any] = {
        "checkpoint_id": meta.checkpoint_id, "version": meta.version, "status": meta.status, "step": meta.step,
        "created_at": meta.created_at, "updated_at": meta.updated_at, "error": meta.error, "origin": meta.origin,
    }
    if meta.status == "running":
        out["lease"] = {"owner": meta.lease_owner, "expires": meta.lease_expires, "alive": lease_alive(meta)}
    return out


def _tool_of(address: str) -> tuple[str | None, str | None]:
    for segment in reversed(address.split(";")):
        if segment.startswith("tool:"):
            _, name, call_id = (segment.split(":", 2) + [""])[:3]
            return name or None, call_id or None
    return None, None


def pending_view(ctx: InterruptCtx, version: int | None, paused_at: float | None) -> dict[str, Any]:
    """One interrupt the run waits on: `kind` "approval" (ApprovalMiddleware), "pause" (a static
    interrupt_before / interrupt_after) or "interrupt"; `paused_at` is when the pause was written."""
    from waypoint.middleware import ApprovalInfo

    tool, call_id = _tool_of(ctx.address)
    info = ctx.info
    out: dict[str, Any] = {"id": ctx.id, "kind": "interrupt", "address": ctx.address, "paused_at": paused_at,
                           "version": version}
    if isinstance(info, ApprovalInfo):
        out.update(kind="approval", tool=info.tool_name, call_id=call_id, arguments=parsed(info.arguments_json),
                   arguments_json=info.arguments_json, digest=info.digest)
        return out
    if ctx.address.endswith((";pause:before", ";pause:after")):
        out["kind"] = "pause"
    elif tool is not None:
        out.update(tool=tool, call_id=call_id)
    out["info"] = plain(info)
    return out


def message_view(m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": parsed(c.arguments)} for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"], out["name"] = m.tool_call_id, m.name
    return out


def _is_message(value: Any) -> bool:
    return hasattr(value, "role") and hasattr(value, "tool_calls") and hasattr(value, "content")


def run_view(snap: RunSnapshot, history: Sequence[CheckpointMeta], *, active: bool) -> dict[str, Any]:
    """A decoded version with the run's history (newest first)."""
    from waypoint.engine.agents import AgentState

    meta = snap.meta
    is_agent = isinstance(snap.state, AgentState)
    out = {**meta_view(meta), "graph": snap.graph, "kind": "agent" if is_agent else "graph",
           "newest_version": history[0].version if history else meta.version, "active": active,
           "interrupts": [pending_view(c, meta.version, meta.updated_at) for c in snap.interrupts.contexts]
           if meta.status != "completed" else [],
           "pending_nodes": list(snap.pending)}
    if is_agent:
        out["messages"] = [message_view(m) for m in snap.state.messages]
        out["decisions"] = plain(snap.state.decisions)
    else:
        out["state"] = plain(snap.state)
    out["output"] = message_view(snap.output) if _is_message(snap.output) else plain(snap.output)
    out["history"] = [meta_view(m) for m in history]
    return out
