"""Waypoint messages to and from Anthropic's messages API (pure functions, no I/O, no SDK import).

Where the wire formats differ from chat completions:

- system messages are one top-level `system` text, not messages;
- an assistant turn is a list of content blocks: its `thinking` / `redacted_thinking` blocks (kept as the
  message's `reasoning`, returned unchanged: the API requires them with tool use), `text`, then one
  `tool_use` block per call, whose `input` is a JSON object (the call's arguments parsed; arguments that are
  not a JSON object, or cannot be sent as one — nested deeper than `MAX_INPUT_DEPTH`, NaN, Infinity: a
  model's earlier mistake, already answered with an error — are sent as `{}`);
- tool results are `tool_result` blocks in a *user* turn; the results of one batch share that turn;
- a streamed answer is a sequence of events (message_start, content_block_start/delta/stop,
  message_delta, message_stop) in which a tool call's arguments arrive as `input_json_delta` fragments;
- finish reasons (`stop_reason`) are mapped to the chat-completions words the rest of Waypoint uses.

Responses are read by attribute from the SDK's objects, so these functions work on any object of that shape;
one they cannot read raises (the model reports a `ModelError`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from waypoint.engine.models.base import ToolChoice
from waypoint.engine.models.schema import Message, Reasoning, ToolCall, ToolInfo, Usage

from ._outgoing import depth

__all__ = ["request", "message_from_response", "StreamReader", "FINISH", "MAX_INPUT_DEPTH"]

MAX_INPUT_DEPTH = 128
"""A `tool_use` input nested deeper than this is sent as `{}` (the model's arguments were unusable anyway)."""
_PROVIDER = "anthropic"

FINISH = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
          "pause_turn": "pause_turn", "refusal": "content_filter"}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object of its `tool_use` block: `{}` when they cannot be one."""
    try:
        value = json.loads(arguments, parse_constant=_no_constant) if arguments and arguments.strip() else {}
    except (ValueError, RecursionError):  # invalid JSON, NaN, a number too long, or nested past Python's limit
        return {}
    if not isinstance(value, dict) or depth(value, MAX_INPUT_DEPTH) > MAX_INPUT_DEPTH:
        return {}
    return value


def _thinking(reasoning: Sequence[Reasoning]) -> list[dict[str, Any]]:
    """The thinking blocks of an assistant turn, as Anthropic returned them (other providers' are left out)."""
    blocks: list[dict[str, Any]] = []
    for r in reasoning:
        if r.provider != _PROVIDER:
            continue
        if r.kind == "redacted_thinking":
            blocks.append({"type": "redacted_thinking", "data": r.data})
        else:
            blocks.append({"type": r.kind, "thinking": r.text, "signature": r.signature})
    return blocks


def _assistant(message: Message) -> dict[str, Any]:
    thinking = _thinking(message.reasoning)
    if not message.tool_calls and not thinking:
        return {"role": "assistant", "content": message.content}
    blocks = thinking + ([{"type": "text", "text": message.content}] if message.content else [])
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)}
               for c in message.tool_calls]
    return {"role": "assistant", "content": blocks}


def request(messages: Sequence[Message], tools: Sequence[ToolInfo] | None, tool_choice: ToolChoice) -> dict[str, Any]:
    """`system`, `messages`, and (when tools are offered) `tools` and `tool_choice` of a messages request."""
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    wire: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.tool_call_id or "", "content": m.content}
            last = wire[-1] if wire else None
            if last is not None and last["role"] == "user" and isinstance(last["content"], list) \
                    and all(b.get("type") == "tool_result" for b in last["content"]):
                last["content"].append(block)  # one batch's results: one user turn
            else:
                wire.append({"role": "user", "content": [block]})
        elif m.role == "assistant":
            wire.append(_assistant(m))
        else:
            wire.append({"role": "user", "content": m.content})
    out: dict[str, Any] = {"messages": wire}
    if system:
        out["system"] = system
    if tools:
        out["tools"] = [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]
        out["tool_choice"] = _choice(tool_choice)
    return out


def _choice(tool_choice: ToolChoice) -> dict[str, Any]:
    if tool_choice == "auto":
        return {"type": "auto"}
    if tool_choice == "required":
        return {"type": "any"}
    if tool_choice == "none":
        return {"type": "none"}
    return {"type": "tool", "name": tool_choice}


def _usage(raw: Any, output_tokens: int | None = None) -> Usage | None:
    if raw is None:
        return None
    prompt = (getattr(raw, "input_tokens", None) or 0) + (getattr(raw, "cache_read_input_tokens", None) or 0) \
        + (getattr(raw, "cache_creation_input_tokens", None) or 0)
    completion = output_tokens if output_tokens is not None else (getattr(raw, "output_tokens", None) or 0)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _reasoning(block: Any) -> Reasoning | None:
    """A `thinking` / `redacted_thinking` block as `Reasoning` (None for any other block)."""
    if block.type == "thinking":
        return Reasoning(provider=_PROVIDER, kind="thinking", text=block.thinking or "",
                         signature=block.signature or "")
    if block.type == "redacted_thinking":
        return Reasoning(provider=_PROVIDER, kind="redacted_thinking", data=block.data or "")
    return None


def message_from_response(response: Any) -> Message:
    """The assistant message of a whole (non-streamed) response; tool calls carry their position as index."""
    text, calls, reasoning = [], [], []
    for block in response.content or ():
        if block.type == "text":
            text.append(block.text or "")
        elif block.type == "tool_use":
            calls.append(ToolCall(id=block.id or "", name=block.name or "", index=len(calls),
                                  arguments=json.dumps(block.input if block.input is not None else {})))
        elif (thought := _reasoning(block)) is not None:
            reasoning.append(thought)
    return Message(role="assistant", content="".join(text), tool_calls=tuple(calls), usage=_usage(response.usage),
                   finish_reason=FINISH.get(response.stop_reason or "", response.stop_reason),
                   reasoning=tuple(reasoning), **_answer_names(response))


def _answer_names(response: Any) -> dict[str, str | None]:
    """The response's `id` and `model` when the server sent them as text."""
    names = {"response_id": getattr(response, "id", None), "response_model": getattr(response, "model", None)}
    return {k: v if isinstance(v, str) and v else None for k, v in names.items()}


@dataclass
class StreamReader:
    """Turns the events of one streamed response into Waypoint chunks (`concat_messages` joins them into
    what `message_from_response` returns for the same answer). A thinking block is gathered from its deltas
    and sent as one chunk when it ends."""

    prompt_usage: Any = None
    names: dict[str, str | None] = field(default_factory=dict)
    """The response's `id` and `model`, from its `message_start`: given with the last chunk."""
    tools: dict[int, list[Any]] = field(default_factory=dict)
    """block index -> [position among the calls, arguments seen?, the start block's input]"""
    thinking: dict[int, list[Any]] = field(default_factory=dict)
    """block index -> [the start block, thinking text pieces, signature pieces]"""
    finished: bool = False

    def chunks(self, event: Any) -> list[Message]:
        kind = getattr(event, "type", None)
        if kind == "message_start":
            self.prompt_usage = getattr(event.message, "usage", None)
            self.names = _answer_names(event.message)
        elif kind == "content_block_start":
            return self._start(event)
        elif kind == "content_block_delta":
            return self._delta(event)
        elif kind == "content_block_stop":
            return self._stop(event)
        elif kind == "message_delta":
            reason = getattr(event.delta, "stop_reason", None)
            self.finished = self.finished or reason is not None
            usage = _usage(self.prompt_usage, getattr(getattr(event, "usage", None), "output_tokens", None) or 0)
            return [Message(role="assistant", finish_reason=FINISH.get(reason or "", reason), usage=usage,
                            **self.names)]
        return []

    def _start(self, event: Any) -> list[Message]:
        block = event.content_block
        if block.type == "tool_use":
            self.tools[event.index] = [len(self.tools), False, block.input]
            return [_call(ToolCall(index=self.tools[event.index][0], id=block.id or "", name=block.name or ""))]
        if block.type == "text" and block.text:
            return [Message(role="assistant", content=block.text)]
        if block.type in ("thinking", "redacted_thinking"):
            self.thinking[event.index] = [block, [], []]
        return []

    def _stop(self, event: Any) -> list[Message]:
        slot = self.tools.get(event.index)
        if slot is not None and not slot[1]:  # no argument fragments: the start block held them all
            return [_call(ToolCall(index=slot[0], arguments=json.dumps(slot[2] if slot[2] is not None else {})))]
        gathered = self.thinking.pop(event.index, None)
        if gathered is not None:
            start, text, signature = gathered
            thought = _reasoning(start)
            if thought is not None and thought.kind == "thinking":
                thought = thought.model_copy(update={"text": thought.text + "".join(text),
                                                     "signature": thought.signature + "".join(signature)})
            return [Message(role="assistant", reasoning=(thought,))] if thought is not None else []
        return []

    def _delta(self, event: Any) -> list[Message]:
        delta = event.delta
        if delta.type == "text_delta" and delta.text:
            return [Message(role="assistant", content=delta.text)]
        if delta.type == "input_json_delta":
            slot = self.tools.get(event.index)
            if slot is not None and delta.partial_json:
                slot[1] = True
                return [_call(ToolCall(index=slot[0], arguments=delta.partial_json))]
        gathered = self.thinking.get(event.index)
        if gathered is not None and delta.type == "thinking_delta":
            gathered[1].append(delta.thinking or "")
        elif gathered is not None and delta.type == "signature_delta":
            gathered[2].append(delta.signature or "")
        return []


def _call(call: ToolCall) -> Message:
    return Message(role="assistant", tool_calls=(call,))
