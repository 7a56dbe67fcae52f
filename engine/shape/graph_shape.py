"""What `compile()` decides, as the run loop reads it: `GraphShape`, its `CNode`s and `CBranch`es.

A shape is the checked, frozen structure of one graph (nodes with their runnables and options, edges,
branches, predecessors, the order used to break ties) plus its compile options (store, durability,
static interrupts, trigger, limits, codec, lease). The run loop, the checkpointer and the lifecycle
take a shape; `CompiledGraph` is the public object that holds one. A subgraph node holds the
subgraph's shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import GraphBuildError, GraphRunError
from .field_mapping import FlowPlan
from .nodes import NodeRunnable, _Fn, as_runnable
from .reducers import Reducers, reducers_of
from .retry import RetryPolicy
from .spec import END, START, Branch, NodeSpec
from .state_schema import state_schema

__all__ = ["GraphShape", "CNode", "CBranch"]


@dataclass(frozen=True, slots=True)
class CBranch:
    """A compiled branch: resolves what the condition returned into target node keys."""

    condition: _Fn
    ends: dict[Any, str]
    source: str

    def resolve(self, choice: Any, graph: str) -> tuple[str, ...]:
        if isinstance(choice, (str, int)) or choice is None:
            choices = (choice,)
        else:
            try:
                choices = tuple(choice)
            except TypeError:
                choices = (choice,)
        targets = []
        for c in choices:
            try:
                targets.append(self.ends[c])
            except (KeyError, TypeError):
                raise GraphRunError(
                    f"graph '{graph}': branch after '{self.source}' chose {c!r}, which is not one of its "
                    f"ends {list(self.ends)}; return one of those or add it to ends"
                ) from None
        return tuple(targets)


@dataclass(slots=True, eq=False)
class CNode:
    """A compiled node: the runnable (or a subgraph's shape), its options, and where its output goes."""

    key: str
    runnable: NodeRunnable | None
    subgraph: GraphShape | None
    pre: _Fn | None
    post: _Fn | None
    input_key: str | None
    output_key: str | None
    retry: RetryPolicy | None
    timeout: float | None
    edges: tuple[str, ...]
    branches: tuple[CBranch, ...]
    live_end: bool = False
    control_only: frozenset[str] = frozenset()
    """Workflow: targets that depend on this node's running but take none of its output (sent None)."""


class GraphShape:
    """One checked graph as the engine runs it. Built by `Graph.compile()`; immutable afterwards.

    `nodes` maps keys to `NodeSpec`s whose subgraph runnables are already `GraphShape`s.
    """

    def __init__(
        self,
        name: str,
        *,
        state_factory: Any,
        nodes: Mapping[str, NodeSpec],
        edges: Sequence[tuple[str, str]],
        branches: Sequence[Branch],
        store: Any,
        durability: str,
        interrupt_before: tuple[str, ...],
        interrupt_after: tuple[str, ...],
        max_steps: int | None,
        trigger: str,
        serializer: Any,
        lease_seconds: float = 30.0,
        plan: FlowPlan | None = None,
    ) -> None:
        self.name = name
        self.plan = plan
        """A workflow's data flow (field mappings, control predecessors); None for a graph."""
        self.state_factory = state_factory
        self.reducers: Reducers = reducers_of(state_factory, name)
        self.trigger = trigger
        self.max_steps = max_steps or len(nodes) + 10
        self.store = store
        self.durability = durability
        self.interrupt_before = interrupt_before
        self.interrupt_after = interrupt_after
        self.serializer = serializer
        self.lease_seconds = lease_seconds
        self.edges = tuple(edges)
        self.branches = tuple(branches)
        self._structure: dict[str, Any] | None = None
        self._state_schema: tuple[dict[str, Any] | None] | None = None
        self.order = {START: -1, **{k: i for i, k in enumerate(nodes)}, END: len(nodes)}
        self.nodes = {key: self._compile_node(spec) for key, spec in nodes.items()}
        self.start = self._make_node(START, None, None)
        self._successors = {k: self._successor_list(k) for k in (START, *nodes)}
        preds: dict[str, list[str]] = {k: [] for k in (*nodes, END)}
        for src, succs in self._successors.items():
            for s in succs:
                preds[s].append(src)
        self.preds = {k: tuple(v) for k, v in preds.items()}
        self._below: dict[str, frozenset[str]] | None = None
        if plan is not None:
            for key, node in (*self.nodes.items(), (START, self.start)):
                node.live_end = False  # what reaches END is assembled from fields, not forwarded as it comes
                node.control_only = frozenset(t for t in node.edges
                                              if key not in {src for src, _ in plan.sources.get(t, ())})

    def _compile_node(self, spec: NodeSpec) -> CNode:
        obj = spec.runnable
        sub = obj if isinstance(obj, GraphShape) else None
        runnable = None
        if sub is None:
            try:
                runnable = as_runnable(spec.key, obj)
            except TypeError as err:
                raise GraphBuildError(f"graph '{self.name}': {err}") from None
        elif spec.retry is not None:
            raise GraphBuildError(
                f"graph '{self.name}': subgraph node '{spec.key}' cannot take retry= (a retried subgraph would run "
                "again from its start, repeating what its finished nodes did); set retry= on its nodes instead"
            )
        node = self._make_node(spec.key, runnable, sub)
        node.pre = _Fn(spec.pre) if spec.pre else None
        node.post = _Fn(spec.post) if spec.post else None
        node.input_key, node.output_key = spec.input_key, spec.output_key
        node.retry, node.timeout = spec.retry, spec.timeout
        node.live_end = (
            runnable is not None and runnable.streams and node.edges == (END,) and not node.branches
            and spec.retry is None and spec.post is None
        )
        return node

    def _make_node(self, key: str, runnable: Any, sub: Any) -> CNode:
        edges = tuple(b for a, b in self.edges if a == key)
        branches = tuple(
            CBranch(condition=_Fn(b.condition), ends=dict(b.ends), source=key) for b in self.branches if b.source == key
        )
        return CNode(key=key, runnable=runnable, subgraph=sub, pre=None, post=None, input_key=None,
                     output_key=None, retry=None, timeout=None, edges=edges, branches=branches)

    def _successor_list(self, key: str) -> tuple[str, ...]:
        node = self.start if key == START else self.nodes[key]
        out = list(node.edges)
        for br in node.branches:
            out.extend(t for t in br.ends.values() if t not in out)
        return tuple(out)

    def successors_of(self, key: str) -> tuple[str, ...]:
        return self._successors[key]

    def runs_before(self, a: str, b: str) -> bool:
        """DAG: whether node `a` always finishes before node `b` starts (`b` is reachable from `a`)."""
        if self._below is None:
            below: dict[str, frozenset[str]] = {}

            def reach(k: str) -> frozenset[str]:
                if k not in below:
                    found: set[str] = set()
                    for s in self._successors.get(k, ()):
                        found.add(s)
                        found |= reach(s)
                    below[k] = frozenset(found)
                return below[k]

            for k in self._successors:
                reach(k)
            self._below = below
        return b in self._below.get(a, ())

    @property
    def structure(self) -> dict[str, Any]:
        """The graph's shape as plain data (what a checkpoint's fingerprint is computed from)."""
        if self._structure is None:
            nodes = {k: n.subgraph.structure if n.subgraph is not None else "node" for k, n in self.nodes.items()}
            self._structure = {
                "name": self.name,
                "trigger": self.trigger,
                "nodes": nodes,
                "edges": sorted([a, b] for a, b in self.edges),
                "branches": sorted([b.source, sorted(map(str, b.ends.values()))] for b in self.branches),
            }
            if self.plan is not None:  # only workflows have it: a graph's fingerprint is what it always was
                self._structure["flow"] = self.plan.structure()
        return self._structure

    @property
    def state_schema(self) -> dict[str, Any] | None:
        """The state class's fields and their types (engine/shape/state_schema.py), stored with the structure but
        not part of the fingerprint; None when the state is not a dataclass or pydantic model."""
        if self._state_schema is None:
            self._state_schema = (state_schema(self.state_factory),)
        return self._state_schema[0]

    def get_serializer(self) -> Any:
        """The codec checkpoints are written with (the default one unless compile(serializer=...))."""
        if self.serializer is None:
            from ..codec import default_serializer  # msgpack loads on first use, not on import

            self.serializer = default_serializer
        return self.serializer
