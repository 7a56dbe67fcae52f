"""A chat's queued inputs in a `waypoint worker` (double-texting, engine/agents/turns.py).

New input sent while a chat's turn executes in a worker is queued in the store (guarantee 15). When the worker
records that turn's work, it queues the turn of the next input as work of its own (`kind` "input") if one may
start now, so any worker takes it — with the queue's claims, hand-backs and recovery like any other work — and
runs it with the agent's `Runner` (`Runner.drain`, one turn). That work ends by queueing the next input's turn,
so the inputs run one after another, in their order, whichever workers take them. Inputs a turn's end could not
hand on (its worker stopped first) are found by a look every `INPUTS_EVERY` seconds (`take_waiting_inputs`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from waypoint.engine import Runner
from waypoint.engine.agents.turns import drainable, each_waiting, keeps_inputs, settled
from waypoint.engine.keep.checkpoint import fingerprint

from .queue import QueueError, RunQueue

__all__ = ["runners_of", "queue_next_input", "take_waiting_inputs", "INPUTS_EVERY"]

INPUTS_EVERY = 2.0
"""Seconds between a worker's looks for chats whose queued inputs nobody took."""

log = logging.getLogger("waypoint.worker")


def runners_of(graphs: Mapping[str, Any], store: Any) -> dict[str, Runner]:
    """A Runner for each graph an agent compiled (the ones whose chats take queued input)."""
    if not keeps_inputs(store):
        return {}
    return {name: Runner.of(app) for name, app in graphs.items() if getattr(app, "agent", None) is not None}


async def queue_next_input(queue: RunQueue, runner: Runner, graph: str, checkpoint_id: str) -> bool:
    """Queue the turn of the chat's next queued input if one may start now (its turn ended); whether it did. One
    indexed read when none was ever queued."""
    store = runner.store
    if not await store.queued_inputs(checkpoint_id, after=0):
        return False
    found = await settled(runner.app, store, checkpoint_id)
    if not drainable(found):
        return False
    try:
        await queue._take_input(checkpoint_id, graph, found.version)
    except QueueError as err:  # work for the run is queued or running already: its end takes the input
        log.info("run '%s': its next queued input waits for the work queued for it (%s)", checkpoint_id, err)
        return False
    log.info("run '%s': queued the turn of its input %d for the workers", checkpoint_id, found.waiting[0].n)
    return True


async def take_waiting_inputs(queue: RunQueue, runners: Mapping[str, Runner], busy: Callable[[], set[str]],
                              woke: Callable[[], None], every: float = INPUTS_EVERY) -> None:
    """Chats of `runners`' agents whose turn ended with inputs nobody took (the worker that ended it stopped first:
    a drain, a crash between turns): queue each next input's turn, as a turn's end does. `busy()`: runs this
    worker executes now; `woke()`: after queueing one."""
    store = queue.store
    if not runners or getattr(store, "waiting_inputs", None) is None:
        return
    by_fingerprint = {fingerprint(runner.app.structure): name for name, runner in runners.items()}

    async def take(cid: str) -> None:
        head = await store.history(cid, limit=1)
        name = by_fingerprint.get(head[0].fingerprint) if head else None
        if name is not None and cid not in busy() and await queue_next_input(queue, runners[name], name, cid):
            woke()

    while True:
        try:
            await each_waiting(store, take, by_fingerprint)
        except Exception as err:  # noqa: BLE001 - said; the next look tries again
            log.warning("worker: looking for chats whose queued inputs wait failed (%s: %s)", type(err).__name__, err)
        await asyncio.sleep(every)
