"""`waypoint demo`: a non-interactive tour of what Waypoint does today."""

from __future__ import annotations

import asyncio

from waypoint.engine import END, START, Event, Graph


def build_triage() -> Graph:
    """A small ticket-triage graph: classify, then answer or escalate, then close."""
    g = Graph(name="triage", state=dict)

    def classify(ticket: str, state: dict) -> dict:
        state["seen"] = ticket
        urgent = any(word in ticket.lower() for word in ("down", "outage", "urgent"))
        return {"ticket": ticket, "priority": "high" if urgent else "normal"}

    def route(t: dict) -> str:
        return "escalate" if t["priority"] == "high" else "answer"

    async def answer(t: dict):
        for word in f"Thanks! We looked at '{t['ticket']}' and replied.".split(" "):
            yield word + " "

    def escalate(t: dict) -> str:
        return f"Escalated '{t['ticket']}' to the on-call engineer."

    g.add_node("classify", classify)
    g.add_node("answer", answer)
    g.add_node("escalate", escalate)
    g.add_edge(START, "classify")
    g.add_branch("classify", route, ends=["answer", "escalate"])
    g.add_edge("answer", END)
    g.add_edge("escalate", END)
    return g


class _Printer:
    def on_start(self, event: Event) -> None:
        print(f"  -> {'/'.join(event.node_path)} starts")


async def _tour() -> None:
    app = build_triage().compile()
    print("The graph (Mermaid):\n")
    print(app.to_mermaid())
    for ticket in ("How do I reset my password?", "The site is down!"):
        print(f"ticket: {ticket!r}")
        print("  streamed:", end=" ")
        async for chunk in app.astream(ticket, callbacks=[]):
            print(chunk, end="", flush=True)
        print()
        result = await app.ainvoke(ticket, callbacks=[_Printer()])
        print(f"  result: {result}\n")


def run_demo() -> int:
    """Print the tour; returns 0."""
    print("Waypoint demo: a ticket-triage graph (no store yet).\n")
    asyncio.run(_tour())
    print(
        "Coming next: checkpoints in SQLite after every step, and a run paused for a reviewer's\n"
        "approval that a new process resumes by its checkpoint ID."
    )
    return 0
