"""`takeover=True` never takes a run from an owner the engine can see alive (engine/keep/owners.py): this
process still executing it, or a live PID on this host; an owner on this host whose PID is gone may be
taken over before its lease expires."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest
from test_cross_process import run, start, starts, wait_for_line

from waypoint.engine import END, START, CheckpointConflict, Graph
from waypoint.engine.keep.owners import OwnerState, owner_state
from waypoint.stores import MemoryStore

HOST = os.uname().nodename


async def test_a_takeover_of_a_run_this_process_is_executing_is_refused():
    entered, release, ran = asyncio.Event(), asyncio.Event(), []

    async def pay(x):
        ran.append(x)
        entered.set()
        await release.wait()
        return f"paid {x}"

    g = Graph(name="payments")
    g.add_node("pay", pay)
    g.add_edge(START, "pay")
    g.add_edge("pay", END)
    app = g.compile(store=MemoryStore())
    first = asyncio.ensure_future(app.ainvoke(10, checkpoint_id="p1"))
    await entered.wait()
    for _ in range(2):
        with pytest.raises(CheckpointConflict, match="takeover is refused") as err:
            await asyncio.wait_for(app.ainvoke(None, checkpoint_id="p1", takeover=True), 10)
        assert "this very process" in str(err.value)
    release.set()
    assert await first == "paid 10"
    assert ran == [10]  # the takeover ran nothing
    assert (await app.get_run("p1")).meta.status == "completed"


async def test_a_lease_of_this_process_that_it_no_longer_executes_is_named_as_this_process_not_a_gone_one():

    from waypoint.engine.keep.checkpoint import Checkpointer

    g = Graph(name="payments")
    g.add_node("pay", lambda x: f"paid {x}")
    g.add_edge(START, "pay")
    g.add_edge("pay", END)
    store = MemoryStore()
    app = g.compile(store=store, durability="step")
    cp = Checkpointer(store=store, serializer=app.get_serializer(), checkpoint_id="p", graph_structure=app.structure)
    await app.ainvoke(1, checkpoint_id="p")
    loaded = await cp.load(1)  # the claim: this process's own lease, left as if its run had stopped there
    cp.version = 2
    await cp.save(loaded.position, "running", lease=(f"{HOST}:{os.getpid()}:x", 30.0))
    with pytest.raises(CheckpointConflict) as err:
        await app.ainvoke(None, checkpoint_id="p")
    assert "this very process, which no longer executes it" in str(err.value) and "gone" not in str(err.value) and "takeover=True" in str(err.value)
    assert await app.ainvoke(None, checkpoint_id="p", takeover=True) == "paid 1"


def test_a_live_owner_on_this_host_is_refused_a_dead_one_is_taken_over_before_its_lease_expires(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    proc = start(db, "job", "linear", "--sleep-at", "n2", journal=journal)  # lease: 30 s
    try:
        wait_for_line(journal, "n2")
        code, _, err = run(db, "job", "linear", "--continue-run", "--takeover", journal=journal)
        assert code == 3 and "takeover is refused" in err and f"process {proc.pid} on this host" in err, err
        assert proc.poll() is None  # the owner goes on undisturbed
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    code, _, err = run(db, "job", "linear", "--continue-run", journal=journal)
    assert code == 3 and f"process {proc.pid} on this host, and it is gone" in err and "takeover=True" in err, err
    code, out, err = run(db, "job", "linear", "--continue-run", "--takeover", journal=journal)
    assert code == 0, err  # long before the 30 s lease expired
    assert starts(journal) == Counter({"n0": 1, "n1": 1, "n2": 2, "n3": 1, "n4": 1})


def test_what_an_owner_string_tells():
    assert owner_state(None) is OwnerState.UNKNOWN
    assert owner_state("garbage") is OwnerState.UNKNOWN
    assert owner_state(f"another-host-{HOST}:{os.getpid()}:ab12") is OwnerState.UNKNOWN
    assert owner_state(f"{HOST}:{os.getpid()}:ab12") is OwnerState.DEAD  # this process, not executing it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert owner_state(f"{HOST}:{child.pid}:ab12") is OwnerState.ALIVE
        child.kill()
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped yet: a zombie
        assert owner_state(f"{HOST}:{child.pid}:ab12") is OwnerState.DEAD
    finally:
        child.kill()
        child.wait(10)
    assert owner_state(f"{HOST}:{child.pid}:ab12") is OwnerState.DEAD
