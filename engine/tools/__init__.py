"""Tools for agents: `@tool`, `Tool`, `ToolContext`, `ToolsNode`, `RetryAgentRun`, `StopAgentRun`, `BreakLoop`;
tools of MCP servers (`MCPServerStdio`, `MCPServerStreamableHTTP`: the `[mcp]` extra, loaded when first named)."""

from .node import ToolBatch, ToolEvent, ToolsNode
from .tool import BreakLoop, RetryAgentRun, StopAgentRun, Tool, ToolArgumentError, ToolContext, ToolInfo, tool
from .verbs import Decision, Respond, Restart

_MCP = ("MCPServerStdio", "MCPServerStreamableHTTP", "MCPTool", "MCPConnectionError", "MCPTimeoutError", "MCPAuthError")


def __getattr__(name: str):
    if name in _MCP:
        from . import mcp

        return getattr(mcp, name)
    raise AttributeError(f"module 'waypoint.engine.tools' has no attribute {name!r}")


__all__ = ["tool", "Tool", "ToolInfo", "ToolContext", "ToolArgumentError", "ToolsNode", "ToolBatch", "ToolEvent",
           "RetryAgentRun", "StopAgentRun", "BreakLoop", "Respond", "Restart", "Decision", *_MCP]
