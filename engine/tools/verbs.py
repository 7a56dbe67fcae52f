"""What a resume may say to a paused tool call (Genkit's verbs), and the record of what was decided.

- `Respond(output)`: do not run the tool; `output` is its result.
- `Restart(metadata=None, replace_input=None)`: run the tool again; it sees `ctx.is_resumed()`,
  `ctx.resumed_metadata`, and — when `replace_input` gave it new arguments — `ctx.original_input`.
  A restarted tool may pause again.

Every decision about a paused call (approved, rejected, responded, restarted, expired) becomes a `Decision`:
published as an event and kept in the agent's state, so the run's history shows it and the version of
the resume that made it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..codec import register_type

__all__ = ["Respond", "Restart", "Decision", "Verb"]

Verb = Literal["approved", "rejected", "responded", "restarted", "expired"]
""""expired": nobody answered by the pause's deadline (the reason says when); no person decided."""


@register_type(name="waypoint.Respond")
@dataclass(frozen=True)
class Respond:
    """Resume data for a paused tool call: `output` is the call's result; the tool does not run."""

    output: Any


@register_type(name="waypoint.Restart")
@dataclass(frozen=True)
class Restart:
    """Resume data for a paused tool call: run it again, with `metadata` for the tool and, if given,
    `replace_input` (a dict or JSON text) instead of the arguments the model wrote."""

    metadata: Any = None
    replace_input: Any = None


@register_type(name="waypoint.Decision")
@dataclass(frozen=True, kw_only=True)
class Decision:
    """What was decided about a paused call, and at which version of the run (the resume's claim)."""

    call_id: str
    tool: str
    verb: Verb
    reason: str | None = None
    version: int | None = None
    run_path: tuple[str, ...] = ()
    """The agents it was decided inside, below the run's own: ("helper",) for a call of the agent an `AgentTool`
    named `helper` ran; () for the run's own calls. `version` is then the inner run's."""
