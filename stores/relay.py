"""`Relay`: a run's live events — its models' tokens — from the process executing it to the store's relayed log
(stores/_relay_sql.py), where every service reads them (service/_watch.py); docs/decisions.md says why.

A graph callback handler: `Worker` passes one to each run it executes. A token is put in a buffer, never written
on the run's path: a background task writes the buffer every `every` seconds (or at once when `batch` events wait),
one transaction per batch. At the end of a model call the run waits for that call's last batch, at most `wait`
seconds — so a step's tokens are in the store before the version holding its message, and a reader never gets a
token after the message it belongs to — and then goes on whatever became of it. Every batch is fenced on the store
(written only while the run is this process's); a write that fails is said at once in the log, naming the run, and
the run never fails or waits longer for it. Text longer than `PIECE` characters is relayed as several tokens (what
a model streams is its to choose: a row, a NOTIFY, an SSE event stay bounded).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

__all__ = ["Relay", "PIECE"]

log = logging.getLogger("waypoint.worker")

PIECE = 8000
"""Most characters of model text in one relayed token."""
_MOST = 10_000
"""Events a relay holds while the store is slow; beyond it the oldest are dropped (and that is said)."""


class Relay:
    """Relays the tokens of run `checkpoint_id` (of graph `name`) to `store` (see the module)."""

    def __init__(self, store: Any, checkpoint_id: str, name: str, *, every: float = 0.05, batch: int = 64,
                 wait: float = 0.5) -> None:
        self.store, self.checkpoint_id, self.name = store, checkpoint_id, name
        self.every, self.batch, self.wait = every, batch, wait
        self.enabled = hasattr(store, "append_events")
        self.holder: str | None = None
        self.incarnation: float | None = None
        self.base = 0
        self.relayed = 0
        """Events written so far."""
        self._buffer: list[tuple[int, str, str]] = []
        self._kick: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None
        self._closed = False
        self._said_lost = False
        self._said_full = False

    # --- callbacks, inside the run ---------------------------------------------------------------------------

    def on_checkpoint(self, event: Any) -> None:
        self.base = int(event.data)
        meta = getattr(event, "meta", None)
        if meta is not None and meta.status == "running" and meta.lease_owner:
            self.holder, self.incarnation = meta.lease_owner, meta.created_at

    def on_chunk(self, event: Any) -> None:
        from waypoint.engine.models import Message

        data = event.data
        if not self.enabled or self._said_lost or not event.node_path or event.node_path[-1] != "model":
            return
        if type(data) is not Message or not isinstance(data.content, str) or not data.content:
            return
        path = _run_path(self.name, event.node_path)
        text = data.content
        for at in range(0, len(text), PIECE):
            self._add("token", {"text": text[at:at + PIECE], "run_path": path})

    async def on_end(self, event: Any) -> None:
        if self._buffer and event.node_path and event.node_path[-1] == "model":
            await self._flush_within(self.wait)  # this call's tokens before the step's write

    async def on_error(self, event: Any) -> None:
        await self.on_end(event)

    # --- the buffer and its writer ----------------------------------------------------------------------------

    def _add(self, kind: str, data: dict[str, Any]) -> None:
        if len(self._buffer) >= _MOST:
            del self._buffer[: len(self._buffer) - _MOST + 1]
            if not self._said_full:
                self._said_full = True
                log.warning("run '%s': the store takes relayed tokens more slowly than the model makes them; the "
                            "oldest waiting ones are dropped (readers get the whole message once its step is saved)",
                            self.checkpoint_id)
        self._buffer.append((self.base, kind, json.dumps(data, ensure_ascii=True)))
        if self._task is None:
            self._kick, self._lock = asyncio.Event(), asyncio.Lock()
            self._task = asyncio.get_running_loop().create_task(self._writer(), name=f"waypoint-relay:{self.checkpoint_id}")
        if len(self._buffer) >= self.batch:
            self._kick.set()

    async def _writer(self) -> None:
        assert self._kick is not None
        while not self._closed:
            try:
                await asyncio.wait_for(self._kick.wait(), self.every)
            except asyncio.TimeoutError:
                pass
            self._kick.clear()
            await self._flush()

    async def _flush_within(self, seconds: float) -> None:
        task = asyncio.ensure_future(self._flush())
        done, _ = await asyncio.wait([task], timeout=seconds)
        if not done:
            log.warning("run '%s': relaying its tokens takes longer than %.1f s; the run goes on without waiting",
                        self.checkpoint_id, seconds)

    async def _flush(self) -> None:
        """Write what waits, in order, one batch per base version."""
        if self._lock is None:
            return
        async with self._lock:
            while self._buffer and self.holder is not None and self.incarnation is not None and not self._said_lost:
                base = self._buffer[0][0]
                take = [e for e in self._buffer[:1000] if e[0] == base]
                del self._buffer[: len(take)]
                try:
                    await self.store.append_events(self.checkpoint_id, [(k, d) for _, k, d in take],
                                                   incarnation=self.incarnation, base=base, holder=self.holder)
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # noqa: BLE001 - the run goes on; its readers get the message whole
                    from waypoint.engine.errors import LeaseLost

                    if isinstance(err, LeaseLost):
                        self._said_lost = True
                        self._buffer.clear()
                        log.warning("run '%s': its tokens are no longer relayed: %s", self.checkpoint_id, err)
                        return
                    log.warning("run '%s': relaying %d token(s) to the store failed (%s: %s); they are dropped, readers "
                                "get the whole message once its step is saved", self.checkpoint_id, len(take),
                                type(err).__name__, err)
                    continue
                self.relayed += len(take)

    async def aclose(self) -> None:
        """Write what is left (at most `wait` seconds), then stop the writer."""
        if self._task is None:
            return
        if self._buffer:
            await self._flush_within(self.wait)
        self._closed = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _run_path(name: str, node_path: tuple[str, ...]) -> list[str]:
    """The agents a model call's chunk came through: the root graph's name, then each nested agent's node (an agent
    tool's call node, `name#n`, gives its name)."""
    path = [name]
    for element in node_path[:-1]:
        if element == "tools":
            continue
        path.append(element.rpartition("#")[0] or element)
    return path
