"""`POST /runs/{id}/resume` before anything is claimed: the answers checked against the run as it is now,
and turned into what the engine takes.

An answer that runs a tool (`approve`, `restart`) must say what it was made for — the approval's
`digest`, or the run's `expected_version` — or it is refused (422): an answer made for one pause must
never approve another. A digest is compared with the pending approval's before the claim: a stale or
wrong one is a 409, nothing runs and the run stays paused (and listed). Whatever the service looked at,
the claim is then made by compare-and-set on that very version (`expected_version` passed to the engine),
so a run that moves on between the look and the claim is refused by the engine, not resumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from waypoint.engine import CheckpointMeta, Respond, Restart
from waypoint.engine.keep.store import store_clock
from waypoint.middleware import ApprovalResult

from ._refusals import completed, lease_conflict, missing, moved_on, not_pending
from ._responses import SafeJSONResponse, invalid, problem
from ._schemas import ResumeRun
from ._state import ServiceState
from ._targets import Target
from ._views import lease_alive

__all__ = ["Prepared", "prepare_resume"]


@dataclass(frozen=True, kw_only=True)
class Prepared:
    target: Target
    resume: Any
    """What the engine takes as `resume=`: `{interrupt_id: data}`, or None (no answers)."""
    seen: CheckpointMeta
    """The version the answers were checked against: the claim compare-and-sets on it."""


async def served_run(state: ServiceState, checkpoint_id: str) -> tuple[CheckpointMeta, Any] | SafeJSONResponse:
    """The run's newest version and the served graph that continues it, or the answer refusing (404, 409)."""
    found = await state.store.history(checkpoint_id, limit=1)
    if not found:
        return missing(checkpoint_id)
    head = found[0]
    target = await state.resolve(head)
    if target is None:
        return problem(409, f"run '{checkpoint_id}' was written by a graph this service does not run (it runs "
                       f"{', '.join(sorted(state.targets))})", current_version=head.version, status=head.status)
    return head, target


async def prepare_resume(state: ServiceState, checkpoint_id: str, body: ResumeRun) -> Prepared | SafeJSONResponse:
    """The checked resume, or the answer refusing it (404, 409, 422, 500)."""
    served = await served_run(state, checkpoint_id)
    if isinstance(served, SafeJSONResponse):
        return served
    head, target = served
    shape = _shape_problem(body, target.kind)
    if shape is not None:
        return shape
    stale = await _stale(state, head, body)
    if stale is not None:
        return stale
    try:
        pending = {p["id"]: p for p in await state.pending(head)}
    except Exception as err:  # noqa: BLE001 - a run that does not decode is not resumed from here
        return problem(500, f"run '{checkpoint_id}' cannot be read: {type(err).__name__}: {err}")
    answered = await _answered(state, head, body, pending)
    if answered is not None:
        return answered
    resume = {a.interrupt_id: (_agent_answer(a) if target.kind == "agent" else _graph_answer(a))
              for a in body.answers}
    return Prepared(target=target, resume=resume or None, seen=head)


def _shape_problem(body: ResumeRun, kind: str) -> SafeJSONResponse | None:
    """422 for answers that cannot be sent as they are, whatever the run holds."""
    seen: set[str] = set()
    for i, a in enumerate(body.answers):
        if a.interrupt_id in seen:
            return invalid(["body", "answers", i, "interrupt_id"],
                           f"interrupt {a.interrupt_id} is answered twice; give one answer per interrupt")
        seen.add(a.interrupt_id)
        if a.action == "restart" and kind != "agent":
            return invalid(["body", "answers", i, "action"], "restart is for an agent's paused tool calls")
        if a.action == "approve" and a.digest is None and body.expected_version is None:
            return invalid(["body", "answers", i, "digest"], "an approve runs the tool: say what it was made for — "
                           "send the approval's digest (as GET /runs/{id} or GET /approvals shows it) or the run's "
                           "expected_version", "missing")
        if a.action == "restart" and body.expected_version is None:
            return invalid(["body", "expected_version"], "a restart runs the tool: say what it was made for — send "
                           "the run's expected_version (as GET /runs/{id} shows it)", "missing")
    return None


async def _stale(state: ServiceState, head: CheckpointMeta, body: ResumeRun) -> SafeJSONResponse | None:
    """409 when the run is not where the answers can go: completed, executing, moved on."""
    if head.status == "completed":
        return await completed(state, head)
    live = head.status == "running" and lease_alive(head, await store_clock(state.store))
    executors = head.checkpoint_id in state.executor.running or state.dispatcher is not None  # (workers: theirs)
    if live and (executors or not body.takeover):
        return await lease_conflict(state, head, takeover=body.takeover)
    if body.expected_version is not None and body.expected_version != head.version:
        return await moved_on(state, head, body.expected_version)
    return None


async def _answered(state: ServiceState, head: CheckpointMeta, body: ResumeRun,
                    pending: dict[str, dict[str, Any]]) -> SafeJSONResponse | None:
    """409/422 when the answers do not fit what the run waits on now, else None."""
    waiting = [i for i, p in pending.items() if p["kind"] != "pause"]
    unknown = [a.interrupt_id for a in body.answers if a.interrupt_id not in pending]
    if unknown:
        return await not_pending(state, head, unknown)
    for i, a in enumerate(body.answers):
        digest = getattr(a, "digest", None)
        if digest is None:
            continue
        shown = pending[a.interrupt_id].get("digest")
        if shown is None:
            return invalid(["body", "answers", i, "digest"], f"interrupt {a.interrupt_id} shows no digest (it is "
                           "not a tool-call approval): send expected_version instead")
        if digest != shown:
            return problem(409, f"the approval {a.interrupt_id} of run '{head.checkpoint_id}' no longer shows what "
                                f"this answer was made for (the call it shows has digest {shown[:16]}…, the answer "
                                f"{digest[:16]}…): nothing ran and the run still waits; read it again (GET "
                                f"/runs/{head.checkpoint_id}) and decide on what it shows",
                           current_version=head.version, status=head.status, pending=waiting)
    if not body.answers and waiting and head.status == "interrupted" and head.error != "cancelled":
        return invalid(["body", "answers"], f"run '{head.checkpoint_id}' waits on {', '.join(waiting)}: answer "
                       "them (approve, reject, respond or restart)", "missing")
    return None


def _agent_answer(a: Any) -> Any:
    """What an agent's paused tool call receives (docs/middleware.md)."""
    if a.action == "approve":
        return ApprovalResult(approved=True, digest=a.digest)
    if a.action == "reject":
        return ApprovalResult(approved=False, reason=a.reason)
    if a.action == "respond":
        return Respond(a.output)
    return Restart(metadata=a.metadata, replace_input=a.replace_input)


def _graph_answer(a: Any) -> Any:
    """What a plain graph's paused node receives from `get_resume_context()`."""
    if a.action == "respond":
        return a.output
    if a.action == "approve":
        return {"approved": True}
    return {"approved": False, "reason": a.reason} if a.reason else {"approved": False}
