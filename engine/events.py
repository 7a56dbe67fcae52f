"""Node-level events of a run, delivered to callback handlers and to `aevents()`.

A callback handler is any object with some of `on_start`, `on_end`, `on_error`, `on_chunk`,
`on_retry`, `on_interrupt`, `on_checkpoint` (plain or `async def`), each taking one `Event`. Handlers run
in the run's task, in order; an exception in a handler fails the run (a tracer that breaks
should be noticed, not hidden).

A handler may also have `on_run_start` / `on_run_end`, each taking the run's `RunInfo`: once per call
(ainvoke, astream, aevents), around everything the run does. `on_run_start` runs after a stored run was
read and checked, before its claim is written, in the caller's context (what it attaches to a context
variable, the run's tasks inherit); `on_run_end` runs when the call ends, however it ends. These two go to
handlers only: `aevents()` does not yield them.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Event", "EventKind", "RunInfo", "clean_trace", "TRACE_LIMITS"]

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
    meta: Any = field(default=None, compare=False, repr=False)
    """A `checkpoint` event's stored `CheckpointMeta` (who holds the run, its incarnation); None otherwise."""


TRACE_LIMITS = (8, 64, 512)
"""A run's trace carrier holds at most 8 entries, keys of at most 64 and values of at most 512 characters."""


def clean_trace(value: Any) -> dict[str, str]:
    """`value` as a trace carrier (str -> str, within `TRACE_LIMITS`); anything else is dropped, never an error:
    it is diagnostic data, read back from a store."""
    if not isinstance(value, Mapping):
        return {}
    entries, key_max, value_max = TRACE_LIMITS
    out = {k: v for k, v in value.items()
           if type(k) is str and type(v) is str and 0 < len(k) <= key_max and len(v) <= value_max}
    return dict(list(out.items())[:entries])


@dataclass(kw_only=True, slots=True)
class RunInfo:
    """One run as the `on_run_start` / `on_run_end` hooks see it (one ainvoke, astream or aevents call).

    A tracer keeps the link to the run before a resume in `trace`: what `on_run_start` puts there is
    stored with every version this run writes (the checkpoint header, signed with the rest when the codec
    signs), and the run that later continues from one of those versions reads it as `previous_trace` —
    in any process, any time later. It holds at most `TRACE_LIMITS` of short strings (a W3C
    `traceparent`, say); a store never interprets it.
    """

    graph: str
    """The name of the graph (or agent) that runs."""
    checkpoint_id: str | None = None
    """The stored run it writes to (None: not recorded)."""
    resumed: bool = False
    """True when this call continues a stored run: a resume, or a run that stopped midway."""
    resumed_from: int | None = None
    """The stored version it continues from."""
    resume_ids: tuple[str, ...] = ()
    """The interrupt IDs this call answers (`resume={id: ...}` or `[ids]`; empty for `resume=True`)."""
    previous_trace: Mapping[str, str] = field(default_factory=dict)
    """The trace carrier stored by the run that wrote `resumed_from` (empty when it stored none)."""
    trace: dict[str, str] = field(default_factory=dict)
    """Filled by `on_run_start` hooks; stored with every version this run writes."""
    status: str | None = None
    """At `on_run_end`: "completed", "interrupted", "failed" or "cancelled"."""
    version: int | None = None
    """At `on_run_end`: the newest version this run wrote (None when it wrote none)."""
    error: BaseException | None = None
    """At `on_run_end`, when the run failed: what it raised."""
    interrupts: Any = None
    """At `on_run_end`, when the run paused: its `InterruptInfo` (the pending IDs are in `.contexts`)."""


class Emitter:
    """Fans events out to callback handlers and, for `aevents()`, to a sink."""

    __slots__ = ("_hooks", "_sink", "active", "_run_hooks")

    def __init__(self, handlers: Sequence[Any] = (), sink: Callable[[Event], Awaitable[None]] | None = None) -> None:
        hooks: dict[str, list[tuple[Callable, bool]]] = {}
        run_hooks: dict[str, list[Callable]] = {}
        for handler in handlers:
            for kind, name in _HOOK.items():
                fn = getattr(handler, name, None)
                if fn is not None:
                    hooks.setdefault(kind, []).append((fn, inspect.iscoroutinefunction(fn)))
            for name in ("on_run_start", "on_run_end"):
                fn = getattr(handler, name, None)
                if fn is not None:
                    run_hooks.setdefault(name, []).append(fn)
        self._hooks = hooks
        self._run_hooks = run_hooks
        self._sink = sink
        self.active = bool(hooks) or sink is not None

    @property
    def observes_runs(self) -> bool:
        return bool(self._run_hooks)

    async def run_hook(self, name: str, info: RunInfo) -> None:
        """Call every handler's `on_run_start` or `on_run_end` (handlers only, never the sink)."""
        for fn in self._run_hooks.get(name, ()):
            result = fn(info)
            if inspect.isawaitable(result):
                await result

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
