"""Waypoint's engine: graphs, the run loop, checkpoints, interrupts.

Importing this package stays light (no SQLAlchemy, no openai): a resume in a new process pays
for what it imports.
"""

from . import _moved
from .compose import END, START, CompiledGraph, Graph, RunSnapshot, Workflow, WorkflowNode, read_run
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
    PauseExpired,
    ProcessStopping,
    SerializationError,
    StoreUnavailable,
    UnknownInterrupt,
    WaypointError,
)
from .events import Event
from .keep import Checkpoint, CheckpointMeta, CheckPointStore, Recovered, Shutdown, recover
from .run import (
    CompositeInterrupt,
    Expired,
    Interrupt,
    InterruptCtx,
    InterruptInfo,
    Pending,
    StatefulInterrupt,
    address_segment,
    get_interrupt_id,
    get_interrupt_info,
    get_interrupt_state,
    get_resume_context,
    pause_again,
    register_merge,
    segment_of,
    Sleeping,
    sleep_until,
)
from .shape import (
    Component,
    FieldMapping,
    Lambda,
    RetryPolicy,
    Update,
    add_messages,
    append,
    from_field,
    map_fields,
    register_concat,
    to_field,
)

# Names that load msgpack or pydantic load when first touched, not on `import waypoint.engine`.
_LAZY = {
    **dict.fromkeys(("register_type", "Serializer", "TypeRegistry", "UnsupportedFormat", "UnknownType"), "codec.serde"),
    **dict.fromkeys(("Message", "ToolCall", "ToolInfo"), "models"),
    **dict.fromkeys(("tool", "Tool", "ToolContext", "ToolsNode", "RetryAgentRun", "StopAgentRun", "BreakLoop",
                     "Respond", "Restart", "Decision"), "tools"),
    **dict.fromkeys(("ChatModelAgent", "Runner", "AgentEvent", "AgentOutput", "AgentAction", "AgentMiddleware",
                     "AgentContext", "RetryNotice", "AgentTool", "SequentialAgent", "ParallelAgent", "LoopAgent",
                     "Session"), "agents"),
    **dict.fromkeys(("emit_chunk", "task_ledger", "idempotency_key", "enclosing_state", "check_lease"), "run.task"),
    "run_nested": "compose.nested",
}


_moved.install()  # old module paths (waypoint.engine.checkpoint, ...) still import, with a DeprecationWarning


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is not None:
        from importlib import import_module

        return getattr(import_module(f".{module}", __name__), name)
    moved = _moved.old_path(__name__, name)  # `waypoint.engine.graph` and the like, as attributes (deprecated)
    if moved is not None:
        return moved
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
    "Expired",
    "sleep_until",
    "Sleeping",
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
    "PauseExpired",
    "StoreUnavailable",
    "SerializationError",
    "ModelError",
]
