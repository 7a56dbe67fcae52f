"""Building a graph and what it compiles to: `Graph` and `Workflow` (the builders), the checks `compile()`
makes (`compile_checks`), `CompiledGraph` (`compiled`: invoke, stream, read and edit runs), a compiled graph
run as a node of another (`nested`), and its Mermaid drawing (`mermaid`)."""

from .compiled import CompiledGraph, RunSnapshot, read_run, run_sync
from .graph import END, START, Graph
from .nested import run_nested
from .workflow import Workflow, WorkflowNode

__all__ = [
    "CompiledGraph", "END", "Graph", "RunSnapshot", "START", "Workflow", "WorkflowNode", "read_run", "run_nested",
    "run_sync"
]
