"""Node-level events of a run, delivered to callback handlers and to `aevents()`.

A callback handler is any object with some of `on_start`, `on_end`, `on_error`, `on_chunk`,
`on_retry`, `on_interrupt`, `on_checkpoint` (plain or `async def`), each taking one `Event`. Handlers run
in the run's task, in order; an exception in a handler fails the run (a tracer that breaks
should be noticed, not hidden).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Event", "EventKind"]

EventKind = Literal["start", "chunk", "end", "error", "retry", "interrupt", "checkpoint"]

_HOOK = {
    "start": "on_start",
    "chunk": "on_chunk",
    "end": "on_end",
    "error": "on_error",
    "retry": "on_retry",
    "interrupt": "on_interrupt",
    "checkpoint": "on_checkpoint",
}


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened in a run.

    `node_path` is the path of node keys from the root graph (empty for run-level events);
    `data` is the node input (start), output (end), chunk (chunk), exception (error; and retry: the
    exception of an attempt that will be retried — the chunks that attempt produced are void),
    `InterruptInfo` (interrupt) or the checkpoint version (checkpoint).
    """

    kind: EventKind
    node_path: tuple[str, ...]
    data: Any = None
    step: int = 0


class Emitter:
    """Fans events out to callback handlers and, for `aevents()`, to a sink."""

    __slots__ = ("_hooks", "_sink", "active")

    def __init__(self, handlers: Sequence[Any] = (), sink: Callable[[Event], Awaitable[None]] | None = None) -> None:
        hooks: dict[str, list[tuple[Callable, bool]]] = {}
        for handler in handlers:
            for kind, name in _HOOK.items():
                fn = getattr(handler, name, None)
                if fn is not None:
                    hooks.setdefault(kind, []).append((fn, inspect.iscoroutinefunction(fn)))
        self._hooks = hooks
        self._sink = sink
        self.active = bool(hooks) or sink is not None

    def wants(self, kind: str) -> bool:
        return self._sink is not None or kind in self._hooks

    async def emit(self, event: Event) -> None:
        for fn, is_async in self._hooks.get(event.kind, ()):
            if is_async:
                await fn(event)
            else:
                fn(event)
        if self._sink is not None:
            await self._sink(event)
