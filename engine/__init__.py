"""Waypoint's engine: graphs, the run loop, checkpoints, interrupts.

Importing this package stays light (no SQLAlchemy, no openai): a resume in a new process pays
for what it imports.
"""

from .compiled import CompiledGraph, RunSnapshot, read_run
from .errors import (
    CheckpointConflict,
    CheckpointCorrupted,
    CheckpointError,
    CheckpointExists,
    CheckpointNotFound,
    GraphBuildError,
    GraphInterrupted,
    GraphMismatch,
    GraphRunError,
    LeaseLost,
    MaxIterationsExceeded,
    MaxStepsExceeded,
    ModelError,
    NodeError,
    SerializationError,
    StoreUnavailable,
    UnknownInterrupt,
    WaypointError,
)
from .events import Event
from .graph import END, START, Graph
from .interrupts import CompositeInterrupt, Interrupt, InterruptCtx, InterruptInfo, StatefulInterrupt
from .merge import register_merge
from .nodes import Component, Lambda
from .resume import address_segment, get_interrupt_info, get_interrupt_state, get_resume_context, segment_of
from .retry import RetryPolicy
from .store import Checkpoint, CheckpointMeta, CheckPointStore
from .streams import register_concat

# Names that load msgpack or pydantic load when first touched, not on `import waypoint.engine`.
_LAZY = {
    **dict.fromkeys(("register_type", "Serializer", "TypeRegistry", "UnsupportedFormat", "UnknownType"), "serde"),
    **dict.fromkeys(("Message", "ToolCall", "ToolInfo"), "models"),
    **dict.fromkeys(("tool", "Tool", "ToolContext", "ToolsNode", "RetryAgentRun", "StopAgentRun", "Respond",
                     "Restart", "Decision"), "tools"),
    **dict.fromkeys(("ChatModelAgent", "Runner", "AgentEvent", "AgentOutput", "AgentAction", "AgentMiddleware",
                     "AgentContext", "RetryNotice"), "agents"),
    **dict.fromkeys(("emit_chunk", "task_ledger", "idempotency_key", "check_lease"), "task"),
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is not None:
        from importlib import import_module

        return getattr(import_module(f".{module}", __name__), name)
    raise AttributeError(f"module 'waypoint.engine' has no attribute {name!r}")


__all__ = [
    "Message",
    "ToolCall",
    "ToolInfo",
    "tool",
    "Tool",
    "ToolContext",
    "ToolsNode",
    "RetryAgentRun",
    "StopAgentRun",
    "Respond",
    "Restart",
    "Decision",
    "ChatModelAgent",
    "Runner",
    "AgentEvent",
    "AgentOutput",
    "AgentAction",
    "AgentMiddleware",
    "AgentContext",
    "RetryNotice",
    "emit_chunk",
    "task_ledger",
    "idempotency_key",
    "check_lease",
    "register_type",
    "Serializer",
    "TypeRegistry",
    "UnsupportedFormat",
    "UnknownType",
    "Graph",
    "CompiledGraph",
    "RunSnapshot",
    "read_run",
    "CheckPointStore",
    "CheckpointMeta",
    "Checkpoint",
    "get_interrupt_state",
    "get_interrupt_info",
    "get_resume_context",
    "address_segment",
    "segment_of",
    "START",
    "END",
    "Lambda",
    "Component",
    "RetryPolicy",
    "Event",
    "register_merge",
    "register_concat",
    "Interrupt",
    "StatefulInterrupt",
    "CompositeInterrupt",
    "InterruptCtx",
    "InterruptInfo",
    "WaypointError",
    "GraphBuildError",
    "GraphRunError",
    "NodeError",
    "MaxStepsExceeded",
    "MaxIterationsExceeded",
    "GraphInterrupted",
    "GraphMismatch",
    "CheckpointError",
    "CheckpointConflict",
    "LeaseLost",
    "CheckpointExists",
    "CheckpointNotFound",
    "CheckpointCorrupted",
    "UnknownInterrupt",
    "StoreUnavailable",
    "SerializationError",
    "ModelError",
]
