"""`sleep_until(when)`: a node waits until a time — minutes or weeks — without holding a process.

The wait is a pause with a deadline (`Interrupt(deadline=...)`): the run is stored paused, its process may
exit, and whoever recovers runs (`waypoint serve`, `waypoint worker`, `recover(...)`) resumes it once the time
has come on the store's clock. The node then runs again from its start, and `sleep_until` returns. A resume
that answers the pause before then wakes it early: `sleep_until` returns that answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from .interrupts import Expired, Interrupt
from .resume import get_interrupt_state, get_resume_context

__all__ = ["sleep_until", "Sleeping"]


@dataclass(frozen=True)
class Sleeping:
    """What a sleeping node's pause says (`Pending.kind` "sleep"; its `deadline` is when it wakes)."""

    pending_kind: ClassVar[str] = "sleep"
    note: str | None = None


def sleep_until(when: datetime | timedelta | float, *, note: str | None = None) -> Any:
    """Inside a node: pause the run until `when` (a timezone-aware `datetime`, or a `timedelta` or seconds from
    when the pause is stored, on the store's clock). Returns None once the time has come, or the data of a resume
    that woke it early. The node runs again from its start after the wait: call it first, or in a node of its
    own, so what comes before it is not done twice. One sleep per node: a second call in the node, after the
    first woke, returns at once (the node's pause is answered); sleep again in the next node."""
    was, _, _ = get_interrupt_state()
    if was:
        is_target, has_data, data = get_resume_context()
        if is_target:
            return None if not has_data or isinstance(data, Expired) else data
    raise Interrupt(Sleeping(note), deadline=when)
