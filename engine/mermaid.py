"""Render a compiled graph as a Mermaid flowchart (what `waypoint` prints for a graph)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .graph import END, START

if TYPE_CHECKING:
    from .compiled import CompiledGraph


def render(graph: CompiledGraph) -> str:
    ids = {key: f"n{i}" for i, key in enumerate(graph.nodes)}
    ids[START], ids[END] = "__start__", "__end__"
    lines = ["flowchart TD", f"    {ids[START]}([START])", f"    {ids[END]}([END])"]
    for key, node in graph.nodes.items():
        shape = f"[[{key}]]" if node.subgraph is not None else f"[{key}]"
        lines.append(f'    {ids[key]}{shape}')
    for key in (START, *graph.nodes):
        node = graph.start if key == START else graph.nodes[key]
        for target in node.edges:
            lines.append(f"    {ids[key]} --> {ids[target]}")
        for branch in node.branches:
            for label, target in branch.ends.items():
                text = str(label).replace('"', "'")
                lines.append(f'    {ids[key]} -. "{text}" .-> {ids[target]}')
    return "\n".join(lines) + "\n"
