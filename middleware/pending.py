"""`classify_interrupt(ctx)`: what a stored interrupt waits for, for anything that shows or answers it
(`waypoint runs`, the HTTP service): an approval (`ApprovalMiddleware`), a static pause
(`interrupt_before` / `interrupt_after`), or a node's or tool's own interrupt.

It is the engine's `pending_of` (engine/run/pending.py), which reads an approval's tool, arguments and digest from
`ApprovalInfo`'s own fields: `Runner.pending(id)` and `AgentAction.pending` give the same `Pending`s.
"""

from __future__ import annotations

from waypoint.engine import InterruptCtx, Pending
from waypoint.engine.run.pending import pending_of

__all__ = ["Pending", "classify_interrupt"]


def classify_interrupt(ctx: InterruptCtx) -> Pending:
    """What kind of pause `ctx` is, with the tool call it belongs to (`pending_of`)."""
    return pending_of(ctx)
