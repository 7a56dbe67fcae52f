"""Shared test helpers."""

from __future__ import annotations

from waypoint.engine import END, START, Graph


def linear(name: str, *fns, **compile_opts):
    """A compiled START -> f0 -> f1 -> ... -> END graph."""
    g = Graph(name=name)
    keys = [f"n{i}" for i in range(len(fns))]
    for key, fn in zip(keys, fns):
        g.add_node(key, fn)
    for a, b in zip([START, *keys], [*keys, END]):
        g.add_edge(a, b)
    return g.compile(**compile_opts)
