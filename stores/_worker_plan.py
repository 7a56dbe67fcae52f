"""What a worker does with work another attempt already touched (a worker died, drained or handed it back after
writing): plan it again from where the run is now (stores/worker.py, `Worker._do`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from waypoint.engine.errors import CheckpointNotFound

__all__ = ["plan_retry", "NOTHING"]

NOTHING = object()
"""The plan when the run already came to rest after this work: nothing to run, only an outcome to record."""


def plan_retry(item: Any, value: Any, snap: Any) -> Any:
    """(input, resume) for `ainvoke`, or NOTHING when the run already came to rest after this work."""
    newest = snap.meta.version if snap is not None else None
    if newest == item.base_version:  # nothing written since the work was queued: do what was asked
        if item.kind != "resume":
            return value, None
        if snap is None:
            raise CheckpointNotFound(f"run '{item.checkpoint_id}' was deleted after its resume was queued")
        return None, value
    if snap is None:
        raise CheckpointNotFound(f"run '{item.checkpoint_id}' was deleted while its work was running")
    status, error = snap.meta.status, snap.meta.error
    if status == "running" or (status == "interrupted" and error == "cancelled" and snap.cancelled_by is None):
        # crashed or drained (a person's cancel, which says who asked, is where the work came to rest)
        pending = [c.id for c in snap.interrupts.contexts]
        answers = value if item.kind == "resume" else None
        return None, _still_pending(answers, pending)
    return NOTHING


def _still_pending(answers: Any, pending: list[str]) -> Any:
    """The part of a resume's answers whose interrupts are still pending (None: continue plainly)."""
    if not pending or answers is None:
        return None
    if answers is True:
        return True
    if isinstance(answers, Mapping):
        kept = {k: v for k, v in answers.items() if k in pending}
    else:
        kept = [k for k in answers if k in pending]
    return kept or None
