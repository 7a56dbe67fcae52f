"""Slowing down a client that keeps presenting wrong tokens.

Each client (its address as the server sees it) may fail `FREE` times within `WINDOW` seconds; after
that, its token checks take turns: each check waits for the one before it, and a failed one holds the
turn for a delay that doubles from `FIRST_DELAY` up to `MAX_DELAY`. So one client checks at most one
token per `MAX_DELAY` seconds however many connections it opens, and giving up on a slow answer does not
help it (the next check still waits its turn). More than `QUEUE` waiting checks from one client are
answered 429 at once, without a check. A client that stops failing for `WINDOW` seconds starts over.

Only bearer tokens (and the page's login form) are throttled: a session cookie is a 256-bit random ID
nobody guesses, so the page stays quick for its user while someone else guesses tokens from the same
address. Behind a reverse proxy every client has the proxy's address: the slow-down then applies to
all token guessers together (valid tokens are never delayed unless a guesser is queued ahead of them).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Throttle", "Busy", "FREE", "WINDOW", "FIRST_DELAY", "MAX_DELAY", "QUEUE"]

FREE = 5
WINDOW = 60.0
FIRST_DELAY = 0.25
MAX_DELAY = 4.0
QUEUE = 32
_CLIENTS = 10_000

T = TypeVar("T")


class Busy(Exception):
    """Too many checks from one client are waiting: answer 429 without checking."""


@dataclass
class _Client:
    failures: int = 0
    last: float = 0.0
    waiting: int = 0
    ready_at: float = 0.0
    """When its next check may run (monotonic): a check given up on still keeps the next one waiting."""
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)


class Throttle:
    """Token checks per client, slowed after repeated failures (see the module docstring)."""

    def __init__(self, *, free: int = FREE, window: float = WINDOW, first_delay: float = FIRST_DELAY,
                 max_delay: float = MAX_DELAY, queue: int = QUEUE) -> None:
        self.free, self.window, self.first_delay, self.max_delay, self.queue = free, window, first_delay, max_delay, queue
        self._clients: OrderedDict[str, _Client] = OrderedDict()

    def _client(self, address: str) -> _Client:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = _Client()
            while len(self._clients) > _CLIENTS:
                oldest, c = next(iter(self._clients.items()))
                if c.waiting:
                    break
                del self._clients[oldest]
        self._clients.move_to_end(address)
        if client.failures and time.monotonic() - client.last > self.window:
            client.failures = 0
        return client

    def delay(self, failures: int) -> float:
        """Seconds a failed check holds its client's turn, after `failures` failures in the window."""
        if failures <= self.free:
            return 0.0
        return min(self.first_delay * 2 ** (failures - self.free - 1), self.max_delay)

    async def check(self, address: str, check: Callable[[], Awaitable[T]], failed: Callable[[T], bool]) -> T:
        """Run `check()` in `address`'s turn; if `failed(result)`, hold the turn for the delay first."""
        client = self._client(address)
        if client.failures < self.free and not client.waiting:  # the common case: no waiting at all
            result = await check()
            if failed(result):
                self._failed(client)
            return result
        if client.waiting >= self.queue:
            raise Busy(address)
        client.waiting += 1
        try:
            async with client.turn:
                wait = client.ready_at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                result = await check()
                if failed(result):
                    self._failed(client)
                    delay = self.delay(client.failures)
                    client.ready_at = time.monotonic() + delay
                    await asyncio.sleep(delay)
                return result
        finally:
            client.waiting -= 1

    def _failed(self, client: _Client) -> None:
        client.failures += 1
        client.last = time.monotonic()
