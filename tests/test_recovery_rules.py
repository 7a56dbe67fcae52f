"""`waypoint.engine.recover`'s rules, one pass at a time on a real SQLite file (engine/keep/recovery.py): a run whose
owner is on another host is continued only once its lease expired on the store's clock; a live owner on this
host is never taken; a paused or cancelled run is left; a run of a graph not served is left (and said once);
at most `concurrency` runs are continued at once; a run is given up after `max_attempts` takeovers without
progress, and a takeover that made progress starts the count again. Crashed runs are made by writing the
`running` version a dead process leaves behind (tests/test_recovery.py kills real processes)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import pytest

from waypoint.engine import END, START, Graph, GraphInterrupted, Interrupt, StoreUnavailable, WaypointError, recover
from waypoint.engine.keep.checkpoint import Checkpointer
from waypoint.engine.run.position import RunPosition
from waypoint.stores import SQLiteStore

LEASE = 0.5


def build(store, name="g", ran=None, gate=None, lease=LEASE):
    ran = [] if ran is None else ran

    async def work(x):
        ran.append(x)
        if gate is not None:
            await gate.wait()
        return x + 1

    g = Graph(name=name)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile(store=store, lease_seconds=lease)


async def crashed(app, cid, owner, *, lease=LEASE, value=1, pos=None):
    """Write what a process that died inside the first step leaves: a `running` version holding `owner`'s lease."""
    cp = Checkpointer(store=app.store, serializer=app.get_serializer(), checkpoint_id=cid,
                      graph_structure=app.structure, owner=owner, lease_seconds=lease)
    await cp.save(pos or RunPosition(pending={"work": value}, ledger=1, lineage="l" + cid), "running")
    return cp


async def until_leases_ran_out(store, *ids):
    """Wait until the lease of each run's newest version has run out on the store's clock — what recovery judges
    by (a sleep of the lease on this process's clock is not that: the two clocks are not the same)."""
    while True:
        now = await store.clock()
        heads = [(await store.history(cid, limit=1))[0] for cid in ids]
        if all(h.lease_expires is None or h.lease_expires <= now for h in heads):
            return
        await asyncio.sleep(0.02)


@pytest.fixture
async def store(tmp_path):
    s = SQLiteStore(tmp_path / "runs.db")
    yield s
    await s.close()


async def test_a_lease_held_from_another_host_is_waited_for_then_the_run_is_continued(store):
    ran = []
    app = build(store, ran=ran)
    await crashed(app, "far", "elsewhere:4242:abcd", lease=1.0)
    assert await recover([app]) == []  # its lease still holds on the store's clock: another host's word
    assert (await app.get_run("far")).meta.status == "running" and ran == []
    await asyncio.sleep(1.05)
    (done,) = await recover([app])
    assert (done.checkpoint_id, done.outcome) == ("far", "completed") and ran == [1]
    assert (await app.get_run("far")).output == 2


async def test_a_live_owner_on_this_host_is_never_taken_and_a_dead_one_at_once(store):
    app = build(store)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = os.uname().nodename
        await crashed(app, "alive", f"{host}:{sleeper.pid}:aaaa", lease=60)
        await crashed(app, "mine", f"{host}:{os.getpid()}:bbbb", lease=60)  # this process, not executing it
        found = {r.checkpoint_id: r.outcome for r in await recover([app])}
        assert found == {"mine": "completed"}
        meta = (await app.get_run("alive")).meta
        assert meta.status == "running" and meta.lease_owner == f"{host}:{sleeper.pid}:aaaa"
        sleeper.kill()
        sleeper.wait()
        found = {r.checkpoint_id: r.outcome for r in await recover([app])}
        assert found == {"alive": "completed"}  # gone from this host: at once, its 60 s lease ended first
    finally:
        sleeper.kill()
        sleeper.wait()


async def test_paused_cancelled_and_completed_runs_are_left_as_they_are(store):
    ran = []
    gate = asyncio.Event()
    app = build(store, ran=ran, gate=gate)

    def ask(x):
        raise Interrupt("ok?")

    g = Graph(name="asker")
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    asker = g.compile(store=store, lease_seconds=LEASE)
    with pytest.raises(GraphInterrupted):
        await asker.ainvoke("x", checkpoint_id="paused")
    task = asyncio.create_task(app.ainvoke(5, checkpoint_id="cancelled"))
    while not ran:
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    gate.set()
    await app.ainvoke(7, checkpoint_id="done")
    await until_leases_ran_out(store, "paused", "cancelled", "done")
    assert await recover([app, asker]) == []
    assert [m.status for m in [(await app.get_run(c)).meta for c in ("cancelled", "done")]] == ["interrupted",
                                                                                               "completed"]
    assert (await asker.get_run("paused")).meta.status == "interrupted" and ran == [5, 7]


async def test_a_run_of_a_graph_not_served_is_left_and_said_once(store, caplog):
    served, other = build(store, name="served"), build(store, name="other")
    await crashed(other, "theirs", "elsewhere:1:x")
    await until_leases_ran_out(store, "theirs")
    with caplog.at_level(logging.WARNING, logger="waypoint.recovery"):
        assert await recover([served]) == []
        assert (await other.get_run("theirs")).meta.status == "running"
    said = [r.getMessage() for r in caplog.records if "'theirs'" in r.getMessage()]
    assert len(said) == 1 and "a graph this process does not serve" in said[0]
    (done,) = await recover([other])
    assert done.outcome == "completed"


async def test_at_most_concurrency_runs_are_continued_at_once(store):
    now, most = 0, 0
    release = asyncio.Event()

    async def work(x):
        nonlocal now, most
        now += 1
        most = max(most, now)
        await release.wait()
        now -= 1
        return x

    g = Graph(name="g")
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    app = g.compile(store=store, lease_seconds=LEASE)
    for i in range(6):
        await crashed(app, f"r{i}", "elsewhere:1:x")
    await until_leases_ran_out(store, *(f"r{i}" for i in range(6)))
    pass_ = asyncio.create_task(recover([app], concurrency=2))
    while now < 2:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # had a third started, it would be running by now
    assert now == 2
    release.set()
    assert sorted(r.outcome for r in await pass_) == ["completed"] * 6 and most == 2


class DiesAfter:
    """The store as seen by a process that dies after `writes` writes: later ones fail (the engine then leaves
    the run `running` as last saved and ends its lease — what a process killed there leaves, minus the wait)."""

    def __init__(self, store, writes):
        self.store, self.writes = store, writes

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def put(self, *args, **kw):
        if self.writes == 0:
            raise StoreUnavailable("this process died here")
        self.writes -= 1
        return await self.store.put(*args, **kw)


def two_steps(store):
    g = Graph(name="two")
    g.add_node("a", lambda x: x + 1)
    g.add_node("b", lambda x: x * 10)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g.compile(store=store, lease_seconds=LEASE)


async def takeovers(app, cid):
    reader = Checkpointer(store=app.store, serializer=app.get_serializer(), checkpoint_id=cid,
                          graph_structure=app.structure)
    loaded = await reader.load()
    return loaded.position.takeovers, loaded.position.taken_at == loaded.meta.version


async def test_takeovers_without_progress_are_counted_and_progress_starts_the_count_again(store):
    app = two_steps(store)
    with pytest.raises(StoreUnavailable):  # the first execution dies after its claim
        await two_steps(DiesAfter(store, 1)).ainvoke(1, checkpoint_id="crashy")
    assert await takeovers(app, "crashy") == (0, False)
    for n in (1, 2):  # takeovers that die right after their claim: nothing written after it
        with pytest.raises(StoreUnavailable):
            await two_steps(DiesAfter(store, 1)).ainvoke(None, checkpoint_id="crashy")
        assert await takeovers(app, "crashy") == (n, True)
    with pytest.raises(StoreUnavailable):  # this one writes a step (progress), then dies
        await two_steps(DiesAfter(store, 2)).ainvoke(None, checkpoint_id="crashy")
    assert await takeovers(app, "crashy") == (3, False)
    with pytest.raises(StoreUnavailable):
        await two_steps(DiesAfter(store, 1)).ainvoke(None, checkpoint_id="crashy")
    assert await takeovers(app, "crashy") == (1, True)  # counted again from one
    with pytest.raises(StoreUnavailable):
        await two_steps(DiesAfter(store, 1)).ainvoke(None, checkpoint_id="crashy")
    (gave,) = await recover([app], max_attempts=2)
    assert gave.outcome == "gave up" and "gave up after 2 attempts" in gave.detail
    meta = (await app.get_run("crashy")).meta
    assert meta.status == "failed" and "resume it by hand" in meta.error
    assert await recover([app], max_attempts=2) == []  # failed: left alone
    assert await app.ainvoke(None, checkpoint_id="crashy") == 20  # by hand: it runs


async def test_recover_refuses_a_graph_without_a_store_and_bad_options():
    g = Graph(name="g")
    g.add_node("n", lambda x: x)
    g.add_edge(START, "n")
    g.add_edge("n", END)
    with pytest.raises(WaypointError, match="without a store"):
        await recover([g.compile()])
    with pytest.raises(ValueError):
        await recover([g.compile()], concurrency=0)


async def test_a_service_with_a_queue_leaves_recovery_to_the_workers_and_one_without_recovers(store):
    from waypoint.service import create_app

    ran = []
    app = build(store, ran=ran)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    await crashed(app, "dead", f"{os.uname().nodename}:{gone.pid}:cccc", lease=60)
    queued = create_app(app, store, auth="test-token-5f1c2d", queue=True)
    async with queued.router.lifespan_context(queued):
        await asyncio.sleep(2.5)  # recovery, when on, looks at once and every second
    assert (await app.get_run("dead")).meta.status == "running" and ran == []  # for a worker of graph "g"
    own = create_app(app, store, auth="test-token-5f1c2d")
    async with own.router.lifespan_context(own):
        for _ in range(250):
            if (await app.get_run("dead")).meta.status == "completed":
                break
            await asyncio.sleep(0.02)
    assert (await app.get_run("dead")).meta.status == "completed" and ran == [1]
