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


def approval_graph(store, calls: Counter, *, slow: float = 0.0, name: str = "ask", lease: float = 30.0,
                   gate: asyncio.Event | None = None):
    """START -> prepare -> ask (pauses until answered) -> finish (waits for `gate`) -> END; counts every node's
    runs."""

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

    async def finish(x):
        calls["finish", x.split(":")[0]] += 1
        if gate is not None:
            await gate.wait()
        return x.upper()

    g = Graph(name=name)
    for key, fn in (("prepare", prepare), ("ask", ask), ("finish", finish)):
        g.add_node(key, fn)
    for a, b in ((START, "prepare"), ("prepare", "ask"), ("ask", "finish"), ("finish", END)):
        g.add_edge(a, b)
    return g.compile(store=store, lease_seconds=lease)


async def until(condition, timeout: float = 20.0) -> None:
    """Wait until `condition()` (a plain or async callable) is true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def counted(obj, name: str) -> list:
    """Every call of `obj.<name>` (a coroutine method) from now on, recorded (the call goes through as before)."""
    calls: list = []
    inner = getattr(obj, name)

    async def counting(*args, **kwargs):
        calls.append(args)
        return await inner(*args, **kwargs)

    setattr(obj, name, counting)
    return calls


async def expired(store, checkpoint_id: str) -> bool:
    """Whether the run's newest lease has run out on the store's clock."""
    (meta,) = await store.history(checkpoint_id, limit=1)
    return meta.lease_expires is not None and meta.lease_expires <= await store.clock()


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
    from waypoint.engine.keep.store import CheckpointMeta

    queue = RunQueue(qstore)
    await queue.submit("g", 1, "run-1")
    ((cid, *_rest),) = await queue._claim("ghost", ["g"], 5, 0.2)  # dies before its run writes anything
    assert await queue._claim("w2", ["g"], 5, 30.0) == []  # its claim still holds
    await asyncio.sleep(0.25)
    (row,) = await queue._claim("w2", ["g"], 5, 0.2)
    assert row[0] == "run-1" and row[5] == 2  # taken again: attempt 2
    w2_token = row[7]
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
    assert await queue._finish("run-1", w2_token, "completed", None, None) is False  # w2's record comes too late


async def test_a_run_whose_executor_died_is_taken_once_its_lease_expires_and_that_takeover_is_kept(qstore):
    """Once the claim's worker wrote the run, the run's lease alone decides: the row is taken as soon as that
    lease expires, though the claim has not lapsed. The new claim is then the takeover's own until its first
    write: nobody takes the row from it meanwhile (claims that bounced between workers gave runs up)."""
    from waypoint.engine.keep.store import CheckpointMeta

    queue = RunQueue(qstore)
    await queue.submit("g", 1, "run-1")
    assert len(await queue._claim("w1", ["g"], 5, 30.0)) == 1  # a long claim...
    now = time.time()
    await qstore.put(CheckpointMeta(checkpoint_id="run-1", version=1, status="running", step=0, fingerprint="f",
                                    created_at=now, updated_at=now, lease_owner="w1-run", lease_expires=now + 0.3),
                     b"h", {}, [], expected_version=None)  # ...whose worker wrote the run, then died
    assert await queue._claim("w2", ["g"], 5, 30.0) == []  # the run's lease is live
    await asyncio.sleep(0.4)
    (row,) = await queue._claim("w2", ["g"], 5, 30.0)  # taken one run lease later, not 30 s later
    assert row[5] == 2
    assert await queue._claim("w3", ["g"], 5, 30.0) == []  # w2's takeover has not written yet: it is w2's


async def test_stop_drains_and_hands_unfinished_runs_to_another_worker(qstore):
    calls: Counter = Counter()
    app = approval_graph(qstore, calls, slow=0.5)
    queue = RunQueue(qstore)
    first = Worker(qstore, [app], poll=0.05, drain_seconds=0.05)
    task = await running(first)
    await queue.submit(app, "s", "run-s")
    await until(lambda: calls["prepare", "s"] > 0)
    await stopped(first, task)  # 'prepare' is still sleeping: stopped where it is, handed back
    handed = await queue.status("run-s")
    assert handed.state == "queued" and handed.attempts == 1 and handed.run_status == "running"
    assert handed.handbacks == 1 and handed.worker is None
    (newest,) = await qstore.history("run-s", limit=1)  # a stop is no decision: not stored as cancelled
    assert newest.error is None and newest.lease_expires <= await qstore.clock()  # its lease ended at once
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


async def test_work_given_up_after_max_attempts_stores_its_run_failed_with_why(qstore):
    """Workers that took the work wrote the run's claim and died: when the queue gives the work up, the run it
    left `running` is stored failed with the same words (else recovery would continue what the queue gave up)."""
    from waypoint.engine.keep.checkpoint import Checkpointer
    from waypoint.engine.run.position import RunPosition

    calls: Counter = Counter()
    app = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    await queue.submit(app, "p", "run-p")
    assert len(await queue._claim("ghost", ["ask"], 5, 0.05)) == 1
    ghost = Checkpointer(store=qstore, serializer=app.get_serializer(), checkpoint_id="run-p",
                         graph_structure=app.structure, owner="elsewhere:1:ghost", lease_seconds=0.05)
    await ghost.save(RunPosition(pending={"prepare": "p"}, ledger=1, lineage="ghost"), "running")
    await asyncio.sleep(0.1)
    for _ in range(2):  # two more took it and died before writing: two claims in a row found it there
        assert len(await queue._claim("ghost", ["ask"], 5, 0.05)) == 1
        await asyncio.sleep(0.1)
    worker = Worker(qstore, [app], poll=0.05, max_attempts=2, recover=False)
    task = await running(worker)
    given_up = await queue.wait("run-p", timeout=20)
    await stopped(worker, task)
    assert given_up.outcome == "error" and "gave up after 2 attempts" in given_up.error
    meta = (await app.get_run("run-p")).meta
    assert meta.status == "failed" and meta.error == given_up.error and calls["prepare", "p"] == 0


async def test_a_worker_continues_a_crashed_run_nobody_queued_unless_told_not_to(qstore):
    """Recovery in the worker: a run of its graph left `running` by a process that died (not through the queue)
    is queued for the fleet and continued; `Worker(recover=False)` leaves it."""
    from waypoint.engine.keep.checkpoint import Checkpointer
    from waypoint.engine.run.position import RunPosition

    calls: Counter = Counter()
    app = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    ghost = Checkpointer(store=qstore, serializer=app.get_serializer(), checkpoint_id="orphan",
                         graph_structure=app.structure, owner="elsewhere:1:ghost", lease_seconds=0.05)
    await ghost.save(RunPosition(pending={"prepare": "o"}, ledger=1, lineage="ghost"), "running")
    await until(lambda: expired(qstore, "orphan"))  # its lease has expired: its process is gone
    off = Worker(qstore, [app], poll=0.05, recover=False)
    looks = counted(off.queue, "_claim")
    task = await running(off)
    await until(lambda: len(looks) >= 10)  # ten looks at the queue: nothing is queued, so nothing runs
    await stopped(off, task)
    assert await queue.status("orphan") is None and calls["prepare", "o"] == 0
    on = Worker(qstore, [app], poll=0.05)
    task = await running(on)
    await until(lambda: queue.status("orphan"))
    paused = await queue.wait("orphan", timeout=20)
    await stopped(on, task)
    assert paused.outcome == "interrupted" and calls["prepare", "o"] == 1 and calls["ask", "o"] == 1


# --- claims that let go (a token per claim; renewed only while worked on; handed back, never orphaned) ------

async def test_a_stale_claim_finishes_nothing_even_when_the_same_worker_claims_again(qstore):
    """A claim is named by its token, not by (worker, attempt): the same worker's lapsed claim, or its claim on
    an earlier request for the run (enqueue starts the attempts again), records nothing."""
    queue = RunQueue(qstore)
    await queue.submit("g", 1, "run-1")
    ((*_, first, _s, _t),) = await queue._claim("w", ["g"], 5, 0.1)
    await asyncio.sleep(0.15)  # w's claim lapsed (say its loop was blocked), and w claims the work again
    ((*_, attempts, _h, second, _s, _t),) = await queue._claim("w", ["g"], 5, 30.0)
    assert attempts == 2 and second != first
    assert await queue._finish("run-1", first, "completed", None, None) is False
    assert await queue._finish("run-1", second, "completed", None, None) is True
    await queue.submit("g", 2, "run-1")  # request 2 for the run (nothing ran it): attempts start again
    ((*_, attempts, _h, third, stalls, _t),) = await queue._claim("w", ["g"], 5, 30.0)
    assert attempts == 1 and stalls == 1
    for stale in (first, second):
        assert await queue._finish("run-1", stale, "completed", None, None) is False
        assert await queue._release("run-1", stale) is False
        assert await queue._renew([stale], 30.0) == 0
    now = await queue.status("run-1")
    assert now.state == "claimed" and now.outcome is None  # request 2 is still to be done, by `third`


async def test_skip_locked_lets_a_claimer_take_the_other_rows_at_once(pg_url):
    """A claim held open in another transaction (rows locked) does not make the next claimer wait: it gets the
    other rows at once (FOR UPDATE SKIP LOCKED), and the locked ones once that transaction ends."""
    import asyncpg

    from pg import database_of

    store = SQLStore(pg_url)
    queue = RunQueue(store)
    for i in range(4):
        await queue.submit("g", i, f"run-{i}")
    host = pg_url.split("host=", 1)[1]
    raw = await asyncpg.connect(host=host, user="postgres", database=database_of(pg_url))
    try:
        holding = raw.transaction()
        await holding.start()
        await raw.fetch("SELECT checkpoint_id FROM waypoint_queue WHERE checkpoint_id IN ('run-0', 'run-1') "
                        "FOR UPDATE")
        got = await asyncio.wait_for(queue._claim("w", ["g"], 10, 30.0), 5)
        assert sorted(row[0] for row in got) == ["run-2", "run-3"]
        await holding.rollback()
        got = await asyncio.wait_for(queue._claim("w", ["g"], 10, 30.0), 5)
        assert sorted(row[0] for row in got) == ["run-0", "run-1"]
    finally:
        await raw.close()
        await store.close()


async def test_a_claimer_whose_clock_runs_ahead_takes_no_live_claim_and_no_live_run(pg_url, monkeypatch):
    """Claims and leases are judged on the Postgres server's clock: a claimer whose wall clock runs 60 s ahead
    takes neither a claim that is live nor a row whose run holds a live lease."""
    from waypoint.engine.keep.store import CheckpointMeta

    store = SQLStore(pg_url)
    queue = RunQueue(store)
    await queue.submit("g", 1, "run-1")
    await queue.submit("g", 2, "run-2")
    assert len(await queue._claim("w1", ["g"], 1, 30.0)) == 1  # run-1: claimed, not started yet
    assert len(await queue._claim("w2", ["g"], 1, 0.1)) == 1  # run-2: claimed, then its run holds a lease
    now = time.time()
    await store.put(CheckpointMeta(checkpoint_id="run-2", version=1, status="running", step=0, fingerprint="f",
                                   created_at=now, updated_at=now, lease_owner="w2-run", lease_expires=now + 30),
                    b"h", {}, [], expected_version=None)
    await asyncio.sleep(0.15)  # w2's claim lapsed; its run's lease has not
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 60)
    assert await queue._claim("thief", ["g"], 5, 30.0) == []
    await store.close()


async def test_a_busy_worker_renews_only_the_claims_of_work_it_is_doing(qstore):
    """A row claimed under the worker's name by a task that is gone (it died) is not kept alive by the worker's
    renewals while it stays busy with other work: its claim lapses and another worker takes it."""
    calls: Counter = Counter()
    app = approval_graph(qstore, calls, slow=3.0)
    queue = RunQueue(qstore)
    worker = Worker(qstore, [app], concurrency=1, poll=0.05, lease_seconds=0.6)
    task = await running(worker)
    await queue.submit(app, "busy", "run-busy")
    await until(lambda: calls["prepare", "busy"] > 0)
    await queue.submit("other", "o", "run-orphan")
    renewals = counted(worker.queue, "_renew")
    (orphan,) = await queue._claim(worker.name, ["other"], 1, 0.6)  # its task died at once
    seen = len(renewals)
    await until(lambda: len(renewals) >= seen + 2)  # the worker renewed its claims at least twice meanwhile
    deadline = time.monotonic() + 10  # its claim (0.6 s, not renewed) lapses: another worker takes it
    while not (got := await queue._claim("w2", ["other"], 1, 30.0)):
        assert time.monotonic() < deadline, "the orphan's claim never lapsed: the busy worker kept renewing it"
        await asyncio.sleep(0.02)
    (taken,) = got
    assert taken[0] == "run-orphan" and taken[5] == 2
    worker.stop(now=True)
    await asyncio.wait_for(task, 30)


def looping_graph(store, answers: list, name: str = "loop"):
    """START -> ask (pauses every pass; the answer is appended) -> ask ... two answers -> END."""

    def ask(got: list):
        is_target, _, data = get_resume_context()
        if not is_target:
            raise Interrupt({"question": f"pass {len(got) + 1}?"})
        answers.append(data)
        return [*got, data]

    g = Graph(name=name)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_branch("ask", lambda got: "ask" if len(got) < 2 else END, ends=["ask", END])
    return g.compile(store=store)


async def test_a_late_duplicate_resume_never_answers_the_next_pause(qstore):
    """A resume carries the version it was made for: a duplicate that arrives once the run paused again is
    refused, and one queued before the run moved on (another process answered) is not applied."""
    answers: list = []
    app = looping_graph(qstore, answers)
    queue = RunQueue(qstore)
    worker = Worker(qstore, [app], poll=0.05)
    task = await running(worker)
    await queue.submit(app, [], "loop-1")
    first = await queue.wait("loop-1", timeout=20)
    (iid,) = first.interrupts
    assert first.version == 2 and first.run_status == "interrupted"
    await queue.resume("loop-1", {iid: "yes-1"}, expected_version=first.version)
    second = await queue.wait("loop-1", timeout=20)
    (iid2,) = second.interrupts
    assert second.outcome == "interrupted" and second.version > first.version and answers == ["yes-1"]
    with pytest.raises(QueueError, match="moved on: it is at version .*made for version 2"):
        await queue.resume("loop-1", {iid: "yes-1"}, expected_version=first.version)  # the duplicate
    await stopped(worker, task)
    await queue.resume("loop-1", {iid2: "yes-2"}, expected_version=second.version)  # queued; no worker yet
    await app.ainvoke(None, checkpoint_id="loop-1", resume={iid2: "direct"})  # another process answers first
    worker = Worker(qstore, [app], poll=0.05)
    task = await running(worker)
    late = await queue.wait("loop-1", timeout=20)
    await stopped(worker, task)
    assert late.outcome == "error" and "moved on since this resume was queued" in late.error
    assert answers == ["yes-1", "direct"]  # the queued answer was not applied to anything
    assert late.run_status == "completed"


async def test_work_held_by_another_process_waits_for_it_and_is_not_left_claimed(qstore):
    """A queued resume whose run another process took meanwhile (a live lease) is not claimed while that process
    runs it; once it is done the worker takes the work — made for a version that moved on: an error outcome,
    the answer not applied — and no row is left claimed."""
    calls: Counter = Counter()
    app = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    worker = Worker(qstore, [app], poll=0.05)
    task = await running(worker)
    await queue.submit(app, "h", "run-h")
    (iid,) = (await queue.wait("run-h", timeout=20)).interrupts
    await stopped(worker, task)
    await queue.resume("run-h", {iid: "queued"})  # no worker is running now
    release = asyncio.Event()
    direct = approval_graph(qstore, calls, gate=release)  # another process's copy, resuming the run itself
    resumer = asyncio.create_task(direct.ainvoke(None, checkpoint_id="run-h", resume={iid: "direct"}))

    async def held():
        return (await queue.status("run-h")).run_status == "running"

    await until(held)
    worker = Worker(qstore, [app], concurrency=2, poll=0.05, lease_seconds=0.6)
    task = await running(worker)
    seen = set()
    for _ in range(100):  # not claimed while the run's lease is live (no claim, conflict, hand-back cycle)
        seen.add((await queue.status("run-h")).state)
        await asyncio.sleep(0.01)
    assert seen == {"queued"}
    release.set()
    assert await resumer == "H:DIRECT"
    done = await queue.wait("run-h", timeout=10)
    await stopped(worker, task)
    assert done.outcome == "error" and "moved on" in done.error and calls["ask", "h"] == 2
    assert done.attempts == 1 and done.handbacks == 0


async def test_a_claim_that_lost_the_race_for_the_run_is_given_back_as_if_never_made(qstore):
    """The worker claims a queued resume, and before it claims the run another process does: the worker wrote
    nothing, so it gives the work back untouched — the next claim is again the first, compare-and-sets on the
    version the answer was made for, and reports the answer as not applied (not the other process's outcome)."""
    calls: Counter = Counter()
    app = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    worker = Worker(qstore, [app], poll=0.05)
    task = await running(worker)
    await queue.submit(app, "r", "run-r")
    (iid,) = (await queue.wait("run-r", timeout=20)).interrupts
    await stopped(worker, task)
    claimed, go, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    class Racing(Worker):
        async def _do(self, item, seen):
            claimed.set()
            await go.wait()  # meanwhile, the other process takes the run
            return await super()._do(item, seen)

    worker = Racing(qstore, [app], poll=0.05)
    task = await running(worker)
    await queue.resume("run-r", {iid: "queued"})
    await asyncio.wait_for(claimed.wait(), 10)
    direct = approval_graph(qstore, calls, gate=release)
    resumer = asyncio.create_task(direct.ainvoke(None, checkpoint_id="run-r", resume={iid: "direct"}))

    async def held():
        return (await queue.status("run-r")).run_status == "running"

    await until(held)
    go.set()
    await until(lambda: calls["finish", "r"] == 1)
    release.set()
    assert await resumer == "R:DIRECT"
    done = await queue.wait("run-r", timeout=10)
    await stopped(worker, task)
    assert done.outcome == "error" and "moved on" in done.error, (done.outcome, done.error)
    assert done.attempts == 1 and done.handbacks == 0


async def test_drains_do_not_count_as_attempts(qstore):
    """Three rolling restarts drain a long run three times; under max_attempts=2 it still completes its work."""
    calls: Counter = Counter()
    app = approval_graph(qstore, calls, slow=0.5)
    queue = RunQueue(qstore)
    await queue.submit(app, "d", "run-d")
    for n in range(1, 4):
        worker = Worker(qstore, [app], poll=0.05, drain_seconds=0.05, max_attempts=2)
        task = await running(worker)
        await until(lambda: calls["prepare", "d"] >= n)
        await stopped(worker, task)  # drained: handed back
    worker = Worker(qstore, [app], poll=0.05, max_attempts=2)
    task = await running(worker)
    paused = await queue.wait("run-d", timeout=20)
    await stopped(worker, task)
    assert paused.outcome == "interrupted", paused.error
    assert paused.attempts == 4 and paused.handbacks == 3


async def test_a_run_whose_worker_died_can_be_resumed_through_the_queue(qstore, tmp_path):
    """A run left `running` by a dead process (its lease expired) — say a request given up after max_attempts —
    is resumed through the queue; while its lease is live, it is refused."""
    import json
    import signal as sig

    from test_cross_process import finish, start, wait_for_line

    db = getattr(qstore, "url", None) or qstore.path
    journal = tmp_path / "journal"
    proc = start(db, "job", "linear", "--sleep-at", "n2", "--lease", "1.0", journal=journal)
    wait_for_line(journal, "n2")
    proc.send_signal(sig.SIGKILL)
    proc.wait(10)
    queue = RunQueue(qstore)
    with pytest.raises(QueueError, match="running under a live lease"):
        await queue.resume("job", None, graph="crash-linear")
    await asyncio.sleep(1.1)
    await queue.resume("job", None, graph="crash-linear")
    worker = Worker(qstore, [crash_graph(qstore, journal)], poll=0.05)
    task = await running(worker)
    done = await queue.wait("job", timeout=20)
    await stopped(worker, task)
    assert done.outcome == "completed" and done.output == ["n0", "n1", "n2", "n3", "n4"], done.error
    started = Counter(line.split()[0] for line in journal.read_text().splitlines() if line.split()[1] != "done")
    assert started == Counter({"n0": 1, "n1": 1, "n2": 2, "n3": 1, "n4": 1})
    assert json.loads(finish(start(db, "job", "linear", journal=journal))[1]) == ["n0", "n1", "n2", "n3", "n4"]


def crash_graph(store, journal):
    """tests/procs/crash_graphs.py's "linear" graph, compiled here (the worker serves it)."""
    import argparse
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("crash_graphs", Path(__file__).parent / "procs" / "crash_graphs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = argparse.Namespace(mode="linear", journal=str(journal), sleep_at=None, trigger="any", barrier=None)
    return module.build(args).compile(store=store)


async def test_the_status_says_whether_a_worker_serves_the_graph(qstore, caplog):
    calls: Counter = Counter()
    app = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    assert await queue.submit("nobody-serves-this", 1, "run-n") == 0
    assert "no live worker serves graph 'nobody-serves-this'" in caplog.text
    with pytest.raises(QueueTimeout, match="no live worker serves graph 'nobody-serves-this': start one"):
        await queue.wait("run-n", timeout=0.05)
    worker = Worker(qstore, [app], poll=0.05)
    task = await running(worker)
    await queue.submit(app, 2, "run-m")
    async def serving():
        return (await queue.status("run-m")).workers == 1  # the worker says so when it starts

    await until(serving)
    assert (await queue.status("run-n")).workers == 0
    await stopped(worker, task)
    assert (await queue.status("run-m")).workers == 0  # it said it stopped


# --- the database fails: a restart, a passing error ----------------------------------------------------------

async def test_after_a_postgres_restart_new_work_still_wakes_an_idle_worker_at_once(pg, pg_url):
    """The LISTEN connection dies with the server; the worker listens again, so work queued after the restart
    is picked up at once, not at the next poll (30 s here)."""
    store = SQLStore(pg_url)
    calls: Counter = Counter()
    app = approval_graph(store, calls)
    worker = Worker(store, [app], poll=30.0)
    task = await running(worker)
    submitter = RunQueue(SQLStore(pg_url))
    await asyncio.sleep(0.5)
    await submitter.submit(app, "a", "run-a")
    assert (await submitter.wait("run-a", timeout=5)).outcome == "interrupted"
    await submitter.store.close()
    pg.restart()
    await asyncio.sleep(0.5)
    submitter = RunQueue(SQLStore(pg_url))
    await submitter.submit(app, "b", "run-b")
    assert (await submitter.wait("run-b", timeout=5)).outcome == "interrupted"
    worker.stop()
    await asyncio.wait_for(task, 30)
    await submitter.store.close()
    await store.close()


async def test_a_database_error_is_handed_back_never_recorded_as_the_runs_outcome(pg_url):
    """Postgres refuses version 2 of the run twice — the first step's commit, then the next worker's claim —
    and the first outcome record once ("too many clients", SQLSTATE 53300, raised by a trigger): the run is
    never stored as failed, the queue never records an error, and the work completes once the database takes
    writes again."""
    import asyncpg

    from pg import database_of

    store = SQLStore(pg_url)
    calls: Counter = Counter()
    app = approval_graph(store, calls)
    queue = RunQueue(store)
    await queue.status("none")  # the schema
    raw = await asyncpg.connect(host=pg_url.split("host=", 1)[1], user="postgres", database=database_of(pg_url))
    await raw.execute("""
        CREATE SEQUENCE step_fails; CREATE SEQUENCE record_fails;
        CREATE FUNCTION refuse_step() RETURNS trigger AS $$ BEGIN
          IF NEW.version = 2 AND nextval('step_fails') <= 2 THEN
            RAISE EXCEPTION 'sorry, too many clients already (injected)' USING ERRCODE = '53300'; END IF;
          RETURN NEW; END $$ LANGUAGE plpgsql;
        CREATE TRIGGER refuse_step BEFORE INSERT ON waypoint_checkpoints FOR EACH ROW EXECUTE FUNCTION refuse_step();
        CREATE FUNCTION refuse_record() RETURNS trigger AS $$ BEGIN
          IF NEW.state = 'done' AND nextval('record_fails') <= 1 THEN
            RAISE EXCEPTION 'sorry, too many clients already (injected)' USING ERRCODE = '53300'; END IF;
          RETURN NEW; END $$ LANGUAGE plpgsql;
        CREATE TRIGGER refuse_record BEFORE UPDATE ON waypoint_queue FOR EACH ROW EXECUTE FUNCTION refuse_record();
    """)
    await raw.close()
    worker = Worker(store, [app], poll=0.05)
    task = await running(worker)
    await queue.submit(app, "t", "run-t")
    paused = await queue.wait("run-t", timeout=30)
    await stopped(worker, task)
    assert paused.outcome == "interrupted", paused.error
    assert paused.handbacks >= 1 and paused.attempts == 1 + paused.handbacks
    assert [m.status for m in await store.history("run-t")].count("failed") == 0
    assert calls["prepare", "t"] == 2  # the step whose commit was refused ran again
    await store.close()


async def test_work_whose_workers_die_while_its_run_moves_on_is_not_given_up(qstore):
    """Three workers in a row took the work, each moved the run on (its claim of the run, then a step) and died —
    preempted, say. With max_attempts=2 the next worker still runs it: only claims in a row without progress
    count (an attempt's claim alone is no progress: tests/test_worker_faults.py)."""
    from waypoint.engine.keep.checkpoint import Checkpointer
    from waypoint.engine.run.position import RunPosition

    calls: Counter = Counter()
    app = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    await queue.submit(app, "p", "run-p")
    ghost = Checkpointer(store=qstore, serializer=app.get_serializer(), checkpoint_id="run-p",
                         graph_structure=app.structure, owner="elsewhere:1:ghost", lease_seconds=30.0)
    for _ in range(3):
        assert len(await queue._claim("ghost", ["ask"], 5, 0.05)) == 1
        ghost.holding = False  # each ghost takes the run anew: its claim, then a step, then it dies
        for _step in range(2):
            await ghost.save(RunPosition(pending={"prepare": "p"}, ledger=1, lineage="ghost"), "running")
        assert await qstore.renew_lease("run-p", ghost.version, ghost.owner, 0.0)  # dead: its lease ended
        await asyncio.sleep(0.1)
    worker = Worker(qstore, [app], poll=0.05, max_attempts=2, recover=False)
    task = await running(worker)
    paused = await queue.wait("run-p", timeout=20)
    await stopped(worker, task)
    assert paused.outcome == "interrupted" and paused.attempts == 4, paused
    assert calls["prepare", "p"] == 1


async def test_hand_backs_are_not_counted_toward_giving_work_up(qstore):
    """Three claims handed back (a drain, the run held elsewhere, the database away) without the run moving: with
    max_attempts=2 the next worker still runs the work."""
    calls: Counter = Counter()
    app = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    await queue.submit(app, "p", "run-p")
    for _ in range(3):
        ((*_, token, _s, _t),) = await queue._claim("drained", ["ask"], 5, 30.0)
        assert await queue._release("run-p", token) is True
    worker = Worker(qstore, [app], poll=0.05, max_attempts=2, recover=False)
    task = await running(worker)
    paused = await queue.wait("run-p", timeout=20)
    await stopped(worker, task)
    assert paused.outcome == "interrupted" and paused.attempts == 4 and paused.handbacks == 3, paused


async def test_a_worker_with_another_version_of_the_graph_leaves_the_run_to_one_that_serves_it(qstore):
    """A rolling deploy: a run paused under version 1 of graph "ask" is resumed through the queue while only a
    worker with version 2 is up, which cannot continue it (the node it is paused at is renamed: docs/resume.md,
    "Deploys"; a version that only added nodes would). It does not record an error nor run anything: it hands the
    work back and leaves the run alone; once a version-1 worker is up, that one completes it."""
    calls: Counter = Counter()
    v1 = approval_graph(qstore, calls)
    queue = RunQueue(qstore)
    await queue.submit(v1, "r", "run-r")
    first = Worker(qstore, [v1], poll=0.05, recover=False)
    task = await running(first)
    paused = await queue.wait("run-r", timeout=20)
    await stopped(first, task)
    v2 = Graph(name="ask")
    for key in ("prepare", "ask_v2", "check", "finish"):
        v2.add_node(key, lambda x: x)
    for a, b in ((START, "prepare"), ("prepare", "ask_v2"), ("ask_v2", "check"), ("check", "finish"), ("finish", END)):
        v2.add_edge(a, b)
    newer = Worker(qstore, [v2.compile(store=qstore)], poll=0.05, recover=False)
    task = await running(newer)
    try:
        (iid,) = paused.interrupts
        await queue.resume("run-r", {iid: "yes"})
        await until(lambda: "run-r" in newer._foreign)
        await asyncio.sleep(0.3)  # six more looks at the queue: it claims the run no more
        now = await queue.status("run-r")
        assert now.state == "queued" and now.outcome is None and now.attempts == 1 and now.handbacks == 1, now
        older = Worker(qstore, [v1], poll=0.05, recover=False)
        older_task = await running(older)
        try:
            done = await queue.wait("run-r", timeout=20)
        finally:
            await stopped(older, older_task)
    finally:
        newer.stop(now=True)
        await asyncio.wait_for(task, 10)
    assert done.outcome == "completed" and done.output == "R:YES" and calls["finish", "r"] == 1, done


async def test_submit_refuses_a_checkpoint_id_no_store_could_keep(qstore):
    queue = RunQueue(qstore)
    for bad in ("x" * 513, "a\x00b", "a\ud800b"):
        with pytest.raises(QueueError, match="at most 512 characters"):
            await queue.submit("g", 1, bad)
    await queue.submit("g", 1, "x" * 512)  # the longest that is kept


async def test_a_claim_whose_run_lease_was_lost_is_handed_back_though_its_task_is_still_inside_a_node(qstore, tmp_path):
    """Worker 1 (one slot) runs a run whose renewals stop getting through while it waits inside a node: the lease
    runs out, and another process continues the run directly and completes it. Worker 1's task is still inside
    the node — but it hands its claim back as soon as it knows the lease is lost, so worker 2 records the work
    done from the completed run at once: `wait()` does not block until the node returns (it used to, for as long
    as the node ran, while worker 1 kept renewing the claim of a run it had lost)."""
    from waypoint.engine import CheckpointConflict, StoreUnavailable

    cut_off = asyncio.Event()

    class CutOff(type(qstore)):  # worker 1's connection for renewals stops getting through
        async def renew_leases(self, leases):
            if cut_off.is_set():
                raise StoreUnavailable("renewals cannot reach the database")
            return await super().renew_leases(leases)

    def opened(kind):
        return kind(tmp_path / "queue.db") if isinstance(qstore, SQLiteStore) else kind(qstore.url)

    mine, other = opened(CutOff), opened(type(qstore))
    gate, entered = asyncio.Event(), []

    async def work(x):
        entered.append(x)
        if len(entered) == 1:  # worker 1's attempt stays inside the node until the gate opens
            await gate.wait()
        return f"{x} done"

    def graph(store):
        g = Graph(name="held")
        g.add_node("work", work)
        g.add_edge(START, "work")
        g.add_edge("work", END)
        return g.compile(store=store, lease_seconds=0.6)

    first = Worker(mine, [graph(mine)], poll=0.05, concurrency=1, recover=False)
    second = Worker(other, [graph(other)], poll=0.05, recover=False)
    tasks = [await running(first)]
    try:
        await RunQueue(mine).submit("held", "x", "held-1")
        await until(lambda: entered)
        cut_off.set()  # worker 1's lease runs out 0.6 s after its last renewal
        direct = graph(other)
        while True:  # another process continues the run once its lease ran out on the store's clock
            try:
                assert await direct.ainvoke(None, checkpoint_id="held-1") == "x done"
                break
            except CheckpointConflict:
                await asyncio.sleep(0.05)
        tasks.append(await running(second))
        done = await RunQueue(other).wait("held-1", timeout=15)  # bounded by the lease, not by the node
        assert done.outcome == "completed" and done.output == "x done" and not gate.is_set()
        assert done.worker == second.name
    finally:
        gate.set()
        await stopped(first, tasks[0])
        if len(tasks) > 1:
            await stopped(second, tasks[1])
        await other.close()
        await mine.close()


async def test_a_worker_renews_its_claims_when_saying_which_graphs_it_serves_fails(qstore):
    """The database refuses the presence write ("too many connections", say): the claims of the work in flight are
    renewed all the same — one failing write must not let a live worker's claims lapse."""
    from waypoint.engine import StoreUnavailable

    calls: Counter = Counter()
    gate = asyncio.Event()
    app = approval_graph(qstore, calls, gate=gate)
    worker = Worker(qstore, [app], poll=0.05, lease_seconds=0.6)

    async def refused(*args):
        raise StoreUnavailable("too many connections for role 'fleet'")

    worker.queue._present = refused
    renewals = counted(worker.queue, "_renew")
    task = await running(worker)
    try:
        queue = RunQueue(qstore)
        await queue.submit(app, "p", "run-p")
        paused = await queue.wait("run-p", timeout=20)
        await queue.resume("run-p", {paused.interrupts and next(iter(paused.interrupts)): "yes"})
        await until(lambda: calls["finish", "p"] == 1)  # inside the last node, held by the gate
        seen = len(renewals)
        await until(lambda: len(renewals) >= seen + 2)
    finally:
        gate.set()
        await stopped(worker, task)
