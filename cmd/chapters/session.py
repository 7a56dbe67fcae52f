"""The console session of chapters 6–10: banners, the `you> ` loop on a stored session, what each turn came
to, and picking up a session that did not end cleanly.

A session ID is the checkpoint ID of the agent's run in the SQLite file: a completed run continues the
conversation on the next message. Before the loop, a session that did not end cleanly is dealt with:
a pending pause is shown first (a chapter's `on_pause` answers it: chapter 7's approval prompt); a run
that was cut off — its process died, Ctrl-C cancelled it, or its turn failed — is resumed from its last
saved step. A run still marked `running` belongs to the process holding its lease: the session waits for
the lease to expire (a dead process renews nothing), or takes the run over at once with `--takeover`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from waypoint.engine import GraphMismatch, WaypointError

from ..console import Console, print_events, read_line
from ..fstools import ProjectRoot

__all__ = ["ChatSession", "add_session_options", "DONE", "QUIT", "FAILED"]

DONE = "done"
"""The turn (or the recovery) ended: the loop goes on."""
QUIT = "quit"
"""The user left at a prompt (EOF): the run stays where it is, the chapter exits (status 0)."""
FAILED = "failed"
"""The turn failed or cannot go on: the chapter exits with status 1; the session keeps the turn."""
BUSY = "busy"
"""Another live process runs the session: this one exits with status 1 and touches nothing."""

TITLE_LIMIT = 60

PauseHandler = Callable[["ChatSession", Any], Awaitable[str]]


def add_session_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`--takeover`, next to `chapter_parser`'s `--session`."""
    parser.add_argument("--takeover", action="store_true",
                        help="resume a session left running by a process you know is dead, without waiting "
                             "for its lease to expire")
    return parser


class ChatSession:
    """One chapter's chat on one stored session. `run(session)` is the whole conversation."""

    def __init__(self, *, number: int, runner: Any, console: Console, root: ProjectRoot,
                 on_pause: PauseHandler | None = None, after_turn: Callable[[], None] | None = None,
                 takeover: bool = False) -> None:
        self.number = number
        self.runner = runner
        self.console = console
        self.root = root
        self.on_pause = on_pause
        self.after_turn = after_turn
        self.takeover = takeover
        self.session_id = ""
        self._said_goodbye = False

    def main(self, session: str | None) -> int:
        """Run the session to its end; the exit status. Ctrl-C keeps the session (its run is saved as
        cancelled, and resumed next time)."""
        try:
            return asyncio.run(self.run(session))
        except KeyboardInterrupt:
            self.console.line()
            self.console.note("Interrupted.")
            if self.session_id and not self._said_goodbye:
                self.goodbye()
            return 130

    async def run(self, session: str | None) -> int:
        self.session_id = session or str(uuid.uuid4())
        try:
            snap = await self.runner.app.get_run(self.session_id) if session else None
            self._banners(snap)
            outcome = await self._recover(snap) if snap is not None else DONE
            if outcome == DONE:
                outcome = await self._loop()
            if outcome == BUSY:
                return 1
        except GraphMismatch as err:
            self.console.note(f"error: session {self.session_id} was not written by chapter {self.number}'s agent; "
                              f"open it with the chapter that created it, or start a new session ({err})", "red")
            return 1
        except WaypointError as err:
            self.console.note(f"error: {err}", "red")
            return 1
        finally:
            await self.runner.store.close()
        if outcome == FAILED:
            self.console.note("This turn did not finish; the session keeps it where it stopped: the command below "
                              "tries it again.", "yellow")
        self.goodbye()
        return 1 if outcome == FAILED else 0

    def goodbye(self) -> None:
        self._said_goodbye = True
        self.console.line(f"Session saved: {self.session_id}")
        self.console.line(f"Resume with: waypoint chapter {self.number} --session {self.session_id}")

    async def play(self, events: Any) -> str:
        """Print a run's events as they come; then what they came to (a pause goes to `on_pause`)."""
        summary = await print_events(events, self.console)
        if self.after_turn is not None:
            self.after_turn()
        if summary.error is not None:
            return FAILED
        if summary.interrupted is not None:
            return await self._paused(summary.interrupted)
        return DONE

    # --- inside -----------------------------------------------------------------------------------------

    def _banners(self, snap: Any) -> None:
        if snap is None:
            self.console.line(f"Created new session: {self.session_id}", "bold")
        else:
            self.console.line(f"Resuming session: {self.session_id}", "bold")
        self.console.line(f"Session title: {_title(snap)}")
        self.console.line(f"Project root: {self.root.root}")

    async def _loop(self) -> str:
        self.console.line("Enter your message (empty line to exit):")
        while True:
            text = read_line(self.console)
            if text is None or not text.strip():
                return DONE
            outcome = await self.play(self.runner.run(text, checkpoint_id=self.session_id))
            if outcome != DONE:
                return outcome

    async def _paused(self, info: Any) -> str:
        if self.on_pause is None:
            self.console.note(f"error: the run paused ({info}); chapter {self.number} cannot answer that — "
                              f"resume it with `waypoint runs resume {self.session_id}`", "red")
            return FAILED
        return await self.on_pause(self, info)

    async def _recover(self, snap: Any) -> str:
        """Before the loop: answer a pending pause, or continue a turn that was cut off."""
        meta = snap.meta
        if meta.status == "completed":
            return DONE
        if meta.status == "interrupted" and snap.interrupts.contexts:
            self.console.line("This session is paused, waiting for you:")
            return await self._paused(snap.interrupts)
        takeover = False
        if meta.status == "running":
            if not await self._wait_for_lease(meta):
                return BUSY
            takeover, why = self.takeover, "its process stopped while it ran"
        else:
            why = meta.error or meta.status
        self.console.line(f"The last turn of this session did not finish ({why}); continuing it from its last "
                          "saved step:", "yellow")
        return await self.play(self.runner.resume(self.session_id, takeover=takeover))

    async def _wait_for_lease(self, meta: Any) -> bool:
        """True once the run may be taken over: `--takeover`, or its owner's lease expired unrenewed."""
        left = (meta.lease_expires or 0) - time.time()
        if left <= 0:
            return True
        if self.takeover:
            self.console.line(f"Taking the session over from process {meta.lease_owner} at once (--takeover).")
            return True
        self.console.line(f"The session is marked running by process {meta.lease_owner}, whose lease runs until "
                          f"{_clock(meta.lease_expires)}.")
        self.console.line(f"Waiting {left:.1f} s for the lease to expire (a dead process does not renew it; "
                          "--takeover skips the wait)...")
        await asyncio.sleep(left + 0.1)
        now = await self.runner.app.get_run(self.session_id)
        if now is not None and now.meta.status == "running" and now.meta.lease_expires == meta.lease_expires:
            self.console.line("The lease expired: taking the session over.")
            return True
        self.console.note(f"error: session {self.session_id} is in use by another process ({meta.lease_owner} "
                          "renewed its lease or finished the turn); close that chapter first, or pass --takeover "
                          "if you know it is dead", "red")
        return False


def _title(snap: Any) -> str:
    messages = (getattr(snap.state, "messages", None) or []) if snap is not None else []
    first = next((m.content for m in messages if m.role == "user" and m.content), None)
    if first is None:
        return "New Session"
    first = " ".join(first.split())
    return first if len(first) <= TITLE_LIMIT else first[:TITLE_LIMIT] + "..."


def _clock(at: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) if at else "?"
