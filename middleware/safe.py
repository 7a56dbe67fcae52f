"""`SafeToolMiddleware`: a tool's error becomes its result (`[tool error] <error>`), so the model can
react instead of the run failing. An error in the middle of a stream becomes the stream's last chunk.
Pauses (interrupts), `RetryAgentRun` and `StopAgentRun` pass through untouched, and so do the signals that stop
the run itself from inside a nested agent's run (`LeaseLost`, `ProcessStopping`, `RunCancelled`): they are not the
tool's error for the model to read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from waypoint.engine import (
    AgentMiddleware,
    LeaseLost,
    ProcessStopping,
    RetryAgentRun,
    RunCancelled,
    StopAgentRun,
    ToolContext,
)

__all__ = ["SafeToolMiddleware"]

_CONTROL = (RetryAgentRun, StopAgentRun, LeaseLost, ProcessStopping, RunCancelled)


class SafeToolMiddleware(AgentMiddleware):
    """Turn tool errors into results the model reads; interrupts and the agent-run signals pass."""

    def wrap_invokable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        async def safe(arguments_json: str) -> str:
            try:
                return await endpoint(arguments_json)
            except _CONTROL:
                raise
            except Exception as err:  # an Interrupt is a BaseException: it is not caught here
                return f"[tool error] {err}"

        return safe

    def wrap_streamable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        def safe(arguments_json: str) -> AsyncIterator[str]:
            async def chunks() -> AsyncIterator[str]:
                produced = False
                try:
                    async for chunk in endpoint(arguments_json):
                        produced = True
                        yield chunk
                except _CONTROL:
                    raise
                except Exception as err:
                    yield ("\n" if produced else "") + f"[tool error] {err}"

            return chunks()

        return safe
