"""Stopping a process's runs because the process stops — a deploy, SIGTERM — which is no decision about them.

A person's cancel (closing a run's stream, cancelling its task) is stored: the run is `interrupted` with
`error="cancelled"`, and recovery leaves it alone. A process that shuts down is not a person: its runs must
go on in the next process at once. So a host — `waypoint serve`, `waypoint worker`, an embedding app — runs
them inside a `Shutdown` (`with shutdown.scope(): ...`, or `asyncio.create_task(..., context=shutdown.context())`)
and, when it stops:

1. `shutdown.request()`: every run of the scope stops at its next safe point — before its next step, and in a
   nested run before the nested run's next step — with what it finished written, raising `ProcessStopping`;
2. waits as long as it can (its drain bound) for the runs to stop, pause or end;
3. `shutdown.cancel(tasks)`: the runs still inside a step are cancelled; their step is not written.

Either way the run is left as it was last saved, `running`, and its lease is ended at once (as after a
`StoreUnavailable`): the next process that recovers runs — or a worker the queue hands it to — continues it
without waiting for the lease to run out. A call cut by step 3 runs again there, flagged `rerun`, with the
same idempotency key.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterable, Iterator

from ..errors import ProcessStopping

__all__ = ["Shutdown", "current_shutdown"]

_CURRENT: contextvars.ContextVar[Shutdown | None] = contextvars.ContextVar("waypoint_shutdown", default=None)


class Shutdown:
    """The shutdown of the runs started inside `scope()` (or in a task created with `context()`)."""

    def __init__(self) -> None:
        self.requested = False
        """Runs stop at their next safe point (`request()`)."""
        self.cancelling = False
        """Runs cancelled now are stopped for the shutdown, not by a person (`cancel()`)."""

    @contextlib.contextmanager
    def scope(self) -> Iterator[Shutdown]:
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def context(self) -> contextvars.Context:
        """A copy of the current context in which runs belong to this shutdown (for `create_task(context=)`)."""
        ctx = contextvars.copy_context()
        ctx.run(_CURRENT.set, self)
        return ctx

    def request(self) -> None:
        """Ask every run of this shutdown to stop at its next safe point."""
        self.requested = True

    def cancel(self, tasks: Iterable[asyncio.Task]) -> None:
        """Cancel `tasks` (runs still inside a step) for the shutdown: not stored as cancelled."""
        self.requested = self.cancelling = True
        for task in tasks:
            task.cancel()

    def check(self, checkpoint_id: str | None) -> None:
        """Between steps: raise `ProcessStopping` once a stop was requested."""
        if self.requested:
            raise ProcessStopping(
                f"run '{checkpoint_id}' stopped at a step boundary because its process is shutting down; it is "
                "left as it was last saved, its lease ended, and the next process that recovers runs (or a "
                "worker) continues it", checkpoint_id=checkpoint_id)


def current_shutdown() -> Shutdown | None:
    """The shutdown the calling code's runs belong to, if any."""
    return _CURRENT.get()
