"""Run-local state: a fresh object per run, injected by parameter name; pre/post handlers; nesting."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from conftest import linear
from waypoint.engine import END, START, Graph


@dataclass
class Notes:
    lines: list[str] = field(default_factory=list)


async def test_state_is_fresh_per_run_and_injected_by_name():
    seen = []

    def write(x, state: Notes):
        state.lines.append(f"saw {x}")
        return x

    def read(x, state):
        seen.append(list(state.lines))
        return len(state.lines)

    g = Graph(name="st", state=Notes)
    g.add_node("write", write)
    g.add_node("read", read)
    g.add_edge(START, "write")
    g.add_edge("write", "read")
    g.add_edge("read", END)
    app = g.compile()
    assert await asyncio.gather(app.ainvoke(1), app.ainvoke(2)) == [1, 1]
    assert sorted(seen) == [["saw 1"], ["saw 2"]]


async def test_pre_and_post_handlers_see_state():
    def pre(x, state):
        state.lines.append("pre")
        return x + 1

    async def post(out, state):
        state.lines.append("post")
        return out * 10

    def node(x, state):
        state.lines.append("node")
        return x

    g = Graph(name="hooks", state=Notes)
    g.add_node("n", node, pre=pre, post=post)
    g.add_node("dump", lambda x, state: (x, state.lines))
    g.add_edge(START, "n")
    g.add_edge("n", "dump")
    g.add_edge("dump", END)
    assert await g.compile().ainvoke(1) == (20, ["pre", "node", "post"])


async def test_nested_graph_sees_its_own_state_or_inherits_the_parents():
    @dataclass
    class Inner:
        hits: int = 0

    inner = Graph(name="inner", state=Inner)
    inner.add_node("bump", lambda x, state: (setattr(state, "hits", state.hits + 1), type(state).__name__)[1])
    inner.add_edge(START, "bump")
    inner.add_edge("bump", END)

    plain = Graph(name="plain")  # no state of its own: nodes see the enclosing graph's state
    plain.add_node("peek", lambda x, state: type(state).__name__)
    plain.add_edge(START, "peek")
    plain.add_edge("peek", END)

    outer = Graph(name="outer", state=Notes)
    outer.add_node("own", inner, output_key="own")
    outer.add_node("inherit", plain, output_key="inherit")
    outer.add_node("join", lambda d, state: (d, state.lines))
    outer.add_edge(START, "own")
    outer.add_edge(START, "inherit")
    outer.add_edge("own", "join")
    outer.add_edge("inherit", "join")
    outer.add_edge("join", END)
    out, lines = await outer.compile().ainvoke(0)
    assert out == {"own": "Inner", "inherit": "Notes"}
    assert lines == []


async def test_function_without_input_parameter():
    app = linear("noarg", lambda: 42)
    assert await app.ainvoke("ignored") == 42
