"""`CompactionMiddleware`: past a budget, the model is sent a summary in place of the conversation's older turns
(what Eino's summarization middleware, LangChain's SummarizationMiddleware and ADK's events compaction do).

Before each model call the agent asks it whether what the model would be sent is over the budget:

1. Measured in tokens by the model's own count when `max_tokens` is set and the latest answer reported one
   (`Usage.prompt_tokens + completion_tokens`, plus ~4 characters a token for the messages after it); in
   characters otherwise (`max_chars`; with only `max_tokens` set, characters / 4).
2. Over it, and with something it may cut off, the agent takes its `prepare` step (a step of its own, checkpointed
   like any other): the summarizer — the agent's own model by default, inside the agent's `wrap_model` layers — is
   asked, with `instruction`, for one summary of the last summary plus the messages newly cut off. It becomes
   `AgentState.compaction`; every model call after it sends it (engine/agents/summary.py, `model_view`).

Where it cuts (tests/test_compaction.py checks each):
- never before the system messages (sent first, as they are), never inside the last `keep_last` messages;
- never between a model message asking for tools and its results — by position: the results follow their call,
  whatever IDs the model wrote — nor at or after a call with no result yet (a pause, an unanswered request);
- never before where the last summary ends: a summary folds the one before it in, so they never nest.

`AgentState.messages` keeps every message: time travel, `runs history` and a chat's next turn see them all. A
failed or empty summary call fails the step as a failed model call does (resume the run to try again); the model
is never sent the whole conversation instead without a word.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from waypoint.engine import AgentMiddleware, GraphBuildError, Message, ModelError
from waypoint.engine.agents import Compaction, model_view

__all__ = ["CompactionMiddleware", "DEFAULT_INSTRUCTION", "cut_point", "transcript"]

log = logging.getLogger("waypoint.agent")

CHARS_PER_TOKEN = 4
"""The estimate for text no model has counted yet (English prose is ~4 characters a token)."""

DEFAULT_INSTRUCTION = (
    "You compact a conversation between a user and an assistant that uses tools. Write a summary the assistant "
    "can continue from without the messages it replaces: the user's goals and requests, decisions and their "
    "reasons, facts learned, each tool called with what it returned (keep names, IDs, numbers, paths and errors "
    "exactly), and what is still to do. If it starts with an earlier summary, fold that in. Write only the summary.")


class CompactionMiddleware(AgentMiddleware):
    """Send the model a summary in place of the older turns once the conversation is over a budget.

    `summarizer`: the model that writes summaries (None: the agent's own). `max_tokens` / `max_chars`: the budget
    (at least one; tokens when the model counts them, characters otherwise — module docstring). `keep_last`: the
    most recent messages, always sent as they are (at least 1). `instruction`: the summary call's system prompt.
    Raises `GraphBuildError` for a setting that cannot work, saying which and what to pass instead.
    """

    def __init__(self, summarizer: Any = None, *, max_tokens: int | None = None, max_chars: int | None = None,
                 keep_last: int = 6, instruction: str = DEFAULT_INSTRUCTION) -> None:
        _check(summarizer, max_tokens, max_chars, keep_last, instruction)
        self.summarizer = summarizer
        self.max_tokens = max_tokens
        self.max_chars = max_chars
        self.keep_last = keep_last
        self.instruction = instruction

    def __repr__(self) -> str:
        return (f"CompactionMiddleware(max_tokens={self.max_tokens}, max_chars={self.max_chars}, "
                f"keep_last={self.keep_last})")

    def needs_prepare(self, ctx: Any) -> bool:
        return self._plan(ctx) is not None

    async def prepare_model(self, ctx: Any) -> None:
        plan = self._plan(ctx)
        if plan is None:
            return
        state = ctx.state
        start, cut = plan
        before = state.compaction
        summary = await self._summarize(ctx, before.summary if before else None, state.messages[start:cut])
        low = before.covers if before else 0  # the system messages newly covered are sent as they are
        kept = (*(before.kept if before else ()), *(i for i in range(low, cut) if state.messages[i].role == "system"))
        state.compaction = Compaction(summary=summary, covers=cut, made_at=len(state.messages),
                                      count=(before.count if before else 0) + 1, kept=tuple(kept))
        log.info("run '%s': agent '%s' summarized messages %d-%d of %d (summary %d of this run, %d characters)",
                 ctx.checkpoint_id, ctx.agent_name, start, cut - 1, len(state.messages), state.compaction.count,
                 len(summary), extra={"agent": ctx.agent_name, "checkpoint_id": ctx.checkpoint_id, "node": "prepare"})
        measure, amount, limit = self.measure(state.messages, state.compaction)
        if amount > limit:
            self._still_over(ctx, measure, amount, limit)

    # --- deciding -----------------------------------------------------------------------------------

    def measure(self, messages: Sequence[Message], compaction: Compaction | None) -> tuple[str, int, int]:
        """(what is measured, how much the model would be sent, the budget): "tokens" by the model's count,
        "characters", or "tokens (estimated)" (characters / 4, when only `max_tokens` is set and nothing counted)."""
        if self.max_tokens is not None:
            counted = counted_tokens(messages, compaction)
            if counted is not None:
                return "tokens", counted, self.max_tokens
        sent = sum(chars(m) for m in model_view(messages, compaction))
        if self.max_chars is not None:
            return "characters", sent, self.max_chars
        return "tokens (estimated)", -(-sent // CHARS_PER_TOKEN), self.max_tokens or 0

    def _plan(self, ctx: Any) -> tuple[int, int] | None:
        """(start, cut): summarize `messages[start:cut]` (with the last summary) now; None when under the budget
        or when nothing more may be cut off."""
        state = ctx.state
        messages, compaction = state.messages, getattr(state, "compaction", None)
        measure, amount, limit = self.measure(messages, compaction)
        if amount <= limit:
            return None
        start = _start(messages, compaction)
        cut = cut_point(messages, start, self.keep_last)
        if cut is None:
            self._still_over(ctx, measure, amount, limit)
            return None
        return start, cut

    def _still_over(self, ctx: Any, measure: str, amount: int, limit: int) -> None:
        log.warning("run '%s': agent '%s' sends its model %d %s, over its budget of %d, and nothing more may be "
                    "summarized (the last keep_last=%d messages, or a tool call waiting for its result); lower "
                    "keep_last or raise the budget", ctx.checkpoint_id, ctx.agent_name, amount, measure, limit,
                    self.keep_last, extra={"agent": ctx.agent_name, "checkpoint_id": ctx.checkpoint_id})

    # --- the summary call ---------------------------------------------------------------------------

    async def _summarize(self, ctx: Any, previous: str | None, messages: Sequence[Message]) -> str:
        model = self.summarizer if self.summarizer is not None else ctx.model
        name = getattr(model, "name", type(model).__name__)
        if ctx.wrapped is not None:  # the agent's retries, logging and tracing cover this call too
            model = ctx.wrapped(model)
        request = [Message.system(self.instruction), Message.user(transcript(previous, messages))]
        reply = await model.generate(request, tools=None, tool_choice="none")
        text = reply.content.strip() if isinstance(reply, Message) else ""
        if not text:
            raise ModelError(f"agent '{ctx.agent_name}' (run '{ctx.checkpoint_id}'): the summary call to model "
                             f"'{name}' returned no text, so the conversation was not compacted and the model was "
                             "not asked; resume the run to try again, or give CompactionMiddleware another "
                             "summarizer", model=name)
        return text


def counted_tokens(messages: Sequence[Message], compaction: Compaction | None) -> int | None:
    """The model's own count of what it was last sent and answered, plus an estimate for what came after; None when
    no answer since the last summary reported one (a count from before it measured the messages it replaced)."""
    since = compaction.made_at if compaction is not None else 0
    for j in range(len(messages) - 1, since - 1, -1):
        usage = messages[j].usage
        if messages[j].role == "assistant" and usage is not None and usage.prompt_tokens > 0:
            after = sum(chars(m) for m in messages[j + 1:])
            return usage.prompt_tokens + max(usage.completion_tokens, 0) + -(-after // CHARS_PER_TOKEN)
    return None


def chars(message: Message) -> int:
    """The characters of a message a model reads: its text, its calls, its reasoning."""
    return (len(message.content) + sum(len(c.name) + len(c.arguments) for c in message.tool_calls)
            + sum(len(r.text) + len(r.data) for r in message.reasoning))


def _start(messages: Sequence[Message], compaction: Compaction | None) -> int:
    """Where the next summary's new messages begin: after the last summary's, or after the leading system ones."""
    start = 0
    while start < len(messages) and messages[start].role == "system":
        start += 1
    if compaction is not None:
        start = max(start, min(compaction.covers, len(messages)))
    return start


def cut_point(messages: Sequence[Message], start: int, keep_last: int) -> int | None:
    """The latest `cut` (> `start`) at which the messages before it may be summarized: the last `keep_last` stay,
    no tool result is cut from its call, and no call without its results (nor anything after it) is summarized.
    None when there is none, or only system messages would be summarized."""
    limit = min(len(messages) - keep_last, _first_open(messages, start))
    for cut in range(limit, start, -1):
        if messages[cut].role != "tool":
            break
    else:
        return None
    if all(m.role == "system" for m in messages[start:cut]):
        return None
    return cut


def _first_open(messages: Sequence[Message], start: int) -> int:
    """The index of the first model message from `start` on whose tool calls do not all have results after it
    (counted by position: a tools step appends one result per call, in order), or `len(messages)`."""
    i, n = start, len(messages)
    while i < n:
        m = messages[i]
        i += 1
        if m.role == "assistant" and m.tool_calls:
            results = i
            while results < n and messages[results].role == "tool":
                results += 1
            if results - i < len(m.tool_calls):
                return i - 1
            i = results
    return n


def transcript(previous: str | None, messages: Sequence[Message]) -> str:
    """The text the summarizer reads: the last summary, then each message with who wrote it (system messages
    are left out: they are sent anyway). Model output is only text here; no ID or name in it is trusted."""
    parts = [f"[earlier summary]\n{previous}"] if previous else []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            parts.append(f"[tool result: {m.name or 'tool'}]\n{m.content}")
            continue
        if m.content or not m.tool_calls:
            parts.append(f"[{m.role}]\n{m.content}")
        parts += [f"[{m.role} calls tool {c.name}]\n{c.arguments}" for c in m.tool_calls]
    return "\n\n".join(parts)


def _check(summarizer: Any, max_tokens: Any, max_chars: Any, keep_last: Any, instruction: Any) -> None:
    for name, value in (("max_tokens", max_tokens), ("max_chars", max_chars)):
        if value is not None and (type(value) is not int or value < 1):
            raise GraphBuildError(f"CompactionMiddleware: {name}={value!r} is not a budget; pass a whole number of "
                                  f"{name[4:]} of at least 1, or leave it out")
    if max_tokens is None and max_chars is None:
        raise GraphBuildError("CompactionMiddleware has no budget: pass max_tokens= (by the model's count), "
                              "max_chars= (when the model gives none), or both")
    if type(keep_last) is not int or keep_last < 1:
        raise GraphBuildError(f"CompactionMiddleware: keep_last={keep_last!r}; pass a whole number of at least 1 "
                              "(the latest message is always sent as it is)")
    if not isinstance(instruction, str) or not instruction.strip():
        raise GraphBuildError("CompactionMiddleware: instruction= must be the summary call's prompt (text)")
    if summarizer is not None and not callable(getattr(summarizer, "generate", None)):
        raise GraphBuildError(f"CompactionMiddleware: summarizer={summarizer!r} is not a chat model (it has no "
                              "generate()); pass a ChatModel, or None for the agent's own model")
