"""`POST /runs/{id}/cancel`: a person's cancel, recorded in the store for whichever process executes the run
(engine/keep/cancel.py) — this service, another one, or a worker."""

from __future__ import annotations

from typing import Any

from waypoint.engine import CheckpointNotFound, NotRunning, WaypointError
from waypoint.engine.keep import cancel_point

from ._refusals import conflict, missing
from ._responses import SafeJSONResponse, invalid
from ._resume import served_run
from ._schemas import CancelRun
from ._state import ServiceState

__all__ = ["cancel_run", "API_BY"]

API_BY = "the service's API"
"""Who asked, when the request does not say."""

async def cancel_run(state: ServiceState, checkpoint_id: str, body: CancelRun) -> Any:
    """The recorded request (202), or the answer refusing it (404, 409, 422)."""
    served = await served_run(state, checkpoint_id)
    if isinstance(served, SafeJSONResponse):
        return served
    head, target = served
    by = body.by if body.by is not None else API_BY
    try:
        when = cancel_point(checkpoint_id, body.when, target.app.structure, agent=target.kind == "agent")
        request = await target.app.cancel(checkpoint_id, when=when, by=by)
    except CheckpointNotFound:
        return missing(checkpoint_id)
    except NotRunning as err:
        fresh = await state.store.history(checkpoint_id, limit=1)
        return await conflict(state, fresh[0] if fresh else head, str(err))
    except (WaypointError, ValueError) as err:  # a point the run's graph does not have, or malformed text
        return invalid(["body", "when" if "when" in str(err) else "by"], str(err))
    return SafeJSONResponse({"checkpoint_id": request.checkpoint_id, "version": request.version, "when": request.when,
                             "by": request.by, "requested_at": request.requested_at}, status_code=202)
