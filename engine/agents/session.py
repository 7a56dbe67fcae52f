"""What the agents of a workflow share: the `Session` (their conversation and session values), how an agent's
instruction reads those values, and the conversation each agent is handed.

A workflow agent (`SequentialAgent`, `ParallelAgent`, `LoopAgent`: engine/agents/workflow.py) is a graph whose
run-local state is a `Session`; workflow agents nested in it share it (they have no state of their own), so
session values and the conversation flow through the whole composition. Each agent in it keeps its own
`AgentState` (its own conversation, tool calls included); the session keeps only the input and each agent's
answer. The session is stored like any state: its conversation is an append-only chain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..codec import register_type
from ..models.schema import Message

__all__ = ["Session", "format_instruction", "conversation_for", "answer_of"]


@register_type(name="waypoint.Session")
@dataclass
class Session:
    """The state a workflow's agents share."""

    messages: list[Message] = field(default_factory=list)
    """The input, then each agent's answer (an assistant message named after the agent), in order."""
    values: dict[str, Any] = field(default_factory=dict)
    """Session values: an agent with `output_key=K` stores its answer's text under K; instructions read them
    as `{K}`."""
    iterations: dict[str, int] = field(default_factory=dict)
    """Finished iterations of each loop agent running now, by its name."""
    breaking: bool = False
    """A tool raised `BreakLoop`: the innermost loop agent ends (and the sequences inside it stop on the way)."""


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def format_instruction(instruction: str, values: dict[str, Any]) -> str:
    """`instruction` with each `{key}` that names a session value replaced by it (Eino's f-string instruction);
    other braces — JSON in the instruction, an unknown key — stay as they are."""
    if not values or "{" not in instruction:
        return instruction
    return _PLACEHOLDER.sub(lambda m: str(values[m[1]]) if m[1] in values else m[0], instruction)


def conversation_for(name: str, messages: list[Message]) -> list[Message]:
    """The session's conversation as agent `name` is handed it: the input as it came, its own earlier answers
    as its own, every other agent's answer as context from the user (Eino's default history rewriter) — a
    model reads another agent's words as information, not as something it said."""
    out = []
    for m in messages:
        if m.role == "assistant" and m.name and m.name != name:
            out.append(Message.user(f"For context: [{m.name}] said: {m.content}"))
        elif m.role == "assistant" and m.name:
            out.append(Message.assistant(m.content))
        else:
            out.append(m)
    return out


def answer_of(name: str, output: Any) -> Message:
    """What an agent's run ended with, as its answer in a session: an assistant message named after it."""
    content = output.content if isinstance(output, Message) else "" if output is None else str(output)
    return Message(role="assistant", content=content, name=name)
