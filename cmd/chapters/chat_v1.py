"""The console chat that chapters 2 to 5 share: `you> ` turns on one checkpoint ID, and sessions.

A turn is one run of the agent on the chat's checkpoint ID. The Runner continues a completed run's
conversation on its ID, so the store is the chat's memory: a `MemoryStore` in chapter 2, the SQLite file
from chapter 3 on, where the session ID *is* the checkpoint ID (no session files of our own).

Input is read outside the event loop, which runs one turn at a time (one `asyncio.Runner` for the whole
chat): Ctrl-C at the prompt ends the chat at once; Ctrl-C during an answer cancels the run, which the
engine saves at its last finished step. A turn that did not finish (cancelled, failed, or its process
killed) is finished before the next message is sent: the engine kept its place.
"""

from __future__ import annotations

import asyncio
import shlex
import sqlite3
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from waypoint.engine import UnknownType

from ..console import Console, EventSummary, compact, default_db, open_store, print_events, read_line

__all__ = ["chat", "turn", "session_chat", "session_title", "guarded", "ChapterError"]

TITLE_LENGTH = 60


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


def chat(runner: Any, console: Console, loop: asyncio.Runner, checkpoint_id: str) -> None:
    """`you> ` turns on `checkpoint_id` until an empty line or the end of the input."""
    while True:
        text = read_line(console)
        if text is None:
            return
        if not text.strip():
            if not sys.stdin.isatty():
                console.line()  # a terminal echoed the Enter; piped input did not
            return
        loop.run(turn(runner, console, text, checkpoint_id))


async def turn(runner: Any, console: Console, text: str, checkpoint_id: str) -> EventSummary | None:
    """One message and its answer, printed as it comes; None if an unfinished turn could not be finished."""
    if not await _finish_last_turn(runner, console, checkpoint_id):
        return None
    return await print_events(runner.run(text, checkpoint_id=checkpoint_id), console)


async def _finish_last_turn(runner: Any, console: Console, checkpoint_id: str) -> bool:
    """Finish the previous turn if it stopped half-way; False if it cannot go on (shown on stderr).

    A new message on a run that did not complete is refused by the engine (`CheckpointExists`), and the
    run's place is worth keeping: finishing it re-runs only the step that was in flight.
    """
    snap = await runner.app.get_run(checkpoint_id)
    if snap is None or snap.meta.status == "completed":
        return True
    if snap.meta.status == "running" and (snap.meta.lease_expires or 0) > time.time():
        until = time.strftime("%H:%M:%S", time.localtime(snap.meta.lease_expires))
        console.note(f"[error] session '{checkpoint_id}' is held by another process until {until}, so this message "
                     "was not sent: send it again when that turn is over (or after then, if that process died)", "red")
        return False
    if snap.interrupts.contexts:
        console.note(f"[error] session '{checkpoint_id}' is paused, waiting for an approval: answer it with "
                     f"`waypoint runs resume {checkpoint_id} --approve ID` (or --reject ID)", "red")
        return False
    console.note(f"[resume] the last turn did not finish ({_why(snap.meta)}); finishing it first", "yellow")
    if (await print_events(runner.resume(checkpoint_id), console)).error is None:
        return True
    console.note("[error] the last turn failed again, so this message was not sent: fix the cause and send it "
                 "again (the turn is retried first), or start a new session", "red")
    return False


def _why(meta: Any) -> str:
    if meta.error == "cancelled":
        return "cancelled"
    if meta.status == "failed":
        return f"failed: {compact(meta.error or '', 120)}"
    return "its process stopped before the end"  # killed, and its lease has expired


# --- sessions (chapter 3 on) ------------------------------------------------------------------------------

def session_title(messages: Sequence[Any]) -> str:
    """The first user text, cut to 60 characters (`New Session` if there is none yet)."""
    first = next((m.content for m in messages if m.role == "user" and m.content), None)
    return " ".join(first.split())[:TITLE_LENGTH] if first else "New Session"


def session_chat(runner_for: Callable[[Any], Any], console: Console, *, chapter: int, session: str | None,
                 db: Path | None, banners: Sequence[str] = ()) -> int:
    """Open (or create) a session in the SQLite file, chat on it, then say how to come back to it.

    `runner_for(store)` builds the chapter's `Runner`; `banners` are printed after the session's
    (chapter 4's `Project root: ...`). Returns the exit code.
    """
    if session is not None and not session.strip():
        raise ChapterError("--session needs an ID (leave it out to start a new session)")
    store = open_store(db)
    runner = runner_for(store)
    with asyncio.Runner() as loop:
        try:
            try:
                session_id = loop.run(_open(runner, console, session))
            except sqlite3.Error as err:
                raise ChapterError(f"cannot use the database {db or default_db()} ({err}); pass --db with the "
                                   "path of a file you can write") from None
            for line in banners:
                console.line(line)
            console.line("Enter your message (empty line to exit):")
            code = 0
            try:
                chat(runner, console, loop, session_id)
            except KeyboardInterrupt:
                console.line()
                loop.run(_stop_the_rest())
                code = 130
            loop.run(_saved(runner, console, chapter, session_id, db))
            return code
        finally:
            loop.run(store.close())


async def _stop_the_rest() -> None:
    """Cancel the run Ctrl-C left behind, and wait while the engine saves it as cancelled.

    Ctrl-C cancels the turn; if it was reading an answer's stream at that moment, the run's own task is
    still going (nothing closed the run's events yet). The store must not close under it.
    """
    await asyncio.sleep(0)
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


async def _open(runner: Any, console: Console, session: str | None) -> str:
    session = session or str(uuid.uuid4())
    not_a_chat = ChapterError(f"checkpoint '{session}' holds a run that is not a chat session; pick another "
                              "--session, or leave it out to start a new one")
    try:
        snap = await runner.app.get_run(session)  # read even for a new ID: a database that cannot open says so now
    except UnknownType:  # its state holds types no chapter registers
        raise not_a_chat from None
    if snap is None:  # a new ID, or a name of the user's choosing: the first message creates the run
        console.line(f"Created new session: {session}")
        return session
    messages = getattr(snap.state, "messages", None)
    if not isinstance(messages, list):
        raise not_a_chat
    console.line(f"Resuming session: {session}")
    console.line(f"Session title: {session_title(messages)}")
    return session


async def _saved(runner: Any, console: Console, chapter: int, session_id: str, db: Path | None) -> None:
    if await runner.app.get_run(session_id) is None:
        console.line(f"Session {session_id} is empty: nothing was saved.")
        return
    again = f"waypoint chapter {chapter} --session {shlex.quote(session_id)}"
    if db is not None:
        again += f" --db {shlex.quote(str(db))}"
    console.line(f"Session saved: {session_id}")
    console.line(f"Resume with: {again}")
