"""Chapter 7's approval prompt (chapter 8 uses it too): a run paused on a tool call that needs approval
shows the call and asks; the answer resumes the run.

    ⚠️  Approval Required ⚠️
    Tool: execute
    Arguments: {"command": "touch made.txt"}

    Approve this action? (y/n):

`y` / `yes` (any case) approves — bound to the digest of the arguments shown, so a call whose stored
arguments changed since is refused — and anything else rejects. One root-cause approval is answered per
resume; the calls not answered pause again with the same IDs, and the prompt comes back for each. EOF at
the prompt leaves the run paused: the next start of the chapter on the same session asks again.
"""

from __future__ import annotations

from typing import Any

from waypoint.engine.run.resume import unescape_part
from waypoint.middleware import ApprovalInfo, ApprovalResult

from waypoint.engine.run.node_calls import in_daemon_thread

from ..console import hides, read_line, visible
from .session import FAILED, QUIT, ChatSession

__all__ = ["approval_prompt", "REJECTED"]

YES = frozenset({"y", "yes"})
REJECTED = "rejected at the prompt"


async def approval_prompt(session: ChatSession, info: Any) -> str:
    """Ask about the first paused approval in `info` (an `InterruptInfo`) and resume with the answer;
    recurses (through `session.play`) while calls stay paused. Returns DONE, QUIT (EOF) or FAILED."""
    console = session.console
    pending = next((c for c in info.contexts if c.is_root_cause and isinstance(c.info, ApprovalInfo)), None)
    if pending is None:
        console.note(f"error: no root cause interrupt context found: the run paused on something other than an "
                     f"approval ({info}); resume it with `waypoint runs resume {session.session_id}`", "red")
        return FAILED
    approval: ApprovalInfo = pending.info
    console.line("\n⚠️  Approval Required ⚠️", "yellow", "bold")
    agents = _agents(pending.address)
    if len(agents) > 1:  # asked inside an agent the chapter's agent called (chapter 10)
        console.line(f"Agent: {' › '.join(visible(a, strict=True) for a in agents)}")
    console.line(f"Tool: {visible(approval.tool_name, strict=True)}")
    console.line(f"Arguments: {visible(approval.arguments_json)}")  # shown as codes, never obeyed
    if hides(approval.tool_name) or hides(approval.arguments_json):
        console.line("! this call holds invisible or direction-changing characters, shown above as \\uXXXX codes: "
                     "read them before you approve", "red", "bold")
    # Read off the event loop: Ctrl-C at the prompt ends the chapter at once, and never becomes an answer.
    answer = await in_daemon_thread(read_line, console, "\nApprove this action? (y/n): ")
    if answer is None:
        console.line("No answer: the call stays paused, and this prompt comes back when you resume the session.")
        return QUIT
    if answer.strip().lower() in YES:
        console.line("✓ Approved, executing...", "green")
        result = ApprovalResult(approved=True, digest=approval.digest)
    else:
        console.line("✗ Rejected", "red")
        result = ApprovalResult(approved=False, reason=REJECTED)
    return await session.play(session.runner.resume_with_params(session.session_id, {pending.id: result}))


def _agents(address: str) -> list[str]:
    """The graphs an interrupt's address passes through: `runnable:ch10;...;runnable:researcher;...` → both."""
    return [unescape_part(part[len("runnable:"):]) for part in address.split(";") if part.startswith("runnable:")]
