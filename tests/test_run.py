"""The run loop: node kinds, Pregel supersteps and cycles, branches, fan-in, keys, sync bridge."""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import linear
from waypoint.engine import (
    END,
    START,
    Graph,
    GraphRunError,
    Lambda,
    MaxStepsExceeded,
    WaypointError,
    register_merge,
)


async def test_sync_async_and_generator_nodes_chain():
    async def double(x):
        await asyncio.sleep(0)
        return x * 2

    async def spell(x):
        for ch in str(x):
            yield ch

    app = linear("kinds", lambda x: x + 1, double, spell, lambda s: s + "!")
    assert await app.ainvoke(4) == "10!"


async def test_lambda_paradigms_are_derived():
    async def collect(chunks):
        return [c async for c in chunks]

    async def transform(chunks):
        async for c in chunks:
            yield c.upper()

    async def stream(value):
        for part in value.split(","):
            yield part

    app = linear(
        "lambdas",
        Lambda(stream=stream),          # invoke derived: chunks concatenated -> "ab"
        Lambda(transform=transform),    # invoke derived from transform on a one-chunk stream
        Lambda(collect=collect),        # collect gets a one-chunk stream
    )
    assert await app.ainvoke("a,b") == ["AB"]
    with pytest.raises(TypeError, match="at least one"):
        Lambda()


async def test_component_protocol_node():
    class Shout:
        async def ainvoke(self, text):
            return text.upper()

        async def astream(self, text):
            for word in text.split():
                yield word.upper() + " "

    app = linear("component", Shout())
    assert await app.ainvoke("hi there") == "HI THERE"
    assert [c async for c in app.astream("hi there")] == ["HI ", "THERE "]


async def test_subgraph_node_runs_inside_parent():
    inner = Graph(name="inner")
    inner.add_node("plus", lambda x: x + 10)
    inner.add_edge(START, "plus")
    inner.add_edge("plus", END)
    outer = Graph(name="outer")
    outer.add_node("first", lambda x: x * 2)
    outer.add_node("sub", inner)
    outer.add_edge(START, "first")
    outer.add_edge("first", "sub")
    outer.add_edge("sub", END)
    assert await outer.compile().ainvoke(1) == 12


def test_invoke_sync_bridge_and_refusal_inside_loop():
    app = linear("sync", lambda x: x + 1)
    assert app.invoke(1) == 2

    async def inside():
        with pytest.raises(WaypointError, match="inside a running event loop"):
            app.invoke(1)

    asyncio.run(inside())


async def test_pregel_cycle_with_branch_counts_supersteps():
    visits = []

    def work(n):
        visits.append(n)
        return n + 1

    g = Graph(name="loop")
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_branch("work", lambda n: "again" if n < 5 else "stop", ends={"again": "work", "stop": END})
    assert await g.compile().ainvoke(0) == 5
    assert visits == [0, 1, 2, 3, 4]


async def test_max_steps_exceeded_compile_and_per_run():
    g = Graph(name="forever")
    g.add_node("spin", lambda n: n + 1)
    g.add_edge(START, "spin")
    g.add_branch("spin", lambda n: "spin" if n < 1000 else END, ends=["spin", END])
    app = g.compile(max_steps=7)
    with pytest.raises(MaxStepsExceeded, match="max_steps=7") as info:
        await app.ainvoke(0)
    assert info.value.max_steps == 7
    with pytest.raises(MaxStepsExceeded, match="max_steps=3"):
        await app.ainvoke(0, max_steps=3)
    assert await app.ainvoke(995, max_steps=20) == 1000


async def test_multi_branch_and_async_condition():
    async def pick(x):
        await asyncio.sleep(0)
        return ["left", "right"]

    g = Graph(name="multi")
    g.add_node("src", lambda x: x)
    g.add_node("left", lambda x: {"l": x})
    g.add_node("right", lambda x: {"r": x * 2})
    g.add_node("join", lambda d: d)
    g.add_edge(START, "src")
    g.add_branch("src", pick, ends=["left", "right"])
    g.add_edge("left", "join")
    g.add_edge("right", "join")
    g.add_edge("join", END)
    assert await g.compile().ainvoke(3) == {"l": 3, "r": 6}


async def test_unknown_branch_target_is_a_clear_error():
    g = Graph(name="g")
    g.add_node("a", lambda x: x)
    g.add_edge(START, "a")
    g.add_branch("a", lambda x: "elsewhere", ends=["a", END])
    with pytest.raises(GraphRunError, match="branch after 'a' chose 'elsewhere', which is not one of its ends"):
        await g.compile().ainvoke(1)


async def test_parallel_tasks_of_one_step_run_concurrently():
    async def slow(x):
        await asyncio.sleep(1.0)
        return x

    g = Graph(name="par")
    g.add_node("fan", lambda x: x)
    for i in range(5):
        g.add_node(f"s{i}", slow, output_key=f"k{i}")
        g.add_edge("fan", f"s{i}")
        g.add_edge(f"s{i}", "join")
    g.add_node("join", lambda d: sorted(d))
    g.add_edge(START, "fan")
    g.add_edge("join", END)
    started = time.perf_counter()
    assert await g.compile().ainvoke(1) == ["k0", "k1", "k2", "k3", "k4"]
    assert time.perf_counter() - started < 3.0  # five 1 s sleeps overlapped (one after the other: 5 s)


async def test_fan_in_duplicate_key_error_names_both_sources():
    g = Graph(name="dup")
    g.add_node("a", lambda x: {"same": 1})
    g.add_node("b", lambda x: {"same": 2})
    g.add_node("join", lambda d: d)
    for n in ("a", "b"):
        g.add_edge(START, n)
        g.add_edge(n, "join")
    g.add_edge("join", END)
    with pytest.raises(GraphRunError, match="key 'same' is sent by both 'a' and 'b'"):
        await g.compile().ainvoke(0)


async def test_fan_in_unmergeable_values_and_register_merge():
    class Total(int):
        pass

    g = Graph(name="sum")
    g.add_node("a", lambda x: Total(1))
    g.add_node("b", lambda x: Total(2))
    g.add_node("join", lambda v: v)
    for n in ("a", "b"):
        g.add_edge(START, n)
        g.add_edge(n, "join")
    g.add_edge("join", END)
    with pytest.raises(GraphRunError, match="no way to merge them"):
        await g.compile().ainvoke(0)
    register_merge(Total, lambda values: Total(sum(values)))
    assert await g.compile().ainvoke(0) == 3


async def test_input_key_and_output_key():
    g = Graph(name="keys")
    g.add_node("wrap", lambda x: x * 2, output_key="doubled")
    g.add_node("unwrap", lambda v: v + 1, input_key="doubled")
    g.add_edge(START, "wrap")
    g.add_edge("wrap", "unwrap")
    g.add_edge("unwrap", END)
    assert await g.compile().ainvoke(4) == 9
    bad = Graph(name="bad")
    bad.add_node("unwrap", lambda v: v, input_key="missing")
    bad.add_edge(START, "unwrap")
    bad.add_edge("unwrap", END)
    with pytest.raises(GraphRunError, match="input_key='missing'"):
        await bad.compile().ainvoke({"other": 1})


async def test_reaching_end_finishes_the_superstep_run():
    ran = []
    g = Graph(name="race")
    g.add_node("fast", lambda x: "fast")
    g.add_node("slow", lambda x: ran.append("slow") or x)
    g.add_node("after", lambda x: ran.append("after") or x)
    g.add_edge(START, "fast")
    g.add_edge(START, "slow")
    g.add_edge("fast", END)
    g.add_edge("slow", "after")
    g.add_edge("after", END)
    assert await g.compile().ainvoke(0) == "fast"
    assert ran == ["slow"]  # 'after' was scheduled for the next superstep, which never starts


async def test_start_branch_and_start_to_end():
    g = Graph(name="startbranch")
    g.add_node("neg", lambda x: -x)
    g.add_branch(START, lambda x: "neg" if x > 0 else END, ends=["neg", END])
    g.add_edge("neg", END)
    app = g.compile()
    assert await app.ainvoke(3) == -3
    assert await app.ainvoke(-2) == -2


async def test_checkpoint_id_without_store_is_refused():
    app = linear("nostore", lambda x: x)
    with pytest.raises(WaypointError, match="compiled without a store"):
        await app.ainvoke(1, checkpoint_id="t-1")


async def test_runs_are_independent_when_concurrent():
    async def slow_add(x):
        await asyncio.sleep(0.01)
        return x + 1

    app = linear("conc", slow_add, slow_add)
    results = await asyncio.gather(*(app.ainvoke(i) for i in range(50)))
    assert results == [i + 2 for i in range(50)]
