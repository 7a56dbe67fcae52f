"""Node errors carry the node path and the cause; retry and timeout per node."""

from __future__ import annotations

import asyncio
import time

import pytest

from conftest import linear
from waypoint.engine import END, START, Graph, NodeError, RetryPolicy, WaypointError
from waypoint.engine import errors as errors_module


def boom(x):
    raise ValueError(f"bad input {x}")


async def test_node_error_has_path_and_cause():
    app = linear("g", lambda x: x, boom)
    with pytest.raises(NodeError) as info:
        await app.ainvoke(3)
    err = info.value
    assert err.node_path == ["n1"]
    assert isinstance(err.__cause__, ValueError)
    assert "node 'n1' failed: ValueError: bad input 3" in str(err)


async def test_nested_node_error_path():
    inner2 = Graph(name="inner2")
    inner2.add_node("deep", boom)
    inner2.add_edge(START, "deep")
    inner2.add_edge("deep", END)
    inner = Graph(name="inner")
    inner.add_node("sub", inner2)
    inner.add_edge(START, "sub")
    inner.add_edge("sub", END)
    outer = Graph(name="outer")
    outer.add_node("outer_node", inner)
    outer.add_edge(START, "outer_node")
    outer.add_edge("outer_node", END)
    with pytest.raises(NodeError) as info:
        await outer.compile().ainvoke(1)
    assert info.value.node_path == ["outer_node", "sub", "deep"]
    assert isinstance(info.value.__cause__, ValueError)


async def test_a_failing_parallel_task_cancels_its_siblings():
    cancelled = []

    async def slow(x):
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    g = Graph(name="g")
    g.add_node("slow", slow, output_key="s")
    g.add_node("bad", boom, output_key="b")
    g.add_node("join", lambda d: d)
    for n in ("slow", "bad"):
        g.add_edge(START, n)
        g.add_edge(n, "join")
    g.add_edge("join", END)
    for trigger in ("any", "all"):
        cancelled.clear()
        started = time.perf_counter()
        with pytest.raises(NodeError, match="node 'bad' failed"):
            await g.compile(trigger=trigger).ainvoke(1)
        assert time.perf_counter() - started < 2
        assert cancelled == [True]


async def test_retry_until_success_and_attempts_reported():
    calls = []

    def flaky(x):
        calls.append(x)
        if len(calls) < 3:
            raise ConnectionError("try again")
        return "ok"

    g = Graph(name="retry")
    g.add_node("flaky", flaky, retry=RetryPolicy(max_attempts=3, initial_interval=0.001, jitter=False))
    g.add_edge(START, "flaky")
    g.add_edge("flaky", END)
    assert await g.compile().ainvoke(1) == "ok"
    assert len(calls) == 3

    calls.clear()
    g2 = Graph(name="retry2")
    g2.add_node("flaky", flaky, retry=RetryPolicy(max_attempts=2, initial_interval=0.001))
    g2.add_edge(START, "flaky")
    g2.add_edge("flaky", END)
    with pytest.raises(NodeError, match="after 2 attempts") as info:
        await g2.compile().ainvoke(1)
    assert info.value.attempts == 2 and isinstance(info.value.__cause__, ConnectionError)


async def test_retry_on_filters_errors():
    calls = []

    def picky(x):
        calls.append(x)
        raise KeyError("not transient")

    g = Graph(name="picky")
    g.add_node("p", picky, retry=RetryPolicy(max_attempts=5, initial_interval=0, retry_on=ConnectionError))
    g.add_edge(START, "p")
    g.add_edge("p", END)
    with pytest.raises(NodeError):
        await g.compile().ainvoke(1)
    assert len(calls) == 1
    assert RetryPolicy(retry_on=lambda e: "429" in str(e)).should_retry(RuntimeError("HTTP 429"), 1)


async def test_timeout_async_and_sync_nodes():
    async def hang(x):
        await asyncio.sleep(10)

    def block(x):
        time.sleep(0.5)
        return x

    for fn in (hang, block):
        g = Graph(name="t")
        g.add_node("slow", fn, timeout=0.05)
        g.add_edge(START, "slow")
        g.add_edge("slow", END)
        started = time.perf_counter()
        with pytest.raises(NodeError) as info:
            await g.compile().ainvoke(1)
        assert isinstance(info.value.__cause__, TimeoutError)
        assert time.perf_counter() - started < 0.4


async def test_timeout_then_retry_succeeds():
    attempts = []

    async def sometimes_slow(x):
        attempts.append(1)
        if len(attempts) == 1:
            await asyncio.sleep(1)
        return "fast now"

    g = Graph(name="tr")
    g.add_node("n", sometimes_slow, timeout=0.05,
               retry=RetryPolicy(max_attempts=2, initial_interval=0, retry_on=TimeoutError))
    g.add_edge(START, "n")
    g.add_edge("n", END)
    assert await g.compile().ainvoke(1) == "fast now"


def test_every_error_derives_from_waypoint_error():
    for name in errors_module.__all__:
        assert issubclass(getattr(errors_module, name), WaypointError), name
