"""A node can pause the run; the loop catches it without losing what other tasks produced."""

from __future__ import annotations

import asyncio

import pytest

from waypoint.engine import (
    END,
    START,
    CompositeInterrupt,
    Graph,
    GraphInterrupted,
    Interrupt,
    StatefulInterrupt,
)


def approval_graph(trigger: str, finished: list):
    async def review(x):
        try:
            raise Interrupt({"question": f"approve {x}?"})
        except Exception:  # a user's broad except must not swallow the pause
            pytest.fail("Interrupt was caught by 'except Exception'")

    async def work(x):
        await asyncio.sleep(0.05)
        finished.append(x)
        return {"work": x}

    g = Graph(name="triage")
    g.add_node("review", review, output_key="review")
    g.add_node("work", work)
    g.add_node("join", lambda d: d)
    for n in ("review", "work"):
        g.add_edge(START, n)
        g.add_edge(n, "join")
    g.add_edge("join", END)
    return g.compile(trigger=trigger)


@pytest.mark.parametrize("trigger", ["any", "all"])
async def test_interrupt_pauses_and_sibling_task_completes(trigger):
    finished = []
    app = approval_graph(trigger, finished)
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke(7)
    assert finished == [7]  # the sibling was not cancelled
    ctx, = info.value.info.contexts
    assert ctx.address == "runnable:triage;node:review"
    assert len(ctx.id) == 16 and int(ctx.id, 16) >= 0  # minted for this pause (docs/resume.md)
    assert ctx.info == {"question": "approve 7?"}
    assert ctx.is_root_cause


async def test_interrupt_in_subgraph_has_full_address_and_an_id_of_its_own_run():
    inner = Graph(name="inner")
    inner.add_node("ask", lambda x: (_ for _ in ()).throw(StatefulInterrupt("need input", state={"x": x})))
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)
    outer = Graph(name="outer")
    outer.add_node("sub", inner)
    outer.add_edge(START, "sub")
    outer.add_edge("sub", END)
    app = outer.compile()
    ids = set()
    for _ in range(2):
        with pytest.raises(GraphInterrupted) as info:
            await app.ainvoke(1)
        ctx, = info.value.info.contexts
        assert ctx.address == "runnable:outer;node:sub;node:ask"
        ids.add(ctx.id)
    assert len(ids) == 2  # one address, two runs: two pauses, two IDs


async def test_composite_interrupt_reports_its_subs_as_root_causes():
    def batch(x):
        raise CompositeInterrupt("batch", state=None, subs=[Interrupt("a"), Interrupt("b")])

    g = Graph(name="c")
    g.add_node("batch", batch)
    g.add_edge(START, "batch")
    g.add_edge("batch", END)
    with pytest.raises(GraphInterrupted) as info:
        await g.compile().ainvoke(0)
    contexts = info.value.info.contexts
    assert [c.info for c in contexts] == ["a", "b"]
    assert all(c.is_root_cause and c.parent.info == "batch" and not c.parent.is_root_cause for c in contexts)
