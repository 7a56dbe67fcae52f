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
    ProcessStopping,
    SerializationError,
    StoreUnavailable,
    UnknownInterrupt,
    WaypointError,
)
from .events import Event
from .field_mapping import FieldMapping, from_field, map_fields, to_field
from .graph import END, START, Graph
from .interrupts import CompositeInterrupt, Interrupt, InterruptCtx, InterruptInfo, StatefulInterrupt
from .merge import register_merge
from .pending import Pending
from .recovery import Recovered, recover
from .reducers import Update, add_messages, append
from .nodes import Component, Lambda
from .resume import (
    address_segment,
    get_interrupt_id,
    get_interrupt_info,
    get_interrupt_state,
    get_resume_context,
    pause_again,
    segment_of,
)
from .retry import RetryPolicy
from .shutdown import Shutdown
from .store import Checkpoint, CheckpointMeta, CheckPointStore
from .streams import register_concat
from .workflow import Workflow, WorkflowNode

# Names that load msgpack or pydantic load when first touched, not on `import waypoint.engine`.
_LAZY = {
    **dict.fromkeys(("register_type", "Serializer", "TypeRegistry", "UnsupportedFormat", "UnknownType"), "serde"),
    **dict.fromkeys(("Message", "ToolCall", "ToolInfo"), "models"),
    **dict.fromkeys(("tool", "Tool", "ToolContext", "ToolsNode", "RetryAgentRun", "StopAgentRun", "BreakLoop",
                     "Respond", "Restart", "Decision"), "tools"),
    **dict.fromkeys(("ChatModelAgent", "Runner", "AgentEvent", "AgentOutput", "AgentAction", "AgentMiddleware",
                     "AgentContext", "RetryNotice", "AgentTool", "SequentialAgent", "ParallelAgent", "LoopAgent",
                     "Session"), "agents"),
    **dict.fromkeys(("emit_chunk", "task_ledger", "idempotency_key", "enclosing_state", "check_lease"), "task"),
    "run_nested": "nested",
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
    "BreakLoop",
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
    "AgentTool",
    "SequentialAgent",
    "ParallelAgent",
    "LoopAgent",
    "Session",
    "emit_chunk",
    "task_ledger",
    "idempotency_key",
    "enclosing_state",
    "run_nested",
    "check_lease",
    "register_type",
    "Serializer",
    "TypeRegistry",
    "UnsupportedFormat",
    "UnknownType",
    "Graph",
    "Workflow",
    "WorkflowNode",
    "FieldMapping",
    "from_field",
    "to_field",
    "map_fields",
    "CompiledGraph",
    "RunSnapshot",
    "read_run",
    "recover",
    "Recovered",
    "Shutdown",
    "CheckPointStore",
    "CheckpointMeta",
    "Checkpoint",
    "get_interrupt_state",
    "get_interrupt_info",
    "get_interrupt_id",
    "pause_again",
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
    "Update",
    "append",
    "add_messages",
    "Interrupt",
    "StatefulInterrupt",
    "CompositeInterrupt",
    "InterruptCtx",
    "InterruptInfo",
    "Pending",
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
    "ProcessStopping",
    "CheckpointExists",
    "CheckpointNotFound",
    "CheckpointCorrupted",
    "UnknownInterrupt",
    "StoreUnavailable",
    "SerializationError",
    "ModelError",
]
