"""Fenced writes in one process (engine/keep/store.py, guarantee 11; docs/scale-out.md, "Fencing"): a process writes
for a run only while the store says it holds the run. Each test is the path one check alone guards — the lease
thread's answer, `check_lease()` before a call, `TaskLedger.record`'s own check, the store's check in the write's
transaction — so removing that check fails it. Real processes are in tests/test_worker_faults.py."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from waypoint.engine import (
    END,
    START,
    ChatModelAgent,
    CheckpointConflict,
    Graph,
    LeaseLost,
    Message,
    StoreUnavailable,
    ToolCall,
    check_lease,
    tool,
)
from waypoint.engine.models import ScriptedChatModel
from waypoint.stores import MemoryStore, SQLiteStore, SQLStore


def ask(*ns: str) -> Message:
    return Message.assistant(tool_calls=[ToolCall(id=f"call-{n}", name="effect", arguments=f'{{"n": "{n}"}}')
                                         for n in ns])


class Refusing(MemoryStore):
    """Renewals reach the store and are refused (another process took the run over, as far as the store says)."""

    async def renew_lease(self, *args, **kwargs) -> bool:
        return False


class Unreachable(MemoryStore):
    """Renewals never get through (a network partition between this process and its database)."""

    async def renew_lease(self, *args, **kwargs) -> bool:
        raise StoreUnavailable("the database cannot be reached")


def waiting_node(store, lease: float, wait: float, done: list):
    async def work(x):
        await asyncio.sleep(wait)
        check_lease()
        done.append(x)
        return x

    g = Graph(name="fenced")
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile(store=store, lease_seconds=lease)


async def test_a_refused_renewal_marks_the_lease_lost_at_once_and_says_so(caplog):
    """A lease of 3 s, renewed every 1 s: the first renewal is refused, and the node that checks its lease 1.5 s in
    (well before the lease would run out by the clock) stops — the refusal alone says the run is lost."""
    store, done = Refusing(), []
    with caplog.at_level(logging.WARNING, logger="waypoint.lease"):
        with pytest.raises(LeaseLost, match="lost its lease at version 1"):
            await waiting_node(store, lease=3.0, wait=1.5, done=done).ainvoke(1, checkpoint_id="refused")
    assert done == []
    assert any("run 'refused': this process lost its lease" in r.getMessage() for r in caplog.records), caplog.text
    (newest,) = await store.history("refused", limit=1)
    assert newest.status == "running" and newest.version == 1  # nothing written after the claim


async def test_a_renewal_that_fails_is_said_at_once_and_the_lease_is_lost_at_its_deadline(caplog):
    store, done = Unreachable(), []
    with caplog.at_level(logging.WARNING, logger="waypoint.lease"):
        with pytest.raises(LeaseLost, match="lease ran out .*renewals failed: StoreUnavailable"):
            await waiting_node(store, lease=0.3, wait=0.8, done=done).ainvoke(1, checkpoint_id="cut-off")
    said = [r for r in caplog.records if "cut-off" in r.getMessage()]
    assert said and said[0].levelno == logging.WARNING and "could not be renewed" in said[0].getMessage(), caplog.text
    assert any(r.levelno == logging.ERROR and "ran out" in r.getMessage() for r in said), caplog.text
    assert done == []


class Flaky(MemoryStore):
    """Knobs for the tests below: renewals that fail, slow ledger reads, leases the store keeps 100× longer than
    asked (so that this process's own deadline passes long before the store's)."""

    unreachable = False
    slow_reads = 0.0
    long_leases = False

    async def renew_lease(self, *args, **kwargs) -> bool:
        if self.unreachable:
            raise StoreUnavailable("the database cannot be reached")
        return await super().renew_lease(*args, **kwargs)

    async def recorded_calls(self, *args, **kwargs):
        await asyncio.sleep(self.slow_reads)
        return await super().recorded_calls(*args, **kwargs)

    async def put(self, meta, *args, **kwargs):
        if self.long_leases and meta.lease_expires is not None:
            from dataclasses import replace

            meta = replace(meta, lease_expires=meta.updated_at + 100 * (meta.lease_expires - meta.updated_at))
        return await super().put(meta, *args, **kwargs)


async def test_a_call_run_again_after_a_stop_is_not_started_by_a_process_that_lost_its_lease():
    """A call that was started and never finished (its process stopped) runs again flagged `rerun` — with no
    start marker to refuse it, so only `check_lease()` before the call stands between a process that lost the
    run and a second execution: the lease runs out (renewals fail) while the step reads its ledger, and the
    call does not start."""
    ran, gate = [], asyncio.Event()

    @tool
    async def effect(n: str) -> str:
        """A side effect."""
        ran.append(n)
        await gate.wait()
        return f"did {n}"

    store = Flaky()
    agent = ChatModelAgent(name="rerun", model=ScriptedChatModel([ask("1"), "done"]), tools=[effect])
    app = agent.compile(store=store, lease_seconds=0.4)
    first = asyncio.create_task(app.ainvoke("go", checkpoint_id="r"))
    while ran != ["1"]:
        await asyncio.sleep(0.01)
    first.cancel()  # the process stops inside the call: its start is recorded, its result is not
    with pytest.raises(asyncio.CancelledError):
        await first
    gate.set()  # a call started again would return at once
    store.unreachable, store.slow_reads = True, 0.6
    with pytest.raises(LeaseLost, match="lease ran out"):
        await app.ainvoke(None, checkpoint_id="r")
    assert ran == ["1"]  # not started again


async def test_a_result_is_not_recorded_once_this_processs_deadline_passed_though_the_store_still_holds_it():
    """The store keeps the lease far longer than this process believes it holds it: when the call returns after
    this process's own deadline, only `TaskLedger.record`'s check keeps its result out of the ledger."""
    store = Flaky()
    store.unreachable, store.long_leases = True, True

    @tool
    async def effect(n: str) -> str:
        """A side effect."""
        await asyncio.sleep(0.6)
        return f"did {n}"

    agent = ChatModelAgent(name="late", model=ScriptedChatModel([ask("1"), "done"]), tools=[effect])
    with pytest.raises(LeaseLost, match="lease ran out"):
        await agent.compile(store=store, lease_seconds=0.3).ainvoke("go", checkpoint_id="late")
    (newest,) = await store.history("late", limit=1)
    assert newest.lease_expires > await store.clock()  # the store still says it is held
    entries = {k.rsplit("|", 1)[1].split(":")[0] for page in range(1, 4) for k in await store.recorded_calls("late", page)}
    assert entries == {"start"}  # the call's start, never its result


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def any_store(request, tmp_path):
    if request.param == "memory":
        return MemoryStore()
    if request.param == "sqlite":
        return SQLiteStore(tmp_path / "runs.db")
    return SQLStore(request.getfixturevalue("pg_url"))


async def test_a_run_deleted_in_the_middle_of_a_call_records_nothing_and_the_next_run_on_its_id_runs_every_call(
        any_store):
    """The process is inside call 0 of three (its lease 30 s, no renewal due) when the run is deleted: the call
    returns, and its result is refused by the store — the process believes it still holds the run, so only the
    store's check stands. A new run on the same ID (the model asks for the same call IDs) runs all three calls."""
    store, executed = any_store, []
    inside, release = asyncio.Event(), asyncio.Event()

    @tool
    async def effect(n: str) -> str:
        """A side effect."""
        executed.append(n)
        if len(executed) == 1:
            inside.set()
            await release.wait()
        return f"did {n}"

    def agent():
        return ChatModelAgent(name="deleted", model=ScriptedChatModel([ask("0", "1", "2"), "done"]), tools=[effect],
                              sequential_tools=True).compile(store=store)

    first = asyncio.create_task(agent().ainvoke("go", checkpoint_id="reused"))
    await asyncio.wait_for(inside.wait(), 10)
    assert await store.delete("reused")
    release.set()
    with pytest.raises(LeaseLost, match="no longer holds the run"):
        await first
    assert executed == ["0"]  # nothing after the refused result
    assert await store.get("reused") is None  # the late writer did not bring it back
    out = await agent().ainvoke("go", checkpoint_id="reused")
    assert out.content == "done" and executed == ["0", "0", "1", "2"]
    await store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_update_state_by_an_editor_whose_clock_runs_ahead_never_edits_a_live_run(kind, request, tmp_path,
                                                                                        monkeypatch):
    """The editor's wall clock is 120 s ahead, so the run's lease looks long expired to it: the store judges the
    lease on its own clock (SQLite's, Postgres's — never this process's `time.time()`), in the edit's transaction,
    and refuses; the run finishes as its owner runs it. (A memory store's clock is its process's.)"""
    store = SQLiteStore(tmp_path / "runs.db") if kind == "sqlite" else SQLStore(request.getfixturevalue("pg_url"))
    gate, ran = asyncio.Event(), []

    async def side_effect(x, state):
        ran.append(x)
        await gate.wait()
        return x

    g = Graph(name="edited", state=dict)
    g.add_node("work", side_effect)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    app = g.compile(store=store, lease_seconds=10.0)
    owner = asyncio.create_task(app.ainvoke("mine", checkpoint_id="live"))
    while not ran and not owner.done():
        await asyncio.sleep(0.01)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 120)
    with pytest.raises(CheckpointConflict, match="is running"):
        await app.update_state("live", {"note": "edited"})
    monkeypatch.setattr(time, "time", real)
    gate.set()
    assert await owner == "mine" and ran == ["mine"]
    assert [m.status for m in await store.history("live")] == ["completed", "running"]  # no edit in between
    await store.close()


async def test_a_step_that_ends_after_this_processs_deadline_is_not_written_though_the_store_still_holds_it():
    """The node returns after this process's own deadline (renewals failed), while the store — which keeps the
    lease far longer — would still take the write: the run writes nothing after its deadline, not even the step
    it just finished; the run continues from its claim wherever it is taken over."""
    store, done = Flaky(), []
    store.unreachable, store.long_leases = True, True

    async def slow(x):
        await asyncio.sleep(0.6)  # no check_lease() here: the write itself must not happen
        done.append(x)
        return x

    g = Graph(name="late-step")
    g.add_node("slow", slow)
    g.add_node("after", lambda x: x)
    g.add_edge(START, "slow")
    g.add_edge("slow", "after")
    g.add_edge("after", END)
    with pytest.raises(LeaseLost, match="lease ran out"):
        await g.compile(store=store, lease_seconds=0.3).ainvoke(1, checkpoint_id="late-step")
    assert done == [1]
    assert [m.version for m in await store.history("late-step")] == [1]  # the claim, nothing after it


async def test_a_call_is_not_started_when_the_record_of_its_start_came_back_after_the_deadline():
    """The start marker's write passed the store's check, but its answer came back late (the process froze
    between the write and its commit): by then the lease ran out here, so the call does not start — another
    process that takes the run over runs it (flagged rerun), once."""
    ran = []

    class LateStart(Flaky):
        async def record_call(self, checkpoint_id, version, call_id, result, **fence):
            wrote = await super().record_call(checkpoint_id, version, call_id, result, **fence)
            if "|start:" in call_id:
                await asyncio.sleep(0.6)  # the commit's answer, delayed past this process's deadline
            return wrote

    @tool
    async def effect(n: str) -> str:
        """A side effect."""
        ran.append(n)
        return f"did {n}"

    store = LateStart()
    store.unreachable = True
    agent = ChatModelAgent(name="late-start", model=ScriptedChatModel([ask("1"), "done"]), tools=[effect])
    with pytest.raises(LeaseLost, match="lease ran out"):
        await agent.compile(store=store, lease_seconds=0.3).ainvoke("go", checkpoint_id="late-start")
    assert ran == []


class Hangs(MemoryStore):
    """A store whose connection for renewals hangs: a renewal is sent and never answered (a dropped network flow,
    a frozen database backend)."""

    reserved = 0

    async def renew_leases(self, leases):
        await asyncio.Event().wait()

    async def reserve_renewals(self):
        self.reserved += 1


async def test_a_renewal_that_gets_no_answer_is_said_at_once_and_its_connection_taken_anew(caplog):
    """No error, no answer: the renewal is counted as failed once its interval passes (logged, naming the run), the
    lease is lost at its deadline with that cause — not blamed on the process — and the store's connection for
    renewals is taken again before this process claims another run there."""
    from waypoint.engine.keep.lease import reserve

    store, done = Hangs(), []
    with caplog.at_level(logging.WARNING, logger="waypoint.lease"):
        with pytest.raises(LeaseLost, match="renewals failed: TimeoutError: its renewal got no answer"):
            await waiting_node(store, lease=0.6, wait=1.2, done=done).ainvoke(1, checkpoint_id="hung")
    said = [r.getMessage() for r in caplog.records if "'hung'" in r.getMessage()]
    assert any("could not be renewed (TimeoutError: its renewal got no answer" in m for m in said), said
    assert done == [] and store.reserved == 1
    await reserve(store)  # the next claim on this store takes the connection for renewals anew
    assert store.reserved == 2


def test_a_store_that_could_not_do_something_says_the_drivers_error_before_its_address():
    from waypoint.stores._common import unavailable

    text = str(unavailable("SQLStore('postgresql+asyncpg://user@" + "x" * 300 + "/db')",
                           ConnectionError('too many connections for role "fleet"')))
    assert text.startswith('the database could not do this now (ConnectionError: too many connections for role '
                           '"fleet"'), text
