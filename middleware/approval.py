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

import difflib
import fnmatch
import hashlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError

from waypoint.engine import (
    AgentMiddleware,
    Expired,
    GraphBuildError,
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
from waypoint.engine.run.interrupts import MAX_WAIT
from waypoint.engine.run.resume import answered_earlier

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

    pending_kind: ClassVar[str] = "approval"
    """What `Pending.kind` says of a pause with this info (engine/run/pending.py reads it; it is not stored)."""

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


_PATTERN = frozenset("*?[")


class ApprovalMiddleware(AgentMiddleware):
    """Pause before the guarded tools run, until a person approves or rejects each call. Works on invokable and
    streamable tools.

    `ApprovalMiddleware(tools, when=None)`, where `tools` selects the guarded tools by name:

    - tool names, exactly as the agent has them (`{"execute"}`), or glob patterns (`{"fs_*", "*write_file"}`,
      `fnmatch` syntax, case-sensitive; a name that holds `*?[` matches itself too) where a prefix or a server's
      renames make names unstable — a name or pattern as a plain string is one name (`"execute"`);
    - or a predicate over names, `tools(name) -> bool`.

    `when(name, arguments_json) -> bool`, if given, is asked at each call of a selected tool: False runs that
    call without approval (say, only commands that delete). A condition on the arguments cannot be checked
    at build; which tools it may guard can, so it always comes with `tools`.

    `expires_after` (seconds or a `timedelta`), if given, is how long each approval waits: past it (on the store's
    clock) whoever recovers runs (`waypoint serve`, `waypoint worker`, `recover(...)`) answers it as `on_expiry`
    says — "reject", the only choice: the model reads that the approval expired, the tool never runs, and the
    `Decision` says "expired" (no person decided). An answer that comes later is refused (`PauseExpired`).

    Fails closed: no tools selected (the argument missing, an empty set) is a `GraphBuildError` at once; a name,
    pattern or predicate that selects no tool of the agent is a `GraphBuildError` when the agent (or `ToolsNode`)
    is built, naming the tools it has and the nearest names. A guard never silently guards nothing.
    """

    def __init__(self, tools: Iterable[str] | str | Callable[[str], bool] | None = None, *,
                 when: Callable[[str, str], bool] | None = None, expires_after: float | timedelta | None = None,
                 on_expiry: str = "reject") -> None:
        self._when = when
        self._expires = _expiry(expires_after, on_expiry)
        if when is not None and not callable(when):
            raise GraphBuildError(f"ApprovalMiddleware(when={when!r}): `when` is a function "
                                  "(name, arguments_json) -> bool, asked at each call of a guarded tool")
        if callable(tools):
            if _arity(tools) != 1:
                raise GraphBuildError(
                    f"ApprovalMiddleware(tools={tools!r}): a predicate selects tools by name alone, "
                    "tools=lambda name: ... (checked against the agent's tools when it is built); a condition on "
                    "the arguments goes in when=lambda name, arguments_json: ..., beside the tools it applies to")
            self._predicate: Callable[[str], bool] | None = tools
            self._names: frozenset[str] = frozenset()
            self._patterns: tuple[str, ...] = ()
            return
        named = [tools] if isinstance(tools, str) else list(tools) if tools is not None else []
        bad = [t for t in named if not isinstance(t, str) or not t]
        if not named or bad:
            raise GraphBuildError(
                f"ApprovalMiddleware(tools={tools!r}) guards no tool: name the tools that need approval — "
                "ApprovalMiddleware(tools={'execute'}), a pattern such as {'fs_*'}, or a predicate over names "
                "(tools=lambda name: ...)" + (f" (not names: {bad!r})" if bad else ""))
        self._predicate = None
        self._names = frozenset(named)  # a pattern's own text is a name too: 'rm[1]' guards a tool named so
        self._patterns = tuple(sorted({t for t in named if _PATTERN & set(t)}))

    def selects(self, name: str) -> bool:
        """Whether the tool `name` is guarded (before `when`)."""
        if self._predicate is not None:
            return bool(self._predicate(name))
        return name in self._names or any(fnmatch.fnmatchcase(name, p) for p in self._patterns)

    def guards(self, name: str, arguments_json: str) -> bool:
        """Whether this call of `name` waits for approval."""
        return self.selects(name) and (self._when is None or bool(self._when(name, arguments_json)))

    def check_tools(self, tools: Sequence[str], where: str) -> None:
        """Refuse (`GraphBuildError`) a name, pattern or predicate that selects none of `tools`, the tools of
        `where`."""
        if self._predicate is not None:
            matched = {"the predicate": [t for t in tools if self.selects(t)]}
        else:
            matched = {n: [n] if n in tools else [] for n in sorted(self._names - set(self._patterns))}
            matched.update({p: [t for t in tools if t == p or fnmatch.fnmatchcase(t, p)] for p in self._patterns})
        missing = [n for n, found in matched.items() if not found]
        if not missing:
            return
        has = ", ".join(tools) if tools else "none"
        said = "; ".join("the predicate matches no tool" if n == "the predicate" else
                         f"{n!r} matches no tool{_nearest(n, tools)}" for n in missing)
        did = "; ".join(f"{n!r} matched {', '.join(found)}" for n, found in matched.items() if found)
        raise GraphBuildError(
            f"{where}: ApprovalMiddleware guards nothing under {', '.join(map(repr, missing))}: {said} (its tools: "
            f"{has}){'; ' + did if did else ''}. Name each guarded tool exactly as the agent has it, or by a "
            "pattern ('fs_*', '*write_file') — a guard that matches no tool would let every call run unapproved")

    def wrap_invokable_tool_call(self, endpoint: Any, ctx: ToolContext) -> Any:
        async def approved_first(arguments_json: str) -> str:
            if not self.guards(ctx.name, arguments_json):
                return await endpoint(arguments_json)
            run, value = _decide(arguments_json, ctx, self._expires)
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
                run, value = _decide(arguments_json, ctx, self._expires)
                if not run:
                    yield value
                    return
                with address_segment(APPROVED):  # as above; the tool's generator runs inside it
                    async for chunk in endpoint(value):
                        yield chunk

            return chunks()

        return approved_first


def _arity(fn: Callable[..., Any]) -> int | None:
    """How many positional arguments `fn` takes (None: cannot tell, or takes any number)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty)


def _nearest(name: str, tools: Sequence[str]) -> str:
    """What `name` probably meant among `tools`: the same name in another case, a tool it ends (a prefix the
    tools were loaded with), or close spellings."""
    same = [t for t in tools if t.lower() == name.lower()]
    ending = [t for t in tools if t.endswith(name) and t != name]
    close = difflib.get_close_matches(name, list(tools), n=3, cutoff=0.6)
    near = list(dict.fromkeys([*same, *ending, *close]))
    if not near:
        return ""
    hint = f"; by pattern: '*{name}'" if ending else ""
    return f" — did you mean {', '.join(map(repr, near))}{hint}?"


def _expiry(expires_after: Any, on_expiry: Any) -> float | None:
    """Seconds an approval waits (None: for ever), checked when the middleware is made."""
    if on_expiry != "reject":
        raise GraphBuildError(f"ApprovalMiddleware(on_expiry={on_expiry!r}): an approval nobody gave is a "
                              "rejection, on_expiry='reject' (a call is never run because nobody answered)")
    if expires_after is None:
        return None
    seconds = expires_after.total_seconds() if isinstance(expires_after, timedelta) else expires_after
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_WAIT:
        raise GraphBuildError(f"ApprovalMiddleware(expires_after={expires_after!r}): give how long an approval waits, "
                              f"seconds (> 0, at most {MAX_WAIT:.0f}: 100 years) or a timedelta")
    return float(seconds)


def _decide(arguments_json: str, ctx: ToolContext, expires: float | None = None) -> tuple[bool, str]:
    """(True, arguments to run with) or (False, the answer for the model); or pauses; or refuses."""
    was, _, state = get_interrupt_state()
    if not was:
        info = ApprovalInfo(tool_name=ctx.name, arguments_json=arguments_json, digest=digest(arguments_json))
        raise StatefulInterrupt(info, {"arguments": arguments_json, "digest": info.digest}, deadline=expires)
    shown = get_interrupt_info()
    is_target, has_data, data = get_resume_context()
    if not is_target or not has_data:  # no answer for this call: ask again, same question, same ID (and deadline)
        raise StatefulInterrupt(shown, state)
    where = _interrupt_name(ctx)
    if isinstance(data, Expired):  # nobody answered by the deadline: a rejection nobody made
        if not answered_earlier():
            ctx.decide("expired", f"no answer by {data.when}")
        return False, f"tool '{ctx.name}' disapproved: the approval expired at {data.when} without an answer"
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
            raise StatefulInterrupt(info, {"arguments": arguments_json, "digest": info.digest}, deadline=expires)
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
