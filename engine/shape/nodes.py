"""What a node can be, and the one shape the run loop sees: `invoke` (value → value) and `stream`.

Node kinds: a plain function, an `async def`, an async generator (streams its output),
a `Lambda` with any of the four paradigms, a `Component` (anything with `ainvoke` / `astream`, what
`ToolsNode` and chat models implement), or a `Graph` (a subgraph, run by the run loop itself).
Missing paradigms are derived: invoke from stream by concatenation, stream from invoke as one chunk,
and collect/transform by feeding a value as a one-chunk stream.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .streams import Chunks, concat, to_chunks

__all__ = ["Lambda", "Component", "NodeRunnable", "as_runnable"]


@runtime_checkable
class Component(Protocol):
    """A reusable node: implements `ainvoke(input)` and, if it can stream, `astream(input)`."""

    async def ainvoke(self, input: Any) -> Any: ...


@dataclass(frozen=True)
class Lambda:
    """A node with explicit paradigms; give at least one.

    - `invoke(value) -> value` (plain or async)
    - `stream(value) -> async iterator of chunks`
    - `collect(async iterator of chunks) -> value` (async)
    - `transform(async iterator of chunks) -> async iterator of chunks`

    Each may also declare a `state` parameter to receive the run-local state.
    """

    invoke: Callable[..., Any] | None = None
    stream: Callable[..., AsyncIterator[Any]] | None = None
    collect: Callable[..., Any] | None = None
    transform: Callable[..., AsyncIterator[Any]] | None = None

    def __post_init__(self) -> None:
        if not (self.invoke or self.stream or self.collect or self.transform):
            raise TypeError("Lambda needs at least one of invoke, stream, collect, transform")


class _Fn:
    """A user callable plus what we learned about its signature once, at compile time."""

    __slots__ = ("fn", "is_async", "wants_state", "takes_input", "name")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)
        )
        self.wants_state, self.takes_input = _signature_of(fn)

    def call(self, value: Any, state: Any) -> Any:
        if self.wants_state:
            return self.fn(value, state=state) if self.takes_input else self.fn(state=state)
        return self.fn(value) if self.takes_input else self.fn()


def _signature_of(fn: Callable[..., Any]) -> tuple[bool, bool]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature take one input
        return False, True
    wants_state = "state" in params
    positional = [
        p
        for name, p in params.items()
        if name != "state"
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return wants_state, bool(positional)


async def _gather(stream: AsyncIterator[Any]) -> list[Any]:
    return [chunk async for chunk in stream]


class NodeRunnable:
    """The four paradigms of one node, with the missing ones derived from the given ones."""

    __slots__ = ("_invoke", "_stream", "_collect", "_transform", "streams", "where", "plain_sync", "source")

    def __init__(self, where: str, *, invoke=None, stream=None, collect=None, transform=None, source=None) -> None:
        self.where = where
        self.source = source
        """The object the node was given (a function, a `Lambda`, a component): what it may say about itself, such
        as `resume_problem` (engine/keep/admission.py)."""
        self._invoke = _Fn(invoke) if invoke else None
        self._stream = _Fn(stream) if stream else None
        self._collect = _Fn(collect) if collect else None
        self._transform = _Fn(transform) if transform else None
        # Streams its output natively (so a streaming run forwards real chunks, not one value).
        self.streams = bool(stream or transform)
        # The hot path: a plain sync function called inline.
        self.plain_sync = self._invoke is not None and not self._invoke.is_async

    @property
    def sync_fn(self) -> _Fn | None:
        return self._invoke if self.plain_sync else None

    async def invoke(self, value: Any, state: Any) -> Any:
        """Run in invoke mode: a value in, a value out."""
        if self._invoke is not None:
            result = self._invoke.call(value, state)
            return await result if self._invoke.is_async else result
        if self._stream is not None:
            return concat(await _gather(self._stream.call(value, state)), where=self.where)
        if self._collect is not None:
            return await self._collect.call(Chunks([value]).aiter(), state)
        return concat(await _gather(self._transform.call(Chunks([value]).aiter(), state)), where=self.where)

    def stream(self, value: Any, state: Any) -> AsyncIterator[Any]:
        """Run in stream mode: a value or `Chunks` in, an async iterator of chunks out."""
        if self._transform is not None:
            return self._transform.call(Chunks(to_chunks(value)).aiter(), state)
        if self._stream is not None:
            return self._stream.call(self._value(value), state)
        return self._one_chunk(value, state)

    async def _one_chunk(self, value: Any, state: Any) -> AsyncIterator[Any]:
        if self._collect is not None and self._invoke is None:
            yield await self._collect.call(Chunks(to_chunks(value)).aiter(), state)
        else:
            yield await self.invoke(self._value(value), state)

    def _value(self, value: Any) -> Any:
        if type(value) is Chunks:
            return concat(value.items, where=f"the input of node '{self.where}'")
        return value


def as_runnable(where: str, obj: Any) -> NodeRunnable:
    """Adapt a user object (function, async function, async generator, Lambda, Component)."""
    if isinstance(obj, Lambda):
        return NodeRunnable(where, invoke=obj.invoke, stream=obj.stream, collect=obj.collect, transform=obj.transform,
                            source=obj)
    if inspect.isasyncgenfunction(obj):
        return NodeRunnable(where, stream=obj, source=obj)
    if inspect.isfunction(obj) or inspect.ismethod(obj) or inspect.isbuiltin(obj):
        return NodeRunnable(where, invoke=obj, source=obj)
    if hasattr(obj, "ainvoke") or hasattr(obj, "astream"):
        return NodeRunnable(where, invoke=getattr(obj, "ainvoke", None), stream=getattr(obj, "astream", None),
                            source=obj)
    if callable(obj):
        call = type(obj).__call__
        if inspect.isasyncgenfunction(call):
            return NodeRunnable(where, stream=obj, source=obj)
        return NodeRunnable(where, invoke=obj, source=obj)
    raise TypeError(
        f"node '{where}': {type(obj).__name__} is not a node; use a function, an async function, "
        "an async generator, a Lambda, a Graph, or an object with ainvoke()/astream()"
    )
