"""What an agent's run says, as `Runner` yields it: `AgentEvent` (an `AgentOutput` — a message or a tool result,
streamed live — an `AgentAction`, or an error) and `_Live`, the callback inside the run that feeds the streams
and translates the engine's events (engine/agents/runner.py runs it)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from collections.abc import AsyncIterator
from typing import Any

from ..events import Event
from ..keep import QueuedInput
from ..models.schema import Message, concat_messages
from ..run import InterruptInfo, Pending, pending_of
from ..tools.node import ToolEvent
from ..tools.verbs import Decision
from .middleware import RetryNotice, StoredMessage
from .paths import AgentPaths, Where

__all__ = ["AgentEvent", "AgentOutput", "AgentAction", "ToolRerun"]


class _Stream:
    """An async iterator of message chunks, fed from inside the run as they are produced."""

    _END = object()

    def __init__(self, opened_by: Any = None) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.seen: list[Message] = []
        self.closed = False
        self.first: Message | None = None
        self.opened_by = opened_by
        """The engine event whose chunk opened this stream: how the consumer pairs announcements with streams."""

    def put(self, chunk: Message) -> None:
        if self.first is None:
            self.first = chunk
        self._queue.put_nowait(chunk)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(self._END)

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> Message:
        item = await self._queue.get()
        if item is self._END:
            self._queue.put_nowait(self._END)  # stays ended for a second reader
            raise StopAsyncIteration
        self.seen.append(item)
        return item


@dataclass(kw_only=True)
class AgentOutput:
    """A message the agent produced: assistant text or tool requests, or a tool's result.

    `message` is set when the runner does not stream; `stream` (chunks, live) when it does.
    `await get_message()` returns the whole message either way.
    """

    role: str
    tool_name: str | None = None
    message: Message | None = None
    stream: AsyncIterator[Message] | None = None

    async def get_message(self) -> Message:
        if self.message is not None:
            return self.message
        assert isinstance(self.stream, _Stream)
        async for _ in self.stream:  # read what is left; chunks already read were kept
            pass
        self.message = concat_messages(self.stream.seen)
        return self.message


@dataclass(frozen=True, kw_only=True)
class ToolRerun:
    """A call that had started but not finished before a crash, run again with the same key."""

    name: str
    call_id: str
    idempotency_key: str


@dataclass(kw_only=True)
class AgentAction:
    """Something the run did: ended (`exit`), paused for an answer (`interrupted`, once durably saved; `pending`
    lists what it waits for), re-ran a call after a crash (`rerun`), carried out a resume's decision about a
    paused call (`decision`), is retrying a model or tool call (`retry`: what a retry middleware announced), or
    handed the conversation to another agent (`transfer`). A run that is cancelled yields no action: it ends
    with its consumer (stored `interrupted` with `meta.cancelled` true, waiting for nothing)."""

    exit: bool = False
    interrupted: InterruptInfo | None = None
    """Set when the run paused: the engine's `InterruptInfo` (root-cause `contexts`). `pending` reads it."""
    rerun: ToolRerun | None = None
    decision: Decision | None = None
    retry: RetryNotice | None = None
    transfer: str | None = None
    """The agent this one handed the conversation to (`transfer_to_agent`): it answers from here on."""
    queued: QueuedInput | None = None
    """The input this call sent was queued for the run another turn of which is executing (`Runner.run(on_busy=)`):
    the process executing it runs it, in its order. The call's only event."""
    taken: QueuedInput | None = None
    """A queued input starts its turn here: the events that follow are that turn's."""

    @property
    def paused(self) -> bool:
        """Whether the run paused here, waiting for an answer (its pause is durably saved)."""
        return self.interrupted is not None

    @property
    def pending(self) -> list[Pending]:
        """What the paused run waits for, one `Pending` per call (`id` — what an answer names —, `tool`,
        `arguments`, `digest`); empty unless the run paused here."""
        return [] if self.interrupted is None else [pending_of(ctx) for ctx in self.interrupted.contexts]


@dataclass(kw_only=True)
class AgentEvent:
    """One event of an agent run: an `output`, an `action`, or the `error` that ended the run.

    `run_path` names the agents the event came through, outermost first: `("supervisor",)` for the agent the
    runner runs, `("supervisor", "researcher")` for one it called as a tool (or a workflow's sub-agent, or a
    handoff); `agent_name` is the last of them."""

    agent_name: str
    run_path: tuple[str, ...] = ()
    output: AgentOutput | None = None
    action: AgentAction | None = None
    error: BaseException | None = None

    @property
    def pending(self) -> list[Pending]:
        """What the run waits for if it paused at this event (`action.pending`); empty for any other event."""
        return self.action.pending if self.action is not None else []


class _Live:
    """A callback inside the run (feeds live streams) plus the translation of engine events.

    The callback runs in the run's task the moment a chunk exists; the translation runs in the
    consumer, possibly later. Streams pass between them in order (a FIFO per kind), so a slow consumer
    still pairs each announcement with the right stream. Events of every agent in a composition come
    through here: `AgentPaths` says which agent's run each belongs to (its `run_path`), and the model stream
    being fed is kept per run, so two agents streaming at once (two calls of one agent tool) stay apart.
    """

    def __init__(self, agent: Any, streaming: bool) -> None:
        self.paths = AgentPaths(agent)
        self.root = self.paths.resolve(())
        self.streaming = streaming
        self.model_stream: dict[tuple[str, ...], _Stream] = {}  # per agent run: the stream being fed
        self.model_streams: deque[_Stream] = deque()  # opened and not yet announced, in order
        # per call execution (ToolEvent.ref — a model may repeat call IDs): the stream being fed, and the
        # streams opened and not yet announced, in order (a void starts a new one)
        self.tool_stream: dict[str, _Stream] = {}
        self.tool_streams: dict[str, deque[_Stream]] = {}

    # --- inside the run ---------------------------------------------------------------------------

    def on_chunk(self, event: Event) -> None:
        data = event.data
        where = self.paths.resolve(event.node_path)
        current = self.model_stream.get(where.key)
        if isinstance(data, RetryNotice) and data.what == "model" and current is not None:
            current.close()  # what it streamed is void; the next attempt opens a new stream
        elif isinstance(data, StoredMessage):  # what is stored differs from what streamed: the last word is it
            if current is not None:
                current.close()
            stored = _Stream(opened_by=data)
            stored.put(data.message)
            stored.close()
            self.model_streams.append(stored)
        elif where.rest == ("model",) and isinstance(data, Message):
            if current is None or current.closed:
                current = self.model_stream[where.key] = _Stream(opened_by=data)
                self.model_streams.append(current)
            current.put(data)
        elif isinstance(data, ToolEvent) and self.streaming:
            self._feed_tool(data)

    def _feed_tool(self, data: ToolEvent) -> None:
        current = self.tool_stream.get(data.ref)
        if data.kind in ("stop", "void"):  # paused or failed; or what it streamed is void (a new stream follows)
            if current is not None:
                current.close()
            return
        if data.kind not in ("chunk", "end"):
            return
        if current is None or current.closed:
            current = self.tool_stream[data.ref] = _Stream(opened_by=data)
            self.tool_streams.setdefault(data.ref, deque()).append(current)
        if data.kind == "chunk":
            current.put(Message.tool(data.data, tool_call_id=data.call_id, name=data.name))
        else:
            if current.first is None:  # an invokable tool (or a voided stream's result): one chunk
                current.put(data.data)
            current.close()
            del self.tool_stream[data.ref]

    def on_interrupt(self, event: Event) -> None:
        if event.node_path == ():  # the run paused: nothing more comes for any open stream
            self.close_all()

    def on_end(self, event: Event) -> None:
        where = self.paths.resolve(event.node_path)
        current = self.model_stream.get(where.key)
        if where.rest == ("model",) and current is not None:
            current.close()

    def on_error(self, event: Event) -> None:
        self.close_all()

    def close_all(self) -> None:
        tools = [s for q in self.tool_streams.values() for s in q]
        for stream in (*self.model_stream.values(), *self.model_streams, *self.tool_stream.values(), *tools):
            stream.close()

    # --- in the consumer, in order ----------------------------------------------------------------

    def translate(self, event: Event) -> list[AgentEvent]:
        kind, path, data = event.kind, event.node_path, event.data
        if kind == "interrupt" and path == ():
            return [self._event(self.root, action=AgentAction(interrupted=data))]
        where = self.paths.resolve(path)
        if kind == "chunk" and isinstance(data, RetryNotice):
            return [self._event(where, action=AgentAction(retry=data))]
        if where.rest == ("model",):
            if kind == "chunk" and self.streaming and self.model_streams and data is self.model_streams[0].opened_by:
                return [self._event(where, output=AgentOutput(role="assistant", stream=self.model_streams.popleft()))]
            if kind == "end" and not self.streaming:
                return [self._event(where, output=AgentOutput(role="assistant", message=data))]
            return []
        if kind == "chunk" and isinstance(data, ToolEvent):
            return self._tool_event(where, data)
        if kind == "start" and where.via == "handoff" and where.rest == ():
            handing = self.paths.resolve(where.key[:-1])
            return [self._event(handing, action=AgentAction(transfer=where.run_path[-1]))]
        return []

    def _tool_event(self, where: Where, data: ToolEvent) -> list[AgentEvent]:
        out: list[AgentEvent] = []
        if data.kind == "decision":
            out.append(self._event(where, action=AgentAction(decision=data.data)))
        if data.kind == "start" and data.rerun:
            out.append(self._event(where, action=AgentAction(rerun=ToolRerun(
                name=data.name, call_id=data.call_id, idempotency_key=data.idempotency_key))))
        waiting = self.tool_streams.get(data.ref) if self.streaming else None
        if waiting and waiting[0].opened_by is data:  # at its first chunk (live), or at its end if it has none
            out.append(self._event(where, output=AgentOutput(role="tool", tool_name=data.name, stream=waiting.popleft())))
        elif data.kind == "end" and not self.streaming:
            out.append(self._event(where, output=AgentOutput(role="tool", tool_name=data.name, message=data.data)))
        return out

    @staticmethod
    def _event(where: Where, **fields: Any) -> AgentEvent:
        return AgentEvent(agent_name=where.run_path[-1], run_path=where.run_path, **fields)
