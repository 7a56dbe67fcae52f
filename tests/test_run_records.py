"""A stored run stays readable and honest while other code prunes, deletes, expires, forks or pages it;
and what the errors say when a stored run refuses a request."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter

import pytest

from waypoint.engine import (
    END,
    START,
    CheckpointExists,
    CheckpointNotFound,
    Graph,
    GraphInterrupted,
    Interrupt,
    UnknownInterrupt,
    WaypointError,
    get_resume_context,
)
from waypoint.stores import MemoryStore, SQLiteStore



def toggling(store, hook) -> Graph:
    """Four steps whose state field goes A, B, (hook), A, B; `hook(step)` runs inside the third."""
    g = Graph(name="toggle", state=lambda: {"mode": "", "items": []})

    def make(n):
        async def step(x, state):
            if n == 2:
                await hook()
            state["mode"] = "AB"[n % 2]
            state["items"].append(n)
            return x + 1

        return step

    names = [f"s{i}" for i in range(4)]
    for i, name in enumerate(names):
        g.add_node(name, make(i))
    for a, b in zip([START, *names], [*names, END]):
        g.add_edge(a, b)
    return g.compile(store=store)


async def test_prune_during_a_live_run_leaves_every_version_readable(store):
    app = toggling(store, lambda: store.prune("t", keep_last=1))  # drops the blob of mode "A"
    assert await app.ainvoke(0, checkpoint_id="t") == 4  # step s2 writes mode "A" again
    for meta in await store.history("t"):
        snap = await app.get_run("t", version=meta.version)
        assert snap.state["items"] == list(range(len(snap.state["items"])))
    assert (await app.get_run("t")).state == {"mode": "B", "items": [0, 1, 2, 3]}


async def test_a_run_deleted_while_it_runs_stays_deleted(store):
    app = toggling(store, lambda: store.delete("t"))
    with pytest.raises(CheckpointNotFound, match="stays deleted"):
        await app.ainvoke(0, checkpoint_id="t")
    assert await store.history("t") == []


async def test_a_run_expired_while_a_resume_claims_it_stays_expired(tmp_path):
    class ExpiringStore(MemoryStore):
        """Expires every paused run just before the resume's claim lands."""

        armed = False

        async def put(self, meta, header, parts, blobs, *, expected_version, **fence):
            if self.armed and meta.status == "running":
                await self.expire(older_than=0, now=time.time() + 1)
            return await super().put(meta, header, parts, blobs, expected_version=expected_version, **fence)

    store = ExpiringStore()
    calls = Counter()

    def gate(x):
        calls["gate"] += 1
        if not get_resume_context()[0]:
            raise Interrupt("?")
        return x

    g = Graph(name="g")
    g.add_node("gate", gate)
    g.add_edge(START, "gate")
    g.add_edge("gate", END)
    app = g.compile(store=store)
    with pytest.raises(GraphInterrupted):
        await app.ainvoke(1, checkpoint_id="e")
    store.armed = True
    with pytest.raises(CheckpointNotFound):
        await app.ainvoke(None, checkpoint_id="e", resume=True)
    assert await store.history("e") == [] and calls["gate"] == 1


def paused_app(store, name="p"):
    g = Graph(name=name)
    g.add_node("ask", lambda x: x if get_resume_context()[0] else (_ for _ in ()).throw(Interrupt("?")))
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g.compile(store=store)


async def test_write_to_a_run_that_exists_is_refused_unless_forced(store):
    app = paused_app(store)
    for cid in ("source", "target"):
        with pytest.raises(GraphInterrupted):
            await app.ainvoke(cid, checkpoint_id=cid)
    with pytest.raises(CheckpointExists, match="write_to='target' already holds a run"):
        await app.ainvoke(None, checkpoint_id="source", resume=True, write_to="target")
    assert (await store.history("target"))[0].status == "interrupted"  # the pending approval survives
    out = await app.ainvoke(None, checkpoint_id="source", resume=True, write_to="target", force_new_run=True)
    assert out == "source"


async def test_a_fork_records_where_it_came_from(store):
    app = paused_app(store)
    with pytest.raises(GraphInterrupted):
        await app.ainvoke("x", checkpoint_id="orig")
    paused = (await store.history("orig"))[0].version
    await app.ainvoke(None, checkpoint_id="orig", resume=True, write_to="fork")
    first = (await store.history("fork"))[-1]
    assert first.origin == f"orig@{paused}"
    assert all(m.origin is None for m in (await store.history("fork"))[:-1])
    await app.ainvoke(None, checkpoint_id="orig", resume=True)
    await app.ainvoke(None, checkpoint_id="orig", version=paused, resume=True)  # time travel
    assert (await store.history("orig"))[1].origin == f"orig@{paused}"


async def test_force_new_run_starts_with_its_own_created_at(store):
    app = paused_app(store)
    with pytest.raises(GraphInterrupted):
        await app.ainvoke("first", checkpoint_id="r")
    before = (await store.history("r"))[0].created_at
    await asyncio.sleep(0.02)
    with pytest.raises(GraphInterrupted):
        await app.ainvoke("second", checkpoint_id="r", force_new_run=True)
    assert (await store.history("r"))[0].created_at > before


async def test_resuming_an_unknown_run_with_input_none_is_not_found(store):
    calls = Counter()
    g = Graph(name="n")
    g.add_node("a", lambda x: calls.update(["a"]) or x)
    g.add_edge(START, "a")
    g.add_edge("a", END)
    app = g.compile(store=store)
    with pytest.raises(CheckpointNotFound, match="does not exist"):
        await app.ainvoke(None, checkpoint_id="nobody")
    assert calls["a"] == 0 and await store.history("nobody") == []
    assert await app.ainvoke(None, checkpoint_id="nobody", force_new_run=True) is None


async def test_an_empty_checkpoint_id_is_refused():
    app = paused_app(MemoryStore())
    with pytest.raises(WaypointError, match="non-empty string"):
        await app.ainvoke(1, checkpoint_id="")


async def test_new_input_for_a_paused_run_says_how_to_resume_it():
    app = paused_app(MemoryStore())
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke(1, checkpoint_id="r")
    iid = paused.value.info.contexts[0].id
    with pytest.raises(CheckpointExists) as exists:
        await app.ainvoke(2, checkpoint_id="r")
    message = str(exists.value)
    assert f"resume={{'{iid}': <answer>}}" in message and iid in message
    # following the advice works
    assert await app.ainvoke(None, checkpoint_id="r", resume={iid: "yes"}) == 1


async def test_a_run_whose_process_died_is_described_as_such():
    from waypoint.engine.keep.checkpoint import Checkpointer
    from waypoint.engine.run.position import RunPosition

    store = MemoryStore()
    app = paused_app(store, name="h")
    # a process that wrote its claim and died: its lease runs out and nobody renews it
    claim = Checkpointer(store=store, serializer=app.get_serializer(), checkpoint_id="h",
                         graph_structure=app.structure, lease_seconds=0.01)
    await claim.save(RunPosition(pending={START: 5}), "running")
    await asyncio.sleep(0.02)
    with pytest.raises(CheckpointExists) as exists:
        await app.ainvoke(5, checkpoint_id="h")
    assert "was running when its process stopped (its lease expired at" in str(exists.value)
    assert re.search(r"continue it with ainvoke\(None, checkpoint_id='h'\)", str(exists.value))
    with pytest.raises(GraphInterrupted):  # and the advice works
        await app.ainvoke(None, checkpoint_id="h")


def test_invoke_inside_a_running_loop_names_ainvoke():
    app = paused_app(MemoryStore())

    async def inside():
        app.invoke(1)

    with pytest.raises(WaypointError, match=r"await graph.ainvoke"):
        asyncio.run(inside())


async def test_an_in_place_edit_of_a_list_survives_pause_and_resume_in_a_fresh_store(tmp_path):
    db = tmp_path / "edit.db"

    def build():
        g = Graph(name="edit", state=lambda: {"items": []})

        def fill(x, state):
            state["items"] += ["a", "b", "c"]
            return x

        def edit(x, state):
            state["items"][0] = "z"  # in place: the list did not grow
            return x

        def gate(x, state):
            if not get_resume_context()[0]:
                raise Interrupt("?")
            return list(state["items"])

        for n, fn in (("fill", fill), ("edit", edit), ("gate", gate)):
            g.add_node(n, fn)
        g.add_edge(START, "fill")
        g.add_edge("fill", "edit")
        g.add_edge("edit", "gate")
        g.add_edge("gate", END)
        return g.compile(store=SQLiteStore(db))

    with pytest.raises(GraphInterrupted):
        await build().ainvoke(0, checkpoint_id="e")
    assert await build().ainvoke(None, checkpoint_id="e", resume=True) == ["z", "b", "c"]


async def test_a_header_that_does_not_list_the_stored_parts_is_corrupted(tmp_path):
    import json
    import sqlite3

    from waypoint.engine import CheckpointCorrupted

    db = tmp_path / "h.db"
    app = paused_app(SQLiteStore(db))
    with pytest.raises(GraphInterrupted):
        await app.ainvoke(1, checkpoint_id="h")
    with sqlite3.connect(db) as conn:
        (parts,) = conn.execute("SELECT parts FROM waypoint_checkpoints WHERE checkpoint_id = 'h' "
                                "ORDER BY version DESC LIMIT 1").fetchone()
        fewer = json.loads(parts)
        fewer.pop("graph")
        conn.execute("UPDATE waypoint_checkpoints SET parts = ? WHERE checkpoint_id = 'h'", (json.dumps(fewer),))
    with pytest.raises(CheckpointCorrupted, match="part list"):
        await paused_app(SQLiteStore(db)).get_run("h")


async def test_unknown_interrupt_message_lists_static_and_dynamic_ids():
    app = paused_app(MemoryStore())
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke(1, checkpoint_id="u")
    with pytest.raises(UnknownInterrupt, match=paused.value.info.contexts[0].id):
        await app.ainvoke(None, checkpoint_id="u")


@pytest.mark.parametrize("durability", ["step", "exit"])
async def test_a_long_step_keeps_its_lease_on_every_store(store, durability):
    """The lease is renewed from another thread (and event loop) than the run's: every store must allow it."""
    started = asyncio.Event()

    async def long_step(x):
        started.set()
        await asyncio.sleep(0.9)
        return x

    g = Graph(name="long")
    g.add_node("long", long_step)
    g.add_edge(START, "long")
    g.add_edge("long", END)
    app = g.compile(store=store, lease_seconds=0.3, durability=durability)
    # force_new_run writes the claim in every durability mode, so there is a lease to watch
    task = asyncio.ensure_future(app.ainvoke(1, checkpoint_id="L2", force_new_run=True))
    await started.wait()
    for _ in range(3):
        await asyncio.sleep(0.25)
        meta = (await store.history("L2"))[0]
        assert meta.status == "running" and meta.lease_expires > time.time(), meta
    assert await task == 1


@pytest.mark.parametrize("cid", ["a\x00b", "\ud800", "x" * 513])
async def test_a_checkpoint_id_no_store_could_keep_is_refused_before_anything_is_written(store, cid):
    from waypoint.engine import END, START, Graph, WaypointError

    g = Graph(name="ids")
    g.add_node("a", lambda x: x)
    g.add_edge(START, "a")
    g.add_edge("a", END)
    with pytest.raises(WaypointError, match="checkpoint_id"):
        await g.compile(store=store).ainvoke(1, checkpoint_id=cid)
    assert await store.list() == []


async def test_an_error_quoting_any_text_is_stored_and_the_run_is_failed(store):
    """An error message may quote a model's text: an unpaired surrogate or a NUL in it must not keep the run
    from being stored as failed (it stayed `running` on a lease nobody renewed)."""
    from waypoint.engine import END, START, Graph, NodeError

    def boom(x):
        raise RuntimeError(f"cannot run {x}")

    g = Graph(name="err")
    g.add_node("a", boom)
    g.add_edge(START, "a")
    g.add_edge("a", END)
    with pytest.raises(NodeError):
        await g.compile(store=store).ainvoke("ls \ud800 \x00", checkpoint_id="e")
    (head,) = await store.history("e", limit=1)
    assert head.status == "failed" and "cannot run ls \\ud800 \\x00" in head.error
