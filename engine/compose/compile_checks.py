"""The whole-graph checks `Graph.compile()` runs; each failure is a `GraphBuildError` naming the culprit."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Sequence
from typing import Any

from ..errors import GraphBuildError
from ..shape import END, START

Graph = Any  # the builder (engine/compose/graph.py, which sits above): .name, .nodes, .edges, .branches


def check_graph(
    g: Graph,
    *,
    trigger: str,
    max_steps: int | None,
    interrupt_before: Sequence[str],
    interrupt_after: Sequence[str],
    edge_types: bool = True,
) -> None:
    """Every whole-graph check, in the order a reader would look for the mistake. `edge_types=False`
    (a workflow, whose field mappings are checked instead) skips comparing edge ends' annotations."""
    _check_options(g.name, trigger, max_steps)
    successors = _successor_map(g)
    _check_reachability(g, successors)
    if trigger == "all":
        cycle = _find_cycle(successors)
        if cycle:
            raise GraphBuildError(
                f"graph '{g.name}': cycle {' -> '.join(cycle)} is not allowed with trigger='all' (a DAG); "
                "use trigger='any' for loops"
            )
    for option, keys in (("interrupt_before", interrupt_before), ("interrupt_after", interrupt_after)):
        for key in keys:
            if key not in g.nodes:
                raise GraphBuildError(f"graph '{g.name}': {option} names unknown node '{key}'")
    if not edge_types:
        return
    for a, b in g.edges:
        _check_types(g, a, b)
    for br in g.branches:
        for target in set(br.ends.values()):
            _check_types(g, br.source, target)


def _check_options(name: str, trigger: str, max_steps: int | None) -> None:
    if trigger not in ("any", "all"):
        raise GraphBuildError(f"graph '{name}': trigger must be 'any' (Pregel) or 'all' (DAG), got {trigger!r}")
    if max_steps is None:
        return
    if trigger == "all":
        raise GraphBuildError(
            f"graph '{name}': max_steps applies to trigger='any' only; a DAG (trigger='all') runs each node once"
        )
    if not isinstance(max_steps, int) or max_steps < 1:
        raise GraphBuildError(f"graph '{name}': max_steps must be a positive integer, got {max_steps!r}")


def _successor_map(g: Graph) -> dict[str, list[str]]:
    """Where each node's output may go (edges and branch ends), checking that every name exists."""
    known = set(g.nodes) | {START, END}
    successors: dict[str, list[str]] = {k: [] for k in (START, *g.nodes, END)}
    for a, b in g.edges:
        for end in (a, b):
            if end not in known:
                raise GraphBuildError(f"graph '{g.name}': edge '{a}' -> '{b}' names unknown node '{end}'")
        successors[a].append(b)
    for br in g.branches:
        if br.source not in known:
            raise GraphBuildError(f"graph '{g.name}': branch starts at unknown node '{br.source}'")
        for target in br.ends.values():
            if target not in known:
                raise GraphBuildError(
                    f"graph '{g.name}': branch after '{br.source}' routes to unknown node '{target}'"
                )
            if target not in successors[br.source]:
                successors[br.source].append(target)
    return successors


def _check_reachability(g: Graph, successors: dict[str, list[str]]) -> None:
    if not successors[START]:
        raise GraphBuildError(f"graph '{g.name}': nothing leaves START; add_edge(START, <first node>)")
    for key in g.nodes:
        if not successors[key]:
            raise GraphBuildError(
                f"graph '{g.name}': node '{key}' has no outgoing edge, so its output would be lost; "
                f"add_edge('{key}', END) if it produces the result"
            )
    reached = _reachable(START, successors)
    unreached = [k for k in g.nodes if k not in reached]
    if unreached:
        raise GraphBuildError(f"graph '{g.name}': node(s) {unreached} cannot be reached from START")
    if END not in reached:
        raise GraphBuildError(f"graph '{g.name}': no path from START reaches END; add an edge to END")


def _reachable(start: str, successors: dict[str, list[str]]) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for nxt in successors[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _find_cycle(successors: dict[str, list[str]]) -> list[str] | None:
    white, grey, black = 0, 1, 2
    color = {k: white for k in successors}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = grey
        stack.append(node)
        for nxt in successors[node]:
            if color[nxt] == grey:
                return stack[stack.index(nxt):] + [nxt]
            if color[nxt] == white:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        color[node] = black
        return None

    for node in successors:
        if color[node] == white:
            found = visit(node)
            if found:
                return found
    return None


# --- edge type check -------------------------------------------------------------------------------

def _check_types(g: Graph, a: str, b: str) -> None:
    """Reject an edge whose annotated output and input types can never match (Base→Derived may)."""
    if a == START or b == END:
        return
    src, dst = g.nodes[a], g.nodes[b]
    if src.output_key or dst.input_key or src.post or dst.pre:
        return
    out_t = _output_type(src.runnable)
    in_t = _input_type(dst.runnable)
    if out_t is None or in_t is None:
        return
    if not _may_match(out_t, in_t):
        raise GraphBuildError(
            f"graph '{g.name}': edge '{a}' -> '{b}' connects output type {_tname(out_t)} "
            f"to input type {_tname(in_t)}, which can never match; fix an annotation or add a converting node"
        )


def _hints(fn: Any) -> dict[str, Any] | None:
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
        return None
    try:
        return typing.get_type_hints(fn)
    except Exception:  # unresolved forward references: no check, not a build error
        return None


def _output_type(fn: Any) -> Any:
    if inspect.isasyncgenfunction(fn):
        return None
    hints = _hints(fn)
    return None if hints is None else hints.get("return")


def _input_type(fn: Any) -> Any:
    hints = _hints(fn)
    if hints is None:
        return None
    for name, p in inspect.signature(fn).parameters.items():
        if name != "state" and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            return hints.get(name)
    return None


def _plain(t: Any) -> type | None:
    origin = typing.get_origin(t)
    if origin is not None:
        return origin if isinstance(origin, type) else None
    return t if isinstance(t, type) else None


def _may_match(out_t: Any, in_t: Any) -> bool:
    if any(t is Any or typing.get_origin(t) in (typing.Union, types.UnionType) for t in (out_t, in_t)):
        return True
    out_c, in_c = _plain(out_t), _plain(in_t)
    if out_c is None or in_c is None or object in (out_c, in_c):
        return True
    try:
        return issubclass(out_c, in_c) or issubclass(in_c, out_c)
    except TypeError:
        return True


def _tname(t: Any) -> str:
    return getattr(t, "__name__", None) or repr(t)


# Shared with the workflow checks (engine/compose/workflow.py), which compare field types the same way.
output_type, input_type, may_match, type_name = _output_type, _input_type, _may_match, _tname
