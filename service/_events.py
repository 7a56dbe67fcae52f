"""Per-run event logs in memory, and Server-Sent Events out of them.

Every event gets an integer ID from one counter per process that starts at the process's start time in
microseconds, so IDs increase within a run, across runs, and across a restart of the server. A run's log
keeps its newest `LOG_SIZE` events. A reader that names the last ID it saw (`Last-Event-ID`) gets what
followed it if that ID is still in the log; otherwise — a new reader, a server restart, a reader that fell
behind — it gets a `snapshot` event (the stored run, read now) and then what happens next.

A run's log belongs to the run it was made for: its `run` is that run's `created_at`, which a new run on the
same ID (after a delete, in this process or another, or a start over a completed run) does not share. A
reader is given a log only if it is the stored run's (`Logs.current`); another run's log is ended and
replaced, never replayed. The service-wide log tags each event with its run, and a reader that reconnects
is replayed only the events of runs that are still there (`stream(..., replayable=...)`).

**Relayed events** (the tokens of a run executed elsewhere, read from the store: service/_watch.py) carry their
number in the store's relayed log (`n`, the same on every service), and from the first one on, every event of
that log carries the newest such number given so far: its SSE ID is `<local ID>.<relayed number>`. A reader that
reconnects with it to this service resumes after the local ID, as before; to a service that does not know the
local ID, it gets a snapshot and then the relayed events after the number, from the store (`stream(...,
relayed=...)`), and none of them twice — unless the store trimmed some of them: then the snapshot only.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._responses import json_bytes

__all__ = ["LogEvent", "EventLog", "Logs", "RunKey", "EventId", "Relayed", "sse", "stream", "LOG_SIZE", "HEARTBEAT"]

LOG_SIZE = 1000
"""Events a run's log keeps (tokens included)."""
HEARTBEAT = 15.0
"""Seconds between keep-alive comments on an idle stream."""

_ids = itertools.count(time.time_ns() // 1000)


RunKey = tuple[str, float | None]
"""A run: (checkpoint ID, created_at)."""


@dataclass(frozen=True, slots=True)
class LogEvent:
    id: int
    kind: str
    data: dict[str, Any]
    run: RunKey | None = None
    """The run it is of, in the service-wide log (None: replayed to anyone, e.g. `deleted`)."""
    cursor: int | None = None
    """The newest relayed number given in its log up to it (None: its log relays nothing)."""
    n: int | None = None
    """Its own number in the store's relayed log (None: not a relayed event)."""


class EventLog:
    """One run's (or the service's) recent events, and a wake-up for the readers that wait on it."""

    def __init__(self, size: int = LOG_SIZE, run: float | None = None) -> None:
        self.size = size
        self.run = run
        """The `created_at` of the run whose events these are (None: not known, e.g. a start not yet written)."""
        self.base = next(_ids)  # what a reader that saw "nothing yet" names
        self.events: list[LogEvent] = []
        self.ids: list[int] = []
        self.dropped = 0  # events trimmed from the front, ever
        self.relayed: int | None = None
        """The number of the newest relayed event read into it from the store (None: none yet)."""
        self.relay_floor: int | None = None
        """Relayed events of steps after this version are shown in it (set when it begins to relay)."""
        self.local = False
        """An execution of this service wrote into it (its tokens are in it already): the ones that execution relayed
        for other services are not read back into it."""
        self.readers = 0
        self.closed = False
        self._wake = asyncio.Event()

    @property
    def last_id(self) -> int:
        return self.ids[-1] if self.ids else self.base

    def append(self, kind: str, data: dict[str, Any], run: RunKey | None = None, *, n: int | None = None) -> LogEvent:
        if n is not None:
            self.relayed = n
        event = LogEvent(next(_ids), kind, data, run, self.relayed, n)
        self.events.append(event)
        self.ids.append(event.id)
        if len(self.events) > 2 * self.size:  # trim in batches: appends stay O(1) amortised
            cut = len(self.events) - self.size
            del self.events[:cut], self.ids[:cut]
            self.dropped += cut
        self._wake.set()
        self._wake = asyncio.Event()
        return event

    def close(self) -> None:
        """Wake every reader for good (the server shuts down)."""
        self.closed = True
        self._wake.set()

    def position_after(self, last_id: int | None) -> int | None:
        """The absolute index of the first event after `last_id`, or None when that ID is not known here."""
        if last_id is None:
            return None
        if last_id == self.base and self.dropped == 0:
            return 0
        i = bisect.bisect_left(self.ids, last_id)
        if i < len(self.ids) and self.ids[i] == last_id:
            return self.dropped + i + 1
        return None

    async def follow(self, position: int, heartbeat: float = HEARTBEAT) -> AsyncIterator[LogEvent | int | None]:
        """Events from absolute index `position` on, as they come; None on an idle `heartbeat`; an int
        (the next position) when the reader fell behind the log (it must take a snapshot). Ends once the
        log is closed and every event in it was given."""
        while True:
            start = position - self.dropped
            if start < 0:  # fell behind: the caller takes a snapshot; what comes after it follows
                position = len(self.events) + self.dropped
                yield position
                continue
            if start < len(self.events):
                batch = self.events[start:]
                position += len(batch)
                for event in batch:
                    yield event
                continue
            if self.closed:
                return
            wake = self._wake
            try:
                await asyncio.wait_for(wake.wait(), heartbeat)
            except asyncio.TimeoutError:
                yield None


class Logs:
    """The logs of the runs this process knows of (bounded, least recently used dropped first) and the
    service-wide log (`hub`: starts, pauses, ends and deletions of every run, for the approval page)."""

    def __init__(self, keep: int = 1000) -> None:
        self.keep = keep
        self.runs: OrderedDict[str, EventLog] = OrderedDict()
        self.hub = EventLog()
        self.busy: Callable[[str], bool] = lambda cid: False

    def current(self, checkpoint_id: str, created_at: float) -> EventLog:
        """The log of the run `checkpoint_id` that was created at `created_at` (as the store has it now). A log
        held for another run (deleted, here or by another process, and started again; or one whose run is
        not known) is ended — its readers' streams end — and a new one begins: no event of another run is
        ever given to this run's readers."""
        log = self.runs.get(checkpoint_id)
        if log is not None and log.run is not None and log.run == created_at:
            self.runs.move_to_end(checkpoint_id)
            return log
        return self._install(checkpoint_id, EventLog(run=created_at))

    def claim(self, checkpoint_id: str, log: EventLog, created_at: float | None) -> EventLog:
        """`log`, the log of an execution that has just written its claim on the run created at `created_at`
        (None: that could not be read), made the run's log. A resume's log is already the run's; a start's is
        new, and replaces the previous run's on that ID."""
        if log.run is not None and log.run != created_at:  # the run was replaced between the look and the claim
            log = EventLog(run=created_at)
        log.run = created_at
        if self.runs.get(checkpoint_id) is log:
            self.runs.move_to_end(checkpoint_id)
            return log
        return self._install(checkpoint_id, log)

    def _install(self, checkpoint_id: str, log: EventLog) -> EventLog:
        old = self.runs.pop(checkpoint_id, None)
        if old is not None:
            old.close()
        self.runs[checkpoint_id] = log
        self._evict()
        return log

    def drop(self, checkpoint_id: str) -> EventLog | None:
        """Forget a run's log (the run was deleted): its readers get what is in it, then their stream ends;
        a new run on the same ID starts a new log, in which no old event ID is known (a snapshot first)."""
        log = self.runs.pop(checkpoint_id, None)
        if log is not None:
            log.close()
        return log

    def _evict(self) -> None:
        if len(self.runs) <= self.keep:
            return
        for cid, log in list(self.runs.items()):
            if len(self.runs) <= self.keep:
                break
            if not log.readers and not self.busy(cid):
                del self.runs[cid]

    def close(self) -> None:
        self.hub.close()
        for log in self.runs.values():
            log.close()


def sse(event: LogEvent | None = None, *, kind: str | None = None, data: Any = None, id: int | None = None,
        comment: str | None = None, cursor: int | None = None) -> bytes:
    """One Server-Sent Event (or a comment line); `cursor`: the relayed number its ID carries."""
    if comment is not None:
        return f": {comment}\n\n".encode()
    if event is not None:
        kind, data, id = event.kind, event.data, event.id
        cursor = event.cursor if cursor is None else cursor
    head = "" if id is None else f"id: {id}\n" if cursor is None else f"id: {id}.{cursor}\n"
    return f"{head}event: {kind}\ndata: ".encode() + json_bytes(data) + b"\n\n"


EventId = tuple[int | None, int | None]
"""What a reader names as the last event it saw: (local ID, relayed number), either None."""

Relayed = Callable[[int], Awaitable[list[tuple[int, str, dict[str, Any]]]]]
"""The relayed events numbered after a given number, from the store: (n, kind, data) each; [] when the store
trimmed some of them (the reader fell too far behind)."""


async def stream(log: EventLog, last_id: int | EventId | None, snapshot: Callable[[], Awaitable[dict[str, Any]]],
                 replayable: Callable[[LogEvent], Awaitable[bool]] | None = None,
                 relayed: Relayed | None = None) -> AsyncIterator[bytes]:
    """The SSE body of one reader: replay after `last_id`, or a snapshot first (then, with `relayed` and a relayed
    number in `last_id`, the relayed events after it); then live events. An event that was in the log before the
    reader came is replayed only if `replayable(event)` says so."""
    local, cursor = last_id if isinstance(last_id, tuple) else (last_id, None)
    log.readers += 1
    try:
        yield b"retry: 2000\n\n"
        replay_end = log.dropped + len(log.events)  # absolute index of the first event that is live to it
        position = log.position_after(local)
        given = -1  # relayed events numbered up to this one were given to this reader: never again
        if position is None:  # events from here on follow the snapshot (a few may show in it too)
            position, seen = replay_end, log.last_id
            yield sse(kind="snapshot", data=await snapshot(), id=seen, cursor=log.relayed)
            if cursor is not None and relayed is not None:  # resumed on another service: what it missed
                for n, kind, data in await relayed(cursor):
                    given = max(given, n)
                    yield sse(kind=kind, data=data, id=seen, cursor=max(n, log.relayed or 0))
        async for item in log.follow(position):
            if item is None:
                yield sse(comment="keep-alive")
            elif isinstance(item, int):
                position, seen = item, log.last_id
                yield sse(kind="snapshot", data=await snapshot(), id=seen, cursor=log.relayed)
            else:
                position += 1
                if item.n is not None and item.n <= given:
                    continue
                if replayable is not None and position <= replay_end and not await replayable(item):
                    continue
                yield sse(item, cursor=None if item.cursor is None else max(item.cursor, given))
    finally:
        log.readers -= 1
