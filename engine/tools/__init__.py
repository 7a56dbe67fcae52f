"""Tools for agents: `@tool`, `Tool`, `ToolContext`, `ToolsNode`, `RetryAgentRun`, `StopAgentRun`, `BreakLoop`;
tools of MCP servers (`MCPServerStdio`, `MCPServerStreamableHTTP`: the `[mcp]` extra), which live in
`waypoint.adapters.mcp_tools` and are looked up there when first named here."""

from .node import ToolBatch, ToolEvent, ToolsNode
from .tool import BreakLoop, RetryAgentRun, StopAgentRun, Tool, ToolArgumentError, ToolContext, ToolInfo, tool
from .verbs import Decision, Respond, Restart

_MCP = ("MCPServerStdio", "MCPServerStreamableHTTP", "MCPTool", "MCPConnectionError", "MCPTimeoutError", "MCPAuthError")


def __getattr__(name: str):
    if name in _MCP:
        from importlib import import_module

        return getattr(import_module("waypoint.adapters.mcp_tools"), name)
    raise AttributeError(f"module 'waypoint.engine.tools' has no attribute {name!r}")


__all__ = ["tool", "Tool", "ToolInfo", "ToolContext", "ToolArgumentError", "ToolsNode", "ToolBatch", "ToolEvent",
           "RetryAgentRun", "StopAgentRun", "BreakLoop", "Respond", "Restart", "Decision", *_MCP]
