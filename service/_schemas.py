"""Request and response bodies of the HTTP API (pydantic: validated in, described in the OpenAPI document)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["StartRun", "ResumeRun", "Answer", "Approve", "Reject", "RespondWith", "RestartCall", "Accepted",
           "Problem", "RunList", "RunRow", "InputMessage", "Served"]

CheckpointId = Annotated[str, Field(min_length=1, max_length=512, pattern=r"^[^/]+$",
                                    description="the run's checkpoint ID (no '/')")]
InterruptId = Annotated[str, Field(min_length=1, max_length=256, description="a pending interrupt's ID")]


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


class Approve(_Body):
    """Approve a paused tool call (`ApprovalResult(approved=True)`); for a plain graph `{"approved": true}`."""

    action: Literal["approve"]
    interrupt_id: InterruptId
    digest: str | None = Field(None, description="the approval's digest as it was shown: refused if it changed")


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
    expected_version: int | None = Field(None, ge=1, description="the version the answers were made for: "
                                         "409 if the run has moved on since")
    takeover: bool = Field(False, description="take over a run whose process died before its lease expired")
    wait: bool = Field(False, description="answer once the run pauses again, completes or fails")


class Accepted(BaseModel):
    """A start or resume that has written the run's first version (its claim)."""

    checkpoint_id: str
    graph: str
    status: str
    version: int | None
    last_event_id: int = Field(description="send as Last-Event-ID to GET /runs/{id}/events to receive every "
                                           "event of this start or resume")


class Problem(BaseModel):
    """An error: what happened and what to do. A conflict also says where the run is now."""

    detail: str
    current_version: int | None = None
    status: str | None = None
    pending: list[str] | None = None


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
