"""`Backoff`: how long a worker waits after a failure that goes on (a busy database, a lost LISTEN), and when it
says so in the log (stores/worker.py)."""

from __future__ import annotations

import random
import time

__all__ = ["Backoff", "SAY_EVERY"]


class Backoff:
    """Delays that double from 0.1 s up to `most` while something keeps failing, each with ±25 % jitter (workers
    refused together do not come back together). `say()`: whether to log this failure — the first of a streak,
    then once every `SAY_EVERY` seconds while it lasts."""

    def __init__(self, most: float) -> None:
        self.most = max(most, 0.1)
        self.delay = 0.1
        self.failing = False
        self.waited = 0.0
        self._said = -SAY_EVERY

    def fail(self) -> float:
        first = not self.failing
        if self.failing:
            self.delay = min(self.delay * 2, self.most)
        self.failing = True
        delay = self.delay * random.uniform(0.75, 1.25)
        self.waited += delay
        if first:
            self._said = -SAY_EVERY
        return delay

    def say(self) -> bool:
        now = time.monotonic()
        if now - self._said >= SAY_EVERY:
            self._said = now
            return True
        return False

    def ok(self) -> None:
        self.delay, self.failing, self.waited = 0.1, False, 0.0


SAY_EVERY = 30.0
"""Seconds between log lines about a failure that goes on (the first one is said at once)."""
