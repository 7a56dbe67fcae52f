"""`ToolRetryMiddleware` and `ModelRetryMiddleware`: try a failed call again, with backoff and jitter,
when a predicate says the error is transient (by default: a retryable `ModelError` — HTTP 429, 5xx, a
timeout, a dropped connection — or a `TimeoutError` / `ConnectionError`). Each retry is announced
before it happens with a `RetryNotice` event (`AgentAction(retry=...)`): what the failed attempt
streamed is void. Pauses pass through; they are never retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from waypoint.engine import AgentMiddleware, ModelError, RetryNotice, RetryPolicy, ToolContext, emit_chunk
from waypoint.engine.run.task import start_over

__all__ = ["ToolRetryMiddleware", "ModelRetryMiddleware", "transient"]


def transient(err: BaseException) -> bool:
    """The default: errors worth trying again a moment later."""
    if isinstance(err, ModelError):
        return err.retryable
    return isinstance(err, (TimeoutError, ConnectionError))


class _Retrying:
    def __init__(self, policy: RetryPolicy | None, retry_on: Callable[[BaseException], bool] | None) -> None:
        self.policy = policy or RetryPolicy(max_attempts=3, initial_interval=0.5, max_interval=10.0)
        self.retry_on = retry_on or transient

    async def again(self, what: str, name: str, err: Exception, attempt: int) -> bool:
        """Announce and wait for the next attempt; False when `err` is final."""
        if attempt >= self.policy.max_attempts or not self.retry_on(err):
            return False
        delay = self.policy.delay(attempt)
        await emit_chunk(RetryNotice(what=what, name=name, attempt=attempt, error=f"{type(err).__name__}: {err}",
                                     delay=delay))
        await start_over()  # what the failed attempt produced is void: not stored, not run, not the result
        await asyncio.sleep(delay)
        return True


class ToolRetryMiddleware(AgentMiddleware):
    """Retry tool calls that fail with a transient error (`retry_on`), under `policy` (a `RetryPolicy`:
    attempts, backoff, jitter). A streamed call starts over; its earlier chunks are void."""

    def __init__(self, policy: RetryPolicy | None = None, *, retry_on: Callable[[BaseException], bool] | None = None,
                 tools: Sequence[str] | None = None) -> None:
        self._retry = _Retrying(policy, retry_on)
        self._tools = None if tools is None else frozenset(tools)

    def wrap_invokable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        if self._tools is not None and ctx.name not in self._tools:
            return endpoint

        async def retried(arguments_json: str) -> str:
            attempt = 1
            while True:
                try:
                    return await endpoint(arguments_json)
                except Exception as err:
                    if not await self._retry.again("tool", ctx.name, err, attempt):
                        raise
                    attempt += 1

        return retried

    def wrap_streamable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        if self._tools is not None and ctx.name not in self._tools:
            return endpoint

        def retried(arguments_json: str) -> AsyncIterator[str]:
            async def chunks() -> AsyncIterator[str]:
                attempt = 1
                while True:
                    try:
                        async for chunk in endpoint(arguments_json):
                            yield chunk
                        return
                    except Exception as err:
                        if not await self._retry.again("tool", ctx.name, err, attempt):
                            raise
                        attempt += 1

            return chunks()

        return retried


class ModelRetryMiddleware(AgentMiddleware):
    """Retry model calls that fail with a transient error (`ModelError.retryable` by default)."""

    def __init__(self, policy: RetryPolicy | None = None, *,
                 retry_on: Callable[[BaseException], bool] | None = None) -> None:
        self._retry = _Retrying(policy, retry_on)

    def wrap_model(self, model: Any, ctx: Any) -> Any:
        return _RetryingModel(model, self._retry)


class _RetryingModel:
    def __init__(self, model: Any, retry: _Retrying) -> None:
        self.model = model
        self.name = getattr(model, "name", type(model).__name__)
        self._retry = retry

    async def generate(self, messages: Any, **options: Any) -> Any:
        attempt = 1
        while True:
            try:
                return await self.model.generate(messages, **options)
            except Exception as err:
                if not await self._retry.again("model", self.name, err, attempt):
                    raise
                attempt += 1

    async def stream(self, messages: Any, **options: Any) -> AsyncIterator[Any]:
        attempt = 1
        while True:
            try:
                async for chunk in self.model.stream(messages, **options):
                    yield chunk
                return
            except Exception as err:
                if not await self._retry.again("model", self.name, err, attempt):
                    raise
                attempt += 1
