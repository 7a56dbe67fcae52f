"""The run-level hooks of callback handlers (`on_run_start` / `on_run_end`) and the trace carrier a run stores
with its versions, which the run that continues from one of them reads back (what tracing links with)."""

from __future__ import annotations

import asyncio

import pytest

from waypoint.engine import END, START, CheckpointConflict, GraphInterrupted, Interrupt, get_resume_context
from waypoint.engine.events import TRACE_LIMITS, RunInfo, clean_trace
from waypoint.stores import MemoryStore, SQLiteStore


class Hooks:
    def __init__(self, trace: dict[str, str] | None = None) -> None:
        self.trace = trace or {}
        self.seen: list[tuple[str, RunInfo]] = []

    def on_run_start(self, info: RunInfo) -> None:
        self.seen.append(("start", info))
        assert info.status is None
        info.trace.update(self.trace)

    async def on_run_end(self, info: RunInfo) -> None:  # async hooks are awaited
        self.seen.append(("end", info))


def ask(x):
    is_target, has_data, data = get_resume_context()
    if not is_target:
        raise Interrupt("approve?")
    return f"{x}:{data}"


def build(store=None, fail=False):
    from waypoint.engine import Graph

    def boom(x):
        raise ValueError("boom")

    g = Graph(name="hooks")
    g.add_node("a", lambda x: x + "!")
    g.add_node("ask", boom if fail else ask)
    g.add_edge(START, "a")
    g.add_edge("a", "ask")
    g.add_edge("ask", END)
    return g.compile(store=store) if store is not None else g.compile()


async def test_each_call_is_one_start_and_one_end_that_says_how_it_ended(tmp_path):
    store = SQLiteStore(tmp_path / "runs.db")
    app = build(store)
    hooks = Hooks()
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke("hi", checkpoint_id="t1", callbacks=[hooks])
    (_, start), (_, end) = hooks.seen
    assert start is end and end.status == "interrupted" and end.graph == "hooks" and end.checkpoint_id == "t1"
    assert [c.id for c in end.interrupts.contexts] == [c.id for c in paused.value.info.contexts]
    paused_at = (await store.history("t1", limit=1))[0].version
    assert end.version == paused_at and not end.resumed

    hooks = Hooks()
    (iid,) = [c.id for c in paused.value.info.contexts]
    assert await app.ainvoke(None, checkpoint_id="t1", resume={iid: "yes"}, callbacks=[hooks]) == "hi!:yes"
    (_, start), (_, end) = hooks.seen
    assert end.status == "completed" and end.resumed and end.resume_ids == (iid,) and end.resumed_from == paused_at

    hooks = Hooks()
    with pytest.raises(Exception, match="boom"):
        await build(store, fail=True).ainvoke("x", checkpoint_id="t2", callbacks=[hooks])
    assert [k for k, _ in hooks.seen] == ["start", "end"] and hooks.seen[1][1].status == "failed"
    assert "boom" in str(hooks.seen[1][1].error)

    hooks = Hooks()  # a run with no store is observed too (nothing to store its carrier with)
    with pytest.raises(GraphInterrupted):
        await build().ainvoke("x", callbacks=[hooks])
    assert [k for k, _ in hooks.seen] == ["start", "end"] and hooks.seen[1][1].status == "interrupted"
    assert hooks.seen[1][1].checkpoint_id is None and hooks.seen[1][1].version is None
    await store.close()


async def test_unstored_and_cancelled_runs_are_observed_too():
    gate = asyncio.Event()

    async def slow(x):
        await gate.wait()
        return x

    from waypoint.engine import Graph

    g = Graph(name="slow")
    g.add_node("s", slow)
    g.add_edge(START, "s")
    g.add_edge("s", END)
    app = g.compile(store=MemoryStore())
    hooks = Hooks()
    task = asyncio.ensure_future(app.ainvoke("x", checkpoint_id="c", callbacks=[hooks]))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [k for k, _ in hooks.seen] == ["start", "end"] and hooks.seen[1][1].status == "cancelled"


async def test_aevents_does_not_yield_run_hooks(tmp_path):
    hooks = Hooks()
    app = build()
    kinds = []
    with pytest.raises(GraphInterrupted):
        async for event in app.aevents("x", callbacks=[hooks]):
            kinds.append(event.kind)
    assert set(kinds) <= {"start", "end", "interrupt", "chunk", "checkpoint"} and hooks.seen


async def test_a_resume_reads_the_trace_stored_by_the_run_that_paused(tmp_path):
    db = tmp_path / "runs.db"
    store = SQLiteStore(db)
    with pytest.raises(GraphInterrupted) as paused:
        await build(store).ainvoke("hi", checkpoint_id="t", callbacks=[Hooks({"traceparent": "run-A"})])
    paused_at = (await store.history("t", limit=1))[0].version
    await store.close()
    store = SQLiteStore(db)  # as a new process would: nothing in memory
    hooks = Hooks({"traceparent": "run-B"})
    (iid,) = [c.id for c in paused.value.info.contexts]
    await build(store).ainvoke(None, checkpoint_id="t", resume={iid: 1}, callbacks=[hooks])
    start = hooks.seen[0][1]
    assert start.previous_trace == {"traceparent": "run-A"} and start.resumed_from == paused_at
    newest = await build(store).get_run("t")  # every version this run wrote carries its own carrier
    assert newest.meta.status == "completed"
    from waypoint.engine.keep.checkpoint import Checkpointer

    reader = Checkpointer(store=store, serializer=build(store).get_serializer(), checkpoint_id="t",
                          graph_structure={})
    assert (await reader.load()).trace == {"traceparent": "run-B"}
    newer = [m.version for m in await store.history("t") if m.version > paused_at]
    assert len(newer) >= 2  # the claim (what a resume after a crash right there would read) and on
    for version in newer:
        assert (await reader.load(version=version)).trace == {"traceparent": "run-B"}, version
    assert (await reader.load(version=paused_at)).trace == {"traceparent": "run-A"}
    from waypoint.engine import read_run  # and the snapshots say so too (what `waypoint runs` reads)

    assert newest.trace == {"traceparent": "run-B"}
    assert (await read_run(store, "t", version=paused_at)).trace == {"traceparent": "run-A"}
    await store.close()


def test_a_trace_carrier_keeps_only_short_strings():
    entries, key_max, value_max = TRACE_LIMITS
    hostile = {"traceparent": "00-ab-cd-01", "k" * (key_max + 1): "v", "big": "x" * (value_max + 1), 3: "x",
               "n": 5, "": "empty", **{f"k{i}": "v" for i in range(20)}}
    cleaned = clean_trace(hostile)
    assert cleaned["traceparent"] == "00-ab-cd-01" and len(cleaned) == entries
    assert all(type(k) is str and len(k) <= key_max and type(v) is str and len(v) <= value_max
               for k, v in cleaned.items())
    assert clean_trace(["traceparent"]) == {} and clean_trace(None) == {}


async def test_a_run_whose_claim_loses_ends_as_failed(tmp_path):
    store = SQLiteStore(tmp_path / "runs.db")
    app = build(store)
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke("hi", checkpoint_id="t", callbacks=[Hooks()])
    (iid,) = [c.id for c in paused.value.info.contexts]

    class Racer(Hooks):
        async def on_run_start(self, info: RunInfo) -> None:  # another resumer wins between read and claim
            super().on_run_start(info)
            assert await build(store).ainvoke(None, checkpoint_id="t", resume={iid: "first"}) == "hi!:first"

    hooks = Racer()
    with pytest.raises(CheckpointConflict):
        await app.ainvoke(None, checkpoint_id="t", resume={iid: "second"}, callbacks=[hooks])
    assert [k for k, _ in hooks.seen] == ["start", "end"]
    assert hooks.seen[1][1].status == "failed" and isinstance(hooks.seen[1][1].error, CheckpointConflict)
    await store.close()
