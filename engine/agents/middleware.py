"""The hook protocol of agent middleware (implementations live in `waypoint.middleware`).

Subclass `AgentMiddleware` and override what you need; every hook is a no-op by default. In a list of
middlewares the first is the outermost: its `wrap_*` sees the call first and the result last. Hooks run
inside the agent's graph boxes, so what they change in the state is checkpointed like any state change.
Interrupt signals raised below a middleware pass through it untouched (they are `BaseException`s).

- `before_agent(ctx)` / `after_agent(ctx)`: once when a run starts (the prompt box) / ends with an answer.
- `prepare_model(ctx)`: before a model call, in a step of its own (the `prepare` box, which the agent's graph
  has only when one of its middlewares overrides this hook): work worth keeping apart from the call — what it
  sets in `ctx.state` is checkpointed before the model is asked, so a crash after it never does it again
  (`CompactionMiddleware`'s summary call). `ctx.model` is the agent's model, `ctx.wrapped(model)` puts the
  agent's `wrap_model` layers (retries, logging, tracing) around a model it calls. `needs_prepare(ctx) -> bool`
  (sync; True by default) says before each model call whether there is work for it: the step is taken only then.
- `before_model(ctx)`: before each model call; may rewrite `ctx.state.messages`.
- `after_model(ctx, message)`: after each model call; may return a rewritten message.
- `wrap_model(model, ctx)`: return a `ChatModel` that wraps `model` (retries, logging).
- `wrap_invokable_tool_call(endpoint, ctx)`: `endpoint` is `async (args_json) -> str`.
- `wrap_streamable_tool_call(endpoint, ctx)`: `endpoint` is `(args_json) -> AsyncIterator[str]`.
- `check_tools(tools, where)`: once, when an agent (or a `ToolsNode`) is built with the middleware, with the
  names of its tools: raise `GraphBuildError` for a configuration that could not do its job with them (a
  guard that names no tool of the agent guards nothing) — refused when it is built, never found out later.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..models.base import ChatModel
from ..models.schema import Message
from ..tools.tool import ToolContext

__all__ = ["AgentMiddleware", "AgentContext", "RetryNotice", "StoredMessage", "InvokableEndpoint",
           "StreamableEndpoint", "prepares_model"]

InvokableEndpoint = Callable[[str], Awaitable[str]]
StreamableEndpoint = Callable[[str], AsyncIterator[str]]


@dataclass(kw_only=True)
class AgentContext:
    """What an agent hook sees: the agent, its run-local state (`state.messages`), the stored run."""

    agent_name: str
    state: Any
    checkpoint_id: str | None = None
    model: ChatModel | None = None
    """The agent's own model (set in `prepare_model`)."""
    wrapped: Callable[[ChatModel], ChatModel] | None = None
    """`model` -> `model` inside the agent's `wrap_model` layers, as its model box calls its own (in `prepare_model`)."""


@dataclass(frozen=True)
class StoredMessage:
    """Published (`emit_chunk`) by the model box when the message it stores differs from the chunks it
    streamed (call IDs the agent replaced, an `after_model` rewrite): a streaming consumer's last output for
    the call is then this message, so what it ends with is what was stored."""

    message: Message


@dataclass(frozen=True, kw_only=True)
class RetryNotice:
    """Published (`emit_chunk`) by a retry middleware before it tries a model or tool call again; what
    that attempt streamed is void. The `Runner` reports it as `AgentAction(retry=...)`."""

    what: str
    """"model" or "tool"."""
    name: str
    attempt: int
    """The attempt that failed (1 = the first call)."""
    error: str
    delay: float


class AgentMiddleware:
    """Base class with no-op hooks; see the module docstring for when each runs."""

    async def before_agent(self, ctx: AgentContext) -> None:
        return None

    async def after_agent(self, ctx: AgentContext) -> None:
        return None

    async def prepare_model(self, ctx: AgentContext) -> None:
        return None

    def needs_prepare(self, ctx: AgentContext) -> bool:
        return True

    async def before_model(self, ctx: AgentContext) -> None:
        return None

    async def after_model(self, ctx: AgentContext, message: Message) -> Message | None:
        return None

    def wrap_model(self, model: ChatModel, ctx: AgentContext) -> ChatModel:
        return model

    def wrap_invokable_tool_call(self, endpoint: InvokableEndpoint, ctx: ToolContext) -> InvokableEndpoint:
        return endpoint

    def wrap_streamable_tool_call(self, endpoint: StreamableEndpoint, ctx: ToolContext) -> StreamableEndpoint:
        return endpoint

    def check_tools(self, tools: Sequence[str], where: str) -> None:
        return None


def prepares_model(mw: Any) -> bool:
    """Whether `mw` has a `prepare_model` hook of its own (the base class's no-op is none): then its agent's graph
    has the `prepare` box, and agents without one keep their graph (and so their stored runs' fingerprint)."""
    hook = getattr(type(mw), "prepare_model", None)
    return callable(hook) and hook is not AgentMiddleware.prepare_model
