"""Tools for agents: `@tool`, `Tool`, `ToolContext`, `ToolsNode`, `RetryAgentRun`, `StopAgentRun`, `BreakLoop`."""

from .node import ToolBatch, ToolEvent, ToolsNode
from .tool import BreakLoop, RetryAgentRun, StopAgentRun, Tool, ToolArgumentError, ToolContext, ToolInfo, tool
from .verbs import Decision, Respond, Restart

__all__ = ["tool", "Tool", "ToolInfo", "ToolContext", "ToolArgumentError", "ToolsNode", "ToolBatch", "ToolEvent",
           "RetryAgentRun", "StopAgentRun", "BreakLoop", "Respond", "Restart", "Decision"]
