"""Graphs with reducer state and edited state, run as separate processes by tests/test_state_reducers.py and
tests/test_update_state.py:

    python state_graphs.py DB reduce-pause CID          -> {"interrupt": id}
    python state_graphs.py DB reduce-resume CID ID      -> {"output": ..., "state": {...}}
    python state_graphs.py DB review-pause CID          -> {"interrupt": id}
    python state_graphs.py DB review-edit CID JSON      -> {"version": n, "origin": ...}   (update_state)
    python state_graphs.py DB review-resume CID ID      -> {"output": ...}
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Annotated

from waypoint.engine import (
    END,
    START,
    Graph,
    GraphInterrupted,
    Interrupt,
    Update,
    add_messages,
    append,
    get_resume_context,
)
from waypoint.engine.codec.serde import register_type
from waypoint.stores import SQLiteStore


@register_type(name="tests.procs.Research")
@dataclass
class Research:
    messages: Annotated[list, add_messages] = field(default_factory=list)
    notes: Annotated[list[str], append] = field(default_factory=list)
    best: Annotated[int, max] = 0
    summary: str = ""


def research_graph(store):
    """START -> a, b, c in parallel -> join -> END; b pauses until it is answered."""
    def a(x):
        return Update({"messages": [{"id": "m1", "text": "draft"}], "notes": ["a"], "best": 3}, output={"a": x})

    def b(x):
        is_target, _, answer = get_resume_context()
        if not is_target:
            raise Interrupt("approve b?")
        return Update({"messages": [{"id": "m1", "text": answer}, {"id": "m2", "text": "b"}], "notes": ["b"],
                       "best": 7}, output={"b": x})

    def c(x):
        return Update({"notes": ["c"], "best": 5}, output={"c": x})

    def join(parts, state):
        return Update({"summary": ",".join(state.notes)}, output=sorted(parts))

    g = Graph(name="research", state=Research)
    for key, fn in (("a", a), ("b", b), ("c", c), ("join", join)):
        g.add_node(key, fn)
    for key in "abc":
        g.add_edge(START, key)
        g.add_edge(key, "join")
    g.add_edge("join", END)
    return g.compile(store=store)


@register_type(name="tests.procs.Ticket")
@dataclass
class Ticket:
    amount: int = 0
    notes: Annotated[list[str], append] = field(default_factory=list)


def review_graph(store):
    """START -> intake -> review (pauses) -> END; review reports the state it sees."""
    def intake(amount, state):
        return Update({"amount": amount, "notes": ["received"]}, output=amount)

    def review(amount, state):
        is_target, _, answer = get_resume_context()
        if not is_target:
            raise Interrupt(f"refund {state.amount}?")
        return {"answer": answer, "amount": state.amount, "notes": list(state.notes)}

    g = Graph(name="refunds", state=Ticket)
    g.add_node("intake", intake)
    g.add_node("review", review)
    g.add_edge(START, "intake")
    g.add_edge("intake", "review")
    g.add_edge("review", END)
    return g.compile(store=store)


async def main(db: str, mode: str, cid: str, *rest: str) -> dict:
    store = SQLiteStore(db)
    try:
        graphs = {"reduce": research_graph, "review": review_graph}
        app = graphs[mode.split("-")[0]](store)
        action = mode.split("-")[1]
        if action == "pause":
            try:
                await app.ainvoke(1 if mode.startswith("reduce") else 120, checkpoint_id=cid)
            except GraphInterrupted as paused:
                return {"interrupt": paused.info.contexts[0].id}
            return {"error": "did not pause"}
        if action == "edit":
            meta = await app.update_state(cid, json.loads(rest[0]))
            return {"version": meta.version, "origin": meta.origin, "status": meta.status}
        answer = "final" if mode.startswith("reduce") else "yes"
        out = await app.ainvoke(None, checkpoint_id=cid, resume={rest[0]: answer})
        snap = await app.get_run(cid)
        return {"output": out, "state": asdict(snap.state)}
    finally:
        await store.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], *sys.argv[4:]))))
