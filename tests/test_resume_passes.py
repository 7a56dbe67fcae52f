"""Resume data belongs to one pass; static pauses everywhere have IDs; a released pause stays released;
pauses at START and after the last node are recorded as pauses."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from waypoint.engine import (
    END,
    START,
    Graph,
    GraphInterrupted,
    Interrupt,
    StatefulInterrupt,
    UnknownInterrupt,
    get_interrupt_state,
    get_resume_context,
)
from waypoint.stores import MemoryStore, SQLiteStore


def looping_approval(seen: list, rounds: int = 3) -> Graph:
    """START -> ask (pauses every pass) -> count -> ask ... until `rounds` approvals -> END."""

    def ask(n):
        was, has_state, saved = get_interrupt_state()
        is_target, has_data, data = get_resume_context()
        seen.append((n, was, saved, is_target, data))
        if not is_target:
            raise StatefulInterrupt({"round": n}, state=f"state-of-{n}")
        return n + 1

    g = Graph(name="loop")
    g.add_node("ask", ask)
    g.add_node("count", lambda n: n)
    g.add_edge(START, "ask")
    g.add_edge("ask", "count")
    g.add_branch("count", lambda n: "ask" if n < rounds else END, ends=["ask", END])
    return g


async def test_one_answer_approves_one_pass_only():
    seen: list = []
    app = looping_approval(seen).compile(store=MemoryStore())
    with pytest.raises(GraphInterrupted) as first:
        await app.ainvoke(0, checkpoint_id="loop")
    (ctx,) = first.value.info.contexts
    with pytest.raises(GraphInterrupted) as second:  # the next pass pauses again: a fresh approval
        await app.ainvoke(None, checkpoint_id="loop", resume={ctx.id: "yes"})
    (again,) = second.value.info.contexts
    assert again.id != ctx.id and again.info == {"round": 1}  # a new pause has a new ID
    # pass 0 re-ran as the target with its own saved state; pass 1 saw neither that state nor the answer
    assert seen[1:] == [(0, True, "state-of-0", True, "yes"), (1, False, None, False, None)]
    with pytest.raises(UnknownInterrupt):  # the first answer, delivered again, approves nothing
        await app.ainvoke(None, checkpoint_id="loop", resume={ctx.id: "yes"})
    with pytest.raises(GraphInterrupted) as third:
        await app.ainvoke(None, checkpoint_id="loop", resume={again.id: "yes"})
    (last,) = third.value.info.contexts
    assert await app.ainvoke(None, checkpoint_id="loop", resume={last.id: "yes"}) == 3
    assert [s[0] for s in seen if s[3]] == [0, 1, 2]  # three passes, three answers


async def test_resume_true_also_belongs_to_one_pass():
    seen: list = []
    app = looping_approval(seen).compile(store=MemoryStore())
    with pytest.raises(GraphInterrupted):
        await app.ainvoke(0, checkpoint_id="loop")
    with pytest.raises(GraphInterrupted) as second:
        await app.ainvoke(None, checkpoint_id="loop", resume=True)
    assert second.value.info.contexts[0].info == {"round": 1}


@pytest.mark.parametrize("trigger", ["any"])
async def test_one_answer_approves_one_pass_of_a_subgraph_in_a_loop(trigger):
    seen: list = []
    inner = looping_approval(seen, rounds=1)  # ask -> count -> END once per subgraph run
    outer = Graph(name="outer")
    outer.add_node("sub", inner)
    outer.add_branch("sub", lambda n: "sub" if n < 3 else END, ends=["sub", END])
    outer.add_edge(START, "sub")
    app = outer.compile(store=MemoryStore(), trigger=trigger)
    with pytest.raises(GraphInterrupted) as first:
        await app.ainvoke(0, checkpoint_id="nested")
    (ctx,) = first.value.info.contexts
    assert ctx.address == "runnable:outer;node:sub;node:ask"
    with pytest.raises(GraphInterrupted) as second:
        await app.ainvoke(None, checkpoint_id="nested", resume={ctx.id: "ok"})
    assert second.value.info.contexts[0].info == {"round": 1}
    assert seen[-1] == (1, False, None, False, None)


async def test_static_interrupt_before_inside_a_subgraph_has_an_id_and_resumes():
    calls = Counter()
    inner = Graph(name="inner")
    for n in ("a", "b"):
        inner.add_node(n, lambda x, n=n: calls.update([n]) or x + [n])
    inner.add_edge(START, "a")
    inner.add_edge("a", "b")
    inner.add_edge("b", END)
    sub = inner.compile(interrupt_before=["b"])
    outer = Graph(name="outer")
    outer.add_node("sub", sub)
    outer.add_edge(START, "sub")
    outer.add_edge("sub", END)
    app = outer.compile(store=MemoryStore())
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke([], checkpoint_id="s")
    (ctx,) = paused.value.info.contexts
    assert ctx.address == "runnable:outer;node:sub;node:b;pause:before"
    assert paused.value.info.before_nodes == ("sub/b",)
    assert ctx.id in str(paused.value)
    assert calls == Counter(a=1)
    assert await app.ainvoke(None, checkpoint_id="s") == ["a", "b"]  # the documented resume
    assert calls == Counter(a=1, b=1)


async def test_static_pause_ids_may_be_named_in_resume():
    g = Graph(name="g")
    g.add_node("a", lambda x: x + 1)
    g.add_edge(START, "a")
    g.add_edge("a", END)
    app = g.compile(store=MemoryStore(), interrupt_before=["a"])
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke(1, checkpoint_id="s")
    (ctx,) = paused.value.info.contexts
    assert ctx.address == "runnable:g;node:a;pause:before" and paused.value.info.before_nodes == ("a",)
    assert await app.ainvoke(None, checkpoint_id="s", resume=[ctx.id]) == 2


async def test_a_released_interrupt_before_stays_released_after_a_cancel(tmp_path):
    db = tmp_path / "runs.db"
    calls = Counter()
    started = asyncio.Event()

    async def deploy(x):
        calls["deploy"] += 1
        started.set()
        if calls["deploy"] == 1:
            await asyncio.sleep(30)
        return "deployed"

    def build():
        g = Graph(name="ship")
        g.add_node("deploy", deploy)
        g.add_edge(START, "deploy")
        g.add_edge("deploy", END)
        return g.compile(store=SQLiteStore(db), interrupt_before=["deploy"])

    with pytest.raises(GraphInterrupted):
        await build().ainvoke("v1", checkpoint_id="r")
    task = asyncio.ensure_future(build().ainvoke(None, checkpoint_id="r"))  # the approval is given
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # the approval was spent on this pass: continuing runs deploy without asking again
    assert await build().ainvoke(None, checkpoint_id="r") == "deployed"
    assert calls["deploy"] == 2


async def test_a_released_interrupt_before_pauses_again_on_the_next_pass():
    calls = Counter()
    g = Graph(name="again")
    g.add_node("a", lambda n: calls.update(["a"]) or n + 1)
    g.add_edge(START, "a")
    g.add_branch("a", lambda n: "a" if n < 2 else END, ends=["a", END])
    app = g.compile(store=MemoryStore(), interrupt_before=["a"])
    for i in range(2):
        with pytest.raises(GraphInterrupted):
            await app.ainvoke(0 if i == 0 else None, checkpoint_id="x")
    assert calls["a"] == 1  # released once, ran once, paused before the second pass
    assert await app.ainvoke(None, checkpoint_id="x") == 2


async def test_an_interrupt_in_a_start_branch_condition_pauses_the_run():
    store = MemoryStore()
    routed = []

    def route(x):
        is_target, _, data = get_resume_context()
        if not is_target:
            raise Interrupt({"route": x})
        routed.append(data)
        return data

    g = Graph(name="router")
    g.add_node("left", lambda x: f"left:{x}")
    g.add_node("right", lambda x: f"right:{x}")
    g.add_branch(START, route, ends=["left", "right"])
    g.add_edge("left", END)
    g.add_edge("right", END)
    app = g.compile(store=store)
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke("in", checkpoint_id="r")
    (ctx,) = paused.value.info.contexts
    assert ctx.address == "runnable:router;node:__start__"
    assert (await store.history("r"))[0].status == "interrupted"
    assert await app.ainvoke(None, checkpoint_id="r", resume={ctx.id: "right"}) == "right:in"
    assert routed == ["right"]


async def test_an_interrupt_in_a_start_branch_without_a_store_is_graph_interrupted():
    g = Graph(name="router")
    g.add_node("a", lambda x: x)
    g.add_branch(START, lambda x: (_ for _ in ()).throw(Interrupt("where?")), ends=["a"])
    g.add_edge("a", END)
    with pytest.raises(GraphInterrupted):
        await g.compile().ainvoke(1)


@pytest.mark.parametrize("trigger", ["any", "all"])
async def test_interrupt_after_the_last_node_is_saved_as_interrupted_not_completed(trigger):
    store = MemoryStore()
    g = Graph(name="last")
    g.add_node("a", lambda x: x + 1)
    g.add_edge(START, "a")
    g.add_edge("a", END)
    app = g.compile(store=store, trigger=trigger, interrupt_after=["a"])
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke(1, checkpoint_id="r")
    assert paused.value.info.after_nodes == ("a",)
    assert "completed" not in [m.status for m in await store.history("r")]
    assert await app.ainvoke(None, checkpoint_id="r") == 2
    assert [m.status for m in await store.history("r")][0] == "completed"


async def test_unknown_interrupt_runs_no_node():
    """A DAG: a gate waits for an answer; a sibling waits at interrupt_before (any resume releases it)."""
    calls = Counter()

    def gate(x):
        calls["gate"] += 1
        if not get_resume_context()[0]:
            raise Interrupt("?")
        return {"gate": x}

    g = Graph(name="g")
    g.add_node("gate", gate)
    g.add_node("held", lambda x: calls.update(["held"]) or {"held": x})
    g.add_node("join", lambda d: d)
    for n in ("gate", "held"):
        g.add_edge(START, n)
        g.add_edge(n, "join")
    g.add_edge("join", END)
    app = g.compile(store=MemoryStore(), trigger="all", interrupt_before=["held"])
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke(1, checkpoint_id="u")
    with pytest.raises(UnknownInterrupt):
        await app.ainvoke(None, checkpoint_id="u", resume={"not-an-id": 1})
    with pytest.raises(UnknownInterrupt):
        await app.ainvoke(None, checkpoint_id="u")
    assert calls == Counter(gate=1)
    gate_id = next(c.id for c in paused.value.info.contexts if c.info == "?")
    assert await app.ainvoke(None, checkpoint_id="u", resume={gate_id: 1}) == {"gate": 1, "held": 1}


async def test_resume_with_a_list_targets_exactly_those_ids():
    calls = Counter()

    def gate(name):
        def node(x):
            calls[name] += 1
            if not get_resume_context()[0]:
                raise Interrupt(name)
            return {name: True}
        return node

    g = Graph(name="three")
    for n in ("a", "b", "c"):
        g.add_node(n, gate(n))
        g.add_edge(START, n)
        g.add_edge(n, "join")
    g.add_node("join", lambda d: d)
    g.add_edge("join", END)
    app = g.compile(store=MemoryStore())
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke(0, checkpoint_id="l")
    ids = {c.info: c.id for c in paused.value.info.contexts}
    with pytest.raises(GraphInterrupted) as again:
        await app.ainvoke(None, checkpoint_id="l", resume=[ids["a"], ids["c"]])
    assert [c.id for c in again.value.info.contexts] == [ids["b"]]
    assert calls == Counter(a=2, b=1, c=2)


async def test_a_run_stopped_midway_with_an_unanswered_pause_continues_without_an_answer():
    """A DAG: `ask` paused while `slow` still ran; the run was cancelled (or crashed). Continuing it runs
    what can run; the pause stays pending with its ID."""
    calls = Counter()
    entered = asyncio.Event()

    def ask(x):
        calls["ask"] += 1
        if not get_resume_context()[0]:
            raise Interrupt("ok?")
        return {"ask": True}

    async def slow(x):
        calls["slow"] += 1
        entered.set()
        if calls["slow"] == 1:
            await asyncio.sleep(30)
        return {"slow": True}

    g = Graph(name="midway")
    g.add_node("ask", ask)
    g.add_node("slow", slow)
    g.add_node("join", lambda d: d)
    for n in ("ask", "slow"):
        g.add_edge(START, n)
        g.add_edge(n, "join")
    g.add_edge("join", END)
    store = MemoryStore()
    app = g.compile(store=store, trigger="all")
    task = asyncio.ensure_future(app.ainvoke(0, checkpoint_id="m"))
    await entered.wait()
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert (await store.history("m"))[0].error == "cancelled"
    with pytest.raises(GraphInterrupted) as paused:  # slow runs; ask stays paused, same question
        await app.ainvoke(None, checkpoint_id="m")
    (ctx,) = paused.value.info.contexts
    assert calls == Counter(ask=1, slow=2)
    assert await app.ainvoke(None, checkpoint_id="m", resume={ctx.id: "yes"}) == {"ask": True, "slow": True}
