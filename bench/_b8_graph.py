"""B8's graph, loaded by the worker processes (`--graphs bench._b8_graph:build`): B5's prepare -> ask -> finish.

Every node appends "<node> <run input>" to the file named by $B8_JOURNAL (one write per line), so the
parent can check that each node ran exactly as often as it should across all the workers.
"""

from __future__ import annotations

import os

from waypoint.engine import END, START, Graph, Interrupt, get_resume_context


def _journal(line: str) -> None:
    path = os.environ.get("B8_JOURNAL")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{line}\n".encode())
        finally:
            os.close(fd)


def prepare(x: int) -> int:
    _journal(f"prepare {x}")
    return x


def ask(x: int) -> int:
    _journal(f"ask {x}")
    is_target, _, data = get_resume_context()
    if not is_target:
        raise Interrupt({"q": "ok?", "run": x})
    return x if data == "yes" else -1


def finish(x: int) -> str:
    _journal(f"finish {x}")
    return f"yes:{x}"


def build(store):
    g = Graph(name="b8")
    g.add_node("prepare", prepare)
    g.add_node("ask", ask)
    g.add_node("finish", finish)
    for a, b in ((START, "prepare"), ("prepare", "ask"), ("ask", "finish"), ("finish", END)):
        g.add_edge(a, b)
    return g.compile(store=store, durability="step")
