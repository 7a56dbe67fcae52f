"""Automatic recovery in the service: runs of the served agents and graphs whose process died are continued
here, with nobody calling resume (`waypoint.engine.recover`, engine/keep/recovery.py, says which and how).

The service starts it with its lifespan and stops it before cancelling its executions. Beside it, a look every
`INPUTS_EVERY` seconds for chats whose turn ended with queued inputs nobody took (`take_waiting_inputs`). Each run it
continues is one of the service's own executions (a resume with no answers — or, for a pause whose deadline
passed, the answers its deadline gives — claimed by compare-and-set on the version recovery judged), so its
events reach the run's event stream and the page like any other.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from waypoint.engine import recover
from waypoint.engine.agents.turns import drainable, each_waiting, settled
from waypoint.engine.keep.recovery import MAX_ATTEMPTS

from ._state import ServiceState

__all__ = ["start_recovery", "stop_recovery", "take_waiting_inputs"]

log = logging.getLogger("waypoint.service")

EVERY = 1.0
"""Seconds between looks for runs to recover."""
CONCURRENCY = 4
"""Runs recovery continues at once (more wait their turn)."""
INPUTS_EVERY = 2.0
"""Seconds between looks for chats whose queued inputs nobody took."""


def start_recovery(state: ServiceState, *, max_attempts: int = MAX_ATTEMPTS, every: float = EVERY,
                   concurrency: int = CONCURRENCY) -> asyncio.Task:
    """Recover the served runs now and keep recovering them until `stop_recovery`."""
    by_app = {id(t.app): t for t in state.targets.values()}

    async def execute(app: Any, meta: Any, *, resume: Any = None) -> str:
        ex = state.executor.launch(by_app[id(app)], meta.checkpoint_id, "resume", resume=resume,
                                   expected_version=meta.version, created_at=meta.created_at)
        outcome = await asyncio.shield(ex.claimed)  # shielded: cancelling recovery never touches the execution
        if outcome.version is None:
            raise outcome.error or RuntimeError("the execution ended before it claimed the run")
        await asyncio.shield(ex.finished)
        found = await state.store.history(meta.checkpoint_id, limit=1)
        return f"continued by this service: now {found[0].status if found else 'deleted'}"

    apps = [t.app for t in state.targets.values()]

    async def both() -> None:
        await asyncio.gather(recover(apps, watch=True, every=every, concurrency=concurrency, max_attempts=max_attempts,
                                     execute=execute), take_waiting_inputs(state))

    return asyncio.create_task(both(), name="waypoint-recovery")


async def take_waiting_inputs(state: ServiceState, every: float = INPUTS_EVERY) -> None:
    """Chats whose turn ended with inputs nobody took (the process that ended it stopped before it could take them:
    a drain at shutdown, a crash between turns): each next input runs here as a turn, as after any turn."""
    store = state.store
    if getattr(store, "waiting_inputs", None) is None:
        return
    async def take(cid: str) -> None:
        if cid in state.executor.launched:
            return
        head = await store.history(cid, limit=1)
        target = state.target_of(head[0]) if head else None
        if target is not None and target.runner is not None and \
                drainable(await settled(target.runner.app, store, cid)):
            state.executor.launch(target, cid, "queued")

    while True:
        try:
            await each_waiting(store, take, state.agent_fingerprints())
        except Exception as err:  # noqa: BLE001 - said; the next look tries again
            log.warning("service: looking for chats whose queued inputs wait failed (%s: %s)", type(err).__name__, err)
        await asyncio.sleep(every)



async def stop_recovery(task: asyncio.Task | None) -> None:
    """Stop looking (the runs it started stay executions of the service, cancelled with the others)."""
    if task is None:
        return
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
