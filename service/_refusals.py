"""The answers for a start or resume that was refused — by the service's own look at the run, or by the
engine before it wrote anything — in the words of an HTTP client: which endpoint to call, which field to
send, never a Python call. A conflict (409) also says where the run is now (`current_version`, `status`)
and which interrupts it waits on (`pending`: the same IDs its `detail` names).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from waypoint.engine import (
    CheckpointConflict,
    CheckpointError,
    CheckpointExists,
    CheckpointMeta,
    CheckpointNotFound,
    GraphMismatch,
    UnknownInterrupt,
    WaypointError,
)
from waypoint.engine.keep.owners import OwnerState, describe_owner, owner_state
from waypoint.engine.keep.store import store_clock

from ._queued import WorkQueued
from ._responses import SafeJSONResponse, invalid, problem
from ._state import ServiceState
from ._views import lease_alive

__all__ = ["Attempt", "refused", "conflict", "lease_conflict", "moved_on", "completed", "not_pending", "missing"]


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """A start or resume as the service sent it to the engine."""

    checkpoint_id: str
    how: str
    """"start" or "resume"."""
    seen: int | None = None
    """The newest version when the service looked (None: no run)."""
    takeover: bool = False


def missing(checkpoint_id: str, version: int | None = None) -> SafeJSONResponse:
    what = f"no run '{checkpoint_id}'" if version is None else f"no version {version} of run '{checkpoint_id}'"
    return problem(404, what)


async def conflict(state: ServiceState, head: CheckpointMeta | None, detail: str, *,
                   pending: list[str] | None = None) -> SafeJSONResponse:
    """409 with where the run is now."""
    extra: dict[str, Any] = {"current_version": head.version if head else None, "status": head.status if head else None}
    if pending is not None:
        extra["pending"] = pending
    return problem(409, detail, **extra)


async def _waiting(state: ServiceState, head: CheckpointMeta) -> list[str]:
    try:
        return await state.answerable(head)
    except WaypointError:  # unreadable: it waits on nothing this service can name
        return []


def _clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


async def lease_conflict(state: ServiceState, head: CheckpointMeta, *, takeover: bool) -> SafeJSONResponse:
    """The run is running under a live lease (here or in another process)."""
    cid = head.checkpoint_id
    follow = f"wait for it to pause or finish (GET /runs/{cid}/events follows it)"
    if state.dispatcher is not None:  # the workers execute runs: a takeover is theirs (at the lease's expiry)
        known = describe_owner(head.lease_owner)
        who = f"its lease is held by {head.lease_owner} until {_clock(head.lease_expires)}" + (f"; {known}" if known else "")
        refused = "takeover is not done from here: " if takeover else ""
        return await conflict(state, head, f"run '{cid}' is running ({who}): {refused}{follow}; if its process died, "
                              "the workers continue a run they were given once its lease expires, and POST "
                              f"/runs/{cid}/resume (no answers) hands them any other then")
    if cid in state.executor.running:
        who = f"this service is executing it right now; its lease runs until {_clock(head.lease_expires)}"
        alive = True
    else:
        known = describe_owner(head.lease_owner)
        who = f"its lease is held by {head.lease_owner} until {_clock(head.lease_expires)}" + (f"; {known}" if known else "")
        alive = owner_state(head.lease_owner) in (OwnerState.ALIVE, OwnerState.EXECUTING_HERE)
    if alive and takeover:
        what = f"takeover is refused while its owner is alive; {follow}"
    elif alive:
        what = follow
    else:
        what = f"{follow}, or, if its process is dead, resume it with takeover: true"
    return await conflict(state, head, f"run '{cid}' is running ({who}): {what}")


async def moved_on(state: ServiceState, head: CheckpointMeta, expected: int) -> SafeJSONResponse:
    cid = head.checkpoint_id
    return await conflict(state, head, f"run '{cid}' moved on: it is at version {head.version} ({head.status}), and "
                          f"this answer was made for version {expected}; read it again (GET /runs/{cid}) and decide "
                          "on what it shows now")


async def completed(state: ServiceState, head: CheckpointMeta) -> SafeJSONResponse:
    cid = head.checkpoint_id
    return await conflict(state, head, f"run '{cid}' has completed (version {head.version}): there is nothing to "
                          f"resume; POST /runs with checkpoint_id '{cid}' starts a new run on this ID", pending=[])


async def not_pending(state: ServiceState, head: CheckpointMeta, unknown: list[str]) -> SafeJSONResponse:
    waiting = await _waiting(state, head)
    return await conflict(state, head, f"run '{head.checkpoint_id}' has no pending interrupt {', '.join(unknown)} "
                          f"(answered already, or never shown here); it waits on: {', '.join(waiting) or 'nothing'}",
                          pending=waiting)


async def _exists(state: ServiceState, head: CheckpointMeta) -> SafeJSONResponse:
    cid, waiting = head.checkpoint_id, await _waiting(state, head)
    where = f"run '{cid}' is {head.status} at version {head.version}"
    if waiting:
        how = f" and waits on {', '.join(waiting)}: answer with POST /runs/{cid}/resume"
    else:
        how = f": continue it with POST /runs/{cid}/resume (no answers needed)"
    return await conflict(state, head, f"{where}{how}, or send force_new_run: true to start over on this ID",
                          pending=waiting)


async def refused(state: ServiceState, attempt: Attempt, err: BaseException | None) -> SafeJSONResponse:
    """The answer for a start or resume the engine refused before it wrote anything."""
    cid = attempt.checkpoint_id
    if isinstance(err, asyncio.CancelledError):
        return problem(503, f"the service is shutting down; run '{cid}' was not {attempt.how}ed: try again")
    if isinstance(err, WorkQueued):
        found = await state.store.history(cid, limit=1)
        return await conflict(state, found[0] if found else None, f"run '{cid}' already has work in the queue (a "
                              f"worker executes it, or it waits for one); wait for it to pause or finish (GET "
                              f"/runs/{cid}/events follows it), then answer what it holds", pending=[])
    if isinstance(err, (TypeError, ValueError)):
        return invalid(["body", "input" if attempt.how == "start" else "answers"], f"{type(err).__name__}: {err}")
    found = await state.store.history(cid, limit=1)
    head = found[0] if found else None
    if isinstance(err, CheckpointNotFound) or (head is None and isinstance(err, CheckpointError)):
        return missing(cid)
    if head is None or not isinstance(err, WaypointError):
        what = f"{type(err).__name__}: {err}" if err is not None else "the run ended without writing anything"
        return problem(500, f"run '{cid}' was not {attempt.how}ed: {what}")
    if isinstance(err, CheckpointExists):
        return await _exists(state, head)
    if isinstance(err, GraphMismatch):
        return await conflict(state, head, f"run '{cid}' was written by another version of its graph than this "
                              "service runs; it cannot be resumed here")
    if isinstance(err, UnknownInterrupt):
        waiting = await _waiting(state, head)
        return await conflict(state, head, f"run '{cid}' waits on {', '.join(waiting) or 'nothing'}: answer those "
                              "(the answers named an interrupt that is not pending)", pending=waiting)
    if attempt.seen is not None and head.version != attempt.seen:
        return await conflict(state, head, f"run '{cid}' moved past version {attempt.seen} while this request was "
                              f"claiming it (it is at version {head.version} now, {head.status}): another request got "
                              f"there first; read it again (GET /runs/{cid})")
    if head.status == "running" and lease_alive(head, await store_clock(state.store)):
        return await lease_conflict(state, head, takeover=attempt.takeover)
    if head.status == "completed":
        return await completed(state, head)
    if isinstance(err, CheckpointConflict):
        return await conflict(state, head, f"run '{cid}' moved on while this request was claiming it; read it "
                              f"again (GET /runs/{cid})")
    return await conflict(state, head, f"run '{cid}' cannot be {attempt.how}ed: {err}")
