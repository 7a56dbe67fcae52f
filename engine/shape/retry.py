"""Per-node retry policy."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

__all__ = ["RetryPolicy"]

RetryOn = Union[type[BaseException], tuple[type[BaseException], ...], Callable[[BaseException], bool]]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Retry a failing node with exponential backoff.

    The node is attempted at most `max_attempts` times; the wait before attempt n+1 is
    `initial_interval * backoff_factor**(n-1)`, capped at `max_interval`, scaled by a random
    factor in [0.5, 1.0] when `jitter` is set. `retry_on` is an exception type, a tuple of
    types, or a predicate; a timeout counts as `TimeoutError`. Interrupts and cancellation
    are never retried.
    """

    max_attempts: int = 3
    initial_interval: float = 0.5
    backoff_factor: float = 2.0
    max_interval: float = 30.0
    jitter: bool = True
    retry_on: RetryOn = Exception

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be at least 1, got {self.max_attempts}")
        if self.initial_interval < 0 or self.max_interval < 0 or self.backoff_factor < 1:
            raise ValueError("RetryPolicy intervals must be >= 0 and backoff_factor >= 1")

    def should_retry(self, error: BaseException, attempt: int) -> bool:
        """True when `error`, raised by attempt number `attempt` (1-based), deserves another try."""
        if attempt >= self.max_attempts or not isinstance(error, Exception):
            return False
        rule = self.retry_on
        if isinstance(rule, type) or isinstance(rule, tuple):
            return isinstance(error, rule)
        return bool(rule(error))

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        base = min(self.initial_interval * self.backoff_factor ** (attempt - 1), self.max_interval)
        return base * random.uniform(0.5, 1.0) if self.jitter else base
