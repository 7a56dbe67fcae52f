"""A failed or cancelled step leaves no trace in the stored run; what finished is kept; node errors are
the node's errors; timeouts bound the caller; closing a stream stops its run; retried chunks are marked."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from waypoint.engine import (
    END,
    START,
    CheckpointConflict,
    Graph,
    GraphBuildError,
    GraphInterrupted,
    GraphRunError,
    Interrupt,
    NodeError,
    RetryPolicy,
    register_merge,
)
from waypoint.engine.codec.serde import register_type
from waypoint.stores import MemoryStore, SQLiteStore


def two_workers_one_fails(calls: Counter, fail_times: int = 1, trigger: str = "any") -> Graph:
    """START -> (note, flaky) -> join -> END; `note` appends to the state, `flaky` fails `fail_times` times."""
    g = Graph(name="w", state=lambda: {"log": []})

    def note(x, state):
        calls["note"] += 1
        state["log"].append("x")
        return {"note": True}

    async def flaky(x):
        calls["flaky"] += 1
        await asyncio.sleep(0.01)  # after `note` has changed the state
        if calls["flaky"] <= fail_times:
            raise ConnectionError("service down")
        return {"flaky": True}

    g.add_node("note", note)
    g.add_node("flaky", flaky)
    g.add_node("join", lambda d, state: {**d, "log": list(state["log"])})
    for n in ("note", "flaky"):
        g.add_edge(START, n)
        g.add_edge(n, "join")
    g.add_edge("join", END)
    return g


@pytest.mark.parametrize("durability", ["step", "exit"])
async def test_a_failed_pregel_step_stores_none_of_its_state_changes(tmp_path, durability):
    calls: Counter = Counter()
    store = SQLiteStore(tmp_path / "f.db")
    app = two_workers_one_fails(calls).compile(store=store, durability=durability)
    with pytest.raises(NodeError):
        await app.ainvoke(0, checkpoint_id="f")
    assert (await store.history("f"))[0].status == "failed"
    assert (await app.get_run("f")).state == {"log": []}  # the failed step's change is not stored
    out = await app.ainvoke(None, checkpoint_id="f")
    assert out["log"] == ["x"]  # applied once, by the step that finished
    await store.close()


async def test_a_cancelled_pregel_step_stores_none_of_its_state_changes(tmp_path):
    store = SQLiteStore(tmp_path / "c.db")
    entered = asyncio.Event()
    g = Graph(name="c", state=lambda: {"log": []})

    def note(x, state):
        state["log"].append("x")
        return {"note": True}

    async def slow(x):
        entered.set()
        await asyncio.sleep(0 if entered.is_set() and slow.resumed else 30)
        return {"slow": True}

    slow.resumed = False
    g.add_node("note", note)
    g.add_node("slow", slow)
    g.add_node("join", lambda d, state: list(state["log"]))
    for n in ("note", "slow"):
        g.add_edge(START, n)
        g.add_edge(n, "join")
    g.add_edge("join", END)
    app = g.compile(store=store)
    task = asyncio.ensure_future(app.ainvoke(0, checkpoint_id="c"))
    await entered.wait()
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    meta = (await store.history("c"))[0]
    assert (meta.status, meta.error) == ("interrupted", "cancelled")
    slow.resumed = True
    assert await app.ainvoke(None, checkpoint_id="c") == ["x"]
    await store.close()


async def test_dag_keeps_the_results_of_a_batch_in_which_one_task_failed():
    calls: Counter = Counter()
    g = Graph(name="batch")

    async def ok(x):  # no await: finishes in the same loop turn as `bad`
        calls["ok"] += 1
        return {"ok": True}

    async def bad(x):
        calls["bad"] += 1
        if calls["bad"] == 1:
            raise ValueError("first try fails")
        return {"bad": True}

    g.add_node("bad", bad)  # first in graph order: its error is met before `ok` is applied
    g.add_node("ok", ok)
    g.add_node("join", lambda d: d)
    for n in ("bad", "ok"):
        g.add_edge(START, n)
        g.add_edge(n, "join")
    g.add_edge("join", END)
    app = g.compile(store=MemoryStore(), trigger="all")
    with pytest.raises(NodeError):
        await app.ainvoke(0, checkpoint_id="b")
    assert await app.ainvoke(None, checkpoint_id="b") == {"ok": True, "bad": True}
    assert calls == Counter(ok=1, bad=2)


@pytest.mark.parametrize("trigger", ["any", "all"])
async def test_a_run_that_failed_on_fan_in_resumes_after_the_suggested_fix(trigger):
    @register_type(name=f"tests.failed_steps.Tally.{trigger}")
    @dataclass
    class Tally:  # a type no other test registers a merge for
        n: int

    calls: Counter = Counter()
    g = Graph(name=f"fanin-{trigger}")
    for n in ("a", "b"):
        g.add_node(n, lambda x, n=n: calls.update([n]) or Tally(1))
        g.add_edge(START, n)
        g.add_edge(n, "total")
    g.add_node("total", lambda t: t.n)
    g.add_edge("total", END)
    app = g.compile(store=MemoryStore(), trigger=trigger)
    with pytest.raises(GraphRunError, match="register_merge"):
        await app.ainvoke(0, checkpoint_id="m")
    register_merge(Tally, lambda values: Tally(sum(v.n for v in values)))  # what the message suggests
    assert await app.ainvoke(None, checkpoint_id="m") == 2
    assert calls == Counter(a=1, b=1)  # the nodes that finished did not run again


def slow_subgraph() -> Graph:
    inner = Graph(name="inner")

    async def slow(x):
        await asyncio.sleep(5)
        return x

    inner.add_node("slow", slow)
    inner.add_edge(START, "slow")
    inner.add_edge("slow", END)
    return inner


async def test_timeout_on_a_subgraph_node_bounds_the_whole_subgraph():
    g = Graph(name="outer")
    g.add_node("sub", slow_subgraph(), timeout=0.1)
    g.add_edge(START, "sub")
    g.add_edge("sub", END)
    started = time.monotonic()
    with pytest.raises(NodeError) as err:
        await g.compile().ainvoke(1)
    assert time.monotonic() - started < 3  # the timeout (0.1 s), not the subgraph's 5 s
    assert err.value.node_path == ["sub"] and isinstance(err.value.__cause__, TimeoutError)


def test_retry_on_a_subgraph_node_is_refused_at_build():
    g = Graph(name="outer")
    g.add_node("sub", slow_subgraph(), retry=RetryPolicy(max_attempts=2))
    g.add_edge(START, "sub")
    g.add_edge("sub", END)
    with pytest.raises(GraphBuildError, match="subgraph node 'sub' cannot take retry="):
        g.compile()


async def test_a_waypoint_error_raised_by_node_code_is_that_nodes_error():
    store = MemoryStore()
    inner = Graph(name="inner")
    inner.add_node("ask", lambda x: (_ for _ in ()).throw(Interrupt("?")))
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)
    inner_app = inner.compile(store=store)

    async def calls_another_run(x):
        return await inner_app.ainvoke(x, checkpoint_id="inner-run")  # pauses: GraphInterrupted

    async def conflicts(x):
        raise CheckpointConflict("somebody else's run")

    for name, fn in (("pauses", calls_another_run), ("conflicts", conflicts)):
        g = Graph(name=name)
        g.add_node("call", fn)
        g.add_edge(START, "call")
        g.add_edge("call", END)
        app = g.compile(store=store)
        with pytest.raises(NodeError) as err:
            await app.ainvoke(1, checkpoint_id=f"outer-{name}")
        assert err.value.node_path == ["call"]
        newest = (await store.history(f"outer-{name}"))[0]
        assert newest.status == "failed" and newest.lease_owner is None, newest


def test_a_sync_node_timeout_bounds_invoke():
    def stuck(x):
        time.sleep(10)
        return x

    g = Graph(name="stuck")
    g.add_node("stuck", stuck, timeout=0.1)
    g.add_edge(START, "stuck")
    g.add_edge("stuck", END)
    app = g.compile()
    started = time.monotonic()
    with pytest.raises(NodeError) as err:
        app.invoke(1)
    assert time.monotonic() - started < 5  # the timeout (0.1 s), not the node's 10 s
    assert isinstance(err.value.__cause__, TimeoutError)


async def test_a_timed_sync_node_still_sees_its_resume_context():
    from waypoint.engine import get_resume_context

    def gate(x):
        if not get_resume_context()[0]:
            raise Interrupt("?")
        return x

    g = Graph(name="gate")
    g.add_node("gate", gate, timeout=5)
    g.add_edge(START, "gate")
    g.add_edge("gate", END)
    app = g.compile(store=MemoryStore())
    with pytest.raises(GraphInterrupted):
        await app.ainvoke(7, checkpoint_id="g")
    assert await app.ainvoke(None, checkpoint_id="g", resume=True) == 7


def talking(store, produced: list):
    """START -> talk (streams 100 chunks, 10 ms apart, noting each) -> END."""
    async def talk(x):
        for i in range(100):
            produced.append(i)
            yield f"{i} "
            await asyncio.sleep(0.01)

    g = Graph(name="talk")
    g.add_node("talk", talk)
    g.add_edge(START, "talk")
    g.add_edge("talk", END)
    return g.compile(store=store)


async def test_closing_a_stream_cancels_its_run_at_once_and_saves_it(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    produced: list = []
    stream = talking(store, produced).astream("hi", checkpoint_id="t")
    assert await stream.__anext__() == "0 "
    await stream.aclose()
    meta = (await store.history("t"))[0]
    assert (meta.status, meta.error) == ("interrupted", "cancelled")  # saved before aclose returned
    count = len(produced)
    await asyncio.sleep(0.05)
    assert len(produced) == count  # nothing runs after the close
    await store.close()


async def test_breaking_out_of_a_stream_cancels_its_run():
    store = MemoryStore()
    produced: list = []
    async for _ in talking(store, produced).astream("hi", checkpoint_id="t"):
        break
    await asyncio.sleep(0.05)
    assert (await store.history("t"))[0].error == "cancelled"
    assert len(produced) < 5


async def test_events_mark_the_chunks_of_a_failed_attempt_as_void():
    attempts = Counter()

    async def shaky(x):
        attempts["n"] += 1
        yield f"try{attempts['n']}"
        if attempts["n"] == 1:
            raise ConnectionError("dropped")
        yield "!"

    g = Graph(name="shaky")
    g.add_node("shaky", shaky, retry=RetryPolicy(max_attempts=2, initial_interval=0, jitter=False))
    g.add_edge(START, "shaky")
    g.add_edge("shaky", END)
    seen = [(e.kind, e.data if e.kind == "chunk" else None) async for e in g.compile().aevents(1)
            if e.kind in ("chunk", "retry", "end")]
    assert seen == [("chunk", "try1"), ("retry", None), ("chunk", "try2"), ("chunk", "!"), ("end", None)]
