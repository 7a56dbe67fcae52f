"""`LoggingMiddleware`: one structured `logging` record per model call and per tool call, and one when an
agent run starts and ends. Each record carries, in `extra`: `agent`, `checkpoint_id`, `node` ("model" or
"tools"), `tool` and `call_id` for tools, `duration_ms`, and `outcome` ("ok", "error", "paused").

Tracing: `OTelTracing` (middleware/otel.py, the `[otel]` extra) has the same shape, plus graph callbacks for
a span per run and per node step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from waypoint.engine import AgentMiddleware, Interrupt, ToolContext

__all__ = ["LoggingMiddleware"]


class LoggingMiddleware(AgentMiddleware):
    """Log agent runs, model calls and tool calls to `logger` (default: the "waypoint.agent" logger)."""

    def __init__(self, logger: logging.Logger | None = None, *, level: int = logging.INFO) -> None:
        self.logger = logger or logging.getLogger("waypoint.agent")
        self.level = level

    def _log(self, message: str, **fields: Any) -> None:
        self.logger.log(self.level, message, extra=fields)

    async def before_agent(self, ctx: Any) -> None:
        self._log("agent run started", agent=ctx.agent_name, checkpoint_id=ctx.checkpoint_id, node="prompt")

    async def after_agent(self, ctx: Any) -> None:
        self._log("agent run answered", agent=ctx.agent_name, checkpoint_id=ctx.checkpoint_id, node="model",
                  messages=len(ctx.state.messages))

    def wrap_model(self, model: Any, ctx: Any) -> Any:
        return _LoggedModel(model, self, ctx)

    def wrap_invokable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        async def logged(arguments_json: str) -> str:
            started, outcome = time.perf_counter(), "error"
            try:
                result = await endpoint(arguments_json)
                outcome = "ok"
                return result
            except Interrupt:
                outcome = "paused"
                raise
            finally:
                self._tool(ctx, started, outcome)

        return logged

    def wrap_streamable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        def logged(arguments_json: str) -> AsyncIterator[str]:
            async def chunks() -> AsyncIterator[str]:
                started, outcome = time.perf_counter(), "error"
                try:
                    async for chunk in endpoint(arguments_json):
                        yield chunk
                    outcome = "ok"
                except Interrupt:
                    outcome = "paused"
                    raise
                finally:
                    self._tool(ctx, started, outcome)

            return chunks()

        return logged

    def _tool(self, ctx: ToolContext, started: float, outcome: str) -> None:
        self._log(f"tool call {ctx.name} {outcome}", checkpoint_id=ctx.checkpoint_id, node="tools", tool=ctx.name,
                  call_id=ctx.call_id, duration_ms=round((time.perf_counter() - started) * 1000, 3), outcome=outcome)


class _LoggedModel:
    def __init__(self, model: Any, log: LoggingMiddleware, ctx: Any) -> None:
        self.model, self.log, self.ctx = model, log, ctx
        self.name = getattr(model, "name", type(model).__name__)

    async def generate(self, messages: Any, **options: Any) -> Any:
        started, outcome = time.perf_counter(), "error"
        try:
            message = await self.model.generate(messages, **options)
            outcome = "ok"
            return message
        finally:
            self._done(started, outcome)

    async def stream(self, messages: Any, **options: Any) -> AsyncIterator[Any]:
        started, outcome = time.perf_counter(), "error"
        try:
            async for chunk in self.model.stream(messages, **options):
                yield chunk
            outcome = "ok"
        finally:
            self._done(started, outcome)

    def _done(self, started: float, outcome: str) -> None:
        self.log._log(f"model call {self.name} {outcome}", agent=self.ctx.agent_name,
                      checkpoint_id=self.ctx.checkpoint_id, node="model", model=self.name,
                      duration_ms=round((time.perf_counter() - started) * 1000, 3), outcome=outcome)
