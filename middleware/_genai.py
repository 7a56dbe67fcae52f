"""The shapes the OpenTelemetry GenAI semantic conventions give span attributes, as plain functions (nothing
of OpenTelemetry here): messages as `role` + `parts`, a finish reason for every output message, the server a
model talks to.

The conventions followed are those of open-telemetry/semantic-conventions-genai (status Development; where
they moved from semantic-conventions after v1.41), the message formats as its `gen-ai-input-messages.json`
and `gen-ai-output-messages.json` schemas define them. docs/ecosystem.md says which attributes come from here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

__all__ = ["input_messages", "output_messages", "finish_reason", "server_of"]

_FINISH = {"tool_calls": "tool_call", "function_call": "tool_call"}
"""Waypoint's finish reasons (OpenAI's words) that the conventions spell otherwise; the rest (`stop`,
`length`, `content_filter`) are theirs already, and any other stays as the provider said it."""


def input_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """`gen_ai.input.messages`: each message as `{"role", "parts"}`, in the order they were sent."""
    return [{"role": getattr(m, "role", "") or "user", "parts": _parts(m)} for m in messages]


def output_messages(message: Any) -> list[dict[str, Any]]:
    """`gen_ai.output.messages`: the one choice an agent's model call returns, with its finish reason."""
    return [{"role": "assistant", "parts": _parts(message), "finish_reason": finish_reason(message)}]


def finish_reason(message: Any) -> str:
    """The conventions' finish reason of an answer: the provider's, in their words; when the provider gave
    none, `tool_call` for an answer that calls tools and `stop` for one that does not."""
    given = getattr(message, "finish_reason", None)
    if given:
        return _FINISH.get(given, given)
    return "tool_call" if getattr(message, "tool_calls", ()) else "stop"


def _parts(message: Any) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for block in getattr(message, "reasoning", ()) or ():
        if getattr(block, "text", ""):  # never a signature or redacted data: they are the provider's, not text
            parts.append({"type": "reasoning", "content": block.text})
    content = getattr(message, "content", "")
    if getattr(message, "role", "") == "tool":
        parts.append({"type": "tool_call_response", "id": getattr(message, "tool_call_id", None),
                      "response": content})
    elif content:
        parts.append({"type": "text", "content": content})
    for call in getattr(message, "tool_calls", ()) or ():
        parts.append({"type": "tool_call", "id": call.id, "name": call.name, "arguments": _arguments(call.arguments)})
    return parts


def _arguments(text: str) -> Any:
    """A call's arguments as the object they encode (the conventions expect one); as written when they are
    not JSON (a model may send anything)."""
    try:
        return json.loads(text) if text else {}
    except (ValueError, RecursionError):
        return text


def server_of(model: Any) -> tuple[str, int] | None:
    """`server.address` and `server.port` of the API a model calls (its `base_url`, looking through middleware
    wrappers that keep the wrapped model in `.model`); None for a model that calls no server."""
    for _ in range(16):
        base_url = getattr(model, "base_url", None)
        if isinstance(base_url, str):
            try:
                parts = urlsplit(base_url)
                port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
            except ValueError:
                return None
            return (parts.hostname, port) if parts.hostname and port else None
        model = getattr(model, "model", None)
        if model is None or isinstance(model, str):
            return None
    return None
