"""Shared test helpers."""

from __future__ import annotations

import pytest

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


@pytest.fixture
def chat_server():
    """A chat-completions server on 127.0.0.1 (tests/chat_server.py); fails the test if replies are left."""
    from chat_server import ChatServer

    server = ChatServer()
    try:
        yield server
    finally:
        server.close()
    assert not server.replies, f"{len(server.replies)} scripted replies were never requested"
