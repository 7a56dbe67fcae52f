"""A graph run nested in the calling task: `run_nested(graph, input, label=...)`.

Code inside a node (a tool, say — an agent used as a tool is one, engine/agents/agent_tool.py) may run a whole
compiled graph as part of its own task, the way a subgraph node runs inside its parent:

- its position is part of the root run's checkpoint, not a run of its own in the store: each of its finished
  steps is recorded there (`durability="step"`), and a task run again after a crash continues it from its
  last finished step;
- its pauses surface at the top with their own IDs, addresses (`<calling point>;runnable:<graph>;node:…`),
  info and state; answering one resumes the task, which calls `run_nested` again and continues the nested
  run exactly where it paused;
- its events reach the root's callbacks and `aevents()` under `node_path = (*task path, label, *node path)`;
- its tool ledger entries and idempotency keys are its own: they are keyed by the calling point's place
  (each call of a tools node has its own) and the nested run's step.

The graph must be the one that paused: a nested run whose graph changed since raises `GraphMismatch`.
"""

from __future__ import annotations

from typing import Any

from ..errors import GraphMismatch
from ..keep import fingerprint
from ..run import Interrupt, RunInterrupted, current_task, escape_part
from ..shape import GraphShape
from .compiled import CompiledGraph

__all__ = ["run_nested"]


async def run_nested(graph: CompiledGraph | GraphShape, input: Any, *, label: str) -> Any:
    """Run `graph` on `input` inside the calling task and return its output; if it pauses, the calling point
    pauses with it (the pause's root causes are the nested run's), and calling `run_nested` again at the same
    point after a resume continues it. `label` names the nested run in events' `node_path`.

    Raises `RuntimeError` outside a running node, `GraphMismatch` when the graph that paused here was another.
    """
    scope = current_task()
    if scope is None:
        raise RuntimeError("run_nested() must be called inside a running node or tool")
    shape = graph.shape if isinstance(graph, CompiledGraph) else graph
    record = scope.resumed.get(scope.address) if scope.resumed else None
    paused = record.child if record is not None else None
    mark = fingerprint(shape.structure)
    if paused is not None:
        _check_same_graph(record.info, mark, shape, scope)
    segment = f"runnable:{escape_part(shape.name)}"
    try:
        return await scope.run.nested(
            shape, input, path=(*scope.path, label), address=f"{scope.address};{segment}",
            place=f"{scope.place or scope.address};{segment}", paused=paused, resume=scope.resume, parent_state=None)
    except RunInterrupted as signal:
        pause = Interrupt({"nested": shape.name, "label": label, "graph": mark})
        pause.child = signal.run.pos
        raise pause from None


def _check_same_graph(info: Any, mark: str, shape: GraphShape, scope: Any) -> None:
    stored = info.get("graph") if isinstance(info, dict) else None
    if stored != mark:
        run = scope.run.checkpoint_id or "(unstored)"
        raise GraphMismatch(
            f"run '{run}': the graph '{shape.name}' nested at {scope.address} paused with another structure than "
            "it has now; resume with the code that paused it, or start the run over (force_new_run=True)")
