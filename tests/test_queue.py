"""The run queue and its worker, in one process, on SQLite and on a real Postgres server.

Cross-process claims (several worker processes, one of them SIGKILLed) are in tests/test_scale_out.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from waypoint.engine import END, START, Graph, GraphInterrupted, Interrupt, get_resume_context
from waypoint.stores import MemoryStore, QueueError, QueueTimeout, RunQueue, SQLiteStore, SQLStore, Worker


@pytest.fixture(params=["sqlite", "postgres"])
async def qstore(request, tmp_path):
    """A store the queue works on: a SQLite file, or a fresh Postgres database."""
    if request.param == "sqlite":
        s = SQLiteStore(tmp_path / "queue.db")
    else:
        s = SQLStore(request.getfixturevalue("pg_url"))
    yield s
    await s.close()


def approval_graph(store, calls: Counter, *, slow: float = 0.0, name: str = "ask", lease: float = 30.0):
    """START -> prepare -> ask (pauses until answered) -> finish -> END; counts every node's runs."""

    async def prepare(x):
        calls["prepare", x] += 1
        await asyncio.sleep(slow)
        return x

    def ask(x):
        calls["ask", x] += 1
        is_target, _, data = get_resume_context()
        if not is_target:
            raise Interrupt({"question": f"ship {x}?"})
        if data == "boom":
            raise RuntimeError("the answer was boom")
        return f"{x}:{data}"

    def finish(x):
        calls["finish", x.split(":")[0]] += 1
        return x.upper()

    g = Graph(name=name)
    for key, fn in (("prepare", prepare), ("ask", ask), ("finish", finish)):
        g.add_node(key, fn)
    for a, b in ((START, "prepare"), ("prepare", "ask"), ("ask", "finish"), ("finish", END)):
        g.add_edge(a, b)
    return g.compile(store=store, lease_seconds=lease)


async def running(worker: Worker):
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(0)
    return task


async def stopped(worker: Worker, task) -> None:
    worker.stop()
    await asyncio.wait_for(task, 30)


async def test_submit_pause_resume_complete(qstore):
    calls: Counter = Counter()
    app = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    worker = Worker(qstore, [app], concurrency=4, poll=0.05)
    task = await running(worker)
    for i in range(5):
        await queue.submit(app, f"r{i}", f"run-{i}")
    paused = [await queue.wait(f"run-{i}", timeout=20) for i in range(5)]
    assert [p.outcome for p in paused] == ["interrupted"] * 5
    assert all(p.run_status == "interrupted" and p.attempts == 1 for p in paused)
    assert list(paused[0].interrupts.values()) == [{"question": "ship r0?"}]
    for i, p in enumerate(paused):
        (iid,) = p.interrupts
        await queue.resume(f"run-{i}", {iid: "yes"})
    done = [await queue.wait(f"run-{i}", timeout=20) for i in range(5)]
    await stopped(worker, task)
    assert [d.outcome for d in done] == ["completed"] * 5
    assert [d.output for d in done] == [f"R{i}:YES" for i in range(5)]
    assert all(d.kind == "resume" and d.run_status == "completed" and d.finished_at >= d.submitted_at for d in done)
    assert all(calls["prepare", f"r{i}"] == 1 and calls["ask", f"r{i}"] == 2 and calls["finish", f"r{i}"] == 1
               for i in range(5))
    assert worker.finished == 10


async def test_the_queue_refuses_what_the_run_does_not_allow(qstore):
    calls: Counter = Counter()
    app = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    with pytest.raises(QueueError, match="'nobody' does not exist"):
        await queue.resume("nobody", {"x": 1})
    with pytest.raises(QueueError, match="nothing was queued"):
        await queue.wait("nobody")
    await queue.submit(app, "a", "run-a")
    with pytest.raises(QueueError, match="already has work queued"):
        await queue.submit(app, "a", "run-a")
    with pytest.raises(QueueTimeout, match="still queued after 0.05 s"):
        await queue.wait("run-a", timeout=0.05)  # no worker serves it
    worker = Worker(qstore, [app], poll=0.05)
    task = await running(worker)
    (iid,) = (await queue.wait("run-a", timeout=20)).interrupts
    with pytest.raises(QueueError, match="is interrupted: submit\\(\\) starts runs"):
        await queue.submit(app, "again", "run-a")
    await queue.resume("run-a", {"not-an-id": "yes"})
    refused = await queue.wait("run-a", timeout=20)
    assert refused.outcome == "error" and "UnknownInterrupt" in refused.error and iid in refused.error
    assert refused.run_status == "interrupted"  # the run itself is untouched: answer it properly
    await queue.resume("run-a", {iid: "boom"})
    failed = await queue.wait("run-a", timeout=20)
    assert failed.outcome == "failed" and "the answer was boom" in failed.error and failed.run_status == "failed"
    await stopped(worker, task)
    with pytest.raises(QueueError, match="MemoryStore lives and dies with one process"):
        RunQueue(MemoryStore())
    direct = approval_graph(qstore, calls, name="direct")
    with pytest.raises(GraphInterrupted):
        await direct.ainvoke("d", checkpoint_id="run-d")  # paused, but never queued
    with pytest.raises(QueueError, match="not submitted through the queue"):
        await queue.resume("run-d", True)
    await queue.resume("run-d", True, graph=direct)  # naming the graph is enough
    assert (await queue.status("run-d")).state == "queued"


async def test_a_worker_only_takes_work_for_its_graphs(qstore):
    calls: Counter = Counter()
    mine = approval_graph(qstore, calls, name="mine")
    queue = RunQueue(qstore)
    await queue.submit("other", "o", "run-o")
    await queue.submit(mine, "m", "run-m")
    worker = Worker(qstore, [mine], poll=0.05)
    task = await running(worker)
    assert (await queue.wait("run-m", timeout=20)).outcome == "interrupted"
    await stopped(worker, task)
    assert (await queue.status("run-o")).state == "queued" and calls["prepare", "o"] == 0


async def test_concurrent_claimers_never_get_the_same_work(qstore, request):
    """Five claimers (separate connections) race for 40 queued runs: each run is claimed exactly once."""
    queue = RunQueue(qstore)
    for i in range(40):
        await queue.submit("g", i, f"run-{i}")
    url = getattr(qstore, "url", None)
    rivals = [RunQueue(SQLStore(url) if url else SQLiteStore(qstore.path)) for _ in range(5)]
    got = await asyncio.gather(*(q._claim(f"w{i}", ["g"], 10, 30.0) for i, q in enumerate(rivals)))
    ids = [row[0] for rows in got for row in rows]
    assert len(ids) == 40 and len(set(ids)) == 40
    assert all(row[5] == 1 for rows in got for row in rows)  # attempt 1 each
    assert await rivals[0]._claim("late", ["g"], 10, 30.0) == []
    for q in rivals:
        await q.store.close()


async def test_a_dead_workers_claim_is_taken_again_only_once_the_run_has_no_live_lease(qstore):
    from waypoint.engine.store import CheckpointMeta

    queue = RunQueue(qstore)
    await queue.submit("g", 1, "run-1")
    ((cid, *_rest),) = await queue._claim("ghost", ["g"], 5, 0.2)  # dies before its run writes anything
    assert await queue._claim("w2", ["g"], 5, 30.0) == []  # its claim still holds
    await asyncio.sleep(0.25)
    (row,) = await queue._claim("w2", ["g"], 5, 0.2)
    assert row[0] == "run-1" and row[5] == 2  # taken again: attempt 2
    # w2's run writes a version with a live lease, then w2's claim lapses (its loop is blocked, say):
    now = time.time()
    await qstore.put(CheckpointMeta(checkpoint_id="run-1", version=1, status="running", step=0, fingerprint="f",
                                    created_at=now, updated_at=now, lease_owner="w2-run", lease_expires=now + 0.6),
                     b"h", {}, [], expected_version=None)
    await asyncio.sleep(0.25)
    assert await queue._claim("w3", ["g"], 5, 30.0) == []  # the run's live lease says w2 is alive
    await asyncio.sleep(0.5)
    (row,) = await queue._claim("w3", ["g"], 5, 30.0)
    assert row[5] == 3 and (await queue.status("run-1")).worker == "w3"
    assert await queue._finish("run-1", "w2", 2, "completed", None, None) is False  # w2's record comes too late


async def test_stop_drains_and_hands_unfinished_runs_to_another_worker(qstore):
    calls: Counter = Counter()
    app = approval_graph(qstore, calls, slow=0.5)
    queue = RunQueue(qstore)
    first = Worker(qstore, [app], poll=0.05, drain_seconds=0.05)
    task = await running(first)
    await queue.submit(app, "s", "run-s")
    while calls["prepare", "s"] == 0:
        await asyncio.sleep(0.01)
    await stopped(first, task)  # 'prepare' is still sleeping: cancelled, saved, handed back
    handed = await queue.status("run-s")
    assert handed.state == "queued" and handed.attempts == 1 and handed.run_status == "interrupted"
    assert (await qstore.history("run-s", limit=1))[0].error == "cancelled"
    second = Worker(qstore, [app], poll=0.05)
    task = await running(second)
    paused = await queue.wait("run-s", timeout=20)
    await stopped(second, task)
    assert paused.outcome == "interrupted" and paused.attempts == 2
    assert calls["prepare", "s"] == 2 and calls["ask", "s"] == 1  # only the step in flight ran again


async def test_postgres_notify_wakes_an_idle_worker_at_once(pg_url):
    store = SQLStore(pg_url)
    calls: Counter = Counter()
    app = approval_graph(store, calls)
    queue = RunQueue(store)
    worker = Worker(store, [app], poll=30.0)  # without NOTIFY it would look again in 30 s
    task = await running(worker)
    await asyncio.sleep(0.3)  # idle, waiting
    started = time.monotonic()
    await queue.submit(app, "n", "run-n")
    assert (await queue.wait("run-n", timeout=10)).outcome == "interrupted"
    assert time.monotonic() - started < 3.0
    await stopped(worker, task)
    await store.close()


async def test_work_that_every_worker_died_on_is_given_up_after_max_attempts(qstore):
    calls: Counter = Counter()
    app = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    await queue.submit(app, "p", "run-p")
    for _ in range(2):  # two workers took it and died before the run wrote anything
        assert len(await queue._claim("ghost", ["ask"], 5, 0.05)) == 1
        await asyncio.sleep(0.1)
    worker = Worker(qstore, [app], poll=0.05, max_attempts=2)
    task = await running(worker)
    given_up = await queue.wait("run-p", timeout=20)
    await stopped(worker, task)
    assert given_up.outcome == "error" and "gave up after 2 attempts" in given_up.error
    assert given_up.attempts == 3 and calls["prepare", "p"] == 0
