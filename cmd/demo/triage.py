"""The demo's ticket-triage graph: classify, then answer or (after a reviewer approves) escalate."""

from __future__ import annotations

from dataclasses import dataclass, field

from waypoint.engine import END, START, Graph, StatefulInterrupt, get_interrupt_state, get_resume_context
from waypoint.engine.codec.serde import register_type


@register_type(name="waypoint.demo.Ticket")
@dataclass
class Ticket:
    """The run-local state: what happened to the ticket so far."""

    text: str = ""
    priority: str = "normal"
    log: list[str] = field(default_factory=list)


def classify(text: str, state: Ticket) -> str:
    state.text = text
    urgent = any(word in text.lower() for word in ("down", "outage", "urgent"))
    state.priority = "high" if urgent else "normal"
    state.log.append(f"classified as {state.priority}")
    return state.priority


def route(priority: str) -> str:
    return "review" if priority == "high" else "answer"


async def answer(priority: str, state: Ticket):
    state.log.append("answered by the bot")
    for word in f"Thanks! We looked at '{state.text}' and replied.".split(" "):
        yield word + " "


def review(priority: str, state: Ticket) -> str:
    """Pause until a reviewer decides; resumed with {"approved": bool, "reviewer": str}."""
    was_interrupted, _, _ = get_interrupt_state()
    is_target, has_data, decision = get_resume_context(dict)
    if not was_interrupted or not (is_target and has_data):
        raise StatefulInterrupt({"question": f"Page the on-call engineer for '{state.text}'?"}, state=state.text)
    who = decision.get("reviewer", "a reviewer")
    state.log.append(f"{'approved' if decision.get('approved') else 'rejected'} by {who}")
    return "page" if decision.get("approved") else "queue"


def escalate(decision: str, state: Ticket) -> str:
    if decision == "page":
        state.log.append("on-call paged")
        return f"Escalated '{state.text}': the on-call engineer was paged."
    state.log.append("left in the queue")
    return f"'{state.text}' stays in the normal queue."


def build_triage() -> Graph:
    g = Graph(name="triage", state=Ticket)
    g.add_node("classify", classify)
    g.add_node("answer", answer)
    g.add_node("review", review)
    g.add_node("escalate", escalate)
    g.add_edge(START, "classify")
    g.add_branch("classify", route, ends=["answer", "review"])
    g.add_edge("answer", END)
    g.add_edge("review", "escalate")
    g.add_edge("escalate", END)
    return g
