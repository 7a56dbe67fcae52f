"""Pauses inside subgraphs: partial resumes inside a child, several levels deep, beside parent tasks."""

from __future__ import annotations

from collections import Counter

import pytest

from waypoint.engine import END, START, Graph, GraphInterrupted, Interrupt, get_resume_context
from waypoint.stores import MemoryStore


def gate(name: str, calls: Counter):
    def node(x):
        calls[name] += 1
        is_target, has_data, data = get_resume_context()
        if not is_target:
            raise Interrupt({"gate": name})
        return {name: data}

    return node


def child_with_two_gates(calls: Counter, trigger: str) -> Graph:
    child = Graph(name="child")
    for name in ("a", "b"):
        child.add_node(name, gate(name, calls))
        child.add_edge(START, name)
        child.add_edge(name, "merge")
    child.add_node("merge", lambda d: calls.update(["merge"]) or d)
    child.add_edge("merge", END)
    return child


@pytest.mark.parametrize("trigger", ["any", "all"])
async def test_partial_resume_inside_a_subgraph_beside_a_parent_task(trigger):
    calls: Counter = Counter()
    parent = Graph(name="parent")
    parent.add_node("sub", child_with_two_gates(calls, trigger), output_key="sub")
    parent.add_node("side", lambda x: calls.update(["side"]) or x, output_key="side")
    parent.add_node("join", lambda d: d)
    for n in ("sub", "side"):
        parent.add_edge(START, n)
        parent.add_edge(n, "join")
    parent.add_edge("join", END)
    app = parent.compile(store=MemoryStore(), trigger=trigger)
    with pytest.raises(GraphInterrupted) as first:
        await app.ainvoke("x", checkpoint_id="n")
    ids = {c.info["gate"]: c for c in first.value.info.contexts}
    assert {c.address for c in ids.values()} == {"runnable:parent;node:sub;node:a", "runnable:parent;node:sub;node:b"}
    with pytest.raises(GraphInterrupted) as second:
        await app.ainvoke(None, checkpoint_id="n", resume={ids["a"].id: 1})
    assert [c.id for c in second.value.info.contexts] == [ids["b"].id]
    out = await app.ainvoke(None, checkpoint_id="n", resume={ids["b"].id: 2})
    assert out == {"sub": {"a": 1, "b": 2}, "side": "x"}
    assert calls == Counter(a=2, b=2, merge=1, side=1)


async def test_three_levels_deep():
    calls: Counter = Counter()
    inner = Graph(name="inner")
    inner.add_node("ask", gate("ask", calls))
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)
    middle = Graph(name="middle")
    middle.add_node("pre", lambda x: calls.update(["pre"]) or x)
    middle.add_node("inner", inner)
    middle.add_edge(START, "pre")
    middle.add_edge("pre", "inner")
    middle.add_edge("inner", END)
    outer = Graph(name="outer")
    outer.add_node("middle", middle)
    outer.add_edge(START, "middle")
    outer.add_edge("middle", END)
    app = outer.compile(store=MemoryStore())
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke(0, checkpoint_id="deep")
    (ctx,) = info.value.info.contexts
    assert ctx.address == "runnable:outer;node:middle;node:inner;node:ask"
    assert await app.ainvoke(None, checkpoint_id="deep", resume={ctx.id: "ok"}) == {"ask": "ok"}
    assert calls == Counter(ask=2, pre=1)


async def test_interrupt_before_in_a_dag_lets_running_siblings_finish():
    calls: Counter = Counter()
    g = Graph(name="dagstatic")
    for n in ("left", "right", "after_left"):
        g.add_node(n, lambda x, n=n: calls.update([n]) or {n: True})
    g.add_node("join", lambda d: d)
    g.add_edge(START, "left")
    g.add_edge(START, "right")
    g.add_edge("left", "after_left")
    g.add_edge("after_left", "join")
    g.add_edge("right", "join")
    g.add_edge("join", END)
    app = g.compile(store=MemoryStore(), trigger="all", interrupt_before=["after_left"])
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke(0, checkpoint_id="s")
    assert info.value.info.before_nodes == ("after_left",)
    assert calls == Counter(left=1, right=1)
    assert await app.ainvoke(None, checkpoint_id="s") == {"after_left": True, "right": True}
    assert calls == Counter(left=1, right=1, after_left=1)
