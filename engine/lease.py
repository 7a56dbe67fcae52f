"""Keeping a running run's lease, from a thread a blocked event loop cannot stop.

While a run executes, its newest version names this process as the lease owner until an expiry time;
another process may take the run over once that time has passed. Every version the run writes sets a
fresh expiry. Between writes, one daemon thread per process (with its own event loop) renews the lease
of every run this process executes, `lease_seconds / 3` after the last write or renewal — a sync node
that blocks the run's event loop for minutes does not let it lapse. Starting and stopping a keeper only
touches a locked set: a run does not wake the thread (measured: a wake-up per run halved B5).

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
        self.interval = max(lease_seconds / 3, 0.05)
        self._version = version
        self.held_until = time.time() + lease_seconds
        self.due = time.monotonic() + self.interval
        self.lost: str | None = None

    def wrote(self, expires: float | None) -> None:
        """A version was written with lease expiry `expires` (None once the run stopped running)."""
        if expires is not None:
            self.held_until = expires
            self.due = time.monotonic() + self.interval

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
        _renewer().add(self)

    def stop(self) -> None:
        _renewer().remove(self)

    async def renew(self) -> None:
        """One renewal (on the lease thread's loop)."""
        self.due = time.monotonic() + self.interval
        version = self._version()
        if version is None or self.lost is not None:
            return
        now = time.time()
        try:
            ok = await self.store.renew_lease(self.checkpoint_id, version, self.owner, now + self.lease_seconds)
        except Exception:  # noqa: BLE001 - transient; check() stops the run once the lease may be gone
            return
        if ok:
            self.held_until = max(self.held_until, now + self.lease_seconds)
        elif self._version() == version:  # not just overtaken by this run's own newer write
            self.lost = (
                f"run '{self.checkpoint_id}': this process lost its lease at version {version} (another "
                "process took the run over, or the run was deleted); it stops before its next step"
            )


class _Renewer:
    """One daemon thread with its own event loop that renews every due lease of this process."""

    IDLE = 1.0  # seconds between looks when nothing is due sooner

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.keepers: set[LeaseKeeper] = set()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.next_look = time.monotonic() + self.IDLE
        threading.Thread(target=self._main, name="waypoint-lease", daemon=True).start()

    def add(self, keeper: LeaseKeeper) -> None:
        with self.lock:
            self.keepers.add(keeper)
        if keeper.due < self.next_look:  # only a short lease needs the thread awake sooner
            self.wake.set()

    def remove(self, keeper: LeaseKeeper) -> None:
        with self.lock:
            self.keepers.discard(keeper)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        while True:
            now = time.monotonic()
            with self.lock:
                keepers = list(self.keepers)
            due = [k for k in keepers if k.due <= now]
            if due:
                loop.run_until_complete(_renew_all(due))
            self.next_look = min([k.due for k in keepers] + [time.monotonic() + self.IDLE])
            self.wake.wait(max(0.005, self.next_look - time.monotonic()))
            self.wake.clear()


async def _renew_all(keepers: list[LeaseKeeper]) -> None:
    await asyncio.gather(*(k.renew() for k in keepers), return_exceptions=True)


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
