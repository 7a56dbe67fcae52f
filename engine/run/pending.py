"""`Pending`: one thing a stored run waits for, read without resuming it (`pending_of(ctx)`).

`CompiledGraph.pending(id)`, `Runner.pending(id)`, `RunSnapshot.waits_for` and `AgentAction.pending` give
them; `waypoint runs`, the HTTP service and `waypoint.middleware.classify_interrupt` read them the same way.

The engine knows an interrupt's ID, its address and its info. What it waits for is read from those:

1. the tool call it belongs to, from the address's innermost `tool:` segment (`tool`, `call_id`), and the
   innermost node (`node`);
2. the info's own fields, when it has them: `tool_name` (wins over the address: a call's middleware may
   rename it), `arguments_json` (the call's arguments as the model wrote them), `digest` (what an answer
   binds to); and its kind, when its class names one (`pending_kind`: `ApprovalInfo` in
   `waypoint.middleware` says "approval") — so this module names no middleware, and an info of your own
   with those fields reads the same way;
3. its `deadline` from the pause itself (`Interrupt(deadline=...)`, `ApprovalMiddleware(expires_after=...)`);
4. otherwise a static pause (`interrupt_before` / `interrupt_after`, a `pause:` segment) is "pause", and
   anything else "interrupt".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .interrupts import InterruptCtx
from .resume import segment_of

__all__ = ["Pending", "pending_of"]


@dataclass(frozen=True, kw_only=True)
class Pending:
    """One interrupt a run waits on: its ID (what an answer names), and the call it is about."""

    id: str
    address: str
    kind: str
    """"approval" (ApprovalMiddleware), "pause" (a static interrupt_before / interrupt_after), or "interrupt"
    (a node's or a tool's own `Interrupt`)."""
    info: Any
    """What the interrupt said, as it was stored (an `ApprovalInfo`, a dict, ...)."""
    tool: str | None = None
    """The tool whose call paused, if it paused inside one."""
    call_id: str | None = None
    """The model's ID of that call."""
    arguments: str | None = None
    """The call's arguments as the JSON text the model wrote, when the info carries them (an approval)."""
    digest: str | None = None
    """What an answer binds to (`ApprovalResult(digest=...)`), when the info carries one."""
    deadline: float | None = None
    """When the pause stops waiting (seconds since the epoch, on the store's clock), if it has a deadline: at it,
    recovery answers it with what the pause said (`on_deadline`; an approval is rejected as expired)."""
    node: str | None = None
    """The innermost node of the address: where a plain graph paused."""


def pending_of(ctx: InterruptCtx) -> Pending:
    """What `ctx` waits for (the rules in the module docstring)."""
    info = ctx.info
    tool, call_id = ((segment_of(ctx.address, "tool") or ()) + (None, None))[:2]
    node = (segment_of(ctx.address, "node") or (None,))[0]
    kind = getattr(type(info), "pending_kind", None)
    if not isinstance(kind, str):
        kind = "pause" if segment_of(ctx.address, "pause") is not None else "interrupt"
    return Pending(id=ctx.id, address=ctx.address, kind=kind, info=info,
                   tool=_text(info, "tool_name") or tool or None, call_id=call_id or None,
                   arguments=_text(info, "arguments_json"), digest=_text(info, "digest"),
                   deadline=ctx.deadline, node=node)


def _text(info: Any, name: str) -> str | None:
    value = getattr(info, name, None)
    return value if isinstance(value, str) else None
