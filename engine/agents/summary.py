"""What a model is sent when a summary stands for the start of the conversation (`CompactionMiddleware`,
middleware/compaction.py, makes the summaries; this is the part the agent itself needs).

`AgentState.messages` always keeps every message: a `Compaction` in `AgentState.compaction` changes only what the
model box sends (`model_view`): the system messages among the covered ones (`kept`), then the summary as one user
message, then the messages after the covered ones, as they are. A chat's next turn starts from the same conversation, so
`Runner` starts it with the last turn's compaction in its state (`standing`) and the summary is reused, not made
again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..codec import register_type
from ..models.schema import Message

__all__ = ["Compaction", "SUMMARY_HEADER", "model_view", "standing"]

SUMMARY_HEADER = "Summary of the earlier conversation (it stands for the messages before this one):\n\n"
"""What the summary message starts with, so the model reads it as a summary and not as the user's request."""


@register_type(name="waypoint.Compaction")
@dataclass(frozen=True, kw_only=True)
class Compaction:
    """A summary standing for the first `covers` messages of an agent's conversation in what its model is sent."""

    summary: str
    covers: int
    """How many leading messages of `AgentState.messages` the summary stands for (system messages are sent anyway)."""
    made_at: int
    """How many messages the conversation had when the summary was made: a model's token count from a call
    before that measured the conversation without the summary."""
    count: int = 1
    """Summaries made in this run (each one model call); the turns of a chat add theirs up."""
    kept: tuple[int, ...] = ()
    """The positions, below `covers`, of the messages sent as they are before the summary (the system messages):
    kept here so that what the model is sent costs the same however long the conversation grows."""


def model_view(messages: Sequence[Message], compaction: Compaction | None) -> list[Message]:
    """What the model is sent for `messages` under `compaction` (module docstring). Never starts the messages it
    sends as they are with a tool result: a `covers` that would cut one from its call (a state edited by hand)
    is moved back to the call, which is then sent as well as summarized."""
    if compaction is None or not compaction.covers:
        return list(messages)
    covers = min(max(compaction.covers, 0), len(messages))
    while 0 < covers < len(messages) and messages[covers].role == "tool":
        covers -= 1
    kept = [messages[i] for i in compaction.kept if 0 <= i < covers]
    return [*kept, Message.user(SUMMARY_HEADER + compaction.summary), *messages[covers:]]


def standing(state: Any, history: list[Message]) -> Compaction | None:
    """The compaction the last turn of a chat ended with (`state`), for the next turn that goes on from `history`:
    only while it still stands for the same first messages (a rollback may have dropped them), else None."""
    compaction = getattr(state, "compaction", None)
    if not isinstance(compaction, Compaction):
        return None
    before = getattr(state, "messages", None) or []
    covers = compaction.covers
    if covers > len(history) or covers > len(before) or any(a != b for a, b in zip(history[:covers], before)):
        return None
    return compaction
