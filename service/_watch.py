"""Runs executed by other processes — workers, another service process, `waypoint runs resume`, a script —
followed from the store, so that their events reach this service's event logs and streams as those of the
runs it executes do.

**How it learns that a run moved.** On Postgres a run's transitions — its start or claim, its pause or end —
and its deletion are announced when their transaction commits (`SQLStore.listen_runs`: a NOTIFY on
`waypoint_runs` carrying the version, its status and the run's ID); the watcher listens on one connection,
and listens again (reading what it may have missed) when that connection is lost. The steps in between are
not announced (a NOTIFY serialises commits database-wide), so the runs someone follows — a reader, a
submission waiting for its claim, a run seen running with a log here — are also looked at every `POLL`
seconds. On SQLite, which announces nothing, that polling is all, plus, while the page's stream has readers,
a look at the runs updated most recently.

**What it derives.** Only what the store holds, version by version: `checkpoint` (version, step) for each
version, `started` at a claim (a running version after one that was not), the assistant's messages and tool
calls, tool results and decisions (the stored conversation compared with what it held at the version shown
before), `interrupt` once a pause is stored, `error` for a failure, and `end`. A model's tokens are never
stored, so a run executed elsewhere has none (its assistant text arrives whole as `message`;
docs/decisions.md says why); neither do plain graphs' `chunk` and `node` events. Everything is shown by the
same views as the runs executed here (service/_views.py), so the hostile-text rules hold for it too.

**Tokens.** A model's tokens are not stored, but the process executing the run relays them to the store's short
relayed log (stores/relay.py): the watcher reads them into the run's log as `token` events carrying their number
there (service/_events.py), for the runs someone reads — woken by the relay's NOTIFY on Postgres, looked for every
`RELAY_POLL` seconds on SQLite while such a run is running. A token relayed for a step comes before the events of
the version that step wrote (each relayed event says the version it followed), and one of a step after the
newest version announced waits until that version's events are given.

**Whose log.** Events go to the log of the run they are of (`Logs`: by the run's `created_at`), and the
service-wide log gets `started`, `interrupt`, `end` and `deleted`. A run this process executes is never
followed from the store (`executing`); when such an execution ends, the watcher is told the version it left
the run at (`wrote`), so nothing it wrote is announced twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from waypoint.engine.codec.jsonable import tool_arguments

from ._events import EventLog, Logs
from ._views import message_view, pending_view, plain

__all__ = ["Watcher", "POLL"]

log = logging.getLogger("waypoint.service")

POLL = 0.5
"""Seconds between looks at the store where it announces nothing (SQLite)."""
WINDOW = 64
"""Versions read first per look at a run; one that wrote more since the last look is read again, further back."""
CATCH_UP = 5000
"""Most versions read in one look at a run (a reader of a run that wrote more since gets a snapshot's worth)."""
KEEP = 10_000
"""Runs whose last known version is remembered (least recently seen dropped first)."""
HUB_RUNS = 50
"""Most recently updated runs looked at per poll for the service-wide stream (SQLite)."""
RELAY_POLL = 0.05
"""Seconds between looks for relayed tokens of a running run someone reads, where the store announces nothing."""
_RELAY_READ = 500
_RELAYED_KINDS = frozenset({"token"})


@dataclass
class _Seen:
    """Where the watcher last saw a run: its version and status, and how long its conversation and decision
    list were at that version (None: not read)."""

    created_at: float
    version: int
    status: str
    messages: int | None = None
    decisions: int | None = None


@dataclass(frozen=True)
class _Expected:
    """A start this service submitted: `log` becomes the new run's log at its claim (a version after `base`)."""

    log: EventLog
    base: int | None


class Watcher:
    """Follows runs executed elsewhere from `store` into `logs` (see the module). `read(checkpoint_id, version,
    meta)` decodes a version; `name_of(meta)` is the served name of the graph that wrote it (or None)."""

    def __init__(self, store: Any, logs: Logs, read: Callable[[str, int, Any], Awaitable[Any]],
                 name_of: Callable[[Any], str | None], *, poll: float = POLL) -> None:
        self.store, self.logs, self.read, self.name_of, self.poll = store, logs, read, name_of, poll
        self.executing: Callable[[str], bool] = lambda cid: False
        self.runs: OrderedDict[str, _Seen] = OrderedDict()
        self.expected: dict[str, _Expected] = {}
        self._dirty: dict[str, None] = {}
        self._relay_dirty: dict[str, None] = {}
        self._waiters: dict[str, list[asyncio.Future]] = {}
        self._wake: asyncio.Event | None = None
        self._looking = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._listening: Any = None
        self._lost = False
        self._hub_seen = False
        self._since = float("inf")
        """When it began to watch (runs created since are news from their first version)."""
        self.notifies = getattr(store, "dialect", None) == "postgresql" and hasattr(store, "listen_runs")

    # --- what the service tells it ------------------------------------------------------------------------

    def ensure(self) -> None:
        """Start following (on the running loop), if not already."""
        if self._task is None or self._task.done():
            self._since = time.time()
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._main(), name="waypoint-service:watcher")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._listening is not None:
            await self._listening.close()
            self._listening = None

    def wrote(self, meta: Any) -> None:
        """An execution of this process ended, leaving the run at `meta`: nothing up to it is news."""
        self._remember(meta.checkpoint_id, _Seen(meta.created_at, meta.version, meta.status))

    def forget(self, checkpoint_id: str) -> None:
        """The run was deleted by this process (which announced it)."""
        self.runs.pop(checkpoint_id, None)
        self.expected.pop(checkpoint_id, None)

    def expect(self, checkpoint_id: str, log: EventLog, base: int | None) -> None:
        """A start was submitted: the new run's events (from its claim, a version after `base`) go to `log`."""
        self.expected[checkpoint_id] = _Expected(log, base)
        self._mark(checkpoint_id)

    def unexpect(self, checkpoint_id: str, log: EventLog) -> None:
        found = self.expected.get(checkpoint_id)
        if found is not None and found.log is log:
            del self.expected[checkpoint_id]

    def follow(self, checkpoint_id: str, head: Any, *, fresh: bool) -> None:
        """A reader is about to read the log of run `head` (its newest version), which this process does not
        execute. A run not seen before, or a log made just now (`fresh`: no reader can have seen an event of
        it), is taken as it is now — the reader gets a snapshot of it. Otherwise what happened since the
        watcher last looked is announced at its next look (the log is followed while it has readers on SQLite,
        while it is kept on Postgres), so a reader that comes back gets what it missed."""
        seen = self.runs.get(checkpoint_id)
        if fresh or seen is None or seen.created_at != head.created_at:
            self._remember(checkpoint_id, _Seen(head.created_at, head.version, head.status))

    async def follow_hub(self) -> None:
        """A reader is about to read the service-wide log. Where the store announces nothing, the runs updated
        most recently are taken as they are now, once: what changes after this is news (polled)."""
        if self.notifies or self._hub_seen:
            return
        for meta in await self.store.list(limit=HUB_RUNS):
            if meta.checkpoint_id not in self.runs:
                self._remember(meta.checkpoint_id, _Seen(meta.created_at, meta.version, meta.status))
        self._hub_seen = True

    async def changed(self, checkpoint_id: str, timeout: float) -> None:
        """Wait until the store announces a change of the run, at most `timeout` seconds (all of it where the
        store announces nothing)."""
        if not self.notifies or self._listening is None:
            await asyncio.sleep(timeout)
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(checkpoint_id, []).append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            waiting = self._waiters.get(checkpoint_id, [])
            if waiter in waiting:
                waiting.remove(waiter)
            if not waiting:
                self._waiters.pop(checkpoint_id, None)

    # --- the loop -------------------------------------------------------------------------------------------

    def _announced(self, checkpoint_id: str | None, version: int, status: str) -> None:
        """A NOTIFY (on this loop): decide whether the run needs a look."""
        if status == "lost" or checkpoint_id is None:  # look at every run followed; relisten if lost
            self._lost = self._lost or status == "lost"
            for cid in self._followed():
                self._mark(cid)
            if self._wake is not None:
                self._wake.set()
            return
        for waiter in self._waiters.pop(checkpoint_id, []):
            if not waiter.done():
                waiter.set_result(None)
        if self.executing(checkpoint_id):
            return
        seen = self.runs.get(checkpoint_id)
        if status == "events":  # the executor relayed tokens
            self._relay_dirty[checkpoint_id] = None
            if self._wake is not None:
                self._wake.set()
        elif status == "deleted" or seen is None or version > seen.version:
            self._mark(checkpoint_id)

    def relayed(self, checkpoint_id: str, created_at: float) -> Any:
        """For `stream(..., relayed=)`: the relayed events of run (`checkpoint_id`, `created_at`) numbered after a
        given number, from the store; [] when some of them were trimmed (the reader fell too far behind)."""
        async def after(n: int) -> list[tuple[int, str, dict[str, Any]]]:
            rows = await self._relayed_rows(checkpoint_id, created_at, n, gap_ok=False)
            return [] if rows is None else [(m, kind, data) for m, _base, kind, data in rows]

        return after if hasattr(self.store, "read_events") else None

    async def begin_relay(self, run_log: EventLog, head: Any) -> None:
        """A reader is about to read `run_log` (of run `head`, its newest version), which relays nothing yet: it
        relays what is relayed from now on (a reader that comes back from another service gets what it missed
        before from the store: `relayed`)."""
        if self._wake is not None:  # a reader now: the loop looks for its tokens at the relay's pace
            self._wake.set()
        if run_log.relay_floor is not None or not hasattr(self.store, "read_events"):
            return
        if run_log.local:  # its tokens came from this service's own execution; what another relays later is news
            run_log.relay_floor = head.version
            return
        try:
            _oldest, newest, _rows = await self.store.read_events(head.checkpoint_id, incarnation=head.created_at,
                                                                  after=2**62, limit=1)
        except Exception as err:  # noqa: BLE001 - its readers get the messages whole; the next look tries again
            log.warning("waypoint serve: reading the relayed events of run %r failed (%s: %s)", head.checkpoint_id,
                        type(err).__name__, err)
            return
        if run_log.relay_floor is None:
            run_log.relay_floor = head.version
            if newest is not None:  # (IDs stay plain numbers until a relayed event is given: older clients)
                run_log.relayed = max(run_log.relayed or 0, newest)

    async def _relayed_rows(self, cid: str, created_at: float, after: int, *, gap_ok: bool = True
                            ) -> list[tuple[int, int, str, Any]] | None:
        """The relayed events of the run after number `after`, decoded: (n, base, kind, data); None when some
        after `after` were trimmed and not `gap_ok`. An event that cannot be decoded is left out (and said)."""
        if not hasattr(self.store, "read_events"):
            return []
        out: list[tuple[int, int, str, Any]] = []
        first = True
        while True:
            oldest, _newest, rows = await self.store.read_events(cid, incarnation=created_at, after=after,
                                                                 limit=_RELAY_READ)
            if first and oldest is not None and after and oldest > after + 1 and not gap_ok:
                return None
            first = False
            for n, base, kind, data in rows:
                after = n
                if kind not in _RELAYED_KINDS:
                    continue
                try:
                    value = json.loads(data)
                except ValueError as err:
                    log.warning("waypoint serve: relayed event %d of run %r cannot be read (%s)", n, cid, err)
                    continue
                if isinstance(value, dict):
                    out.append((n, base, kind, value))
            if len(rows) < _RELAY_READ:
                return out

    def _mark(self, checkpoint_id: str) -> None:
        self._dirty[checkpoint_id] = None
        if self._wake is not None:
            self._wake.set()

    def _followed(self) -> list[str]:
        """The runs a poll looks at: read now, waited for, or seen running with a log here."""
        out = dict.fromkeys(self.expected)
        for cid, run_log in self.logs.runs.items():
            seen = self.runs.get(cid)
            if run_log.readers or (seen is not None and seen.status == "running"):
                out[cid] = None
        return list(out)

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        last_poll, next_listen, backoff = float("-inf"), 0.0, 0.1
        assert self._wake is not None
        while True:
            listening = False
            if self.notifies:
                if self._listening is not None and self._listening.alive() and not self._lost:
                    listening = True
                elif loop.time() >= next_listen:
                    listening = await self._listen()
                    if listening:
                        backoff = 0.1
                    else:
                        next_listen, backoff = loop.time() + backoff, min(backoff * 2, 5.0)
            if loop.time() - last_poll >= self.poll:
                last_poll = loop.time()
                await self._poll(hub=not listening)
            reading = [] if listening else self._relaying()
            for cid in reading:
                self._relay_dirty[cid] = None
            while self._dirty or self._relay_dirty:
                full = bool(self._dirty)
                cid = next(iter(self._dirty if full else self._relay_dirty))
                del (self._dirty if full else self._relay_dirty)[cid]
                try:
                    await (self._look(cid) if full else self._look_relayed(cid))
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # noqa: BLE001 - one run that cannot be read never stops the others
                    log.warning("waypoint serve: following run %r from the store failed (%s: %s)", cid,
                                type(err).__name__, err)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), RELAY_POLL if reading else self.poll)
            except asyncio.TimeoutError:
                pass

    def _relaying(self) -> list[str]:
        """Runs whose relayed tokens are looked for now (where nothing announces them): running, read here."""
        out = []
        for cid, run_log in self.logs.runs.items():
            seen = self.runs.get(cid)
            if run_log.readers and seen is not None and seen.status == "running" and not self.executing(cid):
                out.append(cid)
        return out

    async def _listen(self) -> bool:
        """Hold the LISTEN connection (Postgres); False while it cannot be had (then poll)."""
        if self._listening is not None and self._listening.alive() and not self._lost:
            return True
        if self._listening is not None:
            log.warning("waypoint serve: the connection announcing runs' writes was lost; listening again")
            await self._listening.close()
            self._listening = None
        try:
            self._listening = await self.store.listen_runs(self._announced)
        except Exception as err:  # noqa: BLE001 - the database may come back; poll meanwhile
            log.warning("waypoint serve: cannot listen for runs' writes (%s: %s); polling meanwhile",
                        type(err).__name__, err)
            return False
        self._lost = False
        for cid in self._followed():  # whatever was written while nobody listened
            self._mark(cid)
        return self._listening is not None

    async def _poll(self, hub: bool) -> None:
        """Look at the followed runs (their steps are not announced) and, with `hub` (SQLite, or Postgres
        without its LISTEN) while the page's stream is read, at the runs updated most recently."""
        for cid in self._followed():
            self._dirty[cid] = None
        if not hub or not self.logs.hub.readers:
            return
        try:
            metas = await self.store.list(limit=HUB_RUNS)
        except Exception as err:  # noqa: BLE001 - tried again at the next poll
            log.warning("waypoint serve: listing runs failed (%s: %s)", type(err).__name__, err)
            return
        for meta in metas:
            seen = self.runs.get(meta.checkpoint_id)
            if seen is None or seen.created_at != meta.created_at or meta.version > seen.version:
                if not self.executing(meta.checkpoint_id):
                    self._dirty[meta.checkpoint_id] = None

    # --- one look at one run ----------------------------------------------------------------------------------

    async def look(self, cid: str) -> None:
        """Look at the run now (a submitted start's claim: its log becomes the run's at once)."""
        await self._look(cid)

    async def _look(self, cid: str) -> None:
        """Read the run's newest versions and announce what is new since the watcher last saw it (one look at
        a time: a reader's catching up and the loop never announce the same version twice)."""
        async with self._looking:
            await self._look_now(cid)

    async def _look_now(self, cid: str) -> None:
        if self.executing(cid):
            return
        metas = await self.store.history(cid, limit=WINDOW)
        seen = self.runs.get(cid)
        if not metas:
            if cid not in self.expected:  # (a submitted start's run is not written yet)
                self._gone(cid, seen)
            return
        newest = metas[0]
        expected = self.expected.get(cid)
        floor = _announced_up_to(seen, expected, newest)
        if floor is not None and metas[-1].version > floor + 1:  # wrote more since: read back to the floor
            metas = await self._back_to(cid, metas, floor)
            newest = metas[0]
        mine = [m for m in metas if m.created_at == newest.created_at]  # this run's versions, newest first
        same = seen is not None and seen.created_at == newest.created_at
        if expected is not None and (expected.base is None or newest.version > expected.base):
            new = [m for m in reversed(mine) if expected.base is None or m.version > expected.base]
            prev, same = None, False
            run_log: EventLog | None = self.logs.claim(cid, expected.log, newest.created_at)
            del self.expected[cid]
        elif expected is not None:  # its claim is not written yet
            if seen is None:
                self._remember(cid, _Seen(newest.created_at, newest.version, newest.status))
            return
        else:
            if same:
                new = [m for m in reversed(mine) if m.version > seen.version]
                prev = seen.status
            elif seen is not None or newest.created_at >= self._since:  # a new run (on an ID seen before, or not)
                new, prev = list(reversed(mine)), None
            else:  # a run from before the watcher looked, never seen: only where it is now
                new, prev = [newest], (mine[1].status if len(mine) > 1 else None)
            run_log = self.logs.runs.get(cid)
            if run_log is not None and run_log.run != newest.created_at:
                run_log = self.logs.current(cid, newest.created_at)  # the old run's readers' streams end
        rows: list[Any] = []
        if run_log is not None and run_log.run == newest.created_at:
            if run_log.relay_floor is None:  # tokens of the steps after this version are news to its readers
                run_log.relay_floor = (expected.base or 0) if expected is not None else (
                    seen.version if same and seen is not None else newest.version)
            rows = await self._relayed_rows(cid, newest.created_at, run_log.relayed or 0) or []
        if not new:
            _relay(run_log, rows, None)
            return
        conversation = (seen.messages, seen.decisions) if same and seen is not None else (None, None)
        if run_log is not None and conversation[0] is None:
            conversation = await self._conversation(cid, seen.version if same else new[0].version, None, (None, None))
        await self._announce(cid, new, prev, run_log, conversation, rows)

    async def _look_relayed(self, cid: str) -> None:
        """Read the run's newly relayed tokens into its log; a token of a step after the newest version announced
        makes it a whole look (that version's events come first)."""
        async with self._looking:
            seen, run_log = self.runs.get(cid), self.logs.runs.get(cid)
            if self.executing(cid) or seen is None or run_log is None or run_log.run != seen.created_at:
                return
            if run_log.relay_floor is None:
                await self._look_now(cid)
                return
            rows = await self._relayed_rows(cid, seen.created_at, run_log.relayed or 0) or []
            if any(base > seen.version for _n, base, _k, _d in rows):
                await self._look_now(cid)
                return
            _relay(run_log, rows, None)

    async def _back_to(self, cid: str, metas: list[Any], floor: int) -> list[Any]:
        """The run's versions from its newest down to just above `floor` (at most CATCH_UP): a run that writes on
        while it is read moves the window up, so the read is made again from the new newest until it reaches
        the floor — else the versions written meanwhile would push the oldest unannounced ones out of it."""
        while metas[-1].version > floor + 1:
            want = min(metas[0].version - floor, CATCH_UP)
            if len(metas) >= want:
                break
            more = await self.store.history(cid, limit=want)
            if not more:
                break
            metas = more
            if len(more) < want:  # the whole history: nothing older to read
                break
        return metas

    async def _announce(self, cid: str, new: list[Any], prev: str | None, run_log: EventLog | None,
                        conversation: tuple[int | None, int | None], rows: list[Any] = ()) -> None:
        hub = self.logs.hub
        status = prev
        for meta in new:
            rows = _relay(run_log, rows, meta.version)  # the tokens of the step that wrote it, first
            key = (cid, meta.created_at)
            if meta.status == "running" and status != "running":
                data = {"checkpoint_id": cid, "graph": self.name_of(meta), "how": "start" if status is None else "resume",
                        "version": meta.version}
                _append(run_log, "started", data)
                hub.append("started", data, key)
            _append(run_log, "checkpoint", {"version": meta.version, "step": meta.step})
            if meta.status != "running":
                snap = await self._read(cid, meta)
                if run_log is not None:
                    conversation = await self._conversation(cid, meta.version, run_log, conversation, snap)
                self._stopped(cid, meta, snap, run_log)
            status = meta.status
        _relay(run_log, rows, None)
        newest = new[-1]
        if run_log is not None and newest.status == "running":
            conversation = await self._conversation(cid, newest.version, run_log, conversation)
        messages, decisions = conversation if run_log is not None else (None, None)
        self._remember(cid, _Seen(newest.created_at, newest.version, newest.status, messages, decisions))

    def _stopped(self, cid: str, meta: Any, snap: Any, run_log: EventLog | None) -> None:
        """A version at which the run stopped: its pause, failure and end."""
        hub, key = self.logs.hub, (cid, meta.created_at)
        contexts = list(snap.interrupts.contexts) if snap is not None else []
        if meta.status == "interrupted" and contexts and meta.error != "cancelled":
            data = {"checkpoint_id": cid, "version": meta.version,
                    "interrupts": [pending_view(c, meta.version, meta.updated_at) for c in contexts]}
            _append(run_log, "interrupt", data)
            hub.append("interrupt", data, key)
        if meta.status == "failed" and meta.error:
            kind, _, message = meta.error.partition(": ")
            _append(run_log, "error", {"type": kind if message else "Error", "message": message or meta.error})
        end = {"checkpoint_id": cid, "status": meta.status, "version": meta.version, "error": meta.error}
        _append(run_log, "end", end)
        hub.append("end", end, key)

    async def _read(self, cid: str, meta: Any) -> Any:
        try:
            return await self.read(cid, meta.version, meta)
        except Exception as err:  # noqa: BLE001 - unreadable: its end is still announced
            log.warning("waypoint serve: version %s of run %r cannot be read (%s: %s)", meta.version, cid,
                        type(err).__name__, err)
            return None

    async def _conversation(self, cid: str, version: int, run_log: EventLog | None,
                            counts: tuple[int | None, int | None], snap: Any = None) -> tuple[int | None, int | None]:
        """Announce to `run_log` the messages and decisions the stored conversation holds at `version` beyond
        `counts` (how many it held before); returns how many it holds now (None, None: not an agent's, or
        unreadable)."""
        from waypoint.engine.agents import AgentState

        if snap is None:
            try:
                snap = await self.read(cid, version, None)
            except Exception as err:  # noqa: BLE001 - what cannot be read is not announced
                log.warning("waypoint serve: version %s of run %r cannot be read (%s: %s)", version, cid,
                            type(err).__name__, err)
                return None, None
        state = getattr(snap, "state", None)
        if not isinstance(state, AgentState):
            return None, None
        messages, decisions = list(state.messages), list(state.decisions)
        shown, decided = counts
        if run_log is not None and shown is not None and decided is not None and shown <= len(messages):
            path = [snap.graph]
            for decision in decisions[decided:]:
                data = plain(decision)
                _append(run_log, "decision", {**data, "run_path": path} if isinstance(data, dict)
                        else {"value": data, "run_path": path})
            for message in messages[shown:]:
                _message(run_log, message, path)
        return len(messages), len(decisions)

    def _gone(self, cid: str, seen: _Seen | None) -> None:
        """The run is not in the store any more (deleted by another process)."""
        self.runs.pop(cid, None)
        if seen is None and cid not in self.logs.runs:
            return
        gone = {"checkpoint_id": cid}
        run_log = self.logs.drop(cid)
        if run_log is not None:
            run_log.append("deleted", gone)
        self.logs.hub.append("deleted", gone)

    def _remember(self, cid: str, seen: _Seen) -> None:
        self.runs[cid] = seen
        self.runs.move_to_end(cid)
        while len(self.runs) > KEEP:
            self.runs.popitem(last=False)


def _relay(run_log: EventLog | None, rows: Any, below: int | None) -> list[Any]:
    """Append to `run_log` the relayed events of `rows` that followed a version before `below` (None: all), those
    of steps before the log's floor skipped; returns the rest."""
    rows = list(rows)
    if run_log is None:
        return []
    floor = run_log.relay_floor or 0
    while rows and (below is None or rows[0][1] < below):
        n, base, kind, data = rows.pop(0)
        if n <= (run_log.relayed or 0):
            continue
        if base >= floor:
            run_log.append(kind, data, n=n)
        else:
            run_log.relayed = n
    return rows


def _append(run_log: EventLog | None, kind: str, data: dict[str, Any]) -> None:
    if run_log is not None:
        run_log.append(kind, data)


def _message(run_log: EventLog, message: Any, path: list[str]) -> None:
    """A stored message as the events an execution here gives it (service/_execution.py)."""
    if message.role == "tool":
        run_log.append("tool_result", {"call_id": message.tool_call_id, "name": message.name,
                                       "content": message.content, "run_path": path})
    elif message.role == "assistant":
        run_log.append("message", {**message_view(message), "run_path": path})
        for call in message.tool_calls or ():
            run_log.append("tool_call", {"call_id": call.id, "name": call.name,
                                         "arguments": tool_arguments(call.arguments),
                                         "arguments_json": call.arguments, "run_path": path})


def _announced_up_to(seen: Any, expected: Any, newest: Any) -> int | None:
    """The version of run `newest` whose events were announced last (0: none of a run submitted here yet;
    None: a run not followed before — only where it is now is announced)."""
    if expected is not None:
        return expected.base or 0
    if seen is not None and seen.created_at == newest.created_at:
        return seen.version
    return None
