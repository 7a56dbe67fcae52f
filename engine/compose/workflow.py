"""`Workflow`: a DAG whose nodes name which fields of their predecessors' outputs they take (Eino's compose
Workflow), checked at `compile()`.

    wf = Workflow(name="rag")
    wf.add_node("load", load).add_input(START, map_fields("path", "path"))
    wf.add_node("score", score) \\
        .add_input("load", to_field("chunks")) \\
        .add_input(START, map_fields("question", "question"), data_only=True)
    wf.end().add_input("score")
    app = wf.compile()

Each `add_input(from_node, mapping)` is a data *and* control dependency: the node waits for `from_node` and
takes the mapped fields of its output. `data_only=True` takes the fields without the ordering (something
else must start the node: it is skipped when all its control predecessors are); `add_dependency(from_node)`
orders without data. A branch (`add_branch`) is control only: the nodes it picks declare their own inputs.

`compile()` raises `GraphBuildError` naming the node and the field for: an input from an unknown node, a
field the source's output annotation or the target's input annotation does not have, field types that can
never match, a field (or the whole input) mapped twice or at two depths, a required field of an input class
no mapping fills, a node nothing starts — besides every check a DAG gets (engine/compose/compile_checks.py).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import GraphBuildError
from ..shape import END, START, FieldMapping, FlowPlan, path_of, show_path
from .compile_checks import input_type, may_match, output_type, type_name
from .compiled import CompiledGraph
from .graph import Graph

__all__ = ["Workflow", "WorkflowNode"]


@dataclasses.dataclass
class _Input:
    source: str
    mappings: tuple[FieldMapping, ...] = ()
    data: bool = False
    control: bool = False


class WorkflowNode:
    """A node of a `Workflow` (or its END), to declare what it takes: `add_input`, `add_dependency`,
    `set_static_value`. Each returns the node, so calls chain."""

    def __init__(self, workflow: Workflow, key: str) -> None:
        self.workflow = workflow
        self.key = key

    def add_input(self, from_node: str, mapping: Any = None, *, data_only: bool = False) -> WorkflowNode:
        """Take `from_node`'s output (or the fields `mapping` names) as this node's input, and wait for it.

        `mapping`: None (the whole output is the whole input), a `FieldMapping` (`from_field`, `to_field`,
        `map_fields`), a list of them, or a dict `{source_path: target_path}`. `data_only=True`: take the
        data without waiting on `from_node` to start this node (Eino's `WithNoDirectDependency`)."""
        wf = self.workflow
        wf._check_open(f"add_input({from_node!r}) on '{self.key}'")
        mappings = _mappings(mapping, f"workflow '{wf.name}': node '{self.key}' add_input({from_node!r})")
        spec = wf._input(self.key, from_node)
        if spec.data:
            raise GraphBuildError(f"workflow '{wf.name}': node '{self.key}' already takes input from '{from_node}'; "
                                  "give all the mappings from one node in one add_input call")
        spec.mappings, spec.data = mappings, True
        spec.control = spec.control or not data_only
        return self

    def add_dependency(self, from_node: str) -> WorkflowNode:
        """Run this node only after `from_node`, taking none of its output (Eino's `AddDependency`)."""
        self.workflow._check_open(f"add_dependency({from_node!r}) on '{self.key}'")
        self.workflow._input(self.key, from_node).control = True
        return self

    def set_static_value(self, path: str | tuple[str, ...], value: Any) -> WorkflowNode:
        """Set field `path` of this node's input to `value` on every run."""
        wf = self.workflow
        wf._check_open(f"set_static_value({path!r}) on '{self.key}'")
        wf.statics.setdefault(self.key, []).append((path_of(path, f"node '{self.key}' set_static_value"), value))
        return self


class Workflow(Graph):
    """A DAG with field mapping (Eino's compose Workflow). Build it with `add_node(...)` (which returns the
    node, for `add_input`), `end()`, `add_branch`; `compile()` checks every mapping and always runs it as a
    DAG (`trigger="all"`). A `Workflow` is a `Graph`: it can be a subgraph node of another graph."""

    def __init__(self, name: str = "workflow", *, state: Callable[[], Any] | None = None, **misplaced: Any) -> None:
        super().__init__(name, state=state, **misplaced)
        self.inputs: dict[str, dict[str, _Input]] = {}  # node -> source -> what it takes from it
        self.statics: dict[str, list[tuple[tuple[str, ...], Any]]] = {}
        self._plan_flow = self._plan

    def add_node(self, key: str, node: Any, **options: Any) -> WorkflowNode:  # type: ignore[override]
        """Add a node as `Graph.add_node` does (same options) and return it, to declare its inputs."""
        super().add_node(key, node, **options)
        return WorkflowNode(self, key)

    def end(self) -> WorkflowNode:
        """END, to declare what the workflow returns: `wf.end().add_input("answer")`."""
        return WorkflowNode(self, END)

    def add_edge(self, start: str, end: str) -> Graph:
        raise GraphBuildError(
            f"workflow '{self.name}': add_edge('{start}', '{end}') is not how a workflow is wired; use "
            f"add_node('{end}', ...).add_input('{start}') (data and order), add_dependency (order only), or "
            "add_input(..., data_only=True) (data only)")

    def compile(self, *, trigger: str = "all", **options: Any) -> CompiledGraph:  # type: ignore[override]
        """Check the workflow (its mappings included) and freeze it; it runs as a DAG."""
        if trigger != "all":
            raise GraphBuildError(f"workflow '{self.name}' always runs as a DAG (trigger='all'); "
                                  f"trigger={trigger!r} is not accepted")
        for node, specs in self.inputs.items():
            for source in specs:
                if source != START and source not in self.nodes:
                    raise GraphBuildError(f"workflow '{self.name}': node '{node}' takes input from '{source}', "
                                          "which is not a node of the workflow (add_node it, or fix the name)")
            if node != END and node not in self.nodes:
                raise GraphBuildError(f"workflow '{self.name}': inputs were declared for '{node}', which is not a node")
        return super().compile(trigger="all", **options)

    def _input(self, node: str, source: str) -> _Input:
        if source == END:
            raise GraphBuildError(f"workflow '{self.name}': node '{node}' cannot take input from END")
        if node == START:
            raise GraphBuildError(f"workflow '{self.name}': START takes no input")
        if source == node:
            raise GraphBuildError(f"workflow '{self.name}': node '{node}' cannot take input from itself")
        specs = self.inputs.setdefault(node, {})
        if source not in specs:
            specs[source] = _Input(source)
            self.edges.append((source, node))
        return specs[source]

    # --- compile ---------------------------------------------------------------------------------------

    def _plan(self) -> FlowPlan:
        """Check the mappings (after the DAG checks) and turn them into the plan the run loop reads."""
        self._check_started()
        sources: dict[str, tuple[tuple[str, tuple[FieldMapping, ...]], ...]] = {}
        classes: dict[str, type] = {}
        for node in [*self.nodes, END]:
            data = [s for s in self.inputs.get(node, {}).values() if s.data]
            statics = self.statics.get(node, [])
            _check_targets(self.name, node, data, statics)
            target_t = self._target_type(node)
            for spec in data:
                for m in spec.mappings:
                    self._check_mapping(node, spec.source, m, target_t)
            for path, _ in statics:
                _walk(target_t, path, f"workflow '{self.name}': node '{node}' set_static_value({show_path(path)!r})",
                      f"the input of '{node}'", fix="the path")
            cls = _input_class(target_t)
            if cls is not None and (statics or any(m.target for s in data for m in s.mappings)):
                _check_required(self.name, node, cls, data, statics)
                classes[node] = cls
            if data:
                sources[node] = tuple((s.source, s.mappings) for s in data)
        control = {node: frozenset(s.source for s in specs.values() if s.control)
                   for node, specs in self.inputs.items()}
        for br in self.branches:
            for end in set(br.ends.values()):
                control[end] = control.get(end, frozenset()) | {br.source}
        statics = {k: tuple(v) for k, v in self.statics.items()}
        return FlowPlan(sources=sources, statics=statics, control=control, classes=classes)

    def _check_started(self) -> None:
        """Every node is started by a chain of control dependencies from START (data-only inputs start nothing)."""
        nexts: dict[str, set[str]] = {}
        for node, specs in self.inputs.items():
            for spec in specs.values():
                if spec.control:
                    nexts.setdefault(spec.source, set()).add(node)
        for br in self.branches:
            nexts.setdefault(br.source, set()).update(br.ends.values())
        reached, todo = {START}, [START]
        while todo:
            for nxt in nexts.get(todo.pop(), ()):
                if nxt not in reached:
                    reached.add(nxt)
                    todo.append(nxt)
        for node in [*self.nodes, END]:
            if node in reached:
                continue
            controls = [s.source for s in self.inputs.get(node, {}).values() if s.control]
            why = ("it has only data_only inputs" if not controls else
                   f"its control predecessors ({', '.join(controls)}) are never started")
            raise GraphBuildError(
                f"workflow '{self.name}': node '{node}' never runs: {why}; give it an input without data_only, "
                "or add_dependency on a node that runs before it")

    def _target_type(self, node: str) -> Any:
        if node == END:
            return None
        spec = self.nodes[node]
        if spec.pre is not None or spec.input_key is not None:  # its input is transformed first: unchecked
            return None
        return input_type(spec.runnable)

    def _source_type(self, source: str) -> Any:
        if source == START:
            return None
        spec = self.nodes[source]
        if spec.post is not None or spec.output_key is not None:
            return None
        return output_type(spec.runnable)

    def _check_mapping(self, node: str, source: str, m: FieldMapping, target_t: Any) -> None:
        where = f"workflow '{self.name}': node '{node}' input from '{source}'"
        if source != START and source not in self.nodes:
            raise GraphBuildError(f"{where}: '{source}' is not a node of the workflow")
        src_t = _walk(self._source_type(source), m.source, where, f"the output of '{source}'")
        dst_t = _walk(target_t, m.target, where, f"the input of '{node}'")
        if src_t is not None and dst_t is not None and not may_match(src_t, dst_t):
            raise GraphBuildError(
                f"{where}: field {show_path(m.source)} ({type_name(src_t)}) cannot feed field {show_path(m.target)} "
                f"({type_name(dst_t)}); map another field, or fix an annotation")


def _mappings(mapping: Any, where: str) -> tuple[FieldMapping, ...]:
    if mapping is None:
        return (FieldMapping(),)
    if isinstance(mapping, FieldMapping):
        return (mapping,)
    if isinstance(mapping, Mapping):
        return tuple(FieldMapping(path_of(a, where), path_of(b, where)) for a, b in mapping.items())
    if isinstance(mapping, Iterable) and not isinstance(mapping, (str, bytes)):
        items = tuple(mapping)
        if items and all(isinstance(m, FieldMapping) for m in items):
            return items
    raise GraphBuildError(f"{where}: mapping must be None, from_field/to_field/map_fields(...), a list of them, "
                          f"or a dict {{source_field: target_field}}; got {mapping!r}")


def _check_targets(graph: str, node: str, data: Sequence[_Input], statics: Sequence[tuple[tuple[str, ...], Any]]) -> None:
    """No field of the input set twice: the whole input once, a field once, never a field and a field inside it."""
    where = f"workflow '{graph}': node '{node}'"
    seen: dict[tuple[str, ...], str] = {}
    targets = [(m.target, f"'{s.source}'") for s in data for m in s.mappings]
    targets += [(path, "set_static_value") for path, _ in statics]
    for target, by in targets:
        for earlier, other in seen.items():
            if target == earlier:
                what = "its whole input" if not target else f"field '{show_path(target)}' of its input"
                raise GraphBuildError(f"{where}: {what} is mapped twice (from {other} and from {by}); keep one")
            if not target or not earlier or target[:len(earlier)] == earlier or earlier[:len(target)] == target:
                raise GraphBuildError(
                    f"{where}: {show_path(earlier)} (from {other}) and {show_path(target)} (from {by}) overlap: "
                    "one is inside the other, so one would overwrite the other; map disjoint fields")
        seen[target] = by


def _input_class(t: Any) -> type | None:
    """The dataclass or pydantic model a node's input is built as (None: a dict is handed over)."""
    if isinstance(t, type) and (dataclasses.is_dataclass(t) or callable(getattr(t, "model_validate", None))):
        return t
    return None


def _check_required(graph: str, node: str, cls: type, data: Sequence[_Input],
                    statics: Sequence[tuple[tuple[str, ...], Any]]) -> None:
    filled = {m.target[0] for s in data for m in s.mappings if m.target} | {p[0] for p, _ in statics}
    missing = [name for name in _required(cls) if name not in filled]
    if missing:
        raise GraphBuildError(
            f"workflow '{graph}': node '{node}' takes a {cls.__name__}, whose required field(s) "
            f"{', '.join(repr(n) for n in missing)} no input maps; map them (map_fields(..., '{missing[0]}')) or "
            "set_static_value them")


def _required(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls) if f.init and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    fields = getattr(cls, "model_fields", {})
    return [name for name, f in fields.items() if f.is_required()]


_NO_FIELDS = (str, bytes, int, float, bool, complex, list, tuple, set, frozenset, type(None))


def _walk(t: Any, path: tuple[str, ...], where: str, what: str, fix: str = "the mapping") -> Any:
    """The type at `path` inside annotation `t` of `what` (None when it cannot be known); a field the
    annotation does not have is a `GraphBuildError` naming it, the type that lacks it and the fields it has."""
    for i, name in enumerate(path):
        if t is None:
            return None
        fields = _fields_of(t)
        if fields is None:
            return None
        if name not in fields:
            holder = f"field '{show_path(path[:i])}' of {what}" if i else what
            there = f" (its fields: {', '.join(sorted(fields))})" if fields else ""
            raise GraphBuildError(f"{where}: {holder} is {type_name(t)}, which has no field '{name}'{there}; "
                                  f"fix {fix} or the annotation")
        t = fields[name]
    return t


def _fields_of(t: Any) -> dict[str, Any] | None:
    """Field name -> annotation for a dataclass, pydantic model or TypedDict; {} for a type without fields;
    None when it cannot be known (Any, unions, dicts, arbitrary classes)."""
    if typing.get_origin(t) is typing.Annotated:
        t = t.__origin__
    if t is Any:
        return None
    origin = typing.get_origin(t)
    if origin is not None:  # list[int] has no fields; dict[str, X], unions and the rest cannot be known
        return {} if origin in _NO_FIELDS else None
    if not isinstance(t, type):
        return None
    if t in _NO_FIELDS:
        return {}
    model_fields = getattr(t, "model_fields", None)
    if isinstance(model_fields, dict):
        config = getattr(t, "model_config", None)
        if isinstance(config, dict) and config.get("extra") == "allow":  # any name is a field of it
            return None
        return {name: f.annotation for name, f in model_fields.items()}
    if dataclasses.is_dataclass(t) or typing.is_typeddict(t):
        try:
            hints = typing.get_type_hints(t)
        except Exception:  # unresolvable annotations: no check
            return None
        if dataclasses.is_dataclass(t):
            return {f.name: hints.get(f.name) for f in dataclasses.fields(t)}
        return hints
    return None
