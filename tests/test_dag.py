"""trigger="all": wait for every predecessor, eager scheduling, skip propagation through untaken branches."""

from __future__ import annotations

import asyncio

import pytest

from waypoint.engine import END, START, Graph, GraphRunError


async def test_waits_for_all_predecessors_of_unequal_length():
    # START -> a -> b -> join ; START -> c -> join. Pregel would run join twice; DAG waits for both.
    calls = []

    def join(d):
        calls.append(d)
        return d

    g = Graph(name="dag")
    g.add_node("a", lambda x: x + 1)
    g.add_node("b", lambda x: {"b": x})
    g.add_node("c", lambda x: {"c": x})
    g.add_node("join", join)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "join")
    g.add_edge(START, "c")
    g.add_edge("c", "join")
    g.add_edge("join", END)
    assert await g.compile(trigger="all").ainvoke(1) == {"b": 2, "c": 1}
    assert calls == [{"b": 2, "c": 1}]


async def test_eager_scheduling_starts_successor_before_slow_sibling_ends():
    order = []

    async def slow(x):
        await asyncio.sleep(0.15)
        order.append("slow done")
        return {"slow": x}

    async def fast(x):
        order.append("fast done")
        return x

    async def after_fast(x):
        order.append("after_fast ran")
        return {"fast": x}

    g = Graph(name="eager")
    g.add_node("slow", slow)
    g.add_node("fast", fast)
    g.add_node("after_fast", after_fast)
    g.add_node("join", lambda d: d)
    g.add_edge(START, "slow")
    g.add_edge(START, "fast")
    g.add_edge("fast", "after_fast")
    g.add_edge("after_fast", "join")
    g.add_edge("slow", "join")
    g.add_edge("join", END)
    assert await g.compile(trigger="all").ainvoke(7) == {"slow": 7, "fast": 7}
    assert order == ["fast done", "after_fast ran", "slow done"]


async def test_skip_propagates_through_untaken_branch():
    ran = []

    def mark(name, value):
        ran.append(name)
        return value

    g = Graph(name="skip")
    g.add_node("decide", lambda x: mark("decide", x))
    g.add_node("yes", lambda x: mark("yes", {"yes": x}))
    g.add_node("yes2", lambda x: mark("yes2", x))      # only reachable through 'yes'
    g.add_node("no", lambda x: mark("no", {"no": x}))
    g.add_node("join", lambda d: mark("join", d))
    g.add_edge(START, "decide")
    g.add_branch("decide", lambda x: "no" if x < 0 else "yes", ends=["yes", "no"])
    g.add_edge("yes", "yes2")
    g.add_edge("yes2", "join")
    g.add_edge("no", "join")
    g.add_edge("join", END)
    app = g.compile(trigger="all")
    assert await app.ainvoke(-1) == {"no": -1}
    assert ran == ["decide", "no", "join"]          # yes and yes2 skipped, join did not wait for them
    ran.clear()
    assert await app.ainvoke(5) == {"yes": 5}
    assert ran == ["decide", "yes", "yes2", "join"]


async def test_node_chosen_by_one_branch_and_rejected_by_another_runs():
    g = Graph(name="two-branches")
    g.add_node("src", lambda x: x)
    g.add_node("t", lambda x: {"t": x * 10})
    g.add_node("o", lambda x: {"o": x})
    g.add_node("join", lambda d: d)
    g.add_edge(START, "src")
    g.add_branch("src", lambda x: "t", ends=["t", "o"])
    g.add_branch("src", lambda x: "o", ends=["t", "o"])
    g.add_edge("t", "join")
    g.add_edge("o", "join")
    g.add_edge("join", END)
    assert await g.compile(trigger="all").ainvoke(2) == {"t": 20, "o": 2}


async def test_all_paths_skipped_means_end_never_reached():
    g = Graph(name="dead")
    g.add_node("decide", lambda x: x)
    g.add_node("a", lambda x: x)
    g.add_branch(START, lambda x: "decide", ends=["decide"])
    g.add_branch("decide", lambda x: [], ends=["a"])
    g.add_edge("a", END)
    with pytest.raises(GraphRunError, match="stopped without reaching END"):
        await g.compile(trigger="all").ainvoke(1)
