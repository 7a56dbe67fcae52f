"""Agents compiled to graphs: `ChatModelAgent`, `Runner`, `AgentEvent`, the middleware hook protocol, and
composition: `AgentTool`, `SequentialAgent`, `ParallelAgent`, `LoopAgent`, handoffs; what a model is sent under a
summary (`Compaction`, `model_view`)."""

from .agent_tool import AgentTool
from .chat_agent import AgentState, ChatModelAgent
from .middleware import AgentContext, AgentMiddleware, RetryNotice
from .runner import AgentAction, AgentEvent, AgentOutput, Runner, ToolRerun
from .session import Session
from .summary import Compaction, model_view
from .workflow import LoopAgent, ParallelAgent, SequentialAgent

__all__ = ["ChatModelAgent", "AgentState", "Runner", "AgentEvent", "AgentOutput", "AgentAction", "ToolRerun",
           "AgentMiddleware", "AgentContext", "RetryNotice", "AgentTool", "SequentialAgent", "ParallelAgent",
           "LoopAgent", "Session", "Compaction", "model_view"]
