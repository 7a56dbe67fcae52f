"""Keeping a running run's lease, from a thread a blocked event loop cannot stop.

While a run executes, its newest version names this process as the lease owner until an expiry time;
another process may take the run over once that time has passed. Every version the run writes sets a
fresh expiry. Between writes, one daemon thread per process (its own event loop) renews the lease of
every run this process executes, every `lease_seconds / 3` — a sync node that blocks the run's event
loop for minutes does not let it lapse.

A process that lost its lease stops before its next step (`LeaseKeeper.check`, called by the run loop):

- renewal was refused (another process took the run over with `takeover=True`, or the run was
  deleted): noticed by the next renewal, within `lease_seconds / 3`;
- renewals failed (the database was unreachable) until the lease may have expired: another process
  may now take the run over, so this one runs no further step.

In `durability="step"` a lost run is also caught by the compare-and-set of its next write.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import CheckpointConflict

__all__ = ["LeaseKeeper"]


class LeaseKeeper:
    """The lease of one run executing in this process."""

    def __init__(self, store: Any, checkpoint_id: str, owner: str, lease_seconds: float,
                 version: Callable[[], int | None]) -> None:
        self.store = store
        self.checkpoint_id = checkpoint_id
        self.owner = owner
        self.lease_seconds = lease_seconds
        self._version = version
        self.held_until = time.time() + lease_seconds
        self.lost: str | None = None
        self._task: Any = None

    def wrote(self, expires: float | None) -> None:
        """A version was written with lease expiry `expires` (None once the run stopped running)."""
        if expires is not None:
            self.held_until = expires

    def check(self) -> None:
        """Raise `CheckpointConflict` if this process may no longer hold the run's lease."""
        if self.lost is not None:
            raise CheckpointConflict(self.lost)
        if time.time() > self.held_until:
            raise CheckpointConflict(
                f"run '{self.checkpoint_id}': this process could not renew its lease before it expired at "
                f"{_clock(self.held_until)} (is the store reachable?); another process may take the run over, "
                "so this one stops before its next step. Resume it with ainvoke(None, checkpoint_id=...)"
            )

    def start(self) -> None:
        self._task = _renewer().submit(self._renew())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()  # a concurrent future: cancelling it cancels the renewal task (thread-safe)
            self._task = None

    async def _renew(self) -> None:
        interval = max(self.lease_seconds / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            version = self._version()
            if version is None:
                continue
            now = time.time()
            try:
                ok = await self.store.renew_lease(self.checkpoint_id, version, self.owner, now + self.lease_seconds)
            except Exception:  # noqa: BLE001 - transient; check() stops the run once the lease may be gone
                continue
            if ok:
                self.held_until = max(self.held_until, now + self.lease_seconds)
            elif self._version() == version:  # not just overtaken by this run's own newer write
                self.lost = (
                    f"run '{self.checkpoint_id}': this process lost its lease at version {version} (another "
                    "process took the run over, or the run was deleted); it stops before its next step"
                )
                return


class _Renewer:
    """One daemon thread with its own event loop that runs every lease keeper of this process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        threading.Thread(target=main, name="waypoint-lease", daemon=True).start()
        ready.wait()

    def submit(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


_RENEWER: _Renewer | None = None
_LOCK = threading.Lock()


def _renewer() -> _Renewer:
    global _RENEWER
    with _LOCK:
        if _RENEWER is None or _RENEWER.pid != os.getpid():  # a forked child has no such thread
            _RENEWER = _Renewer()
        return _RENEWER


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
