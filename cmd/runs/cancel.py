"""`waypoint runs cancel ID [--when W] [--by WHO] [--wait S]`: ask whichever process executes a run to stop it
(engine/keep/cancel.py) — a chapter, `waypoint serve`, a worker, on this machine or another one on the database."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from waypoint.engine.keep import cancel_point, request_cancel
from waypoint.engine.keep.store import store_clock

from ..console import Console
from .read import RunsError, opened_store, read_run

__all__ = ["cancel_command"]

WAIT_LOOK = 0.1
"""Seconds between two looks at the run while `--wait` waits for it to stop."""


async def cancel_command(args: Any, console: Console, hint: str) -> int:
    async with opened_store(args.db) as store:
        run = await read_run(store, args.id, hint=hint)
        when = cancel_point(args.id, args.when, run.structure, agent=run.is_agent)
        request = await request_cancel(store, args.id, when=when, by=args.by)
        stopped = await _stopped(store, args.id, request.version, args.wait) if args.wait else None
    if args.json:
        console.line(json.dumps({"checkpoint_id": args.id, "version": request.version, "when": request.when,
                                 "by": request.by, "requested_at": request.requested_at,
                                 "stopped": None if stopped is None else {"version": stopped.version,
                                                                          "status": stopped.status,
                                                                          "error": stopped.error}}))
    else:
        console.line(f"asked run {args.id} to stop ({_said(request.when)}), as {request.by}")
        if stopped is not None:
            how = "cancelled" if stopped.cancelled else stopped.status
            console.line(f"it stopped at version {stopped.version}: {how}; `{hint} resume {args.id}` continues it"
                         if stopped.cancelled else f"it ended at version {stopped.version} before the point: {how}")
    if args.wait and stopped is None:
        raise RunsError(f"run {args.id!r} was asked to stop but still runs after {args.wait:g} s; the process executing "
                        f"it stops it when it reaches {_said(request.when)} (`{hint} show {args.id}`)")
    return 0


async def _stopped(store: Any, checkpoint_id: str, asked_at: int, wait: float) -> Any:
    """The run's newest version once it is no longer running after `asked_at` (None if it still runs after `wait` s,
    on the store's clock)."""
    until = await store_clock(store) + wait
    while True:
        found = await store.history(checkpoint_id, limit=1)
        if not found:
            raise RunsError(f"run {checkpoint_id!r} was deleted while it was asked to stop")
        head = found[0]
        if head.version > asked_at and head.status != "running":
            return head
        if await store_clock(store) >= until:
            return None
        await asyncio.sleep(WAIT_LOOK)


def _said(when: str) -> str:
    return {"now": "now", "after_step": "after its step", "after:tools": "after its tool calls",
            "after:model": "after its model call"}.get(when, f"after node {when[len('after:'):]!r}")
