"""The chat of chapters 2–10: `you> ` turns on one stored session, and a session that did not end cleanly.

A session ID is the checkpoint ID of the agent's run: a completed run continues the conversation on the
next message (chapter 2 keeps it in memory, chapters 3 on in the SQLite file). A turn that did not finish
is dealt with when the session opens and again before each new message (docs/decisions.md, "One chat
session"):

- paused, waiting for a person: the chapter's `on_pause` answers it (the approval prompt of chapters 7,
  8 and 10); a chapter without one says how to answer it with `waypoint runs resume`;
- running under a live lease: if its owner is a process on this host that is gone, the session takes the
  run over at once; if the owner is alive, the session is refused in one line (`--takeover` is for an owner
  on another machine that you know is dead);
- cut off (its process died and its lease expired, Ctrl-C cancelled it, or the turn failed): it continues
  from its last saved step; finished tool calls do not run again.

A turn that fails is reported and kept: the next message finishes it first. Ctrl-C cancels the turn (the
engine saves it at its last finished step) and ends the chat; the session says how to come back to it.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from waypoint.engine import GraphMismatch, UnknownType, WaypointError
from waypoint.engine.keep.owners import OwnerState, owner_state
from waypoint.engine.keep.store import store_clock

from ..console import Console, compact, default_db, print_events, read_line

__all__ = ["ChatSession", "ChapterError", "add_session_options", "guarded", "DONE", "QUIT", "FAILED", "BUSY"]

DONE = "done"
"""The turn (or the catching up) ended: the chat goes on."""
QUIT = "quit"
"""The user left at a prompt (EOF): the run stays where it is, the chapter exits (status 0)."""
FAILED = "failed"
"""The turn failed or cannot go on: the session keeps it; the next message (or the next start) finishes it."""
BUSY = "busy"
"""A live process runs the session: this one touches nothing and exits with status 1."""

TITLE_LENGTH = 60

PauseHandler = Callable[["ChatSession", Any], Awaitable[str]]


class ChapterError(Exception):
    """Something the user can fix (a flag, an environment variable); its message says how."""


def guarded(console: Console, body: Callable[[], int]) -> int:
    """Run a chapter: Ctrl-C exits 130; an error is one line on stderr and exit 1, never a traceback."""
    try:
        return body()
    except KeyboardInterrupt:
        console.line()
        return 130
    except ChapterError as err:
        console.note(f"error: {err}", "red")
        return 1
    except Exception as err:  # the CLI's edge: whatever went wrong, say it in one line
        console.note(f"error: {compact(f'{type(err).__name__}: {err}', 500)}", "red")
        return 1


def add_session_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`--takeover`, next to `chapter_parser`'s `--session`."""
    parser.add_argument("--takeover", action="store_true",
                        help="continue a session left running by a process on another machine that you know is "
                             "dead, without waiting for its lease to expire")
    return parser


class ChatSession:
    """One chapter's chat on one session. `main(session)` is the whole conversation; its exit status."""

    def __init__(self, *, number: int, runner: Any, console: Console, banners: Sequence[str] = (),
                 on_pause: PauseHandler | None = None, after_turn: Callable[[], None] | None = None,
                 takeover: bool = False, stored: bool = True, db: Path | None = None,
                 prepare: Callable[[ChatSession, Any], None] | None = None) -> None:
        self.number = number
        self.runner = runner
        self.console = console
        self.banners = tuple(banners)
        self.on_pause = on_pause
        self.after_turn = after_turn
        self.takeover = takeover
        self.stored = stored
        """False for chapter 2: one conversation in memory, no session to name or come back to."""
        self.db = db
        self.prepare = prepare
        """Called with the session and its stored run (None: a new session) once it is read, before anything
        runs or is printed; it may set `runner`, `banners` and `again`, or refuse with `ChapterError`
        (chapters 4–10: the runner confined to the session's project root, cmd/chapters/project.py)."""
        self.again: Callable[[Any], Sequence[str]] | None = None
        """The options the `Resume with:` line adds, given the session's stored run."""
        self.session_id = ""
        self._named = False
        self._said_goodbye = False

    def main(self, session: str | None) -> int:
        """Run the session to its end; the exit status. Input is read outside the event loop, which runs
        one turn at a time: Ctrl-C at the prompt ends the chat at once, and during a turn cancels it (saved
        as cancelled, continued next time)."""
        if session is not None and not session.strip():
            self.console.note("error: --session needs an ID (leave it out to start a new session)", "red")
            return 1
        self.session_id = session or str(uuid.uuid4())
        self._named = session is not None
        with asyncio.Runner() as loop:
            try:
                outcome = loop.run(self._start())
                if outcome in (DONE, FAILED):
                    outcome = self._chat(loop)
                if outcome != BUSY and self.stored:
                    loop.run(self.goodbye())
                return 1 if outcome in (BUSY, FAILED) else 0
            except KeyboardInterrupt:
                self.console.line()
                loop.run(_stop_the_rest())
                if self.stored and not self._said_goodbye:
                    loop.run(self.goodbye())
                return 130
            except (ChapterError, WaypointError) as err:
                if isinstance(err, GraphMismatch):
                    err = ChapterError(f"session {self.session_id} was not written by chapter {self.number}'s agent; "
                                       f"open it with the chapter that created it, or start a new session ({err})")
                self.console.note(f"error: {err}", "red")
                return 1
            finally:
                loop.run(self.runner.store.close())

    async def _start(self) -> str:
        snap = await self._open()
        return await self.catch_up(snap) if snap is not None else DONE

    def _chat(self, loop: asyncio.Runner) -> str:
        self.console.line("Enter your message (empty line to exit):")
        outcome = DONE
        while True:
            text = read_line(self.console)
            if text is None or not text.strip():
                return outcome
            outcome = loop.run(self._message(text))
            if outcome in (QUIT, BUSY):
                return outcome

    async def _message(self, text: str) -> str:
        """One message: the last turn first if it did not finish, then this one."""
        snap = await self.runner.app.get_run(self.session_id)
        if snap is not None and snap.meta.status != "completed":
            outcome = await self.catch_up(snap)
            if outcome in (QUIT, BUSY):
                return outcome
            if outcome == FAILED:
                self.console.note("[error] the last turn failed again, so this message was not sent: fix the cause "
                                  "and send it again (the turn is tried first), or start a new session", "red")
                return FAILED
        return await self.play(self.runner.run(text, checkpoint_id=self.session_id))

    async def goodbye(self) -> None:
        self._said_goodbye = True
        snap = await self.runner.app.get_run(self.session_id)
        if snap is None:
            self.console.line(f"Session {self.session_id} is empty: nothing was saved.")
            return
        extra = self.again(snap) if self.again is not None else ()
        again = " ".join(map(shlex.quote, ("waypoint", "chapter", str(self.number), "--session", self.session_id,
                                           *extra)))
        if self.db is not None:
            again += f" --db {shlex.quote(str(self.db))}"
        self.console.line(f"Session saved: {self.session_id}")
        self.console.line(f"Resume with: {again}")

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

    async def catch_up(self, snap: Any) -> str:
        """A turn that did not finish: answer its pause, or continue it from its last saved step."""
        meta = snap.meta
        if meta.status == "completed":
            return DONE
        if meta.status == "interrupted" and snap.interrupts.contexts:
            self.console.line("This session is paused, waiting for you:")
            return await self._paused(snap.interrupts)
        takeover = False
        if meta.status == "running" and (meta.lease_expires or 0) > await store_clock(self.runner.store):
            takeover = self._may_take_over(meta)
            if takeover is None:
                return BUSY
            why = "its process stopped while it ran"
        elif meta.status == "running":  # its lease lapsed already: nothing to wait for, whoever held it
            if owner_state(meta.lease_owner) is OwnerState.DEAD:
                self._say_gone(meta)
            why = "its process stopped while it ran"
        elif meta.error == "cancelled":
            why = "cancelled"
        else:
            why = f"failed: {compact(meta.error or meta.status, 120)}"
        self.console.line(f"The last turn of this session did not finish ({why}); continuing it from its last "
                          "saved step:", "yellow")
        return await self.play(self.runner.resume(self.session_id, takeover=bool(takeover)))

    # --- inside -----------------------------------------------------------------------------------------

    async def _open(self) -> Any:
        not_a_chat = ChapterError(f"checkpoint '{self.session_id}' holds a run that is not a chat session of "
                                  f"chapter {self.number}; pick another --session, or leave it out to start a new one")
        try:
            snap = await self.runner.app.get_run(self.session_id)  # even for a new ID: a bad database says so now
        except UnknownType:  # its state holds types no chapter registers
            raise not_a_chat from None
        except sqlite3.Error as err:
            raise ChapterError(f"cannot use the database {self.db or default_db()} ({err}); pass --db with the path "
                               "of a file you can write") from None
        if snap is not None and (snap.graph != self.runner.agent.name
                                 or not isinstance(getattr(snap.state, "messages", None), list)):
            other = f"; it belongs to '{snap.graph}'" if snap.graph else ""
            raise ChapterError(f"checkpoint '{self.session_id}' holds a run that is not a chat session of chapter "
                               f"{self.number}{other}; pick another --session, or leave it out to start a new one")
        if snap is None and self._named and self.stored and self.db is None:
            await self._refuse_a_demo_run()
        if self.prepare is not None:
            self.prepare(self, snap)
        if self.stored:
            self.console.line(f"{'Resuming' if snap else 'Created new'} session: {self.session_id}", "bold")
            self.console.line(f"Session title: {_title(snap)}")
        for line in self.banners:
            self.console.line(line)
        return snap

    async def _refuse_a_demo_run(self) -> None:
        """A session ID the chapter's database does not hold, but the demo's does (`waypoint demo` prints its
        run's ID, and keeps it in a database of its own): refused, as it is when `--db` names the demo's file —
        never a new chat under the demo's ID."""
        from waypoint.stores import SQLiteStore

        from ..demo.agent_tour import DEFAULT_DB as AGENT_TOUR
        from ..demo.triage_tour import DEFAULT_DB as TRIAGE_TOUR

        for db in (AGENT_TOUR, TRIAGE_TOUR):
            if not db.is_file() or db.resolve() == default_db().resolve():
                continue
            store = SQLiteStore(db)
            try:
                found = await store.history(self.session_id, limit=1)
            except Exception:  # noqa: BLE001 - a demo file this chapter cannot read holds no session to refuse
                continue
            finally:
                await store.close()
            if found:
                raise ChapterError(f"checkpoint '{self.session_id}' is a run of the demo, stored in {db}, not a chat "
                                   f"session of chapter {self.number}; pick another --session, or leave it out to "
                                   "start a new one")

    async def _paused(self, info: Any) -> str:
        if self.on_pause is None:
            self.console.note(f"error: the run paused ({info}); chapter {self.number} cannot answer that — answer it "
                              f"with `waypoint runs resume {self.session_id}`", "red")
            return BUSY
        return await self.on_pause(self, info)

    def _say_gone(self, meta: Any) -> None:
        self.console.line(f"The process that ran this session ({meta.lease_owner}) is gone: taking it over.")

    def _may_take_over(self, meta: Any) -> bool | None:
        """True to take the run over now, False when it may just be continued; None: a live process has it."""
        state = owner_state(meta.lease_owner)
        if state is OwnerState.DEAD:
            self._say_gone(meta)
            return True
        if state is OwnerState.UNKNOWN and self.takeover:
            self.console.line(f"Taking the session over from process {meta.lease_owner} at once (--takeover).")
            return True
        until = time.strftime("%H:%M:%S", time.localtime(meta.lease_expires))
        hint = "" if state is not OwnerState.UNKNOWN else (", or pass --takeover if you know that machine's "
                                                          "process is dead")
        self.console.note(f"error: session {self.session_id} is in use by another process ({meta.lease_owner}, "
                          f"lease until {until}); close that chapter first{hint}", "red")
        return None


async def _stop_the_rest() -> None:
    """Cancel the run Ctrl-C left behind, and wait while the engine saves it as cancelled."""
    await asyncio.sleep(0)
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


def _title(snap: Any) -> str:
    """The first user text, cut to 60 characters (`New Session` if there is none yet)."""
    messages = (getattr(snap.state, "messages", None) or []) if snap is not None else []
    first = next((m.content for m in messages if m.role == "user" and m.content), None)
    return " ".join(first.split())[:TITLE_LENGTH] if first else "New Session"
