"""Waypoint's engine: graphs, the run loop, checkpoints, interrupts.

Importing this package stays light (no SQLAlchemy, no openai): a resume in a new process pays
for what it imports.
"""

from .compiled import CompiledGraph, RunSnapshot
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
    MaxIterationsExceeded,
    MaxStepsExceeded,
    ModelError,
    NodeError,
    SerializationError,
    UnknownInterrupt,
    WaypointError,
)
from .events import Event
from .graph import END, START, Graph
from .interrupts import CompositeInterrupt, Interrupt, InterruptCtx, InterruptInfo, StatefulInterrupt
from .merge import register_merge
from .nodes import Component, Lambda
from .resume import address_segment, get_interrupt_state, get_resume_context
from .retry import RetryPolicy
from .store import Checkpoint, CheckpointMeta, CheckPointStore
from .streams import register_concat

# The codec's names load msgpack when first touched, not on `import waypoint.engine`.
_LAZY = {"register_type", "Serializer", "TypeRegistry", "UnsupportedFormat", "UnknownType"}


def __getattr__(name: str):
    if name in _LAZY:
        from . import serde

        return getattr(serde, name)
    raise AttributeError(f"module 'waypoint.engine' has no attribute {name!r}")


__all__ = [
    "register_type",
    "Serializer",
    "TypeRegistry",
    "UnsupportedFormat",
    "UnknownType",
    "Graph",
    "CompiledGraph",
    "RunSnapshot",
    "CheckPointStore",
    "CheckpointMeta",
    "Checkpoint",
    "get_interrupt_state",
    "get_resume_context",
    "address_segment",
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
    "CheckpointExists",
    "CheckpointNotFound",
    "CheckpointCorrupted",
    "UnknownInterrupt",
    "SerializationError",
    "ModelError",
]
