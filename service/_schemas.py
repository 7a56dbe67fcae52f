"""Request and response bodies of the HTTP API (pydantic: validated in, described in the OpenAPI document)."""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = ["StartRun", "ResumeRun", "CancelRun", "CancelAccepted", "Answer", "Approve", "Reject", "RespondWith", "RestartCall", "Accepted",
           "Problem", "RunList", "RunRow", "InputMessage", "Served", "RunView", "PendingView", "VersionRow",
           "Approvals", "ApprovalItem", "HistoryPage", "run_id_problem", "MAX_VERSION"]

MAX_VERSION = 2**53
"""The largest version a request may name (what a JSON number holds exactly)."""


def run_id_problem(text: str) -> str | None:
    """Why `text` cannot be a run ID started over HTTP (the page and every client must be able to address
    it in a URL path), or None."""
    if text in (".", ".."):
        return "'.' and '..' are path steps, not run IDs (a browser resolves them away)"
    if "/" in text:
        return "a run ID started over HTTP may not contain '/' (a URL path could not address it)"
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            return f"a run ID may not contain control characters or lone surrogates (found U+{ord(ch):04X})"
    return None


def _run_id(text: str) -> str:
    problem = run_id_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


CheckpointId = Annotated[str, Field(min_length=1, max_length=512, description="the run's checkpoint ID: no '/', no "
                                    "control characters, not '.' or '..'"),
                         AfterValidator(_run_id)]
InterruptId = Annotated[str, Field(min_length=1, max_length=256, description="a pending interrupt's ID")]


def _who(text: str) -> str:
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise ValueError(f"who asks may not contain control characters or lone surrogates (found U+{ord(ch):04X})")
    return text


Who = Annotated[str, Field(max_length=200), AfterValidator(_who)]
Version = Annotated[int, Field(ge=1, le=MAX_VERSION)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputMessage(_Body):
    """One chat message given to an agent."""

    role: Literal["system", "user", "assistant"] = "user"
    content: str


class StartRun(_Body):
    """Start a run of a served agent or graph."""

    agent: str | None = Field(None, description="the served agent or graph to run (optional when one is served)")
    input: Any = Field(..., description="an agent: text or a list of messages; a graph: its input (JSON)")
    checkpoint_id: CheckpointId | None = Field(None, description="the run's ID (a new random one if not given)")
    force_new_run: bool = Field(False, description="start over on an ID whose run is paused or failed")
    wait: bool = Field(False, description="answer once the run pauses, completes or fails (the run's page), "
                                          "instead of once its first version is written")
    on_busy: Literal["reject", "enqueue", "interrupt", "rollback"] | None = Field(
        None, description="an agent's chat whose turn is executing (anywhere): `reject` (409), or queue this input "
        "(202, status \"queued\") to run after the turn (`enqueue`), after stopping it at its next step (`interrupt`) "
        "or after stopping and dropping it (`rollback`); default: the service's (`waypoint serve --on-busy`)")
    by: Who | None = Field(None, description="who sends a queued input, as its record shows it (default: the "
                           "service's API); no control characters; shown, never trusted")


class Approve(_Body):
    """Approve a paused tool call (`ApprovalResult(approved=True)`); for a plain graph `{"approved": true}`."""

    action: Literal["approve"]
    interrupt_id: InterruptId
    digest: str | None = Field(None, max_length=128, description="the approval's digest as it was shown: 409 if the "
                               "call changed since (nothing runs); an approve needs it or `expected_version`")


class Reject(_Body):
    """Reject a paused tool call; the model reads the reason. For a plain graph `{"approved": false, "reason": ...}`."""

    action: Literal["reject"]
    interrupt_id: InterruptId
    reason: str | None = None


class RespondWith(_Body):
    """Answer a paused call with its result (`Respond(output)`: the tool does not run); for a plain graph,
    `output` is the resume data itself."""

    action: Literal["respond"]
    interrupt_id: InterruptId
    output: Any


class RestartCall(_Body):
    """Run a paused tool call again (`Restart(metadata, replace_input)`); agents only."""

    action: Literal["restart"]
    interrupt_id: InterruptId
    metadata: Any = None
    replace_input: dict[str, Any] | str | None = None


Answer = Annotated[Union[Approve, Reject, RespondWith, RestartCall], Field(discriminator="action")]


class ResumeRun(_Body):
    """Resume a paused (or crashed, or failed) run with answers for its pending interrupts."""

    answers: list[Answer] = Field(default_factory=list, description="one answer per interrupt ID; none to "
                                  "continue a run that waits on no answer (a static pause, a crash, a failure)")
    expected_version: Version | None = Field(None, description="the version the answers were made for: 409 if "
                                             "the run has moved on since (an approve needs it or its `digest`)")
    takeover: bool = Field(False, description="take over a run whose process died before its lease expired; "
                                              "refused (409) while its owner is this service or a live process "
                                              "on this host")
    wait: bool = Field(False, description="answer once the run pauses again, completes or fails")


class CancelRun(_Body):
    """Ask whichever process executes a run to stop it (docs/service.md, "Cancelling a run")."""

    when: str = Field("now", max_length=300, description="`now` (a tool call in flight is abandoned and runs again "
                      "when the run is continued), `after_step`, for agents `after_tool_calls` or `after_model_call`, "
                      "or `after:<node>`")
    by: Who | None = Field(None, description="who asks, as the run's record shows it (default: the service's API); "
                           "no control characters; shown, never trusted")


class CancelAccepted(BaseModel):
    """A cancel request recorded: the process executing the run stops it within about half a second (at `when`)."""

    checkpoint_id: str
    version: int = Field(description="the run's newest version when it was asked: a later continuation is not stopped")
    when: str
    by: str
    requested_at: float = Field(description="Unix seconds, on the store's clock")


class QueuedView(BaseModel):
    """New input queued for a chat whose turn executes: its place in the chat's order."""

    n: int = Field(description="its place among the chat's queued inputs (1, 2, 3, …): the order they run in")
    policy: str
    by: str
    queued_at: float = Field(description="when the store recorded it (its clock)")


class Accepted(BaseModel):
    """A start or resume that has written the run's first version (its claim)."""

    checkpoint_id: str
    graph: str
    status: str
    version: int | None
    last_event_id: int | None = Field(None, description="send as Last-Event-ID to GET /runs/{id}/events to receive "
                                      "every event of this start or resume")
    queued: QueuedView | None = Field(None, description="status \"queued\" (202): new input for a chat whose turn "
                                      "executes, queued to run after it (`on_busy`)")


class Problem(BaseModel):
    """An error: what happened and what to do. A conflict also says where the run is now, and which
    interrupts it waits on (the same IDs its `detail` names)."""

    detail: str
    current_version: int | None = None
    status: str | None = None
    pending: list[str] | None = None


class Lease(BaseModel):
    owner: str | None
    expires: float | None
    alive: bool


class VersionRow(BaseModel):
    """One version of a run."""

    checkpoint_id: str
    version: int
    status: str
    step: int
    created_at: float
    updated_at: float
    error: str | None
    origin: str | None
    lease: Lease | None = None


class PendingView(BaseModel):
    """One interrupt a run waits on: an approval (tool, arguments, digest), a static pause, or a node's or
    tool's own interrupt (`info`)."""

    model_config = ConfigDict(extra="allow")

    id: str
    kind: Literal["approval", "pause", "sleep", "interrupt"]
    address: str
    run_path: list[str] = Field(default_factory=list, description="the agents (or graphs) it was raised in, "
                                "outermost first: [\"supervisor\", \"researcher\"] for a call of an agent used as a tool")
    paused_at: float | None
    version: int | None
    tool: str | None = None
    call_id: str | None = None
    arguments: Any = None
    arguments_json: str | None = Field(None, description="the call's arguments exactly as the model wrote them "
                                       "(`arguments` parsed; show this one: a JSON parser that reads numbers as "
                                       "doubles rounds big integers)")
    digest: str | None = None
    info: Any = None
    deadline: float | None = Field(None, description="when the pause stops waiting (Unix seconds, the store's "
                                   "clock): an approval is then rejected as expired, a sleep wakes")
    expires_in: float | None = Field(None, description="seconds left until `deadline` when this was read (0: due, "
                                     "being expired)")


class RunView(VersionRow):
    """A run as stored: its newest (or a given) version, what it waits on, its conversation (an agent) or
    state (a graph), its output, and a page of its history, newest first."""

    model_config = ConfigDict(extra="allow")

    graph: str
    kind: Literal["agent", "graph"]
    newest_version: int
    active: bool
    interrupts: list[PendingView]
    pending_nodes: list[str]
    cancelled_by: dict[str, Any] | None = Field(None, description="who cancelled the run at this version (`by`, as "
                                                "they said it), where it stopped (`when`) and when they asked (`at`, "
                                                "the store's clock), when a person's cancel stopped it")
    input_taken: int | None = Field(None, description="an agent's chat: the number of the last queued input a turn "
                                    "took (`on_busy`); inputs numbered above it still wait")
    messages: list[dict[str, Any]] | None = None
    decisions: Any = None
    state: Any = None
    output: Any = None
    history: list[VersionRow]
    history_next: int | None = Field(description="pass as ?before= to GET /runs/{id}/history for older versions")


class HistoryPage(BaseModel):
    history: list[VersionRow]
    next: int | None = Field(description="pass as ?before= for the next page; null on the last")


class ApprovalItem(PendingView):
    """A pending interrupt with its run: a failed run still waiting on one says so (`run_status`, `run_error`)."""

    checkpoint_id: str
    graph: str | None
    run_status: Literal["interrupted", "failed", "running"]
    run_error: str | None


class Approvals(BaseModel):
    approvals: list[ApprovalItem]
    unreadable: list[str] = Field(description="runs that wait on something but cannot be read (damaged, foreign)")


class RunRow(BaseModel):
    """One run in a list: its newest version."""

    model_config = ConfigDict(extra="allow")

    checkpoint_id: str
    version: int
    status: str
    step: int
    created_at: float
    updated_at: float
    error: str | None
    graph: str | None
    active: bool


class RunList(BaseModel):
    runs: list[RunRow]
    next: str | None = Field(description="pass as ?before= for the next page; null on the last page")


class Served(BaseModel):
    name: str
    kind: str
    description: str
