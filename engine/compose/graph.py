"""Building a graph: `Graph`, `START`, `END`, nodes, edges, branches, and the compile-time checks.

The builder is mutable until `compile()`; compiling checks the whole graph and
returns an immutable `CompiledGraph`. Mistakes visible from one call (a duplicate node, a
reserved name) raise at that call; mistakes only visible in the whole graph (an unknown node in
an edge, no path to END, a cycle in a DAG) raise at `compile()`. All raise `GraphBuildError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import GraphBuildError
from ..keep import RunOptions
from ..shape import END, KEY_RE, START, Branch, Durability, GraphShape, NodeSpec, RetryPolicy, Trigger
from .compile_checks import check_graph
from .compiled import CompiledGraph
from .mermaid import render

__all__ = ["Graph", "START", "END", "Branch", "NodeSpec", "Trigger", "Durability"]

class Graph:
    """A graph under construction. `compile()` checks it and returns a runnable `CompiledGraph`.

    `state` is an optional factory (a class or a function of no arguments) for the run-local state
    handed to nodes and handlers that declare a `state` parameter; each run gets a fresh one.
    """

    def __init__(self, name: str = "graph", *, state: Callable[[], Any] | None = None, **misplaced: Any) -> None:
        if misplaced:  # compile() and ainvoke() options given to the builder: say where they belong
            raise TypeError(_misplaced_options(misplaced))
        if not isinstance(name, str) or not KEY_RE.match(name):
            raise GraphBuildError(f"graph name {name!r} must be a non-empty string without ';' or ':'")
        if state is not None and not callable(state):
            raise GraphBuildError(f"graph '{name}': state must be a factory (a class or function), got {state!r}")
        self.name = name
        self.state_factory = state
        self.nodes: dict[str, NodeSpec] = {}
        self.edges: list[tuple[str, str]] = []
        self.branches: list[Branch] = []
        self._frozen = False
        self._plan_flow: Callable[[], Any] | None = None  # a Workflow's field mappings, checked at compile()

    def add_node(
        self,
        key: str,
        node: Any,
        *,
        pre: Callable[..., Any] | None = None,
        post: Callable[..., Any] | None = None,
        input_key: str | None = None,
        output_key: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
    ) -> Graph:
        """Add `node` under `key`: a function, async function, async generator, `Lambda`, component
        (an object with `ainvoke` / `astream`), or a subgraph — a `Graph` (compiled with default options)
        or a `CompiledGraph` (its trigger, max_steps and static interrupts apply; its store is not used:
        a subgraph's position is saved inside its parent's checkpoint).

        A node that declares a `state` parameter gets the run-local state; `pre(input, state)` and
        `post(output, state)` run around it; `input_key` / `output_key` unwrap and wrap dicts;
        `retry` and `timeout` (seconds, per attempt) apply to the node call.
        """
        self._check_open(f"add_node({key!r})")
        if key in (START, END):
            raise GraphBuildError(f"graph '{self.name}': '{key}' is reserved (START/END); choose another node key")
        if not isinstance(key, str) or not KEY_RE.match(key):
            raise GraphBuildError(
                f"graph '{self.name}': node key {key!r} must be a non-empty string without ';' or ':' "
                "(keys are part of interrupt addresses)"
            )
        if key in self.nodes:
            raise GraphBuildError(f"graph '{self.name}': node '{key}' is added twice")
        if node is self:
            raise GraphBuildError(f"graph '{self.name}': node '{key}' is the graph itself")
        if timeout is not None and timeout <= 0:
            raise GraphBuildError(f"graph '{self.name}': node '{key}' timeout must be > 0 seconds, got {timeout}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise GraphBuildError(f"graph '{self.name}': node '{key}' retry must be a RetryPolicy")
        self.nodes[key] = NodeSpec(
            key=key, runnable=node, pre=pre, post=post, input_key=input_key,
            output_key=output_key, retry=retry, timeout=timeout,
        )
        return self

    def add_edge(self, start: str, end: str) -> Graph:
        """Send `start`'s output to `end`."""
        self._check_open(f"add_edge({start!r}, {end!r})")
        if start == END:
            raise GraphBuildError(f"graph '{self.name}': an edge cannot start at END ('{start}' -> '{end}')")
        if end == START:
            raise GraphBuildError(f"graph '{self.name}': an edge cannot end at START ('{start}' -> '{end}')")
        if (start, end) in self.edges:
            raise GraphBuildError(f"graph '{self.name}': edge '{start}' -> '{end}' is added twice")
        self.edges.append((start, end))
        return self

    def add_branch(
        self, source: str, condition: Callable[..., Any], ends: Iterable[str] | Mapping[Any, str]
    ) -> Graph:
        """After `source`, route its output to the node(s) `condition(output)` names (sync or async)."""
        self._check_open(f"add_branch({source!r}, ...)")
        if source == END:
            raise GraphBuildError(f"graph '{self.name}': a branch cannot start at END")
        if not callable(condition):
            raise GraphBuildError(f"graph '{self.name}': branch after '{source}' needs a callable condition")
        mapping = dict(ends) if isinstance(ends, Mapping) else {e: e for e in ends}
        if not mapping:
            raise GraphBuildError(f"graph '{self.name}': branch after '{source}' has no ends")
        if START in mapping.values():
            raise GraphBuildError(f"graph '{self.name}': branch after '{source}' cannot route to START")
        self.branches.append(Branch(source=source, condition=condition, ends=mapping))
        return self

    def compile(
        self,
        *,
        store: Any = None,
        durability: Durability | None = None,
        interrupt_before: Sequence[str] = (),
        interrupt_after: Sequence[str] = (),
        max_steps: int | None = None,
        trigger: Trigger = "any",
        serializer: Any = None,
        lease_seconds: float = 30.0,
    ) -> CompiledGraph:
        """Check the graph and freeze it. Raises `GraphBuildError` naming the node or edge at fault.

        `store` + `durability` decide what is recorded (docs/stores.md); `lease_seconds` is how long a
        running run's claim lasts without renewal before another process may take it over.
        """
        check_graph(self, trigger=trigger, max_steps=max_steps, interrupt_before=interrupt_before,
                    interrupt_after=interrupt_after, edge_types=self._plan_flow is None)
        plan = self._plan_flow() if self._plan_flow is not None else None
        if lease_seconds <= 0:
            raise GraphBuildError(f"graph '{self.name}': lease_seconds must be > 0, got {lease_seconds}")
        if durability is not None and durability not in ("step", "interrupt", "exit"):
            raise GraphBuildError(
                f"graph '{self.name}': durability must be 'step', 'interrupt' or 'exit', got {durability!r}"
            )
        nodes = {key: self._with_subgraph_shape(spec) for key, spec in self.nodes.items()}
        self._frozen = True
        return CompiledGraph(GraphShape(
            self.name, state_factory=self.state_factory, nodes=nodes, edges=self.edges, branches=self.branches,
            store=store, durability=durability or ("step" if store is not None else "exit"),
            interrupt_before=tuple(interrupt_before), interrupt_after=tuple(interrupt_after),
            max_steps=max_steps, trigger=trigger, serializer=serializer, lease_seconds=lease_seconds, plan=plan,
        ))

    def _with_subgraph_shape(self, spec: NodeSpec) -> NodeSpec:
        """A subgraph node (a `Graph`, compiled here with default options, or a `CompiledGraph`) runs its shape."""
        obj = spec.runnable
        if isinstance(obj, Graph):
            try:
                obj = obj.compile()
            except GraphBuildError as err:
                raise GraphBuildError(f"graph '{self.name}': subgraph node '{spec.key}': {err}") from err
        if isinstance(obj, CompiledGraph):
            return replace(spec, runnable=obj.shape)
        return spec

    def to_mermaid(self) -> str:
        """A Mermaid flowchart of the graph as built so far (no checks; it does not freeze the graph)."""
        return render({k: isinstance(s.runnable, (Graph, CompiledGraph)) for k, s in self.nodes.items()},
                      self.edges, ((b.source, b.ends) for b in self.branches))

    def _check_open(self, what: str) -> None:
        if self._frozen:
            raise GraphBuildError(
                f"graph '{self.name}' is already compiled; {what} would change a compiled graph. "
                "Build a new Graph instead"
            )


def _misplaced_options(options: dict[str, Any]) -> str:
    """The error for keywords given to Graph() that belong to compile() or to a run (read from both)."""
    import inspect

    compile_options = set(inspect.signature(Graph.compile).parameters) - {"self"}
    run_options = {*RunOptions.__dataclass_fields__, "callbacks"}
    hints = []
    for name in sorted(options):
        if name in compile_options:
            hints.append(f"{name!r} is an option of compile(): Graph(...).compile({name}=...)")
        elif name in run_options:
            hints.append(f"{name!r} is an option of each run: app.ainvoke(input, {name}=...)")
        else:
            hints.append(f"{name!r} is not an option of Graph() (it takes a name and state=)")
    return "Graph() got unexpected keyword argument(s): " + "; ".join(hints) + " (docs/api.md lists them)"
