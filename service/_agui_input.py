"""What an AG-UI client sends (`RunAgentInput`, https://docs.ag-ui.com) and what it becomes here: the thread's
new user messages (a start), or its resume entries turned into the service's own answers (a resume).

The input is validated by our own pydantic model, not the `ag-ui-protocol` package's (a test dependency only:
docs/decisions.md). Members this model does not name are kept and ignored, as the protocol asks of a producer.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from waypoint.engine import Message

from ._responses import SafeJSONResponse, invalid
from ._schemas import Approve, Reject, RespondWith

__all__ = ["AguiInput", "ResumeEntry", "new_input", "answers_of", "APPROVAL_SCHEMA"]

APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"},
                   "reason": {"type": "string", "description": "why not (read by the model after a no)"},
                   "digest": {"type": "string", "description": "the approval's digest as shown (metadata.waypoint."
                                                               "digest): a yes for a call that changed is refused"}},
    "required": ["approved"],
}
"""What a resume entry answering an approval carries in `payload` (the interrupt's `responseSchema`)."""


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class ResumeEntry(_Wire):
    """One answer to an interrupt that ended the previous run on the thread."""

    interrupt_id: str = Field(min_length=1, max_length=256)
    status: Literal["resolved", "cancelled"]
    payload: Any = None
    metadata: dict[str, Any] | None = None


class AguiInput(_Wire):
    """An AG-UI `RunAgentInput`: the thread is the run's checkpoint ID."""

    thread_id: str = Field(min_length=1, max_length=512)
    run_id: str = Field(min_length=1, max_length=512)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    resume: list[ResumeEntry] | None = None
    state: Any = None
    tools: list[Any] | None = None
    context: list[Any] | None = None
    forwarded_props: Any = None
    parent_run_id: str | None = None
    protocol_version: str | None = None


def _text(content: Any) -> str | None:
    """A message's text: a string, or the text parts of a list of parts joined (others are skipped, as the
    protocol asks of a producer that cannot use a part)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(p for p in parts if isinstance(p, str))
    return None


def new_input(body: AguiInput, *, continuing: bool) -> list[Message] | SafeJSONResponse:
    """The messages a start gives the agent. A new thread: every user, system, developer and assistant text
    message the client sent (tool messages and tool calls are the run's own business: none is taken from a
    client). A thread that already holds a conversation (`continuing`): only the user messages after the last
    message that is not the user's — the stored conversation is the thread's history, not the client's copy."""
    messages = body.messages
    if continuing:
        tail = len(messages)
        while tail > 0 and messages[tail - 1].get("role") == "user":
            tail -= 1
        messages = messages[tail:]
    out: list[Message] = []
    for i, m in enumerate(messages):
        role, text = m.get("role"), _text(m.get("content"))
        if role not in ("user", "system", "developer", "assistant"):
            continue
        if text is None:
            at = i + (len(body.messages) - len(messages))
            return invalid(["body", "messages", at, "content"], "a message's content is text or a list of parts")
        out.append(Message.user(text) if role == "user" else Message.assistant(text) if role == "assistant"
                   else Message.system(text))
    if not out or out[-1].role != "user":
        return invalid(["body", "messages"], f"thread '{body.thread_id}' has no new user message to answer: end "
                       "`messages` with the user's message (or answer its interrupts in `resume`)", "missing")
    return out


def answers_of(body: AguiInput, pending: dict[str, dict[str, Any]]) -> list[Any] | SafeJSONResponse:
    """The service's answers (`POST /runs/{id}/resume`'s) for the resume entries: an approval's entry is an
    approve (`payload.approved` true) or a reject (false, or the entry `cancelled`: an abandoned approval never
    runs its tool); another interrupt's is a respond with the payload; a static pause's needs no answer. An
    entry naming no pending interrupt is kept, so the resume's own checks refuse it (409: nothing runs)."""
    out: list[Any] = []
    for i, entry in enumerate(body.resume or ()):
        where = ["body", "resume", i, "payload"]
        kind = pending.get(entry.interrupt_id, {}).get("kind", "approval")
        if kind == "pause":
            continue
        if kind != "approval":
            if entry.status == "cancelled":
                out.append(Reject(action="reject", interrupt_id=entry.interrupt_id, reason="cancelled"))
            else:
                out.append(RespondWith(action="respond", interrupt_id=entry.interrupt_id, output=entry.payload))
            continue
        if entry.status == "cancelled":
            out.append(Reject(action="reject", interrupt_id=entry.interrupt_id, reason="cancelled by the user"))
            continue
        payload = entry.payload
        if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
            return invalid(where, f"interrupt {entry.interrupt_id} is an approval: its payload is {{\"approved\": "
                           "true}} or {\"approved\": false, \"reason\": \"...\"}")
        if "editedArgs" in payload:
            return invalid(where + ["editedArgs"], "edited arguments are not taken: approve or reject the call as "
                           "it was shown")
        digest, reason = payload.get("digest"), payload.get("reason")
        if digest is not None and (not isinstance(digest, str) or len(digest) > 128):
            return invalid(where + ["digest"], "the digest is the text the interrupt's metadata.waypoint.digest shows")
        if payload["approved"]:
            out.append(Approve(action="approve", interrupt_id=entry.interrupt_id, digest=digest))
        else:
            out.append(Reject(action="reject", interrupt_id=entry.interrupt_id,
                              reason=reason if isinstance(reason, str) else None))
    return out
