"""`Notifier`: the served runs' events, found in the store and posted to the webhooks, off every run's path
(service/_webhooks.py says which events and what they carry; docs/service.md, "Notifications").

**Found in the store**, whoever executed the run (this service, another, a worker, a script): every `poll`
seconds one query reads the versions written since the last look that may carry an event (stopped ones, an
expiry). A version's `updated_at` is its writer's clock, so each look reads back `overlap` seconds before the
previous look's time on the store's clock; the first reads back `lookback` seconds before the service started
(the gap of a restart) — nothing older is ever posted.

**Once per event, however many services share the database**: each event is registered as a row keyed by
(run incarnation, version, event, receiver) with an insert only one service can win; an attempt is made under
a claim on that row that lapses on the database's clock (stores/deliveries.py). The delivery's ID is derived
from the key, so an attempt repeated after a crash carries the same ID (receivers dedupe on it).

**Never in a run's way**: the runs never call it. Each attempt is a task of its own bounded by `timeout`, at
most `concurrency` at once; whatever fails — the receiver, the store, this code — is logged and tried again,
never raised into anything else.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict
from typing import Any

from waypoint.stores.deliveries import Delivery, deliveries_for, delivery_id, receiver_of, row_of

from ._responses import json_bytes
from ._webhooks import SIGNATURE_HEADER, Webhooks, events_of, payload, safe_url, sign

__all__ = ["Notifier"]

log = logging.getLogger("waypoint.webhooks")

PRUNE_EVERY = 3600.0
"""Seconds between prunes of delivered and given-up rows (stores/deliveries.py, `KEEP_DONE`)."""
_SEEN = 100_000
"""Delivery IDs remembered as registered (the overlap reads them again at every look)."""
_READ_AT_MOST = 64 * 1024
"""Bytes of a receiver's answer read (its status is all that counts)."""


class Notifier:
    """Posts the events of `state`'s served runs to `hooks` (see the module). `start()` on the running loop;
    `aclose()` stops it, handing unfinished attempts back for the next service."""

    def __init__(self, state: Any, hooks: Webhooks) -> None:
        self.state, self.hooks = state, hooks
        self.ledger = deliveries_for(state.store)
        self.receivers = {receiver_of(url): url for url in hooks.urls}
        self.hold = hooks.timeout * 2 + 10.0
        """Seconds an attempt's claim holds its row: past an attempt's timeout, so a live attempt keeps it."""
        self.began: float | None = None
        """The store's clock when it began to look (what it posts begins `lookback` before)."""
        self._since: float | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._inflight: set[asyncio.Task] = set()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._failing: str | None = None
        self._client: Any = None
        self.looks = 0
        """Looks at the store made so far (each one found and registered every event written before it began)."""

    def start(self) -> None:
        import httpx

        self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.hooks.timeout), follow_redirects=False,
                                         limits=httpx.Limits(max_connections=self.hooks.concurrency),
                                         headers={"User-Agent": "waypoint-webhooks"})
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._main(), name="waypoint-webhooks")

    async def aclose(self, last_look: float = 5.0) -> None:
        """Stop: one last look registers what the drain wrote (for whichever service posts next), then the
        attempts in flight are stopped and handed back uncounted."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        if self._since is not None:
            try:
                async with asyncio.timeout(last_look):
                    await self._find(self._since)
            except Exception as err:  # noqa: BLE001 - the next service's lookback covers it
                log.warning("webhooks: the last look for events at shutdown failed (%s: %s)", type(err).__name__, err)
        for task in list(self._inflight):
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        await self._client.aclose()

    # --- the loop ---------------------------------------------------------------------------------------------

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        next_look = next_prune = loop.time()
        assert self._wake is not None
        while True:
            try:
                if loop.time() >= next_look:
                    next_look = loop.time() + self.hooks.poll
                    await self._look()
                await self._dispatch()
                if loop.time() >= next_prune:
                    next_prune = loop.time() + PRUNE_EVERY
                    await self.ledger.prune()
                self._works()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - the store may come back: tried again at the next look
                self._failed(err)
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), max(0.0, next_look - loop.time()))
            except asyncio.TimeoutError:
                pass

    async def _look(self) -> None:
        now = await self.ledger.clock()
        if self.began is None:
            self.began = now
            self._since = now - self.hooks.lookback
        assert self._since is not None
        await self._find(self._since)
        self._since = max(self.began - self.hooks.lookback, now - self.hooks.overlap)
        self.looks += 1

    def _failed(self, err: Exception) -> None:
        said = f"{type(err).__name__}: {err}"
        if said != self._failing:  # once per streak of the same failure, not every poll
            log.error("webhooks: looking for events to post failed (%s); trying again every %.1f s", said,
                      self.hooks.poll)
            self._failing = said

    def _works(self) -> None:
        if self._failing is not None:
            log.warning("webhooks: looking for events to post works again")
            self._failing = None

    # --- finding events ---------------------------------------------------------------------------------------

    async def _find(self, since: float) -> None:
        """Register every event of a served run written since `since` that no service registered yet."""
        fresh = []
        for meta in await self.ledger.stopped_since(since):
            target = await self.state.resolve(meta)  # an earlier version of a served graph's run is served too
            if target is None:  # a graph this service does not serve: its own service posts it
                continue
            for event in events_of(meta):
                ids = {r: delivery_id(meta.checkpoint_id, meta.created_at, meta.version, event, r)
                       for r in self.receivers}
                if not all(i in self._seen for i in ids.values()):
                    fresh.append((meta, event, target.name, ids))
        if not fresh:
            return
        known = await self.ledger.known([i for *_, ids in fresh for i in ids.values()])
        rows = []
        for meta, event, graph, ids in fresh:
            todo = {r: i for r, i in ids.items() if i not in known}
            if todo:
                data = await payload(self.state, meta, event, graph)
                rows += [row_of(meta.checkpoint_id, meta.created_at, meta.version, event, r,
                                json_bytes({"id": i, **data})) for r, i in todo.items()]
        await self.ledger.register(rows)
        for *_, ids in fresh:
            for i in ids.values():
                self._seen[i] = None
        while len(self._seen) > _SEEN:
            self._seen.popitem(last=False)

    # --- posting ----------------------------------------------------------------------------------------------

    async def _dispatch(self) -> None:
        """Claim as many due deliveries as there are free slots, and attempt each in a task of its own."""
        free = self.hooks.concurrency - len(self._inflight)
        if free <= 0:
            return
        for d in await self.ledger.claim(list(self.receivers), free, self.hold):
            task = asyncio.create_task(self._attempt(d), name=f"waypoint-webhook:{d.event}:{d.checkpoint_id}")
            self._inflight.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self._inflight.discard(task)
        if self._wake is not None:
            self._wake.set()  # a free slot: take the next due delivery now

    async def _attempt(self, d: Delivery) -> None:
        url = self.receivers[d.receiver]
        try:
            problem = await self._post(url, d)
        except asyncio.CancelledError:  # a shutdown: the next service makes this attempt, uncounted
            await asyncio.shield(self._hand_back(d))
            raise
        except Exception as err:  # noqa: BLE001 - a fault here, not the receiver's: logged, counted, retried
            log.exception("webhooks: posting the %r event of run %r failed inside Waypoint", d.event, d.checkpoint_id)
            problem = f"{type(err).__name__}: {err}"
        try:
            await self._outcome(d, url, problem)
        except Exception as err:  # noqa: BLE001 - the claim lapses and the delivery is attempted again
            log.error("webhooks: the outcome of posting the %r event of run %r (version %s) to %s could not be "
                      "recorded (%s: %s); it is attempted again once its claim lapses (%.0f s)", d.event,
                      d.checkpoint_id, d.version, safe_url(url), type(err).__name__, err, self.hold)

    async def _post(self, url: str, d: Delivery) -> str | None:
        """One POST of the delivery: None once a 2xx answered, else what went wrong."""
        import httpx

        headers = {"Content-Type": "application/json", "Waypoint-Event": d.event, "Waypoint-Delivery": d.id,
                   SIGNATURE_HEADER: sign(self.hooks.secret, d.body)}
        try:
            async with asyncio.timeout(self.hooks.timeout):  # the whole exchange, however the receiver trickles
                async with self._client.stream("POST", url, content=d.body, headers=headers) as answer:
                    read = 0
                    async for chunk in answer.aiter_raw():
                        read += len(chunk)
                        if read > _READ_AT_MOST:
                            break
                    status = answer.status_code
        except TimeoutError:
            return f"no answer within {self.hooks.timeout:g} s"
        except (httpx.HTTPError, OSError) as err:
            return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        return None if 200 <= status < 300 else f"HTTP {status}"

    async def _outcome(self, d: Delivery, url: str, problem: str | None) -> None:
        attempt, where = d.attempts + 1, safe_url(url)
        if problem is None:
            kept = await self.ledger.finish(d, "delivered")
            log.debug("webhooks: posted the %r event of run %r (version %s) to %s, attempt %d", d.event,
                      d.checkpoint_id, d.version, where, attempt)
        elif attempt >= self.hooks.attempts:
            kept = await self.ledger.finish(d, "failed", error=problem)
            log.error("webhooks: gave up posting the %r event of run %r (version %s, delivery %s) to %s after %d "
                      "attempts; the last: %s", d.event, d.checkpoint_id, d.version, d.id, where, attempt, problem)
        else:
            delay = self.hooks.delay(attempt, random.random())
            kept = await self.ledger.finish(d, "pending", delay=delay, error=problem)
            log.warning("webhooks: attempt %d of %d to post the %r event of run %r (version %s) to %s failed (%s); "
                        "trying again in %.1f s", attempt, self.hooks.attempts, d.event, d.checkpoint_id, d.version,
                        where, problem, delay)
        if not kept:
            log.warning("webhooks: the claim on the %r event of run %r lapsed during its attempt (longer than %.0f s); "
                        "another attempt may be made (same delivery ID)", d.event, d.checkpoint_id, self.hold)

    async def _hand_back(self, d: Delivery) -> None:
        try:
            async with asyncio.timeout(2.0):
                await self.ledger.finish(d, "pending", counts=False)
        except Exception as err:  # noqa: BLE001 - its claim lapses instead
            log.warning("webhooks: handing the %r event of run %r back at shutdown failed (%s: %s); it is attempted "
                        "again once its claim lapses", d.event, d.checkpoint_id, type(err).__name__, err)
