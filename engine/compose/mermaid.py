"""Render a graph as a Mermaid flowchart: edges solid, branch routes dotted and labelled."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..shape import END, START


def render(
    nodes: Mapping[str, bool],
    edges: Sequence[tuple[str, str]],
    branches: Iterable[tuple[str, Mapping[Any, str]]],
) -> str:
    """`nodes` maps each key to whether it is a subgraph; `branches` are (source, {label: target})."""
    ids = {key: f"n{i}" for i, key in enumerate(nodes)}
    ids[START], ids[END] = "__start__", "__end__"
    lines = ["flowchart TD", f"    {ids[START]}([START])", f"    {ids[END]}([END])"]
    for key, is_subgraph in nodes.items():
        lines.append(f"    {ids[key]}{f'[[{key}]]' if is_subgraph else f'[{key}]'}")
    for a, b in edges:
        if a in ids and b in ids:
            lines.append(f"    {ids[a]} --> {ids[b]}")
    for source, ends in branches:
        for label, target in ends.items():
            if source in ids and target in ids:
                text = str(label).replace('"', "'")
                lines.append(f'    {ids[source]} -. "{text}" .-> {ids[target]}')
    return "\n".join(lines) + "\n"
