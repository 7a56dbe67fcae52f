"""One MCP session, owned by a task of the loop it runs in: requests that wait no longer than their caller's
deadline, and a close that never makes anyone wait.

The SDK's task groups must be entered and left by one task, so the session lives in a task of its own
(`_hold`). Every request runs in a task of its own too, and its caller waits for it with a deadline:

1. A caller waits at most its `timeout` for an answer, whatever the transport does: when the deadline
   passes, the request's task is cancelled and left to finish in the background (the SDK then sends the
   server a cancellation, itself bounded), and the caller is told at once.
2. Closing never blocks: it asks the session to end and returns. The end — a stdio server's stdin closed,
   then SIGTERM, then SIGKILL (the SDK's own bounded shutdown); an HTTP session's DELETE — runs in the
   background, and a session that has not ended after `close_grace` seconds is cancelled.
3. `finished(closes)` waits for the closes under way in the running loop (what `aclose()` waits for).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Connection", "Closes", "finished"]

log = logging.getLogger("waypoint.mcp")

_REAP_TIMEOUT = 5.0
"""How long a cancelled session may take to unwind before it is given up on (and logged)."""


class Closes:
    """The closes under way for one server, in any loop (a running task is only weakly referenced)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()
        self.guard = threading.Lock()

    def add(self, task: asyncio.Task) -> None:
        with self.guard:
            self.tasks.add(task)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task) -> None:
        with self.guard:
            self.tasks.discard(task)

    def of(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Task]:
        with self.guard:
            return [t for t in self.tasks if t.get_loop() is loop]


class Connection:
    """One session to an MCP server, held by a task of the running loop."""

    def __init__(self, transport: Callable[[Connection], Any], *, label: str, close_grace: float,
                 closes: Closes) -> None:
        self._transport = transport
        self._label = label
        self._close_grace = close_grace
        self._closes = closes
        self.client: Any = None
        self.error: BaseException | None = None
        self.ready = asyncio.Event()
        self.closing = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.waiting = 0
        """Callers waiting for an answer on this connection: it is not dropped from under them."""
        self.probe: asyncio.Task | None = None
        """A check of the connection after a timed-out request; new callers wait for its verdict."""
        self.refusals = 0
        """HTTP 401 / 403 answers seen on this connection (counted by the HTTP client's response hook)."""
        self.refused_status = 0

    async def open(self) -> None:
        """Start the session's task and wait for its handshake (the caller bounds the wait); on failure
        `error` holds what the SDK raised."""
        self.task = asyncio.get_running_loop().create_task(self._hold(), name=f"mcp:{self._label}")
        await self.ready.wait()

    async def _hold(self) -> None:
        try:
            from mcp import Client  # inside: an import that fails is this connection's error, told to its caller

            # No read timeout in the SDK: every wait is bounded by its caller's deadline (`ask`, `open`).
            async with Client(self._transport(self), read_timeout_seconds=None) as client:
                self.client = client
                self.ready.set()
                await self.closing.wait()
        except Exception as err:  # noqa: BLE001 - reported to whoever waits on the connection
            self.error = err
        finally:
            self.client = None
            self.ready.set()

    def refused(self, status: int) -> None:
        self.refusals += 1
        self.refused_status = status

    @property
    def alive(self) -> bool:
        return self.client is not None and not self.closing.is_set()

    async def ask(self, send: Callable[[Any], Awaitable[Any]], timeout: float) -> Any:
        """`send(client)` in a task of its own; its answer, or `TimeoutError` once `timeout` seconds have
        passed (the request is then cancelled in the background: the caller does not wait for that)."""
        client = self.client
        if client is None:
            from mcp import MCPError
            from mcp_types import CONNECTION_CLOSED

            raise MCPError(code=CONNECTION_CLOSED, message="Connection closed")
        request = asyncio.get_running_loop().create_task(send(client))
        request.add_done_callback(_settled)
        self.waiting += 1
        try:
            done, _ = await asyncio.wait([request], timeout=timeout)
        except BaseException:  # the caller was cancelled: its request goes with it
            request.cancel()
            raise
        finally:
            self.waiting -= 1
        if not done:
            request.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s")
        return request.result()

    def close(self) -> None:
        """Ask the session to end, in the background (idempotent). A session still in its handshake is
        cancelled at once; one that was open gets `close_grace` seconds to end in order."""
        if self.closing.is_set():
            return
        self.closing.set()
        if self.probe is not None:
            self.probe.cancel()
        task = self.task
        if task is None or task.done():
            return
        grace = self._close_grace if self.client is not None else 0.0
        self._closes.add(asyncio.get_running_loop().create_task(_end(task, grace, self._label),
                                                                name=f"mcp-close:{self._label}"))


async def finished(closes: Closes) -> None:
    """Wait until the closes of `closes` under way in the running loop are over (each is bounded)."""
    mine = closes.of(asyncio.get_running_loop())
    if mine:
        await asyncio.wait(mine)


async def _end(task: asyncio.Task, grace: float, label: str) -> None:
    if grace > 0:
        await asyncio.wait([task], timeout=grace)
    if task.done():
        return
    task.cancel()
    await asyncio.wait([task], timeout=_REAP_TIMEOUT)
    if not task.done():
        log.warning("MCP server '%s': the connection did not end %g s after it was cancelled; left behind",
                    label, _REAP_TIMEOUT)


def _settled(request: asyncio.Task) -> None:
    if not request.cancelled():
        request.exception()  # an abandoned request's failure is nobody's to report
