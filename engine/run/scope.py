"""The task the calling code runs in (a context variable set by the run loop around each task)."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

__all__ = ["TaskScope", "current_task"]


@dataclass(frozen=True, slots=True)
class TaskScope:
    """What code running inside a task can ask about itself (interrupts, resume context, tools).

    `resume` and `resumed` are set only for a paused task that runs again: the caller's resume
    request and what paused under this task last time (address -> record). A later pass through
    the same node in the same call gets neither: one answer approves one pass. `consumed` (shared by
    every deeper address of the task) records the answers this pass has taken (address -> record
    with its answer): a pause below one of them carries them, so the next pass is not asked again.
    """

    run: Any
    """The `Run` executing the task (engine/run/loop.py, which sits above this module)."""
    node: str
    path: tuple[str, ...]
    address: str
    resume: Any = None
    resumed: Mapping[str, Any] | None = None
    consumed: dict[str, Any] | None = None
    place: str = ""
    """The address plus the pass of every subgraph run above: what keys the task ledger and idempotency
    keys, so that two passes of a node inside one step of its parent never share them."""


_TASK: ContextVar[TaskScope | None] = ContextVar("waypoint_task", default=None)


def current_task() -> TaskScope | None:
    """The task the calling code runs in, or None outside a run."""
    return _TASK.get()
