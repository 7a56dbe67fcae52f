"""Tools for agents: `@tool`, `Tool`, `ToolContext`, `ToolsNode`, `RetryAgentRun`, `StopAgentRun`."""

from .node import ToolBatch, ToolEvent, ToolsNode
from .tool import RetryAgentRun, StopAgentRun, Tool, ToolArgumentError, ToolContext, ToolInfo, tool
from .verbs import Decision, Respond, Restart

__all__ = ["tool", "Tool", "ToolInfo", "ToolContext", "ToolArgumentError", "ToolsNode", "ToolBatch", "ToolEvent",
           "RetryAgentRun", "StopAgentRun", "Respond", "Restart", "Decision"]
