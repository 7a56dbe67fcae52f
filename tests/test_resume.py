"""Resume by checkpoint ID: targeted and partial resumes, the errors that protect a paused run, forks,
time travel, graph changes, subgraphs, static interrupts, concurrency and cancellation."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from pydantic import BaseModel

from waypoint.engine import (
    END,
    START,
    CheckpointConflict,
    CheckpointError,
    CheckpointExists,
    CheckpointNotFound,
    Graph,
    GraphInterrupted,
    GraphMismatch,
    NodeError,
    Interrupt,
    StatefulInterrupt,
    UnknownInterrupt,
    WaypointError,
    get_interrupt_state,
    get_resume_context,
)
from waypoint.engine.codec.serde import register_type
from waypoint.stores import MemoryStore, SQLiteStore


def approver(name: str, calls: Counter):
    """A node that pauses for approval with its input as state, Eino's leaf pattern."""

    def node(x):
        calls[name] += 1
        was, has_state, saved = get_interrupt_state()
        if not was:
            raise StatefulInterrupt({"approve": name}, state=x)
        is_target, has_data, data = get_resume_context()
        if not is_target:
            raise StatefulInterrupt({"approve": name}, state=saved)
        return {name: f"{saved}:{data}"}

    return node


def parallel_approvals(store, trigger: str, calls: Counter):
    g = Graph(name="review")
    for name in ("legal", "security"):
        g.add_node(name, approver(name, calls))
        g.add_edge(START, name)
        g.add_edge(name, "join")

    def plain(x):
        calls["plain"] += 1
        return {"plain": x}

    g.add_node("plain", plain)
    g.add_edge(START, "plain")
    g.add_edge("plain", "join")
    g.add_node("join", lambda d: d)
    g.add_edge("join", END)
    return g.compile(store=store, trigger=trigger)


@pytest.mark.parametrize("trigger", ["any", "all"])
async def test_partial_resume_of_parallel_interrupts(trigger):
    calls: Counter = Counter()
    app = parallel_approvals(MemoryStore(), trigger, calls)
    with pytest.raises(GraphInterrupted) as first:
        await app.ainvoke("doc", checkpoint_id="r")
    ids = {c.info["approve"]: c.id for c in first.value.info.contexts}
    assert set(ids) == {"legal", "security"} and calls == Counter(legal=1, security=1, plain=1)

    with pytest.raises(GraphInterrupted) as second:  # only legal is answered
        await app.ainvoke(None, checkpoint_id="r", resume={ids["legal"]: "ok"})
    (left,) = second.value.info.contexts
    assert left.id == ids["security"]  # the ID is stable across the re-interrupt
    assert calls == Counter(legal=2, security=1, plain=1)  # untargeted: not re-run; finished: not re-run

    out = await app.ainvoke(None, checkpoint_id="r", resume={ids["security"]: "fine"})
    assert out == {"legal": "doc:ok", "security": "doc:fine", "plain": "doc"}
    assert calls == Counter(legal=2, security=2, plain=1)


async def test_resume_list_and_true_target_without_data():
    calls: Counter = Counter()
    app = parallel_approvals(MemoryStore(), "any", calls)
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke("d", checkpoint_id="r")
    first = info.value.info.contexts[0].id
    with pytest.raises(GraphInterrupted):
        await app.ainvoke(None, checkpoint_id="r", resume=[first])
    out = await app.ainvoke(None, checkpoint_id="r", resume=True)
    assert set(out.values()) == {"d:None", "d"}


async def test_errors_that_protect_a_paused_run():
    calls: Counter = Counter()
    app = parallel_approvals(MemoryStore(), "any", calls)
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke("doc", checkpoint_id="r")
    pending = {c.id for c in info.value.info.contexts}
    with pytest.raises(UnknownInterrupt, match="no pending interrupt has ID nope") as unknown:
        await app.ainvoke(None, checkpoint_id="r", resume={"nope": 1})
    assert all(i in str(unknown.value) for i in pending)
    with pytest.raises(UnknownInterrupt, match="say which to resume"):
        await app.ainvoke(None, checkpoint_id="r")
    with pytest.raises(CheckpointExists, match="force_new_run=True"):
        await app.ainvoke("new input", checkpoint_id="r")
    with pytest.raises(CheckpointNotFound):
        await app.ainvoke(None, checkpoint_id="never-ran", resume=True)
    before = sum(calls.values())
    with pytest.raises(GraphInterrupted):
        await app.ainvoke("fresh", checkpoint_id="r", force_new_run=True)
    assert sum(calls.values()) == before + 3  # a new run from START


async def test_completed_run_restarts_on_the_same_id_and_keeps_history():
    store = MemoryStore()
    g = Graph(name="once")
    g.add_node("double", lambda x: x * 2)
    g.add_edge(START, "double")
    g.add_edge("double", END)
    app = g.compile(store=store)
    assert await app.ainvoke(2, checkpoint_id="c") == 4
    versions = len(await store.history("c"))
    assert await app.ainvoke(5, checkpoint_id="c") == 10
    history = await store.history("c")
    assert len(history) == 2 * versions and history[0].status == "completed"
    assert (await app.get_run("c", version=versions)).output == 4


async def test_fork_with_write_to_and_time_travel_with_version():
    store = MemoryStore()
    calls: Counter = Counter()
    app = parallel_approvals(store, "any", calls)
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke("doc", checkpoint_id="orig")
    resume = {c.id: "yes" for c in info.value.info.contexts}
    out = await app.ainvoke(None, checkpoint_id="orig", resume=resume, write_to="fork")
    assert out["legal"] == "doc:yes"
    assert (await store.history("orig"))[0].status == "interrupted"  # the source is untouched
    assert (await store.history("fork"))[0].status == "completed"
    # time travel: resume 'orig' again from its paused version with other answers
    paused_version = (await store.history("orig"))[0].version
    out2 = await app.ainvoke(None, checkpoint_id="orig", resume={k: "no" for k in resume})
    assert out2["legal"] == "doc:no"
    out3 = await app.ainvoke(None, checkpoint_id="orig", version=paused_version,
                             resume={k: "maybe" for k in resume})
    assert out3["security"] == "doc:maybe"
    assert (await store.history("orig"))[0].status == "completed"


@pytest.mark.parametrize("write_to", [None, "fork"])
async def test_a_branch_re_opens_the_pauses_it_does_not_answer_under_new_ids(write_to):
    """Time travel (or a fork) answering one of the pauses of version N by the ID it had there: that answer
    counts, the pause it leaves open gets a new ID, and the old ID — replayed to the run without version= —
    answers nothing."""
    store = MemoryStore()
    calls: Counter = Counter()
    app = parallel_approvals(store, "any", calls)
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke("doc", checkpoint_id="orig")
    old = {c.info["approve"]: c.id for c in info.value.info.contexts}
    paused_version = (await store.history("orig"))[0].version
    await app.ainvoke(None, checkpoint_id="orig", resume={i: "yes" for i in old.values()})  # completed
    target = write_to or "orig"
    with pytest.raises(GraphInterrupted) as again:
        await app.ainvoke(None, checkpoint_id="orig", version=paused_version, write_to=write_to,
                          resume={old["legal"]: "no"})  # an explicit version=: its ID there answers it
    (left,) = again.value.info.contexts
    assert left.info == {"approve": "security"} and left.id != old["security"]
    assert [c.id for c in (await app.get_run(target)).interrupts.contexts] == [left.id]
    with pytest.raises(UnknownInterrupt, match=f"no pending interrupt has ID {old['security']}"):
        await app.ainvoke(None, checkpoint_id=target, resume={old["security"]: "replayed"})
    out = await app.ainvoke(None, checkpoint_id=target, resume={left.id: "later"})
    assert (out["legal"], out["security"]) == ("doc:no", "doc:later")


async def test_a_later_version_that_added_a_node_continues_a_paused_run(tmp_path):
    """A deploy added `audit` after the node the run is paused at: the new version continues the run (docs/resume.md,
    "Deploys"); the same in real processes is in tests/test_deploys.py."""
    store = SQLiteStore(tmp_path / "g.db")

    def build(extra: bool):
        g = Graph(name="flow")
        g.add_node("ask", lambda x: x if get_resume_context()[0] else (_ for _ in ()).throw(Interrupt("?")))
        g.add_edge(START, "ask")
        if extra:
            g.add_node("audit", lambda x: f"audited {x}")
            g.add_edge("ask", "audit")
            g.add_edge("audit", END)
        else:
            g.add_edge("ask", END)
        return g.compile(store=store)

    with pytest.raises(GraphInterrupted):
        await build(False).ainvoke(1, checkpoint_id="m")
    assert await build(True).ainvoke(None, checkpoint_id="m", resume=True) == "audited 1"
    await store.close()


async def test_graph_mismatch_names_the_node_the_run_is_at_that_a_deploy_removed(tmp_path):
    store = SQLiteStore(tmp_path / "g.db")

    def build(pause_at: str):
        g = Graph(name="flow")
        g.add_node(pause_at, lambda x: (_ for _ in ()).throw(Interrupt("?")))
        g.add_edge(START, pause_at)
        g.add_edge(pause_at, END)
        return g.compile(store=store)

    with pytest.raises(GraphInterrupted):
        await build("ask").ainvoke(1, checkpoint_id="m")
    with pytest.raises(GraphMismatch, match=r"run 'm' cannot be continued .*node 'ask', where the run is, is gone"
                                            r".*node\(s\) \['ask'\] removed.*migrate="):
        await build("ask_again").ainvoke(None, checkpoint_id="m", resume=True)
    assert (await store.history("m"))[0].status == "interrupted"  # nothing was written
    await store.close()


async def test_subgraph_interrupt_resumes_into_the_subgraph():
    calls: Counter = Counter()
    inner = Graph(name="inner", state=dict)

    def prep(x, state):
        calls["prep"] += 1
        state["prepared"] = x
        return x

    inner.add_node("prep", prep)
    inner.add_node("check", approver("check", calls))
    inner.add_edge(START, "prep")
    inner.add_edge("prep", "check")
    inner.add_edge("check", END)
    outer = Graph(name="outer")
    outer.add_node("first", lambda x: calls.update(["first"]) or x + "!")
    outer.add_node("sub", inner)
    outer.add_node("last", lambda d: calls.update(["last"]) or d)
    outer.add_edge(START, "first")
    outer.add_edge("first", "sub")
    outer.add_edge("sub", "last")
    outer.add_edge("last", END)
    app = outer.compile(store=MemoryStore())
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke("go", checkpoint_id="s")
    (ctx,) = info.value.info.contexts
    assert ctx.address == "runnable:outer;node:sub;node:check"
    out = await app.ainvoke(None, checkpoint_id="s", resume={ctx.id: "approved"})
    assert out == {"check": "go!:approved"}
    assert calls == Counter(first=1, prep=1, check=2, last=1)


async def test_static_interrupt_before_and_after():
    seen = []
    g = Graph(name="static")
    for n in ("a", "b", "c"):
        g.add_node(n, lambda x, n=n: seen.append(n) or x + [n])
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    app = g.compile(store=MemoryStore(), interrupt_before=["b"], interrupt_after=["b"])
    with pytest.raises(GraphInterrupted) as first:
        await app.ainvoke([], checkpoint_id="s")
    assert first.value.info.before_nodes == ("b",) and seen == ["a"]
    with pytest.raises(GraphInterrupted) as second:
        await app.ainvoke(None, checkpoint_id="s")
    assert second.value.info.after_nodes == ("b",) and seen == ["a", "b"]
    assert await app.ainvoke(None, checkpoint_id="s") == ["a", "b", "c"]


async def test_concurrent_resumes_in_one_process_exactly_one_wins(tmp_path):
    calls: Counter = Counter()
    app = parallel_approvals(SQLiteStore(tmp_path / "c.db"), "any", calls)
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke("doc", checkpoint_id="r")
    resume = {c.id: "ok" for c in info.value.info.contexts}
    results = await asyncio.gather(*(app.ainvoke(None, checkpoint_id="r", resume=resume) for _ in range(5)),
                                   return_exceptions=True)
    wins = [r for r in results if isinstance(r, dict)]
    losers = [r for r in results if not isinstance(r, dict)]
    assert len(wins) == 1
    # A loser either lost the claim, met the winner's live lease, or came after it completed.
    assert any(isinstance(r, CheckpointConflict) for r in losers)
    assert all(isinstance(r, CheckpointConflict) or "has completed" in str(r) for r in losers), losers
    assert calls["legal"] == 2 and calls["security"] == 2


async def test_an_answer_made_for_an_older_version_is_refused_and_runs_nothing():
    calls: Counter = Counter()
    app = parallel_approvals(MemoryStore(), "any", calls)
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke("doc", checkpoint_id="v")
    seen = (await app.get_run("v")).meta.version
    legal, security = sorted(info.value.info.contexts, key=lambda c: c.info["approve"])
    with pytest.raises(GraphInterrupted):  # someone else answers legal first: the run moves on
        await app.ainvoke(None, checkpoint_id="v", resume={legal.id: "ok"}, expected_version=seen)
    moved = (await app.get_run("v")).meta.version
    assert moved > seen
    before = dict(calls)
    with pytest.raises(CheckpointConflict, match=f"moved on: it is at version {moved}.*made for version {seen}"):
        await app.ainvoke(None, checkpoint_id="v", resume={security.id: "ok"}, expected_version=seen)
    assert dict(calls) == before and (await app.get_run("v")).meta.version == moved  # nothing ran or was written
    out = await app.ainvoke(None, checkpoint_id="v", resume={security.id: "ok"}, expected_version=moved)
    assert out["security"] == "doc:ok"
    with pytest.raises(WaypointError, match="expected_version= needs a store"):
        await parallel_approvals(None, "any", calls).ainvoke("doc", expected_version=1)


async def test_cancelling_a_run_leaves_a_resumable_checkpoint(tmp_path):
    store = SQLiteStore(tmp_path / "cancel.db")
    started = asyncio.Event()
    runs = Counter()

    async def slow(x):
        runs["slow"] += 1
        started.set()
        await asyncio.sleep(0 if runs["slow"] > 1 else 30)
        return x + 1

    g = Graph(name="c")
    g.add_node("fast", lambda x: x + 1)
    g.add_node("slow", slow)
    g.add_edge(START, "fast")
    g.add_edge("fast", "slow")
    g.add_edge("slow", END)
    app = g.compile(store=store)
    task = asyncio.ensure_future(app.ainvoke(1, checkpoint_id="k"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    meta = (await store.history("k"))[0]
    assert meta.status == "interrupted" and meta.error == "cancelled" and meta.lease_owner is None
    assert (await app.get_run("k")).pending == ("slow",)
    assert await app.ainvoke(None, checkpoint_id="k") == 3
    await store.close()


async def test_resume_context_validates_data_with_pydantic():
    @register_type(name="tests.Decision")
    class Decision(BaseModel):
        approved: bool
        reason: str = ""

    def gate(x):
        is_target, has_data, decision = get_resume_context(Decision)
        if not is_target:
            raise Interrupt("decide")
        return decision

    g = Graph(name="typed")
    g.add_node("gate", gate)
    g.add_edge(START, "gate")
    g.add_edge("gate", END)
    app = g.compile(store=MemoryStore())
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke(1, checkpoint_id="t")
    iid = info.value.info.contexts[0].id
    out = await app.ainvoke(None, checkpoint_id="t", resume={iid: {"approved": True, "reason": "fine"}})
    assert out == Decision(approved=True, reason="fine")


async def test_migrate_hook_adapts_a_run_written_by_an_older_graph():
    store = MemoryStore()

    def build(second: str):
        g = Graph(name="flow")
        g.add_node("ask", lambda x: (_ for _ in ()).throw(Interrupt("?")) if not get_resume_context()[0] else x)
        g.add_node(second, lambda x: f"{second}:{x}")
        g.add_edge(START, "ask")
        g.add_edge("ask", second)
        g.add_edge(second, END)
        return g.compile(store=store)

    with pytest.raises(GraphInterrupted) as info:
        await build("old").ainvoke(1, checkpoint_id="m")
    iid = info.value.info.contexts[0].id
    seen = []

    def migrate(position, old_structure):
        seen.append(sorted(old_structure["nodes"]))
        return position  # nothing pending refers to the renamed node

    assert await build("new").ainvoke(None, checkpoint_id="m", resume=[iid], migrate=migrate) == "new:1"
    assert seen == [["ask", "old"]]


async def test_a_live_runner_renews_its_lease_during_a_long_step():
    store = MemoryStore()
    started = asyncio.Event()

    async def long_step(x):
        started.set()
        await asyncio.sleep(0.6)
        return x

    g = Graph(name="long")
    g.add_node("long", long_step)
    g.add_edge(START, "long")
    g.add_edge("long", END)
    app = g.compile(store=store, lease_seconds=0.2)
    first = asyncio.ensure_future(app.ainvoke(1, checkpoint_id="L"))
    await started.wait()
    await asyncio.sleep(0.4)  # twice the lease: only renewal keeps it alive
    meta = (await store.history("L"))[0]
    assert meta.status == "running" and meta.lease_expires > __import__("time").time()
    with pytest.raises(CheckpointConflict, match="lease held by"):
        await app.ainvoke(None, checkpoint_id="L")
    assert await first == 1


async def test_a_completed_run_is_not_resumed_by_accident():
    g = Graph(name="done")
    g.add_node("n", lambda x: x)
    g.add_edge(START, "n")
    g.add_edge("n", END)
    app = g.compile(store=MemoryStore())
    assert await app.ainvoke(1, checkpoint_id="d") == 1
    with pytest.raises(CheckpointError, match="has completed; pass an input"):
        await app.ainvoke(None, checkpoint_id="d")
    with pytest.raises(CheckpointError, match="nothing to resume"):
        await app.ainvoke(None, checkpoint_id="d", resume=True)
    assert await app.ainvoke(None, checkpoint_id="d", force_new_run=True) is None


async def test_a_failed_run_resumes_from_its_last_good_step():
    attempts = Counter()

    def route(x):
        attempts["route"] += 1
        if attempts["route"] == 1:
            raise ConnectionError("router service down")
        return "work"

    def flaky(x):
        attempts["work"] += 1
        if attempts["work"] == 1:
            raise TimeoutError("try later")
        return x * 2

    g = Graph(name="retry-later")
    g.add_node("work", flaky)
    g.add_branch(START, route, ends=["work"])
    g.add_edge("work", END)
    store = MemoryStore()
    app = g.compile(store=store)
    with pytest.raises(NodeError):
        await app.ainvoke(21, checkpoint_id="f")  # the START branch fails: the input is kept
    assert (await store.history("f"))[0].status == "failed"
    with pytest.raises(NodeError):
        await app.ainvoke(None, checkpoint_id="f")  # routed now; the node fails
    # stored at the last finished step: routing START belongs to the first step, which failed
    assert (await app.get_run("f")).pending == ("__start__",)
    assert await app.ainvoke(None, checkpoint_id="f") == 42
    assert attempts == Counter(route=3, work=2)


async def test_a_run_paused_while_streaming_resumes_with_ainvoke_and_vice_versa():
    async def words(text):
        for w in text.split():
            yield w + " "

    seen = []

    def review(text):
        seen.append(type(text).__name__)
        if not get_resume_context()[0]:
            raise Interrupt("?")
        return text.strip().upper()

    g = Graph(name="modes")
    g.add_node("words", words)
    g.add_node("review", review)
    g.add_edge(START, "words")
    g.add_edge("words", "review")
    g.add_edge("review", END)
    app = g.compile(store=MemoryStore())
    with pytest.raises(GraphInterrupted):
        async for _ in app.astream("a b", checkpoint_id="m"):
            pass
    assert await app.ainvoke(None, checkpoint_id="m", resume=True) == "A B"
    with pytest.raises(GraphInterrupted):
        await app.ainvoke("c d", checkpoint_id="m")
    assert [c async for c in app.astream(None, checkpoint_id="m", resume=True)] == ["C D"]
    assert seen == ["str"] * 4  # a value node always gets a value, whichever mode paused the run
    assert (await app.get_run("m")).output == "C D"  # a streamed run stores its output as a value


async def test_a_new_run_over_one_created_on_a_clock_ahead_is_still_written(tmp_path, monkeypatch):
    """A run's incarnation (`created_at`) is stamped by the store, from its clock, and a new run written over an
    existing one is always created after it — whatever the writing host's clock says (here an hour ahead)."""
    import time
    import types

    import waypoint.engine.keep.checkpoint as checkpoint

    store = SQLiteStore(tmp_path / "runs.db")
    g = Graph(name="g")
    g.add_node("a", lambda x: x + 1)
    g.add_edge(START, "a")
    g.add_edge("a", END)
    app = g.compile(store=store)
    ahead = types.SimpleNamespace(time=lambda: time.time() + 3600)  # a host whose clock is an hour ahead
    monkeypatch.setattr(checkpoint, "time", ahead)
    assert await app.ainvoke(1, checkpoint_id="ahead") == 2
    monkeypatch.undo()
    first = (await store.history("ahead", limit=1))[0]
    assert await app.ainvoke(10, checkpoint_id="ahead", force_new_run=True) == 11
    again = (await store.history("ahead", limit=1))[0]
    assert abs(first.created_at - time.time()) < 60  # the store's clock, not the writer's hour ahead
    assert again.status == "completed" and again.created_at > first.created_at
    await store.close()


async def test_time_travel_to_a_version_of_a_run_a_newer_run_replaced(tmp_path):
    """Run A pauses, run B is started over it on the same ID (force_new_run); resuming A's paused version
    (version=) writes on top of B as a run of its own, and is not taken for a writer of a deleted run."""
    store = SQLiteStore(tmp_path / "runs.db")

    def ask(x):
        is_target, _, answer = get_resume_context()
        if not is_target:
            raise Interrupt({"q": x})
        return f"{x}:{answer}"

    g = Graph(name="g")
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    app = g.compile(store=store)
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke("A", checkpoint_id="tt")
    (asked,) = paused.value.info.contexts
    a_version = (await store.history("tt", limit=1))[0].version
    with pytest.raises(GraphInterrupted):
        await app.ainvoke("B", checkpoint_id="tt", force_new_run=True)
    assert await app.ainvoke(None, checkpoint_id="tt", version=a_version, resume={asked.id: "yes"}) == "A:yes"
    newest, b = (await store.history("tt"))[0], (await store.history("tt"))[2]
    assert newest.status == "completed" and newest.created_at > b.created_at
    await store.close()
