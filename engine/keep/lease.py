"""Keeping a running run's lease, from a thread a blocked event loop cannot stop.

While a run executes, its newest version names this process as the lease owner until an expiry time;
another process may take the run over once that time has passed. **Leases are judged on one clock, the
store's** (`CheckPointStore.clock()`: the database server's on Postgres, the host's for SQLite and
memory): the store stamps every expiry it writes from its own clock (`put`, `renew_lease`), and a
process deciding whether a lease is live asks the store's clock, never its own wall clock. Every version
the run writes sets a fresh expiry — and is refused by the store once this process no longer holds the
lease there (a fenced write, engine/keep/store.py guarantee 11), whatever this process believes.

Between writes, one daemon thread per process (with its own event loop) renews the lease of every run
this process executes, `lease_seconds / 3` after the last write or renewal — a sync node that blocks the
run's event loop for minutes does not let it lapse. The renewals of one store go in one transaction
(`renew_leases`) on a connection the store keeps for renewals alone, taken before the process claims a
run (`reserve`): a process whose work holds every pooled connection still renews, and a process that
cannot get that connection takes no run. Starting and stopping a keeper only touches a locked set: a
run does not wake the thread (measured: a wake-up per run halved B5).

The owning process keeps its own, conservative deadline on a local clock that only moves forward and
keeps counting while the process is stopped (`lease_clock`): the moment each write or renewal was *sent*
plus `lease_seconds`. The store stamped that lease no earlier, so this process gives the run up no later
than any other process may take it — whatever the offset between the machines' wall clocks.

A process that lost its lease starts nothing more (`LeaseKeeper.check`, called by the run loop before
every step and every write, and by `check_lease()` inside a task, before every tool call), raising
`LeaseLost`:

- its deadline passed without a renewal (the process was stopped — SIGSTOP, a GC pause, a frozen VM —
  or starved, or the store was unreachable): noticed at once, by the clock, even when the renewal thread
  has not run since the process woke up;
- renewal was refused (another process took the run over, the run was deleted, or the lease had already
  expired on the store's clock): noticed by the next renewal, within `lease_seconds / 3`.

Every renewal that fails is logged at once (logger `waypoint.lease`), naming the run and how long its
lease still holds; a lease lost — refused, or run out at its deadline — is logged once, when it happens.
"""

from __future__ import annotations

import _thread
import asyncio
import concurrent.futures
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import LeaseLost
from .cancel import POLL

__all__ = ["LeaseKeeper", "lease_clock", "reserve", "forget", "lost"]

log = logging.getLogger("waypoint.lease")

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
        self._failing: str | None = None  # the last renewal's error, while renewals fail
        self.since = version()
        """The version this execution's claim wrote: a cancel request naming an earlier one is not for it."""
        self.cancel: Any = None
        """The cancel request this execution honours (engine/keep/cancel.py), once the lease thread read one."""
        self.armed = True
        """The run's task is inside the run: a cancel "now" may cancel it (`disarm()` once it is not)."""
        self.busy: Callable[[], bool] = lambda: False
        """Whether the run is writing a version now: a cancel "now" waits for the write to end (set by the run)."""
        try:
            self.task: asyncio.Task | None = asyncio.current_task()  # what `lost(task)` asks about
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.task = self._loop = None

    def wrote(self, sent: float | None) -> None:
        """A version was written; `sent` is the lease clock when its write was sent (None once the
        run stopped running: nothing to renew)."""
        if sent is not None:
            self.held_until = max(self.held_until, sent + self.lease_seconds)
            self.due = lease_clock() + self.interval

    def check(self) -> None:
        """Raise `LeaseLost` if this process may no longer hold the run's lease."""
        if self.lost is not None:
            raise LeaseLost(self.lost, checkpoint_id=self.checkpoint_id, database=self.database)
        late = lease_clock() - self.held_until
        if late > 0:
            raise LeaseLost(self._ran_out(late), checkpoint_id=self.checkpoint_id, database=self.database)

    def reason(self) -> str | None:
        """Why this process no longer holds the lease (None while it does)."""
        if self.lost is not None:
            return self.lost
        late = lease_clock() - self.held_until
        return self._ran_out(late) if late > 0 else None

    @property
    def database(self) -> bool:
        """Whether the lease was lost because the database did not renew it (it failed or got no answer), not
        because this process was stopped: for a worker, no failed attempt."""
        return self._failing is not None

    def _ran_out(self, late: float) -> str:
        cause = f"renewals failed: {self._failing}" if self._failing else "the process was stopped or starved"
        return (f"run '{self.checkpoint_id}': this process's lease ran out {late:.1f} s ago, at about "
                f"{_clock(time.time() - late)}, without a renewal ({cause}); another process may run it now, so "
                "this one starts nothing more and writes nothing for it. The run continues wherever it is taken "
                "over (a worker, or ainvoke(None, checkpoint_id=...))")

    def start(self) -> None:
        _renewer().add(self)

    def disarm(self) -> None:
        """The run's task left the run: a cancel read from now on cancels nothing (it would hit other code)."""
        self.armed = False

    def asked(self, request: Any) -> None:
        """(The lease thread.) A cancel request was read for this run: honoured if it is for this execution; a newer
        one replaces the one honoured so far (a person who asked for a safe point may then ask for "now")."""
        if request.version < (self.since or 0) or (self.cancel is not None and (
                request.requested_at, request.when, request.by) == (self.cancel.requested_at, self.cancel.when,
                                                                    self.cancel.by)):
            return
        if self.cancel is not None and request.requested_at < self.cancel.requested_at:
            return
        self.cancel = request
        log.info("run '%s': cancel requested by %s (%s)", self.checkpoint_id, request.by or "an unnamed caller",
                 request.when)
        if request.when == "now" and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._cancel_now)
            except RuntimeError:  # the run's loop closed: the run is over
                pass

    def _cancel_now(self) -> None:
        if not self.armed or self.task is None or self.task.done():
            return
        if self.busy():  # a write of the run is in flight: it may land after a cancel, so let it finish first
            self._loop.call_later(0.005, self._cancel_now)  # type: ignore[union-attr]
            return
        self.task.cancel(f"run '{self.checkpoint_id}' cancelled by {self.cancel.by or 'an unnamed caller'}")

    def stop(self) -> None:
        _renewer().remove(self)

    async def let_go(self) -> None:
        """This process stops running the run while it is still `running` (its store failed): end the lease
        now, if the store lets us, so that another process may take the run over at once, not when the
        lease runs out. If the store is still unavailable, the lease runs out by itself (said in the log)."""
        version = self._version()
        if version is None or self.lost is not None:
            return
        try:
            await self.store.renew_lease(self.checkpoint_id, version, self.owner, 0.0)
        except Exception as err:  # noqa: BLE001 - the lease then expires when its time is up
            log.warning("run '%s': its lease could not be ended early (%s: %s); another process may take the run "
                        "over once it runs out", self.checkpoint_id, type(err).__name__, err)

    # --- the renewal thread's side ------------------------------------------------------------------

    def renewed(self, ok: bool, sent: float, version: int) -> None:
        """The answer to one renewal sent at `sent` (lease clock) for `version`."""
        if ok:
            self.held_until = max(self.held_until, sent + self.lease_seconds)
            if self._failing is not None:
                log.warning("run '%s': its lease is renewed again", self.checkpoint_id)
                self._failing = None
        elif self._version() == version and self.lost is None and not self.busy():
            # not overtaken by this run's own newer write — landed, or still in flight (its answer, fenced, tells)
            self.lost = (
                f"run '{self.checkpoint_id}': this process lost its lease at version {version} (another process "
                "took the run over, the run was deleted, or the lease had run out before this process could "
                "renew it); it starts nothing more and writes nothing for it. The run continues wherever it is "
                "taken over"
            )
            log.warning("%s", self.lost)

    def failed(self, err: BaseException) -> None:
        """A renewal raised (or got no answer): said at once; the lease holds until its deadline, and is lost
        there."""
        first = self._failing is None
        self._failing = _cause(err)
        if first and self.lost is None:
            log.warning("run '%s': its lease could not be renewed (%s); this process holds the run for another "
                        "%.1f s at most and stops there unless a renewal gets through", self.checkpoint_id,
                        self._failing, max(0.0, self.held_until - lease_clock()))

    def watch_deadline(self) -> None:
        """Say once, when it happens, that the lease ran out at its deadline."""
        if self.lost is None and lease_clock() > self.held_until and self._version() is not None:
            self.lost = self._ran_out(lease_clock() - self.held_until)
            log.error("%s", self.lost)


class _Renewer:
    """One daemon thread with its own event loop that renews every due lease of this process."""

    IDLE = 1.0  # seconds between looks when nothing is due sooner

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.keepers: set[LeaseKeeper] = set()
        self.lock = threading.Lock()
        self.reserved: weakref.WeakSet[Any] = weakref.WeakSet()  # stores whose renewals have their connection
        self.next_look = lease_clock() + self.IDLE
        self.loop: asyncio.AbstractEventLoop | None = None  # made on the thread; its first look sees every keeper
        self.ready = threading.Event()  # set once `loop` exists
        self._go = threading.Event()  # make the loop now: a renewal is due sooner than `next_look`, or a reservation
        self._wake: asyncio.Event | None = None
        self._renewing: dict[int, tuple[asyncio.Task, float, Any, list[LeaseKeeper]]] = {}
        """id(store) -> its look in flight (one at a time: renewals, then cancel requests): the task, when it was sent,
        the store, the keepers it renews."""
        self._next_poll: dict[int, float] = {}  # id(store) -> when its cancel requests are read next
        self._asking_failed: set[int] = set()  # id(store) of stores whose cancel requests could not be read
        # Started with `_thread`, not `threading.Thread.start()`, which waits for the new thread to be scheduled,
        # and the thread makes its loop only when a renewal is due: both would otherwise hold up (the GIL of) the
        # first run of a process — a cold resume — for ~0.5 ms, for a thread it needs seconds later. Daemon by
        # nature; no code of a user's runs on it.
        _thread.start_new_thread(self._main, ())

    def add(self, keeper: LeaseKeeper) -> None:
        with self.lock:
            self.keepers.add(keeper)
            loop = self.loop
        if keeper.due < self.next_look:  # only a short lease needs the thread awake sooner
            self.wake(loop)

    def wake(self, loop: asyncio.AbstractEventLoop | None) -> None:
        if loop is not None:
            loop.call_soon_threadsafe(self._set)
        else:
            self._go.set()

    def remove(self, keeper: LeaseKeeper) -> None:
        with self.lock:
            self.keepers.discard(keeper)

    def keepers_of(self, task: asyncio.Task) -> list[LeaseKeeper]:
        with self.lock:
            return [k for k in self.keepers if k.task is task]

    def _set(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _main(self) -> None:
        try:
            self._go.wait(max(0.0, self.next_look - lease_clock()))
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            with self.lock:
                self.loop = loop
            self.ready.set()
            loop.run_until_complete(self._run())
        except BaseException:  # the runs here keep their deadlines and stop at them; say why nothing renews
            log.exception("the lease renewal thread of process %s stopped: no lease of its runs is renewed any more; "
                          "each run stops at its lease's deadline (LeaseLost) — report this with the traceback",
                          os.getpid())

    async def _run(self) -> None:
        self._wake = asyncio.Event()
        while True:
            now = lease_clock()
            with self.lock:
                keepers = list(self.keepers)
            due: dict[int, tuple[Any, list[LeaseKeeper]]] = {}
            for k in keepers:
                if k.due <= now:
                    due.setdefault(id(k.store), (k.store, []))[1].append(k)
            polls = self._cancel_polls(keepers, now)
            for key in due.keys() | polls.keys():
                if key not in self._renewing:  # a store still answering the last look is not sent more
                    store, group = due.get(key) or (polls[key][0], [])
                    task = asyncio.ensure_future(self._look(store, group, polls.get(key, (store, []))[1]))
                    self._renewing[key] = (task, lease_clock(), store, group)
                    task.add_done_callback(lambda _, key=key: self._done_renewing(key))
            self._overdue()
            for k in keepers:
                k.watch_deadline()
            soonest = [k.due for k in keepers if id(k.store) not in self._renewing]
            soonest += [k.held_until for k in keepers if k.lost is None]
            soonest += [sent + min(k.interval for k in group) for _, sent, _, group in self._renewing.values() if group]
            soonest += list(self._next_poll.values())
            self.next_look = min(soonest + [lease_clock() + self.IDLE])
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.005, self.next_look - lease_clock()))
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    def _cancel_polls(self, keepers: list[LeaseKeeper], now: float) -> dict[int, tuple[Any, list[LeaseKeeper]]]:
        """The keepers, by store, whose cancel requests are due to be read (engine/keep/cancel.py): every `POLL` s
        while a run of that store executes here and has not been asked to stop "now" (a later request may still
        replace a safe point with "now")."""
        asking: dict[int, tuple[Any, list[LeaseKeeper]]] = {}
        for k in keepers:
            if (k.cancel is None or k.cancel.when != "now") and k.lost is None \
                    and getattr(k.store, "cancel_requests", None) is not None:
                asking.setdefault(id(k.store), (k.store, []))[1].append(k)
        self._next_poll = {key: self._next_poll.get(key, now) for key in asking}
        due = {}
        for key, found in asking.items():
            if self._next_poll[key] <= now and key not in self._renewing:
                self._next_poll[key] = now + POLL
                due[key] = found
        return due

    def _done_renewing(self, key: int) -> None:
        self._renewing.pop(key, None)
        self._set()  # its keepers may be due again

    def _overdue(self) -> None:
        """Renewals that got no answer within their interval count as failed (a connection that hangs — a
        dropped network flow, a frozen database backend): said at once, and the store's connection for renewals
        is taken anew before this process claims another run there."""
        now = lease_clock()
        for task, sent, store, group in list(self._renewing.values()):
            waited = now - sent
            if group and not task.done() and waited > min(k.interval for k in group):
                self.reserved.discard(store)
                for k in group:
                    k.failed(TimeoutError(f"its renewal got no answer for {waited:.1f} s"))

    async def _look(self, store: Any, renew: list[LeaseKeeper], ask: list[LeaseKeeper]) -> None:
        """One store's renewals and cancel requests, one after the other: they share its connection for renewals."""
        if renew:
            await self._renew(store, renew)
        if ask:
            await self._read_cancels(store, ask)

    async def _read_cancels(self, store: Any, keepers: list[LeaseKeeper]) -> None:
        """Hand each keeper the cancel request recorded for its run, if any. A store that cannot answer is said at
        once (a cancel asked meanwhile takes effect once it answers again), and when it answers again."""
        try:
            requests = await store.cancel_requests([k.checkpoint_id for k in keepers])
        except Exception as err:  # noqa: BLE001 - said, naming the runs; the runs go on
            if id(store) not in self._asking_failed:
                self._asking_failed.add(id(store))
                log.warning("cancel requests of run(s) %s could not be read (%s); a cancel asked meanwhile takes "
                            "effect once they can be", ", ".join(repr(k.checkpoint_id) for k in keepers[:5]),
                            _cause(err))
            return
        if id(store) in self._asking_failed:
            self._asking_failed.discard(id(store))
            log.warning("cancel requests of run(s) %s are read again",
                        ", ".join(repr(k.checkpoint_id) for k in keepers[:5]))
        log.debug("cancel requests of %d run(s) read", len(keepers))
        found = {r.checkpoint_id: r for r in requests}
        for k in keepers:
            request = found.get(k.checkpoint_id)
            if request is not None:
                k.asked(request)

    async def _renew(self, store: Any, keepers: list[LeaseKeeper]) -> None:
        """Renew the leases of `keepers` (all on `store`) in one go. A store slow to answer is waited for (never
        cancelled mid-statement), while the other stores' renewals go on; its runs hold their leases until
        their deadlines meanwhile."""
        now = lease_clock()
        batch = []
        for k in keepers:
            k.due = now + k.interval
            version = k._version()
            if version is not None and k.lost is None:
                batch.append((k, version))
        if not batch:
            return
        leases = [(k.checkpoint_id, version, k.owner, k.lease_seconds) for k, version in batch]
        sent = lease_clock()
        try:
            answers = await _renew_leases(store, leases)
        except Exception as err:  # noqa: BLE001 - said per run (`failed`); each stops at its deadline
            self.reserved.discard(store)  # its connection may be gone: the next claim takes it again first
            for k, _ in batch:
                k.failed(err)
            return
        for (k, version), ok in zip(batch, answers):
            k.renewed(bool(ok), sent, version)

    async def _reserve(self, store: Any) -> None:
        await store.reserve_renewals()
        self.reserved.add(store)


async def _renew_leases(store: Any, leases: list[tuple[str, int, str, float]]) -> list[bool]:
    many = getattr(store, "renew_leases", None)
    if many is not None:
        return list(await many(leases))
    return [await store.renew_lease(*lease) for lease in leases]


async def reserve(store: Any) -> None:
    """Make sure this process can renew leases on `store` before it takes a run there: the store's connection
    for renewals (engine/keep/store.py, guarantee 12) is taken on the renewal thread now, if it is not held yet.
    Raises `StoreUnavailable` when the database refuses it — the caller then takes nothing. Cheap once held."""
    if getattr(store, "reserve_renewals", None) is None:  # renewals need nothing up front (SQLite, memory)
        return
    renewer = _renewer()
    if store in renewer.reserved:
        return
    renewer.wake(None)
    renewer.ready.wait()  # the thread makes its loop at once: a wait only on the process's first reservation
    assert renewer.loop is not None
    future: concurrent.futures.Future = asyncio.run_coroutine_threadsafe(renewer._reserve(store), renewer.loop)
    await asyncio.wrap_future(future)


def _cause(err: BaseException) -> str:
    """What went wrong, for a log line: the driver's error behind a `StoreUnavailable` (whose own message starts
    with the store's address), else the error itself; one line, clipped."""
    inner = err.__cause__ if isinstance(err.__cause__, BaseException) else err
    sa = getattr(inner, "orig", None)  # SQLAlchemy's DBAPIError wraps the driver's
    inner = sa if isinstance(sa, BaseException) else inner
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[0][:300] if text else ''}"


def forget(store: Any) -> None:
    """The process let go of `store`'s connections (closed it): the next `reserve` takes the one for renewals
    again."""
    renewer = _RENEWER
    if renewer is not None:
        renewer.reserved.discard(store)


def lost(task: asyncio.Task) -> LeaseLost | None:
    """Why the run the asyncio task `task` executes here no longer holds its lease — refused, or run out at its
    deadline — as the `LeaseLost` its run raises (`.database`: the database did not renew it), or None (it holds
    it, or `task` executes no run with a lease right now)."""
    renewer = _RENEWER
    if renewer is None or renewer.pid != os.getpid():
        return None
    keepers = renewer.keepers_of(task)
    reasons = [k.reason() for k in keepers]
    if not keepers or not all(reasons):
        return None
    return LeaseLost(reasons[0], checkpoint_id=keepers[0].checkpoint_id, database=keepers[0].database)


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
