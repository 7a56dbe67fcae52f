"""`classify_interrupt(ctx)`: what a stored interrupt waits for, for anything that shows or answers it
(`waypoint runs`, the HTTP service): an approval (`ApprovalMiddleware`), a static pause
(`interrupt_before` / `interrupt_after`), or a node's or tool's own interrupt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from waypoint.engine import InterruptCtx, segment_of

from .approval import ApprovalInfo

__all__ = ["Pending", "classify_interrupt"]


@dataclass(frozen=True, kw_only=True)
class Pending:
    """One interrupt a run waits on, classified for display and for the answers it takes."""

    id: str
    address: str
    kind: str
    """"approval" (ApprovalMiddleware), "pause" (a static interrupt_before / interrupt_after), "interrupt"."""
    info: Any
    tool: str | None = None
    call_id: str | None = None
    arguments: str | None = None
    """An approval's arguments, as the JSON text the model wrote."""
    node: str | None = None
    """The innermost node of the address: where a plain graph paused."""


def classify_interrupt(ctx: InterruptCtx) -> Pending:
    """What kind of pause `ctx` is, with the tool call it belongs to (read from its address)."""
    tool, call_id = ((segment_of(ctx.address, "tool") or ()) + (None, None))[:2]
    node = (segment_of(ctx.address, "node") or (None,))[0]
    info = ctx.info
    common = {"id": ctx.id, "address": ctx.address, "info": info, "node": node}
    if isinstance(info, ApprovalInfo):
        return Pending(kind="approval", tool=info.tool_name, call_id=call_id or None,
                       arguments=info.arguments_json, **common)
    if segment_of(ctx.address, "pause") is not None:
        return Pending(kind="pause", **common)
    return Pending(kind="interrupt", tool=tool or None, call_id=call_id or None, **common)
