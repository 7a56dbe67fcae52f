"""Keeping a running run's lease, from a thread a blocked event loop cannot stop.

While a run executes, its newest version names this process as the lease owner until an expiry time;
another process may take the run over once that time has passed. **Leases are judged on one clock, the
store's** (`CheckPointStore.clock()`: the database server's on Postgres, the host's for SQLite and
memory): the store stamps every expiry it writes from its own clock (`put`, `renew_lease`), and a
process deciding whether a lease is live asks the store's clock, never its own wall clock. Every version
the run writes sets a fresh expiry. Between writes, one daemon thread per process (with its own event
loop) renews the lease of every run this process executes, `lease_seconds / 3` after the last write or
renewal — a sync node that blocks the run's event loop for minutes does not let it lapse. Starting and
stopping a keeper only touches a locked set: a run does not wake the thread (measured: a wake-up per run
halved B5). A store refuses to renew a lease that has already expired.

The owning process keeps its own, conservative deadline on a local clock that only moves forward and
keeps counting while the process is stopped (`lease_clock`): the moment each write or renewal was *sent*
plus `lease_seconds`. The store stamped that lease no earlier, so this process gives the run up no later
than any other process may take it — whatever the offset between the machines' wall clocks.

A process that lost its lease starts nothing more (`LeaseKeeper.check`, called by the run loop before
every step and by `check_lease()` inside a task, before every tool call), raising `LeaseLost`:

- its deadline passed without a renewal (the process was stopped — SIGSTOP, a GC pause, a frozen VM —
  or starved, or the store was unreachable): noticed at once, by the clock, even when the renewal thread
  has not run since the process woke up;
- renewal was refused (another process took the run over, the run was deleted, or the lease had already
  expired on the store's clock): noticed by the next renewal, within `lease_seconds / 3`.

In `durability="step"` a lost run is also caught by the compare-and-set of its next write.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import LeaseLost

__all__ = ["LeaseKeeper", "lease_clock"]

_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)


def lease_clock() -> float:
    """Seconds on this machine's clock that never goes back and keeps counting while the process is
    stopped or the machine sleeps (Linux `CLOCK_BOOTTIME`; elsewhere `time.monotonic()`). Only
    differences of its readings mean anything."""
    return time.clock_gettime(_CLOCK) if _CLOCK is not None else time.monotonic()


class LeaseKeeper:
    """The lease of one run executing in this process.

    `held_from`: the lease clock when the write that took the lease (the run's claim) was sent.
    """

    def __init__(self, store: Any, checkpoint_id: str, owner: str, lease_seconds: float,
                 version: Callable[[], int | None], *, held_from: float | None = None) -> None:
        self.store = store
        self.checkpoint_id = checkpoint_id
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.interval = max(lease_seconds / 3, 0.05)
        self._version = version
        self.held_until = (lease_clock() if held_from is None else held_from) + lease_seconds
        self.due = lease_clock() + self.interval
        self.lost: str | None = None

    def wrote(self, sent: float | None) -> None:
        """A version was written; `sent` is the lease clock when its write was sent (None once the
        run stopped running: nothing to renew)."""
        if sent is not None:
            self.held_until = max(self.held_until, sent + self.lease_seconds)
            self.due = lease_clock() + self.interval

    def check(self) -> None:
        """Raise `LeaseLost` if this process may no longer hold the run's lease."""
        if self.lost is not None:
            raise LeaseLost(self.lost, checkpoint_id=self.checkpoint_id)
        late = lease_clock() - self.held_until
        if late > 0:
            raise LeaseLost(
                f"run '{self.checkpoint_id}': this process's lease ran out {late:.1f} s ago, at about "
                f"{_clock(time.time() - late)}, without a renewal (the process was stopped or starved, or the "
                "store was unreachable); another process may run it now, so this one starts nothing more. "
                "The run continues wherever it is taken over (a worker, or ainvoke(None, checkpoint_id=...))",
                checkpoint_id=self.checkpoint_id,
            )

    def start(self) -> None:
        _renewer().add(self)

    async def let_go(self) -> None:
        """This process stops running the run while it is still `running` (its store failed): end the lease
        now, if the store lets us, so that another process may take the run over at once, not when the
        lease runs out. Best effort: if the store is still unavailable, the lease runs out by itself."""
        version = self._version()
        if version is None or self.lost is not None:
            return
        try:
            await self.store.renew_lease(self.checkpoint_id, version, self.owner, 0.0)
        except Exception:  # noqa: BLE001, S110 - the lease then expires when its time is up
            pass

    def stop(self) -> None:
        _renewer().remove(self)

    async def renew(self) -> None:
        """One renewal (on the lease thread's loop)."""
        self.due = lease_clock() + self.interval
        version = self._version()
        if version is None or self.lost is not None:
            return
        sent = lease_clock()
        try:
            ok = await self.store.renew_lease(self.checkpoint_id, version, self.owner, self.lease_seconds)
        except Exception:  # noqa: BLE001 - transient; check() stops the run once the lease may be gone
            return
        if ok:
            self.held_until = max(self.held_until, sent + self.lease_seconds)
        elif self._version() == version:  # not just overtaken by this run's own newer write
            self.lost = (
                f"run '{self.checkpoint_id}': this process lost its lease at version {version} (another process "
                "took the run over, the run was deleted, or the lease had run out before this process could "
                "renew it); it starts nothing more. The run continues wherever it is taken over"
            )


class _Renewer:
    """One daemon thread with its own event loop that renews every due lease of this process."""

    IDLE = 1.0  # seconds between looks when nothing is due sooner

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.keepers: set[LeaseKeeper] = set()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.next_look = lease_clock() + self.IDLE
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
            now = lease_clock()
            with self.lock:
                keepers = list(self.keepers)
            due = [k for k in keepers if k.due <= now]
            if due:
                loop.run_until_complete(_renew_all(due))
            self.next_look = min([k.due for k in keepers] + [lease_clock() + self.IDLE])
            self.wake.wait(max(0.005, self.next_look - lease_clock()))
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
