"""New input while a chat's run executes (`Runner.run(on_busy=)`, engine/agents/turns.py), on a real SQLite file:
each policy, with the turn in flight held at a tool until the test opens it (an event, never a sleep)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from waypoint.engine import (
    ChatModelAgent,
    CheckpointConflict,
    Interrupt,
    Message,
    Runner,
    ToolCall,
    ToolContext,
    tool,
)
from waypoint.stores import SQLiteStore


class Echo:
    """Calls `work`, then answers the turn's user message."""

    async def generate(self, messages, **_):
        if messages[-1].role == "tool":
            return Message.assistant(f"answer to {[m for m in messages if m.role == 'user'][-1].content}")
        return Message.assistant(tool_calls=[ToolCall(id="w", name="work", arguments="{}")])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


class Seen(logging.Handler):
    """Set once the run's process has read a cancel request (engine/keep/lease.py logs it)."""

    def __init__(self) -> None:
        super().__init__()
        self.cancel = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "cancel requested" in record.getMessage():
            self.cancel.set()


@pytest.fixture
def seen():
    handler, lease = Seen(), logging.getLogger("waypoint.lease")
    lease.addHandler(handler)
    old, lease.level = lease.level, logging.INFO
    yield handler
    lease.removeHandler(handler)
    lease.setLevel(old)


def _chat(store, gate: asyncio.Event, started: asyncio.Event) -> Runner:
    @tool
    async def work(ctx: ToolContext) -> str:
        """Work."""
        started.set()
        await gate.wait()
        return "done"

    return Runner(ChatModelAgent(name="chat", model=Echo(), tools=[work]), store=store)


def _said(messages) -> list[str]:
    return [m.content for m in messages if m.role in ("user", "assistant") and m.content]


async def _race(tmp_path, seen, policy: str):
    store = SQLiteStore(str(tmp_path / "runs.db"))
    gate, started = asyncio.Event(), asyncio.Event()
    runner = _chat(store, gate, started)
    first = asyncio.create_task(_collect(runner.run("one", checkpoint_id="c")))
    await asyncio.wait_for(started.wait(), 30)
    sent = [e async for e in runner.run("two", checkpoint_id="c", on_busy=policy, by="client-b")]
    third = [e async for e in runner.run("three", checkpoint_id="c", on_busy="enqueue", by="client-c")]
    if policy != "enqueue":
        await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, seen.cancel.wait, 30), 35)
    gate.set()
    events = await asyncio.wait_for(first, 60)
    snap = await runner.app.get_run("c")
    await store.close()
    return sent, third, events, snap


async def _collect(events):
    return [e async for e in events]


@pytest.mark.parametrize("policy", ["enqueue", "interrupt", "rollback"])
async def test_new_input_while_a_turn_runs_is_queued_and_runs_after_it_in_order(tmp_path, seen, policy):
    sent, third, events, snap = await _race(tmp_path, seen, policy)
    assert [e.action.queued.n for e in sent] == [1] and sent[0].action.queued.by == "client-b"
    assert [e.action.queued.n for e in third] == [2]
    assert [e.action.taken.n for e in events if e.action and e.action.taken] == [1, 2]  # each once, in order
    assert snap.meta.status == "completed" and snap.turn["input"] == 2
    said = _said(snap.state.messages)
    if policy == "enqueue":  # the first turn finished
        assert said == ["one", "answer to one", "two", "answer to two", "three", "answer to three"]
    elif policy == "interrupt":  # stopped after its tool step: what finished is kept, no answer to "one"
        assert said == ["one", "two", "answer to two", "three", "answer to three"]
        assert any(m.role == "tool" and m.content == "done" for m in snap.state.messages[:3])
    else:  # rollback: the unfinished turn is dropped, its input too
        assert said == ["two", "answer to two", "three", "answer to three"]


async def test_reject_is_a_conflict_and_queues_nothing(tmp_path):
    store = SQLiteStore(str(tmp_path / "runs.db"))
    gate, started = asyncio.Event(), asyncio.Event()
    runner = _chat(store, gate, started)
    first = asyncio.create_task(_collect(runner.run("one", checkpoint_id="c")))
    await asyncio.wait_for(started.wait(), 30)
    with pytest.raises(CheckpointConflict, match="is running"):
        [e async for e in runner.run("two", checkpoint_id="c")]
    assert await store.queued_inputs("c") == []
    gate.set()
    await asyncio.wait_for(first, 60)
    assert _said((await runner.app.get_run("c")).state.messages) == ["one", "answer to one"]
    await store.close()


async def test_an_input_is_queued_only_while_the_run_executes(tmp_path):
    store = SQLiteStore(str(tmp_path / "runs.db"))
    gate, started = asyncio.Event(), asyncio.Event()
    gate.set()
    runner = _chat(store, gate, started)
    await _collect(runner.run("one", checkpoint_id="c"))
    events = await _collect(runner.run("two", checkpoint_id="c", on_busy="enqueue"))  # idle: it simply runs
    assert not any(e.action and e.action.queued for e in events)
    assert _said((await runner.app.get_run("c")).state.messages)[-1] == "answer to two"
    from waypoint.engine import NotRunning
    with pytest.raises(NotRunning):
        await store.queue_input("c", b"x", policy="enqueue", by="me")
    await store.delete("c")
    assert await store.queued_inputs("c") == []
    await store.close()


async def test_a_rollback_queued_behind_an_enqueue_drops_the_turn_it_stopped_and_both_run_in_order(tmp_path, seen):
    store = SQLiteStore(str(tmp_path / "runs.db"))
    gate, started = asyncio.Event(), asyncio.Event()
    runner = _chat(store, gate, started)
    first = asyncio.create_task(_collect(runner.run("one", checkpoint_id="c")))
    await asyncio.wait_for(started.wait(), 30)
    [queued_two] = await _collect(runner.run("two", checkpoint_id="c", on_busy="enqueue"))
    [queued_three] = await _collect(runner.run("three", checkpoint_id="c", on_busy="rollback"))
    assert (queued_two.action.queued.n, queued_three.action.queued.n) == (1, 2)
    await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, seen.cancel.wait, 30), 35)
    gate.set()  # for the turns after it
    events = await asyncio.wait_for(first, 60)
    assert [e.action.taken.n for e in events if e.action and e.action.taken] == [1, 2]
    snap = await runner.app.get_run("c")
    assert _said(snap.state.messages) == ["two", "answer to two", "three", "answer to three"]
    assert [m.content for m in snap.state.messages if m.role == "tool"] == ["done", "done"]  # none of turn one's
    await store.close()


def _pausing_chat(store, gate: asyncio.Event, started: asyncio.Event) -> Runner:
    """`work` waits for the gate, then pauses (once: later calls finish)."""
    calls = []

    @tool
    async def work(ctx: ToolContext) -> str:
        """Work."""
        calls.append(1)
        started.set()
        await gate.wait()
        if len(calls) == 1:
            raise Interrupt("needs a person")
        return "done"

    return Runner(ChatModelAgent(name="chat", model=Echo(), tools=[work]), store=store)


async def _paused_with_input(tmp_path):
    store = SQLiteStore(str(tmp_path / "runs.db"))
    gate, started = asyncio.Event(), asyncio.Event()
    runner = _pausing_chat(store, gate, started)
    first = asyncio.create_task(_collect(runner.run("one", checkpoint_id="c")))
    await asyncio.wait_for(started.wait(), 30)
    [queued] = await _collect(runner.run("two", checkpoint_id="c", on_busy="enqueue"))
    gate.set()
    events = await asyncio.wait_for(first, 60)
    assert any(e.action and e.action.paused for e in events) and queued.action.queued.n == 1
    return store, runner


async def test_an_input_that_gives_a_paused_turn_up_runs_after_the_inputs_queued_before_it(tmp_path):
    store, runner = await _paused_with_input(tmp_path)  # paused, with "two" queued (enqueue) while it ran
    events = await _collect(runner.run("four", checkpoint_id="c", force_new_run=True))
    assert [e.action.taken.n for e in events if e.action and e.action.taken] == [1]
    said = _said((await runner.app.get_run("c")).state.messages)
    assert said == ["one", "two", "answer to two", "four", "answer to four"]  # "two" first: it was queued first
    await store.close()


@pytest.mark.parametrize("policy", ["interrupt", "rollback"])
async def test_interrupt_or_rollback_on_a_paused_chat_gives_the_pause_up(tmp_path, policy):
    store = SQLiteStore(str(tmp_path / "runs.db"))
    gate, started = asyncio.Event(), asyncio.Event()
    gate.set()
    runner = _pausing_chat(store, gate, started)
    events = await _collect(runner.run("one", checkpoint_id="c"))
    assert any(e.action and e.action.paused for e in events)
    with pytest.raises(Exception, match="on_busy='interrupt' gives that turn up"):
        await _collect(runner.run("two", checkpoint_id="c", on_busy="enqueue"))  # a pause is no end of turn
    await _collect(runner.run("three", checkpoint_id="c", on_busy=policy))
    said = _said((await runner.app.get_run("c")).state.messages)
    assert said == (["one", "three", "answer to three"] if policy == "interrupt" else ["three", "answer to three"])
    assert await runner.pending("c") == []
    await store.close()


async def test_an_input_that_does_not_decode_is_said_once_per_input_and_never_skipped(tmp_path):
    store = SQLiteStore(str(tmp_path / "runs.db"))
    gate, started = asyncio.Event(), asyncio.Event()
    runner = _chat(store, gate, started)
    first = asyncio.create_task(_collect(runner.run("one", checkpoint_id="c")))
    await asyncio.wait_for(started.wait(), 30)
    await store.queue_input("c", b"\xc1 not a record", policy="enqueue", by="someone")
    gate.set()
    events = await asyncio.wait_for(first, 60)
    errors = [e.error for e in events if e.error is not None]
    assert len(errors) == 1 and "queued input 1 does not decode" in str(errors[0])
    assert await store.waiting_inputs() == []  # marked stuck: no service or worker takes it up again and again
    later = await _collect(runner.run("two", checkpoint_id="c"))  # said again, once; "two" does not jump it
    assert [str(e.error)[:40] for e in later if e.error] == [str(errors[0])[:40]] and len(later) == 1
    assert _said((await runner.app.get_run("c")).state.messages) == ["one", "answer to one"]
    await store.close()


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_the_store_lists_every_chat_whose_input_may_start_now_a_page_at_a_time(tmp_path, kind):
    """`waiting_inputs`: at rest with an input not marked taken — not a pause's enqueued input, not a chat whose input
    is stuck — however many come before it (`each_waiting` reads every page)."""
    from waypoint.engine.agents.turns import each_waiting
    from waypoint.engine.keep.checkpoint import fingerprint
    from waypoint.stores import MemoryStore

    store = SQLiteStore(str(tmp_path / "runs.db")) if kind == "sqlite" else MemoryStore()
    gate, started = asyncio.Event(), asyncio.Event()
    runner = _chat(store, gate, started)
    for cid in ("a", "b", "c", "d"):  # each: an input queued while its turn ran, none taken (nobody drained them)
        gate.clear()
        started.clear()
        first = asyncio.create_task(_collect(runner.run("one", checkpoint_id=cid, take_queued=False)))
        await asyncio.wait_for(started.wait(), 30)
        await _collect(runner.run("two", checkpoint_id=cid, on_busy="enqueue"))
        if cid == "b":
            await _collect(runner.run("three", checkpoint_id=cid, on_busy="enqueue"))
        gate.set()
        await asyncio.wait_for(first, 60)
    assert await store.waiting_inputs() == ["a", "b", "c", "d"]
    assert await store.waiting_inputs(limit=2, after="a") == ["b", "c"]
    await store.mark_inputs("b", 1, state="stuck")  # its input 2 waits behind it: not listed either
    await store.mark_inputs("c", 1)  # taken (as a turn that took it marks it)
    seen: list[str] = []

    async def take(cid: str) -> None:
        seen.append(cid)

    ours = fingerprint(runner.app.structure)
    await each_waiting(store, take, [ours], page=1)
    assert seen == ["a", "d"]
    assert await store.waiting_inputs(fingerprints=["another graph's"]) == []  # a look reads only its graphs' chats
    await _collect(runner.drain("a"))  # a turn takes it and marks it
    assert await store.waiting_inputs() == ["d"]
    await store.mark_inputs("b", 1)  # a stuck input that was run after all (restored, another process read it)
    assert await store.waiting_inputs() == ["b", "d"]  # its chat is listed again: input 2 waits
    await store.close()


async def test_a_pauses_enqueued_input_is_listed_only_once_the_pause_is_answered(tmp_path):
    store, runner = await _paused_with_input(tmp_path)
    assert await store.waiting_inputs() == []  # it waits for the answer, not for a look
    await _collect(runner.resume("c", take_queued=False))  # answered: the turn completes; its input may start now
    assert await store.waiting_inputs() == ["c"]
    await store.close()


async def test_a_chats_turns_go_on_from_the_conversations_stored_chain_and_read_back_whole_after_a_prune(tmp_path):
    """Issue 34 §2 (in part): a new turn's conversation is written as a segment on the chain the last turn left —
    not as a new chain of the whole conversation — and every version still reads back whole, also once older
    versions are pruned."""
    from waypoint.engine.models import ScriptedChatModel

    store = SQLiteStore(str(tmp_path / "runs.db"))
    runner = Runner(ChatModelAgent(name="chat", model=ScriptedChatModel([f"answer {i}" for i in range(7)])),
                    store=store)
    for i in range(6):
        await _collect(runner.run(f"message {i}", checkpoint_id="c"))
    record = await store.get("c")
    assert len(record.chains["s:messages"]) >= 6  # a segment (or more) per turn, one chain across the turns
    expected = [x for i in range(6) for x in (f"message {i}", f"answer {i}")]
    assert _said((await runner.app.get_run("c")).state.messages) == expected
    for meta in (await store.history("c"))[::5]:  # older versions decode too
        snap = await runner.app.get_run("c", version=meta.version)
        assert _said(snap.state.messages) == expected[:len(_said(snap.state.messages))]
    await store.prune("c", keep_last=1)
    await _collect(runner.run("message 6", checkpoint_id="c"))  # written on a chain whose old versions are gone
    assert _said((await runner.app.get_run("c")).state.messages) == [*expected, "message 6", "answer 6"]
    await store.close()
