"""Agents compiled to graphs: `ChatModelAgent`, `Runner`, `AgentEvent`, and the middleware hook protocol."""

from .chat_agent import AgentState, ChatModelAgent
from .middleware import AgentContext, AgentMiddleware, RetryNotice
from .runner import AgentAction, AgentEvent, AgentOutput, Runner, ToolRerun

__all__ = ["ChatModelAgent", "AgentState", "Runner", "AgentEvent", "AgentOutput", "AgentAction", "ToolRerun",
           "AgentMiddleware", "AgentContext", "RetryNotice"]
