"""One SDK client per running event loop, closed when that loop shuts down (the OpenAI and Anthropic models).

An SDK's async client (httpx underneath) is bound to the event loop it first ran on, and
`CompiledGraph.invoke()` runs a fresh loop per call, so a model keeps one client per running loop.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

__all__ = ["ClientPerLoop"]


async def _close_with_loop(client: Any) -> AsyncIterator[None]:
    # Started once in the client's loop, this generator is registered with that loop's async-generator
    # hooks; asyncio.run() closes such generators before it closes the loop, which runs the `finally`
    # while the loop can still do I/O. Without it the client's sockets would leak to the garbage collector.
    try:
        yield
    finally:
        await client.close()


class ClientPerLoop:
    """One client per running event loop; entries for closed loops are dropped on the next lookup."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, Any]] = (
            weakref.WeakKeyDictionary())
        self._lock = threading.Lock()  # loops in other threads may share the model

    async def get(self) -> Any:
        loop = asyncio.get_running_loop()
        with self._lock:
            for stale in [other for other in self._clients if other.is_closed()]:
                del self._clients[stale]
            entry = self._clients.get(loop)
            if entry is None:
                client = self._make()
                entry = self._clients[loop] = (client, _close_with_loop(client))
                started = False
            else:
                started = True
        if not started:
            await entry[1].asend(None)
        return entry[0]


