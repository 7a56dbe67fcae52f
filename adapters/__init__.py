"""Waypoint's adapters to outside services, kept out of the engine (docs/decisions.md, issue 31): chat models of
providers behind the engine's `ChatModel` protocol (`OpenAIChatModel`, `AnthropicChatModel`, `model_from_env()`)
and the tools of MCP servers behind its `Tool` protocol (`MCPServerStdio`, `MCPServerStreamableHTTP`).

Each is loaded when first named: importing this package loads no SDK. `waypoint.engine.models` and
`waypoint.engine.tools` name the same objects.
"""

from __future__ import annotations

from typing import Any

_WHERE = {
    "OpenAIChatModel": "openai_chat",
    "AnthropicChatModel": "anthropic_chat",
    "model_from_env": "env",
    **dict.fromkeys(("MCPServerStdio", "MCPServerStreamableHTTP", "MCPTool", "MCPConnectionError", "MCPTimeoutError",
                     "MCPAuthError"), "mcp_tools"),
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'waypoint.adapters' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)


__all__ = list(_WHERE)
