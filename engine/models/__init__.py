"""Chat models and messages: `ChatModel`, `OpenAIChatModel`, `AnthropicChatModel`, `ScriptedChatModel`,
`OfflineModel`, `model_from_env()`, and the message schema (`Message`, `ToolCall`, `Usage`, `ToolInfo`,
`Reasoning`).

The providers (`OpenAIChatModel`, `AnthropicChatModel`) and `model_from_env()` live outside the engine, in
`waypoint.adapters` (docs/decisions.md, issue 31): named here, they are looked up there on first use, so the
engine itself imports no provider. `openai` is imported only when an `OpenAIChatModel` is created, `anthropic`
when an `AnthropicChatModel` is.
"""

from __future__ import annotations

from typing import Any

from .base import ChatModel, ToolChoice
from .schema import Message, Reasoning, ToolCall, ToolInfo, Usage, as_messages, concat_messages

_LAZY = {
    "OpenAIChatModel": "waypoint.adapters.openai_chat",
    "AnthropicChatModel": "waypoint.adapters.anthropic_chat",
    "model_from_env": "waypoint.adapters.env",
    "ScriptedChatModel": ".scripted",
    "OfflineModel": ".offline",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'waypoint.engine.models' has no attribute {name!r}")


__all__ = [
    "ChatModel",
    "ToolChoice",
    "Message",
    "ToolCall",
    "ToolInfo",
    "Usage",
    "Reasoning",
    "as_messages",
    "concat_messages",
    "OpenAIChatModel",
    "AnthropicChatModel",
    "ScriptedChatModel",
    "OfflineModel",
    "model_from_env",
]
