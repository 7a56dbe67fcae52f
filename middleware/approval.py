"""`ApprovalMiddleware`: a person approves a tool call before it runs (Eino's chatwitheino chapter 7).

The first call of a guarded tool pauses with `StatefulInterrupt(ApprovalInfo(...), state=<arguments>)`.
Resumed as the target with `ApprovalResult(approved=True)` it runs the tool with the *stored*
arguments; `ApprovalResult(approved=False, reason=...)` answers the model with
`tool '<name>' disapproved[: <reason>]` and never runs the tool; `Restart(...)` approves (with new
arguments if it gives them); `Respond(output)` is handled before (the tool does not run). A call that is
not targeted pauses again with the same state and ID.

The approval is bound to what was shown: `ApprovalInfo.digest` is a SHA-256 of the arguments. If the
stored arguments (or the call's own) no longer match it when the resume comes, the resume fails closed
— `ApprovalError`, the tool does not run. Resume data of another kind (a string, say) is an
`ApprovalError` naming the interrupt: it is never read as an approval or a rejection.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError

from waypoint.engine import (
    AgentMiddleware,
    Restart,
    StatefulInterrupt,
    ToolContext,
    WaypointError,
    address_segment,
    get_interrupt_id,
    get_interrupt_info,
    get_interrupt_state,
    get_resume_context,
    register_type,
)
from waypoint.engine.resume import answered_earlier

__all__ = ["ApprovalMiddleware", "ApprovalInfo", "ApprovalResult", "ApprovalError"]


APPROVED = "approved"
"""The address segment an approved call runs under: pauses inside it are new points with their own IDs."""


class ApprovalError(WaypointError):
    """A resume cannot be taken as a decision about a paused call; nothing ran."""


def digest(arguments_json: str) -> str:
    # surrogatepass: a model's text may hold an unpaired surrogate; it must still get a digest
    return hashlib.sha256(arguments_json.encode("utf-8", "surrogatepass")).hexdigest()


@register_type(name="waypoint.ApprovalInfo")
class ApprovalInfo(BaseModel):
    """What the person approving sees: the tool, its arguments, and the digest the approval binds to."""

    model_config = ConfigDict(frozen=True)

    tool_name: str
    arguments_json: str
    digest: str

    def __str__(self) -> str:
        return (f"tool '{self.tool_name}' wants to run with arguments {self.arguments_json}; approve it "
                "(ApprovalResult(approved=True)) or reject it (ApprovalResult(approved=False, reason=...))")


@register_type(name="waypoint.ApprovalResult")
class ApprovalResult(BaseModel):
    """The answer to an `ApprovalInfo`. `digest`, when given, must be the one that was shown."""

    model_config = ConfigDict(frozen=True)

    approved: StrictBool
    """Only a real boolean: `"yes"`, `"on"`, `1` or `"1"` is not an answer (it is refused, naming the interrupt)."""
    reason: str | None = None
    digest: str | None = None


class ApprovalMiddleware(AgentMiddleware):
    """Pause before the tools in `tools` (names) — or those for which `tools(name, arguments_json)` is
    true — run, until a person approves or rejects them. Works on invokable and streamable tools."""

    def __init__(self, tools: Iterable[str] | Callable[[str, str], bool] = ()) -> None:
        self._predicate = tools if callable(tools) else None
        self._names = frozenset(() if callable(tools) else tools)

    def guards(self, name: str, arguments_json: str) -> bool:
        if self._predicate is not None:
            return bool(self._predicate(name, arguments_json))
        return name in self._names

    def wrap_invokable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        async def approved_first(arguments_json: str) -> str:
            if not self.guards(ctx.name, arguments_json):
                return await endpoint(arguments_json)
            run, value = _decide(arguments_json, ctx)
            if not run:
                return value
            with address_segment(APPROVED):  # the approval's answer stays here; what runs below asks anew
                return await endpoint(value)

        return approved_first

    def wrap_streamable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        def approved_first(arguments_json: str) -> AsyncIterator[str]:
            async def chunks() -> AsyncIterator[str]:
                if not self.guards(ctx.name, arguments_json):
                    async for chunk in endpoint(arguments_json):
                        yield chunk
                    return
                run, value = _decide(arguments_json, ctx)
                if not run:
                    yield value
                    return
                with address_segment(APPROVED):  # as above; the tool's generator runs inside it
                    async for chunk in endpoint(value):
                        yield chunk

            return chunks()

        return approved_first


def _decide(arguments_json: str, ctx: ToolContext) -> tuple[bool, str]:
    """(True, arguments to run with) or (False, the answer for the model); or pauses; or refuses."""
    was, _, state = get_interrupt_state()
    if not was:
        info = ApprovalInfo(tool_name=ctx.name, arguments_json=arguments_json, digest=digest(arguments_json))
        raise StatefulInterrupt(info, {"arguments": arguments_json, "digest": info.digest})
    shown = get_interrupt_info()
    is_target, has_data, data = get_resume_context()
    if not is_target or not has_data:  # no answer for this call: ask again, same question, same ID
        raise StatefulInterrupt(shown, state)
    where = _interrupt_name(ctx)
    if isinstance(data, Restart):
        answer = ApprovalResult(approved=True)
    else:
        answer = _as_result(data, where)
    stored = _verified(state, shown, answer, ctx, where)
    if isinstance(data, Restart) and data.replace_input is not None:
        stored = arguments_json  # the person chose new arguments themselves
    elif arguments_json != stored:
        if ctx.original_input is not None:  # a Restart below replaced the input: what was approved is not this
            info = ApprovalInfo(tool_name=ctx.name, arguments_json=arguments_json, digest=digest(arguments_json))
            raise StatefulInterrupt(info, {"arguments": arguments_json, "digest": info.digest})
        raise ApprovalError(f"{where}: the call's arguments no longer match the ones that were approved; "
                            "the tool did not run (the stored run was changed: restore it or start over)")
    first_time = not answered_earlier()  # a carried answer was recorded when it was given
    if answer.approved:
        if first_time and not isinstance(data, Restart):
            ctx.decide("approved", answer.reason)
        return True, stored
    if first_time:
        ctx.decide("rejected", answer.reason)
    text = f"tool '{ctx.name}' disapproved"
    return False, f"{text}: {answer.reason}" if answer.reason else text


def _as_result(data: Any, where: str) -> ApprovalResult:
    if isinstance(data, ApprovalResult):
        return data
    if isinstance(data, dict):
        try:
            return ApprovalResult.model_validate(data)
        except ValidationError as err:
            raise ApprovalError(f"{where}: the resume data is not an approval ({err.error_count()} problem(s): "
                                f"{err.errors()[0]['msg']}); nothing was approved or rejected") from None
    raise ApprovalError(
        f"{where}: resume data must be an ApprovalResult (or Respond / Restart), got {type(data).__name__}; "
        "nothing was approved or rejected — resume with {id: ApprovalResult(approved=True)} or "
        "ApprovalResult(approved=False, reason=...)"
    )


def _verified(state: Any, shown: Any, answer: ApprovalResult, ctx: ToolContext, where: str) -> str:
    """The stored arguments, if they are the ones that were shown (and approved) for this very tool."""
    stored = state.get("arguments") if isinstance(state, dict) else None
    ok = isinstance(stored, str) and isinstance(shown, ApprovalInfo) and digest(stored) == shown.digest \
        and state.get("digest") == shown.digest and (answer.digest is None or answer.digest == shown.digest) \
        and shown.tool_name == ctx.name
    if not ok:
        raise ApprovalError(f"{where}: the arguments stored for approval are not the ones that were shown "
                            "(or the approval names another digest); refusing to run the tool")
    return stored


def _interrupt_name(ctx: ToolContext) -> str:
    return f"interrupt {get_interrupt_id() or '?'} (approval of tool '{ctx.name}', call {ctx.call_id!r})"
