"""`update_state`: a paused or finished run's state edited as a new version with its origin, by the same
compare-and-set as every write; refused under a live lease; a resume (in another process) sees the edit;
`as_node` makes the edit a node's result; `version=` edits an older version."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import pytest

from waypoint.engine import (
    END,
    START,
    CheckpointConflict,
    CheckpointNotFound,
    Graph,
    GraphInterrupted,
    GraphRunError,
    Interrupt,
    UnknownInterrupt,
    Update,
    WaypointError,
    append,
    get_resume_context,
    idempotency_key,
)
from waypoint.engine.keep.checkpoint import Checkpointer
from waypoint.engine.codec.serde import register_type
from waypoint.stores import MemoryStore, SQLiteStore

SCRIPT = Path(__file__).parent / "procs" / "state_graphs.py"


def proc(*args: str) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_edit_is_a_new_version_with_its_origin_and_a_resume_in_another_process_sees_it(tmp_path):
    db = str(tmp_path / "runs.db")
    paused = proc(db, "review-pause", "t1")  # v1 claim, v2 intake's step, v3 paused at review
    edit = proc(db, "review-edit", "t1", json.dumps({"amount": 80, "notes": ["checked by ops"]}))
    assert edit == {"version": 4, "origin": "t1@3 update_state", "status": "interrupted"}
    done = proc(db, "review-resume", "t1", paused["interrupt"])  # the same interrupt ID still answers it
    assert done["output"] == {"answer": "yes", "amount": 80, "notes": ["received", "checked by ops"]}


@register_type(name="tests.update_state.Ticket")
@dataclass
class Ticket:
    amount: int = 0
    notes: Annotated[list[str], append] = field(default_factory=list)


def review_app(store, *, ran=None, keys=None, **opts):
    def intake(amount, state):
        return Update({"amount": amount, "notes": ["received"]}, output=amount)

    def review(amount, state):
        if ran is not None:
            ran.append("review")
        if keys is not None:
            keys.append(idempotency_key())
        is_target, _, answer = get_resume_context()
        if not is_target:
            raise Interrupt(f"refund {state.amount}?")
        return {"answer": answer, "amount": state.amount}

    g = Graph(name="refunds", state=Ticket)
    g.add_node("intake", intake)
    g.add_node("review", review)
    g.add_node("pay", lambda decision, state: {**decision, "paid": state.amount})
    g.add_edge(START, "intake")
    g.add_edge("intake", "review")
    g.add_edge("review", "pay")
    g.add_edge("pay", END)
    return g.compile(store=store, **opts)


async def pause(app, cid="t"):
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke(120, checkpoint_id=cid)
    return info.value.info.contexts[0].id


async def test_a_running_run_under_a_live_lease_is_refused_and_nothing_is_written():
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(x):
        started.set()
        await release.wait()
        return x

    g = Graph(name="slow", state=Ticket)
    g.add_node("slow", slow)
    g.add_edge(START, "slow")
    g.add_edge("slow", END)
    store = MemoryStore()
    app = g.compile(store=store)
    task = asyncio.ensure_future(app.ainvoke(1, checkpoint_id="r"))
    await started.wait()
    before = await store.history("r")
    with pytest.raises(CheckpointConflict, match=r"run 'r' is running \(lease held by .+ until .+; that is this very process, executing it right now\); edit its state once"):
        await app.update_state("r", {"amount": 5})
    assert await store.history("r") == before
    release.set()
    assert await task == 1
    meta = await app.update_state("r", {"amount": 5})  # finished: now it may be edited
    assert meta.status == "completed" and (await app.get_run("r")).state.amount == 5


async def test_an_edit_loses_to_a_write_made_after_it_read_the_run():
    class Racing(MemoryStore):
        """Another writer edits the run between the edit's read and its write."""

        race = None

        async def get(self, checkpoint_id, version=None):
            record = await super().get(checkpoint_id, version)
            if self.race is not None:
                race, self.race = self.race, None
                await race()
            return record

    store = Racing()
    app = review_app(store)
    await pause(app)
    store.race = lambda: app.update_state("t", {"amount": 1})
    with pytest.raises(CheckpointConflict):
        await app.update_state("t", {"amount": 2})
    history = await store.history("t")
    assert [m.origin for m in history[:2]] == ["t@3 update_state", None]  # only the other writer's edit
    assert (await app.get_run("t")).state.amount == 1
    with pytest.raises(CheckpointConflict, match="moved on: it is at version 4"):
        await app.update_state("t", {"amount": 2}, expected_version=3)


async def test_as_node_makes_the_edit_that_nodes_result_and_the_run_continues_after_it():
    ran: list[str] = []
    store = MemoryStore()
    app = review_app(store, ran=ran)
    await pause(app)
    meta = await app.update_state("t", Update({"amount": 50}, output={"answer": "manual"}), as_node="review")
    assert meta.status == "interrupted" and meta.origin == "t@3 update_state as review"
    snap = await app.get_run("t")
    assert snap.pending == ("pay",) and snap.interrupts.contexts == ()  # review's pause is over
    assert await app.ainvoke(None, checkpoint_id="t") == {"answer": "manual", "paid": 50}
    assert ran == ["review"]  # only the first pass: the edit stood in for the second


async def test_as_node_on_a_completed_run_continues_after_that_node():
    g = Graph(name="line", state=Ticket)
    g.add_node("a", lambda x: x + 1)
    g.add_node("b", lambda x, state: (x * 10, state.amount))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    app = g.compile(store=MemoryStore())
    assert await app.ainvoke(1, checkpoint_id="l") == (20, 0)
    meta = await app.update_state("l", Update({"amount": 7}, output=5), as_node="a")
    assert meta.status == "interrupted"
    assert await app.ainvoke(None, checkpoint_id="l") == (50, 7)
    meta = await app.update_state("l", Update({}, output="rewritten"), as_node="b")  # b leads to END
    assert meta.status == "completed" and (await app.get_run("l")).output == "rewritten"


@pytest.mark.parametrize("trigger", ["any", "all"])
async def test_as_node_sends_its_output_on_as_that_nodes_own_return_value_would_be(trigger):
    """Through the node's `post` handler and `output_key`, so the fan-in after it merges as usual."""
    def asker(name):
        def node(x, state):
            if not get_resume_context()[0]:
                raise Interrupt(f"{name}?")
            return Update({"notes": [f"{name} ran"]}, output=f"{name}-out")
        return node

    g = Graph(name=f"two-{trigger}", state=Ticket)
    g.add_node("a", asker("a"), output_key="a", post=lambda out, state: Update({"notes": ["a post"]}, output=out.upper()))
    g.add_node("b", asker("b"), output_key="b")
    g.add_node("j", lambda x, state: (x, list(state.notes)))
    for key in ("a", "b"):
        g.add_edge(START, key)
        g.add_edge(key, "j")
    g.add_edge("j", END)
    app = g.compile(trigger=trigger, store=MemoryStore())
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke(0, checkpoint_id="r")
    ids = {c.info: c.id for c in paused.value.info.contexts}
    await app.update_state("r", Update({"notes": ["ops"]}, output="by ops"), as_node="a")
    out, notes = await app.ainvoke(None, checkpoint_id="r", resume={ids["b?"]: True})
    assert out == {"a": "BY OPS", "b": "b-out"}
    assert notes == ["ops", "a post", "b ran"]


async def test_editing_an_older_version_branches_from_it_on_top_of_the_newest():
    store, keys = MemoryStore(), []
    app = review_app(store, keys=keys)
    first = await pause(app)
    await app.ainvoke(None, checkpoint_id="t", resume={first: "yes"})  # completed at v6
    meta = await app.update_state("t", {"amount": 9}, version=3)  # the pause, with the amount edited
    assert (meta.version, meta.status, meta.origin) == (7, "interrupted", "t@3 update_state")
    snap = await app.get_run("t")
    (ctx,) = snap.interrupts.contexts
    assert ctx.id != first  # the re-opened pause has an ID of its own: the first answer, replayed, answers nothing
    with pytest.raises(UnknownInterrupt, match=f"no pending interrupt has ID {first}"):
        await app.ainvoke(None, checkpoint_id="t", resume={first: "replayed"})
    assert await app.ainvoke(None, checkpoint_id="t", resume={ctx.id: "no"}) == {"answer": "no", "amount": 9,
                                                                                   "paid": 9}
    # the branch's review has keys of its own: an external system never takes it for the first answer's work
    assert keys[2] not in keys[:2]


async def test_a_branch_from_an_old_running_version_writes_no_lease_and_is_judged_by_the_newest_version_only():
    """Right after a run completed, the versions it wrote while running still carry leases that look live:
    editing one, forking from one or travelling back to one is judged by the run's newest version only, and
    the edit continues with a plain resume (no takeover, no wait)."""
    store = MemoryStore()
    app = review_app(store)
    first = await pause(app)
    await app.ainvoke(None, checkpoint_id="t", resume={first: "yes"})  # v4 claim (running) ... v6 completed
    running = [m.version for m in await store.history("t") if m.status == "running" and m.version > 3]
    assert running and (await app.get_run("t", version=running[0])).meta.lease_expires > time.time()
    meta = await app.update_state("t", {"amount": 9}, version=running[0])
    assert meta.status == "running" and meta.lease_owner is None and meta.lease_expires is None
    # the version after review ran (pay pending): pay runs on the edited amount
    assert await app.ainvoke(None, checkpoint_id="t") == {"answer": "yes", "amount": 120, "paid": 9}
    await app.ainvoke(None, checkpoint_id="t", version=running[0], write_to="fork")  # was: "run 't' is running"
    assert (await app.get_run("fork")).meta.status == "completed"
    assert (await app.get_run("t", version=running[0])).meta.status == "running"  # history is as it was


async def test_a_run_whose_process_died_keeps_its_expired_lease_and_is_taken_over_with_the_edit():
    store = MemoryStore()
    app = review_app(store)
    interrupt_id = await pause(app)
    cp = Checkpointer(store=store, serializer=app.get_serializer(), checkpoint_id="t",
                      graph_structure=app.structure)
    loaded = await cp.load()  # write what a process that died right after its claim leaves behind
    await cp.save(loaded.position, "running", lease=("dead-host:1:x", -1.0))  # a lease that ran out 1 s ago
    meta = await app.update_state("t", {"amount": 3})
    assert (meta.status, meta.lease_owner) == ("running", "dead-host:1:x") and meta.lease_expires < time.time()
    with pytest.raises(WaypointError, match="was running when its process stopped"):
        await app.update_state("t", {"amount": 4}, as_node="review")
    out = await app.ainvoke(None, checkpoint_id="t", resume={interrupt_id: "yes"})
    assert out == {"answer": "yes", "amount": 3, "paid": 3}


async def test_edits_that_cannot_apply_are_refused_by_name():
    store = MemoryStore()
    app = review_app(store)
    await pause(app)
    with pytest.raises(GraphRunError, match=r"writes state field 'amout'.*\(its fields: amount, notes\)"):
        await app.update_state("t", {"amout": 1})
    with pytest.raises(WaypointError, match=r"as_node='pay' is not pending \(pending: review\)"):
        await app.update_state("t", {}, as_node="pay")
    with pytest.raises(WaypointError, match="as_node='nope' is not a node"):
        await app.update_state("t", {}, as_node="nope")
    with pytest.raises(WaypointError, match="without as_node"):
        await app.update_state("t", Update({}, output=1))
    with pytest.raises(CheckpointNotFound):
        await app.update_state("missing", {"amount": 1})
    with pytest.raises(WaypointError, match="needs a graph compiled with a store"):
        await review_app(None).update_state("t", {"amount": 1})
    assert len(await store.history("t")) == 3  # none of them wrote anything


async def test_the_edit_is_stored_in_a_file_store_and_read_back_by_a_fresh_one(tmp_path):
    app = review_app(SQLiteStore(tmp_path / "e.db"))
    await pause(app)
    await app.update_state("t", {"notes": ["a", "b"]})
    snap = await review_app(SQLiteStore(tmp_path / "e.db")).get_run("t")
    assert snap.state.notes == ["received", "a", "b"] and snap.meta.origin == "t@3 update_state"
