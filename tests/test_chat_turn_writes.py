"""A chat's next turn writes what is new, once (issue 34 §2): its run starts with the conversation as its state
(`start_state`), so the turn's first version holds the new message as input, not the conversation again, and the
state part goes on from the chain the last turn left. The model is still sent the whole conversation."""

from __future__ import annotations

import asyncio

import pytest

from waypoint.engine import END, START, ChatModelAgent, CheckpointExists, Graph, GraphRunError, Runner
from waypoint.engine.agents.chat_agent import AgentState
from waypoint.engine.models import ScriptedChatModel
from waypoint.stores import SQLiteStore

from measuring import Measuring

WORDS = " ".join(["word"] * 60)


async def test_a_turn_writes_the_same_bytes_at_turn_30_as_at_turn_3_and_the_model_sees_everything(tmp_path):
    store = Measuring(tmp_path / "chat.db")
    model = ScriptedChatModel([f"answer {i} {WORDS}" for i in range(30)])
    runner = Runner(ChatModelAgent(name="chat", instruction="Be brief.", model=model), store=store)
    per_turn = []
    for i in range(30):
        before = len(store.written)
        [e async for e in runner.run(f"message {i} {WORDS}", checkpoint_id="c")]
        per_turn.append(sum(store.written[before:]))
    # a turn adds ~700 B of conversation: the conversation written again would add ~19 KB from turn 3 to turn 30
    assert per_turn[29] - per_turn[2] < 1000, per_turn
    sent = model.calls[-1].messages
    assert [m.role for m in sent[:3]] == ["system", "user", "assistant"] and len(sent) == 1 + 2 * 29 + 1
    assert [m.content for m in sent if m.role == "user"] == [f"message {i} {WORDS}" for i in range(30)]
    stored = (await runner.app.get_run("c")).state.messages
    assert list(stored[:-1]) == list(sent) and stored[-1].content == f"answer 29 {WORDS}"
    await store.close()


def _stateful() -> Graph:
    g = Graph(name="counter", state=AgentState)

    def add(x, state):
        state.iterations += x
        return state.iterations

    g.add_node("add", add)
    g.add_edge(START, "add")
    g.add_edge("add", END)
    return g


async def test_start_state_starts_a_new_run_from_it_and_is_refused_where_it_cannot_apply(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    app = _stateful().compile(store=store)
    assert await app.ainvoke(2, checkpoint_id="a", start_state=AgentState(iterations=40)) == 42
    assert await app.ainvoke(1, checkpoint_id="a", start_state=AgentState(iterations=10)) == 11  # a new run
    with pytest.raises(GraphRunError, match=r"graph 'counter': start_state= is a dict, but its state is a AgentState"):
        await app.ainvoke(1, checkpoint_id="b", start_state={"iterations": 1})
    plain = Graph(name="plain")
    plain.add_node("id", lambda x: x)
    plain.add_edge(START, "id")
    plain.add_edge("id", END)
    with pytest.raises(GraphRunError, match="graph 'plain' has no run-local state"):
        await plain.compile(store=store).ainvoke(1, checkpoint_id="p", start_state=AgentState())
    assert await app.get_run("b") is None  # refused before anything was written
    await store.close()


async def test_start_state_is_refused_by_a_call_that_continues_a_stored_run(tmp_path):
    from waypoint.engine import Interrupt, get_resume_context

    g = Graph(name="gate", state=AgentState)

    def gate(x, state):
        if not get_resume_context()[0]:
            raise Interrupt("?")
        return x

    g.add_node("gate", gate)
    g.add_edge(START, "gate")
    g.add_edge("gate", END)
    store = SQLiteStore(tmp_path / "g.db")
    app = g.compile(store=store)
    from waypoint.engine import GraphInterrupted

    with pytest.raises(GraphInterrupted):
        await app.ainvoke(1, checkpoint_id="g")
    with pytest.raises(CheckpointExists, match="run 'g' exists and this call continues it: start_state= is for a new"):
        await app.ainvoke(None, checkpoint_id="g", resume=True, start_state=AgentState())
    assert await app.ainvoke(None, checkpoint_id="g", resume=True) == 1
    await store.close()


async def test_a_chat_turn_a_worker_runs_writes_only_its_new_messages_too(tmp_path):
    """The service hands a chat's turn to the queue with the conversation and how much of it came before
    (`RunQueue.submit(kept=)`); the worker starts the run with that as its state, as the Runner does."""
    import asyncio

    from waypoint.stores import RunQueue, Worker

    store = Measuring(tmp_path / "queued.db")
    model = ScriptedChatModel([f"answer {i} {WORDS}" for i in range(12)])
    runner = Runner(ChatModelAgent(name="chat", model=model), store=store)
    worker = Worker(store, [runner.app], poll=0.05)
    task = asyncio.create_task(worker.run())
    queue, per_turn = RunQueue(store), []
    try:
        for i in range(12):
            new = f"message {i} {WORDS}"
            messages = await runner.input_for(new, checkpoint_id="q")
            head = await store.history("q", limit=1)
            before = len(store.written)
            await queue.submit(runner.app, messages, "q", expected_version=head[0].version if head else None,
                               kept=len(messages) - 1)
            assert (await queue.wait("q", timeout=30)).outcome == "completed"
            per_turn.append(sum(store.written[before:]))
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
    assert per_turn[11] - per_turn[2] < 1000, per_turn  # the conversation written again: ~6 KB more by turn 12
    sent = model.calls[-1].messages
    assert [m.content for m in sent if m.role == "user"] == [f"message {i} {WORDS}" for i in range(12)]
    await store.close()


class _Dies(BaseException):
    """Stands for the process dying: nothing after it is written."""


@pytest.mark.parametrize("how", ["interrupt", "force_new_run", "rollback"])
async def test_a_turn_killed_before_its_first_step_finished_keeps_its_input_when_the_next_one_gives_it_up(tmp_path,
                                                                                                          how):
    """The turn's input is only in its claim (its run starts with the conversation as state, the input pending):
    a next input that gives the turn up goes on with it — except `rollback`, which drops the turn, input too."""
    from waypoint.engine import AgentMiddleware
    from waypoint.engine.keep.store import store_clock

    class DiesOnHold(AgentMiddleware):
        async def before_agent(self, ctx):
            if ctx.state.messages[-1].content == "hold b":
                raise _Dies

    store = SQLiteStore(tmp_path / "k.db")
    model = ScriptedChatModel(["answered a", "answered three"])
    runner = Runner(ChatModelAgent(name="chat", model=model, middlewares=[DiesOnHold()]), store=store,
                    lease_seconds=0.5)
    [e async for e in runner.run("a", checkpoint_id="k")]
    with pytest.raises(_Dies):
        [e async for e in runner.run("hold b", checkpoint_id="k")]
    while True:  # its lease runs out (0.5 s, as this test set it): nobody executes the turn any more
        (head,) = await store.history("k", limit=1)
        if head.lease_expires is not None and head.lease_expires <= await store_clock(store):
            break
        await asyncio.sleep(0.05)
    options = {"force_new_run": True} if how == "force_new_run" else {"on_busy": how}
    events = [e async for e in runner.run("three", checkpoint_id="k", **options)]
    assert not [e.error for e in events if e.error]
    users = [m.content for m in model.calls[-1].messages if m.role == "user"]
    assert users == (["a", "three"] if how == "rollback" else ["a", "hold b", "three"])
    stored = (await runner.app.get_run("k")).state.messages
    assert [m.content for m in stored if m.role == "user"] == users
    await store.close()
