"""A run's lease in one process (engine/keep/lease.py, `check_lease()`): a process that may no longer hold it starts
nothing more — no step, no tool call — and writes nothing. The same with real processes frozen by SIGSTOP
is in tests/test_scale_out.py; leases on the store's clock are in tests/test_store_contract.py."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from waypoint.engine import (
    END,
    START,
    ChatModelAgent,
    CheckpointConflict,
    Graph,
    LeaseLost,
    Message,
    NodeError,
    StoreUnavailable,
    ToolCall,
    check_lease,
    tool,
)
from waypoint.engine.keep import lease as lease_module
from waypoint.engine.models import ScriptedChatModel
from waypoint.engine.run.task import TaskLedger, task_ledger
from waypoint.stores import MemoryStore


class Unreachable(MemoryStore):
    """A store whose renewals never arrive (a network partition between this process and its database)."""

    async def renew_lease(self, *args, **kwargs) -> bool:
        raise StoreUnavailable("the database cannot be reached")


def two_nodes(store, done: list, *, wait: float = 0.0, lease: float = 30.0):
    async def first(x):
        await asyncio.sleep(wait)
        check_lease()
        done.append("first")
        return x

    def second(x):
        done.append("second")
        return x

    g = Graph(name="lease")
    g.add_node("first", first)
    g.add_node("second", second)
    g.add_edge(START, "first")
    g.add_edge("first", "second")
    g.add_edge("second", END)
    return g.compile(store=store, lease_seconds=lease) if store is not None else g.compile()


async def test_check_lease_is_quiet_while_the_lease_holds_and_without_a_store():
    done: list = []
    assert await two_nodes(None, done).ainvoke(1) == 1
    assert await two_nodes(MemoryStore(), done).ainvoke(2, checkpoint_id="r") == 2
    assert done == ["first", "second"] * 2
    with pytest.raises(RuntimeError, match="inside a running node"):
        check_lease()


async def test_a_lease_that_ran_out_unrenewed_stops_the_run_inside_its_node_and_nothing_is_written():
    """Renewals fail (the store is unreachable) and the lease runs out while a node works: the node's
    `check_lease()` stops it, the run loop lets `LeaseLost` through (not a node failure), the run is not
    stored as failed and no later step runs. Judged by the clock: the failed renewals set no flag."""
    store, done = Unreachable(), []
    app = two_nodes(store, done, wait=0.4, lease=0.2)
    with pytest.raises(LeaseLost, match="lease ran out") as caught:
        await app.ainvoke(1, checkpoint_id="r")
    assert isinstance(caught.value, CheckpointConflict) and not isinstance(caught.value, NodeError)
    assert caught.value.checkpoint_id == "r" and "starts nothing more" in str(caught.value)
    assert done == []
    (newest,) = await store.history("r", limit=1)
    assert newest.status == "running" and newest.version == 1  # the claim; nothing written after it


def ask(*names: str) -> Message:
    return Message.assistant("", [ToolCall(id=f"call-{n}", name="effect", arguments=json.dumps({"n": n}))
                                  for n in names])


async def test_a_tool_call_another_process_started_is_not_started_here():
    """Another process recorded `start:` for call 2 of this step (it runs the step now): this one does not run
    call 2 — recording its start returns False — and stops with `LeaseLost`."""
    ran = []

    @tool
    async def effect(n: str) -> str:
        """A side effect."""
        ran.append(n)
        if n == "1":  # meanwhile, "another process" takes the step over and starts call 2 (its slot: position 1)
            mine = task_ledger()  # this call's; the tools node keeps its markers on the node's page
            node = TaskLedger(mine.store, mine.serializer, mine.checkpoint_id, mine.epoch,
                              mine.prefix[:-1].rsplit(";tool:", 1)[0])
            await node.record("start:1:call-2", True)
        return f"did {n}"

    store = MemoryStore()
    agent = ChatModelAgent(name="two", model=ScriptedChatModel([ask("1", "2"), "done"]), tools=[effect],
                           sequential_tools=True)
    with pytest.raises(LeaseLost, match="started by another process"):
        await agent.compile(store=store).ainvoke("go", checkpoint_id="t")
    assert ran == ["1"]
    assert (await store.history("t", limit=1))[0].status == "running"


async def test_a_process_whose_lease_ran_out_during_a_tool_call_starts_no_further_call():
    """Sequential calls; the lease runs out (renewals fail) while call 1 runs: call 2 never starts."""
    ran = []

    @tool
    async def effect(n: str) -> str:
        """A side effect."""
        ran.append(n)
        await asyncio.sleep(0.4 if n == "1" else 0)
        return f"did {n}"

    store = Unreachable()
    agent = ChatModelAgent(name="two", model=ScriptedChatModel([ask("1", "2"), "done"]), tools=[effect],
                           sequential_tools=True)
    with pytest.raises(LeaseLost, match="lease ran out"):
        await agent.compile(store=store, lease_seconds=0.2).ainvoke("go", checkpoint_id="t")
    assert ran == ["1"]
    assert (await store.history("t", limit=1))[0].status == "running"


async def test_a_process_whose_clock_runs_ahead_does_not_take_over_a_live_run(pg_url, monkeypatch):
    """Postgres judges leases on the server's clock: a resumer whose own wall clock is 60 s ahead sees the run's
    lease as live (it is), and may take the run only with takeover=True."""
    import time

    from waypoint.stores import SQLStore

    store = SQLStore(pg_url)
    gate, done = asyncio.Event(), []

    async def wait_at_gate(x):
        await gate.wait()
        done.append(x)
        return x

    g = Graph(name="gated")
    g.add_node("work", wait_at_gate)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    app = g.compile(store=store, lease_seconds=5.0)
    owner = asyncio.create_task(app.ainvoke("mine", checkpoint_id="live"))
    while not await store.history("live", limit=1):
        await asyncio.sleep(0.01)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 60)
    with pytest.raises(CheckpointConflict, match="is running .* for another [0-9.]+ s"):
        await asyncio.wait_for(app.ainvoke(None, checkpoint_id="live"), 10)  # taken over: it would wait at the gate
    monkeypatch.setattr(time, "time", real)
    gate.set()
    assert await owner == "mine" and done == ["mine"]
    await store.close()


class RefusesStep(MemoryStore):
    """A store whose database refuses the run's second version once (a restart, "too many clients")."""

    refused = False

    async def put(self, meta, *args, **kwargs):
        if meta.version == 2 and not self.refused:
            self.refused = True
            raise StoreUnavailable("the database is restarting")
        return await super().put(meta, *args, **kwargs)


async def test_a_store_that_fails_while_the_run_saves_leaves_it_resumable_at_once_never_failed():
    """The step's commit meets `StoreUnavailable`: the run is not stored as failed, its lease is ended (another
    process may continue it at once, no takeover needed), and the error names the run and what to do."""
    store, done = RefusesStep(), []
    app = two_nodes(store, done)
    with pytest.raises(StoreUnavailable, match="run 'r' stopped: its store failed .* resume it with ainvoke"):
        await app.ainvoke(1, checkpoint_id="r")
    (newest,) = await store.history("r", limit=1)
    assert newest.status == "running" and newest.lease_expires <= await store.clock()
    assert await app.ainvoke(None, checkpoint_id="r") == 1  # at once: the lease is over
    assert done == ["first", "first", "second"]


def _blocks_until_renewed(lease: float) -> tuple[Graph, type]:
    """A graph whose one sync node blocks until the store has renewed a lease (or 3 leases passed), and its store."""
    renewed = threading.Event()

    class Renewals(MemoryStore):
        async def renew_leases(self, leases):
            answers = await super().renew_leases(leases)
            if any(answers):
                renewed.set()
            return answers

    def blocks(x):
        assert renewed.wait(timeout=3 * lease), "the lease was not renewed while the node blocked"
        return x

    g = Graph(name="blocks")
    g.add_node("work", blocks)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g, Renewals


async def test_a_process_first_lease_is_renewed_while_its_sync_node_blocks_though_the_first_renewal_is_late(
        monkeypatch):
    """The renewal thread makes its event loop only when a renewal is due (engine/keep/lease.py): a process's first run,
    whose first renewal comes after the thread's first look, is still renewed while its sync node blocks."""
    monkeypatch.setattr(lease_module, "_RENEWER", None)  # this process's first run with a lease: the thread starts now
    lease = 3 * (lease_module._Renewer.IDLE + 0.2)  # renewed every lease / 3: later than the thread's first look
    g, store = _blocks_until_renewed(lease)
    assert await g.compile(store=store(), lease_seconds=lease).ainvoke(1, checkpoint_id="r") == 1


async def test_a_process_first_short_lease_wakes_the_renewal_thread_at_once(monkeypatch):
    """A first run whose renewal is due before the thread's first look wakes it: renewed in time, not at the look."""
    monkeypatch.setattr(lease_module, "_RENEWER", None)
    monkeypatch.setattr(lease_module._Renewer, "IDLE", 600.0)  # the thread's first look: far past the lease
    lease = 3.0
    g, store = _blocks_until_renewed(lease)
    assert await g.compile(store=store(), lease_seconds=lease).ainvoke(1, checkpoint_id="r") == 1
