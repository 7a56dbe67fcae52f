"""Starting and resuming a run the way every endpoint does it: in this process (`Executor`) or through the run
queue (`Dispatcher`), and waiting for the claim. `POST /runs`, `POST /runs/{id}/resume` and the AG-UI endpoint
(service/_agui.py) all go through here, so a start or a resume is the same thing whichever protocol asked."""

from __future__ import annotations

import asyncio
from typing import Any

from ._cancel import API_BY
from ._execution import Execution, Outcome
from ._queued import Submission
from ._refusals import Attempt, refused
from ._responses import SafeJSONResponse
from ._resume import Prepared
from ._state import ServiceState
from ._targets import Target

__all__ = ["launch_start", "launch_resume", "claim_of"]


async def launch_start(state: ServiceState, target: Target, checkpoint_id: str, data: Any, *,
                       force_new_run: bool, on_busy: str = "reject",
                       by: str | None = None) -> tuple[Execution | Submission, Attempt]:
    """Begin a start of `target` on `checkpoint_id` with input `data` (here, or handed to a worker); an agent's
    chat whose turn executes takes it by `on_busy` (`Runner.run`), queued as from `by`."""
    head = await state.store.history(checkpoint_id, limit=1)
    attempt = Attempt(checkpoint_id=checkpoint_id, how="start", seen=head[0].version if head else None)
    state.watcher.ensure()
    if state.dispatcher is not None:
        ex: Execution | Submission = await state.dispatcher.start(target, checkpoint_id, data,
                                                                  force_new_run=force_new_run,
                                                                  head=head[0] if head else None,
                                                                  on_busy=on_busy, by=API_BY if by is None else by)
    else:
        ex = state.executor.launch(target, checkpoint_id, "start", input=data, force_new_run=force_new_run,
                                   on_busy=on_busy, by=API_BY if by is None else by)
    return ex, attempt


async def launch_resume(state: ServiceState, checkpoint_id: str, prepared: Prepared, *,
                        takeover: bool = False) -> tuple[Execution | Submission, Attempt]:
    """Begin a resume checked by `prepare_resume`: claimed by compare-and-set on `prepared.seen`."""
    attempt = Attempt(checkpoint_id=checkpoint_id, how="resume", seen=prepared.seen.version, takeover=takeover)
    state.watcher.ensure()
    if state.dispatcher is not None:
        answers = prepared.resume
        if answers is None and prepared.target.kind == "agent" and await state.pending(prepared.seen):
            answers = True  # as the agent's Runner resumes: every pending pause, with no data
        ex: Execution | Submission = await state.dispatcher.resume(prepared.target, checkpoint_id, answers,
                                                                   seen=prepared.seen)
    else:
        ex = state.executor.launch(prepared.target, checkpoint_id, "resume", resume=prepared.resume,
                                   takeover=takeover, expected_version=prepared.seen.version,
                                   created_at=prepared.seen.created_at)
    return ex, attempt


async def claim_of(state: ServiceState, ex: Execution | Submission, attempt: Attempt) -> Outcome | SafeJSONResponse:
    """The claim `ex` wrote (or "queued"), or the answer refusing it (404, 409, 422, 503) when the engine stopped
    it before it wrote anything."""
    # shielded: a request given up (client gone, server stopping) must not cancel the futures the
    # execution resolves and announces its start and end by
    outcome = await asyncio.shield(ex.claimed)
    if outcome.error is not None or (outcome.version is None and outcome.status != "queued"):
        return await refused(state, attempt, outcome.error)
    return outcome
