"""`OTelTracing`: OpenTelemetry spans for runs, node steps, model calls and tool calls (extra `[otel]`).

One object plays two parts: a graph callback handler (`callbacks=[tracing]`: a span per run and per node
step, for any graph) and an agent middleware (`middlewares=[tracing, ...]`: a span per model call and per
tool call, with the GenAI semantic conventions). Put it first among the middlewares, so its tool span
covers what the others do (an approval's pause, a retry's attempts).

    waypoint.run <graph>                 one per ainvoke / astream / aevents (a start or a resume);
    invoke_agent <agent>                   for an agent's graph (gen_ai.operation.name = "invoke_agent")
      waypoint.node <path>               one per node step (a subgraph's nodes nest under its node)
        chat <model>                     one per model call   (gen_ai.operation.name = "chat")
        execute_tool <tool>              one per tool call    (gen_ai.operation.name = "execute_tool")

GenAI attributes follow the OpenTelemetry GenAI semantic conventions (middleware/_genai.py says which);
messages are recorded in their `role` + `parts` format. A tool call whose result tells of a failure — an MCP
server's answer marked `isError` — is an error for the trace (status ERROR, `error.type`), though the model
reads it as a result: a tool says so in `ctx.extra["trace"]`, attributes for its span (`MCPTool` puts the MCP
conventions' there).

A resumed run's span *links* to the span of the run that wrote the version it continues from — days
later, in another process: `on_run_start` stores the run span's W3C trace context (`traceparent`) with
every version the run writes (`RunInfo.trace`, kept in the checkpoint header), and the resume reads it
back (`RunInfo.previous_trace`). docs/ecosystem.md shows the trace; docs/decisions.md says why a link.

What may hold secrets is not recorded unless `record_content=True`: message content (prompts, answers,
streamed tokens), tool arguments and results, error messages (a validation error quotes its input).
Token counts, names, IDs, versions and error types always are. Text that reaches an attribute is made
valid UTF-8 (a lone surrogate from a model would make an exporter drop the whole batch) and clipped.
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from waypoint.engine import AgentMiddleware, Interrupt, ToolContext
from waypoint.engine.run.task import collecting_attempts

from ._genai import input_messages, output_messages, server_of

__all__ = ["OTelTracing"]

_PROPAGATOR = TraceContextTextMapPropagator()  # W3C traceparent/tracestate only: never baggage
_SURROGATE = re.compile("[\ud800-\udfff]")
_NAME_LIMIT = 256
"""Characters kept of a name or ID that reaches an attribute (a model may send 100 kB of tool name)."""
_TOLD_LIMIT = 32
"""Attributes kept of what a tool tells its span (`ctx.extra["trace"]`)."""


def _safe(text: Any, limit: int = _NAME_LIMIT) -> str:
    """`text` as valid UTF-8 (lone surrogates become U+FFFD), at most `limit` characters."""
    text = text if isinstance(text, str) else str(text)
    if len(text) > limit:
        text = text[:limit - 1] + "…"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = _SURROGATE.sub("\ufffd", text)
    return text


@dataclass(eq=False)
class _RunSpans:
    """The spans of one run, kept in a context variable for the run's own tasks."""

    span: Any
    attached: Any
    graph: str = ""
    recording: bool = True
    """False when the run's trace was sampled out: its node spans are then not even created."""
    agent: bool = False
    """The graph is an agent's: the span is `invoke_agent <agent>`."""
    provider: str | None = None
    var_token: Any = None
    nodes: dict[tuple[str, ...], tuple[Any, Any]] = field(default_factory=dict)


class OTelTracing(AgentMiddleware):
    """Spans for runs and node steps (as a callback handler) and for model and tool calls (as a middleware).

    `tracer_provider` defaults to the global one (`opentelemetry.trace.set_tracer_provider`).
    `record_content=True` also records message content, tool arguments and results, and error messages,
    each clipped to `content_limit` characters. `node_spans=False` keeps the run, model and tool spans
    and drops the per-node ones (a span costs ~15 µs in the SDK: docs/performance.md).
    """

    def __init__(self, *, tracer_provider: Any = None, record_content: bool = False, node_spans: bool = True,
                 content_limit: int = 8192) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours = version("waypoint-graph")
        except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
            ours = None
        self.tracer = trace.get_tracer("waypoint", ours, tracer_provider=tracer_provider)
        self.record_content = record_content
        self.node_spans = node_spans
        self.content_limit = content_limit
        self._names: dict[tuple[str, ...], tuple[str, str]] = {}
        self._agents: set[str] = set()
        """Graphs seen running an agent: their next runs are `invoke_agent` spans from the start."""
        # The run being traced, as seen from its tasks (concurrent runs sharing this tracer each see their own).
        self._run: contextvars.ContextVar[_RunSpans | None] = contextvars.ContextVar(f"waypoint_otel_{id(self)}",
                                                                                     default=None)
        if not node_spans:  # no per-node hooks: the engine then builds no node events for this handler
            self.on_start = self.on_end = self.on_error = self.on_interrupt = None  # type: ignore[assignment]

    # --- runs (callback handler) -------------------------------------------------------------------

    def on_run_start(self, info: Any) -> None:
        links = []
        if info.previous_trace:
            previous = trace.get_current_span(_PROPAGATOR.extract(info.previous_trace)).get_span_context()
            if previous.is_valid:
                links.append(Link(previous, {"waypoint.link.type": "resumed_from",
                                             "waypoint.checkpoint.version": info.resumed_from or 0}))
        attributes: dict[str, Any] = {"waypoint.graph.name": _safe(info.graph), "waypoint.run.resumed": info.resumed}
        if info.checkpoint_id is not None:
            attributes["waypoint.checkpoint.id"] = _safe(info.checkpoint_id)
        if info.resumed_from is not None:
            attributes["waypoint.run.resumed_from"] = info.resumed_from
        if info.resume_ids:
            attributes["waypoint.resume.ids"] = [_safe(i) for i in info.resume_ids]
        agent = info.graph in self._agents
        if agent:
            attributes.update(_agent_attributes(info.graph))
        name = f"{'invoke_agent' if agent else 'waypoint.run'} {_safe(info.graph, 64)}"
        span = self.tracer.start_span(name, links=links, attributes=attributes)
        current = trace.set_span_in_context(span)
        if info.checkpoint_id is not None:
            _PROPAGATOR.inject(info.trace, context=current)  # stored with every version this run writes
        state = _RunSpans(span=span, attached=otel_context.attach(current), graph=info.graph,
                          recording=span.is_recording(), agent=agent)
        state.var_token = self._run.set(state)

    def _agent_runs(self, agent: str, provider: str | None = None) -> None:
        """An agent's hook ran: when the run is that agent's own (its graph carries the agent's name; a handoff
        or an agent used as a tool is not), its span is `invoke_agent <agent>` — renamed now on the first run
        of that graph in this process, named so from the start after."""
        state = self._run.get()
        if state is None or state.graph != agent:
            return
        if not state.agent:
            state.agent = True
            if len(self._agents) > 4096:
                self._agents.clear()
            self._agents.add(agent)
            state.span.update_name(f"invoke_agent {_safe(agent, 64)}")
            state.span.set_attributes(_agent_attributes(agent))
        if provider and state.provider is None:
            state.provider = provider
            state.span.set_attribute("gen_ai.provider.name", provider)

    def on_run_end(self, info: Any) -> None:
        state = self._run.get()
        if state is None:
            return
        for path, (span, _) in list(state.nodes.items()):  # no end event: cancelled, or a subgraph paused
            span.set_attribute("waypoint.node.outcome", "paused" if info.status == "interrupted" else "stopped")
            span.end()
        state.nodes.clear()
        span = state.span
        span.set_attribute("waypoint.run.status", info.status or "unknown")
        if info.version is not None:
            span.set_attribute("waypoint.checkpoint.version", info.version)
        if info.interrupts is not None:
            span.set_attribute("waypoint.interrupt.ids", [_safe(c.id) for c in info.interrupts.contexts])
        if info.error is not None:
            self._failed(span, info.error)
        otel_context.detach(state.attached)
        self._run.reset(state.var_token)
        span.end()

    # --- node steps (callback handler) -------------------------------------------------------------

    def on_start(self, event: Any) -> None:
        state = self._run.get()
        if state is None or not state.recording:  # node spans follow the run's sampling decision
            return
        path = event.node_path
        names = self._names.get(path)
        if names is None:  # node paths come from the graph: a handful per graph, formatted once
            if len(self._names) > 4096:
                self._names.clear()
            joined = "/".join(path)
            names = self._names[path] = (f"waypoint.node {_safe(joined, 128)}", _safe(joined))
        span = self.tracer.start_span(names[0], attributes={"waypoint.node.path": names[1],
                                                            "waypoint.step": event.step})
        state.nodes[path] = (span, otel_context.attach(trace.set_span_in_context(span)))

    def _node_done(self, event: Any) -> Any:
        state = self._run.get()
        entry = state.nodes.pop(event.node_path, None) if state is not None else None
        if entry is None:
            return None
        otel_context.detach(entry[1])
        return entry[0]

    def on_end(self, event: Any) -> None:
        span = self._node_done(event)
        if span is not None:
            span.end()

    def on_error(self, event: Any) -> None:
        span = self._node_done(event)
        if span is not None:
            self._failed(span, event.data)
            span.end()

    def on_interrupt(self, event: Any) -> None:
        if not event.node_path:  # the run paused: on_run_end records the pending interrupt IDs
            return
        span = self._node_done(event)
        if span is not None:
            span.set_attribute("waypoint.node.outcome", "paused")
            span.end()

    # --- model and tool calls (middleware) -----------------------------------------------------------

    async def before_agent(self, ctx: Any) -> None:
        self._agent_runs(ctx.agent_name)

    def wrap_model(self, model: Any, ctx: Any) -> Any:
        traced = _TracedModel(model, self, ctx)
        self._agent_runs(ctx.agent_name, traced.provider)
        return traced

    def wrap_invokable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        async def traced(arguments_json: str) -> str:
            span = self.tracer.start_span(f"execute_tool {_safe(ctx.name, 64)}", attributes=self._tool_attributes(ctx))
            with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
                self._content(span, "gen_ai.tool.call.arguments", arguments_json)
                try:
                    result = await endpoint(arguments_json)
                except Interrupt:
                    span.set_attribute("waypoint.tool.outcome", "paused")
                    raise
                except BaseException as err:
                    self._told(span, ctx)
                    span.set_attribute("waypoint.tool.outcome", "error")
                    self._failed(span, err)
                    raise
                self._answered_tool(span, ctx)
                self._content(span, "gen_ai.tool.call.result", result)
                return result

        return traced

    def wrap_streamable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        def traced(arguments_json: str) -> AsyncIterator[str]:
            span = self.tracer.start_span(f"execute_tool {_safe(ctx.name, 64)}", attributes=self._tool_attributes(ctx))
            self._content(span, "gen_ai.tool.call.arguments", arguments_json)
            return self._spanned(span, endpoint(arguments_json), ctx)

        return traced

    def _told(self, span: Any, ctx: ToolContext) -> str | None:
        """Put on `span` what the tool told it (`ctx.extra["trace"]`: names and values kept to what an
        attribute takes); the `error.type` it gave, if any."""
        told = ctx.extra.get("trace") if isinstance(ctx.extra, dict) else None
        if not isinstance(told, dict):
            return None
        for key, value in list(told.items())[:_TOLD_LIMIT]:
            if isinstance(key, str) and isinstance(value, (bool, int, float, str)):
                span.set_attribute(_safe(key, 64), _safe(value) if isinstance(value, str) else value)
        error = told.get("error.type")
        return _safe(error, 64) if isinstance(error, str) and error else None

    def _answered_tool(self, span: Any, ctx: ToolContext) -> None:
        """A call that returned: `ok`, or `error` when the tool said its result tells of a failure."""
        error = self._told(span, ctx)
        span.set_attribute("waypoint.tool.outcome", "ok" if error is None else "error")
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))

    def _tool_attributes(self, ctx: ToolContext) -> dict[str, Any]:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": _safe(ctx.name),
                      "gen_ai.tool.call.id": _safe(ctx.call_id), "gen_ai.tool.type": "function",
                      "waypoint.tool.idempotency_key": ctx.idempotency_key, "waypoint.tool.rerun": ctx.rerun,
                      "waypoint.tool.resumed": ctx.resumed}
        if ctx.checkpoint_id is not None:
            attributes["waypoint.checkpoint.id"] = _safe(ctx.checkpoint_id)
        return attributes

    async def _spanned(self, span: Any, chunks: AsyncIterator[Any], ctx: ToolContext) -> AsyncIterator[Any]:
        """Yield a streaming tool's `chunks`, each pulled with `span` current (so calls made meanwhile nest under
        it); end it."""
        seen: list[Any] = []
        iterator = chunks.__aiter__()
        attempts = None
        try:
            with collecting_attempts() as attempts:  # a retry inside voids what earlier attempts produced
                while True:
                    with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                        try:
                            chunk = await iterator.__anext__()
                        except StopAsyncIteration:
                            break
                    if self.record_content:
                        seen.append((attempts.number, chunk))
                    yield chunk
        except Interrupt:
            span.set_attribute("waypoint.tool.outcome", "paused")
            raise
        except GeneratorExit:  # the consumer stopped reading: not an error of the call
            span.set_attribute("waypoint.tool.outcome", "stopped")
            raise
        except BaseException as err:
            self._told(span, ctx)
            span.set_attribute("waypoint.tool.outcome", "error")
            self._failed(span, err)
            raise
        else:
            self._answered_tool(span, ctx)
            last = [chunk for n, chunk in seen if attempts is not None and n == attempts.number]
            if last and isinstance(last[0], str):
                self._content(span, "gen_ai.tool.call.result", "".join(last))
        finally:
            span.end()

    # --- shared --------------------------------------------------------------------------------------

    def _content(self, span: Any, key: str, text: Any) -> None:
        if self.record_content and text is not None:
            span.set_attribute(key, _safe(text, self.content_limit))

    def _failed(self, span: Any, err: BaseException) -> None:
        """Status ERROR; the error's type always, its message only with `record_content`."""
        kind = type(err).__name__
        span.set_attribute("error.type", kind)
        status = getattr(err, "status", None)
        if isinstance(status, int):
            span.set_attribute("http.response.status_code", status)
        retryable = getattr(err, "retryable", None)
        if isinstance(retryable, bool):
            span.set_attribute("waypoint.error.retryable", retryable)
        if self.record_content:
            span.set_status(Status(StatusCode.ERROR, _safe(f"{kind}: {err}", self.content_limit)))
            span.record_exception(err)
        else:
            span.set_status(Status(StatusCode.ERROR, kind))


def _provider(model: Any) -> str | None:
    """The provider of a model, looking through middleware wrappers (which keep the wrapped one in `.model`)."""
    for _ in range(16):
        provider = getattr(model, "provider", None)
        if isinstance(provider, str):
            return provider
        inner = getattr(model, "model", None)
        if inner is None or isinstance(inner, str):
            return None
        model = inner
    return None


class _TracedModel:
    """A `ChatModel` whose calls are `chat <model>` spans (GenAI conventions)."""

    def __init__(self, model: Any, tracing: OTelTracing, ctx: Any) -> None:
        self.model = model
        self.tracing = tracing
        self.name = getattr(model, "name", type(model).__name__)
        self.provider = _provider(model)
        self.server = server_of(model)
        self.ctx = ctx

    def _start(self, messages: Sequence[Any]) -> Any:
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": _safe(self.name),
                                      "waypoint.agent.name": _safe(self.ctx.agent_name)}
        if self.provider:
            attributes["gen_ai.provider.name"] = self.provider
        if self.server is not None:
            attributes["server.address"], attributes["server.port"] = _safe(self.server[0]), self.server[1]
        if self.ctx.checkpoint_id is not None:
            attributes["waypoint.checkpoint.id"] = _safe(self.ctx.checkpoint_id)
        span = self.tracing.tracer.start_span(f"chat {_safe(self.name, 64)}", kind=SpanKind.CLIENT,
                                              attributes=attributes)
        if self.tracing.record_content:
            self.tracing._content(span, "gen_ai.input.messages", _json(input_messages(messages)))
        return span

    def _answered(self, span: Any, message: Any) -> None:
        usage = getattr(message, "usage", None)
        if usage is not None:
            span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
        if getattr(message, "finish_reason", None):
            span.set_attribute("gen_ai.response.finish_reasons", [_safe(message.finish_reason, 64)])
        for key, field_name in (("gen_ai.response.id", "response_id"), ("gen_ai.response.model", "response_model")):
            value = getattr(message, field_name, None)
            if isinstance(value, str) and value:
                span.set_attribute(key, _safe(value))
        if self.tracing.record_content:
            self.tracing._content(span, "gen_ai.output.messages", _json(output_messages(message)))

    async def generate(self, messages: Sequence[Any], **options: Any) -> Any:
        span = self._start(messages)
        with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
            try:
                message = await self.model.generate(messages, **options)
            except BaseException as err:
                self.tracing._failed(span, err)
                raise
            self._answered(span, message)
            return message

    def stream(self, messages: Sequence[Any], **options: Any) -> AsyncIterator[Any]:
        span = self._start(messages)
        return _ModelStream(self, span).run(self.model.stream(messages, **options))


class _ModelStream:
    """Ends a model's span with the usage and finish reason of the joined chunks."""

    def __init__(self, traced: _TracedModel, span: Any) -> None:
        self.traced, self.span = traced, span

    async def run(self, chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
        from waypoint.engine.models import concat_messages

        tracing = self.traced.tracing
        collected: list[Any] = []
        iterator = chunks.__aiter__()
        span = self.span
        attempts = None
        try:
            with collecting_attempts() as attempts:  # a retry inside voids what earlier attempts produced
                while True:
                    with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                        try:
                            chunk = await iterator.__anext__()
                        except StopAsyncIteration:
                            break
                    collected.append((attempts.number, chunk))
                    yield chunk
        except GeneratorExit:
            raise
        except BaseException as err:
            tracing._failed(span, err)
            raise
        else:
            last = [chunk for n, chunk in collected if attempts is not None and n == attempts.number]
            if last:
                self.traced._answered(span, concat_messages(last))
        finally:
            span.end()


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _agent_attributes(agent: str) -> dict[str, Any]:
    return {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": _safe(agent)}
