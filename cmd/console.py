"""What every command and chapter shares: colour (on a TTY only), the embedded database, the model
(with its banner), the chat prompt, and printing an agent's events as they come (tokens live).

The strings follow Eino's chatwitheino quickstart: `[assistant] `, `you> `, `[tool call] name(args)`,
`[tool result] <compact, 200 characters at most>`, `[retry] ...` on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from waypoint.engine.errors import WaypointError

__all__ = ["Console", "default_db", "chapter_parser", "chapter_model", "print_events", "EventSummary",
           "read_line", "open_store", "compact", "visible", "hides"]

_STYLES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "blue": "34", "cyan": "36"}


class Console:
    """Text out, coloured only when the stream is a terminal and NO_COLOR is not set."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, *, color: bool | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.color = color if color is not None else (self.out.isatty() and "NO_COLOR" not in os.environ)

    def style(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        codes = ";".join(_STYLES[s] for s in styles)
        return f"\033[{codes}m{text}\033[0m"

    def line(self, text: str = "", *styles: str) -> None:
        print(_printable(self.style(text, *styles)), file=self.out, flush=True)

    def write(self, text: str, *styles: str) -> None:
        self.out.write(_printable(self.style(text, *styles)))
        self.out.flush()

    def note(self, text: str, *styles: str) -> None:
        """A line on stderr (banners, retries): it never mixes into output a script reads."""
        print(_printable(self.style(text, *styles)), file=self.err, flush=True)


def _printable(text: str) -> str:
    """What a stream can always encode: an unpaired surrogate (model text) as `\\udXXX`, never a crash. Text
    from a run is made `visible()` where it is printed; this is the backstop."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def default_db() -> Path:
    """The embedded database: `$WAYPOINT_DB`, else `./.waypoint/waypoint.db`."""
    return Path(os.environ.get("WAYPOINT_DB") or Path(".waypoint") / "waypoint.db")


def open_store(db: Path | None = None) -> Any:
    from waypoint.stores import SQLiteStore

    path = Path(db) if db is not None else default_db()
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteStore(path)


def chapter_parser(number: int, description: str, *, session: bool = False, db: bool = True,
                   instruction: str = "You are a helpful assistant.") -> argparse.ArgumentParser:
    """The options every chapter takes: `--instruction`; `--db` for chapters that store runs; from
    chapter 3 on, `--session`."""
    p = argparse.ArgumentParser(prog=f"waypoint chapter {number}", description=description)
    p.add_argument("--instruction", default=instruction, help="the system instruction (default: %(default)r)")
    if db:
        p.add_argument("--db", type=Path, default=None,
                       help="SQLite file (default: $WAYPOINT_DB or .waypoint/waypoint.db)")
    if session:
        p.add_argument("--session", default=None, help="resume this session (default: a new one)")
    return p


def chapter_model(console: Console) -> Any:
    """`model_from_env()`, announcing on stderr which model answers (the offline one says so)."""
    from waypoint.engine.models import OfflineModel, model_from_env

    model = model_from_env()
    if isinstance(model, OfflineModel):
        console.note(model.banner, "dim")
    else:
        console.note(f"model: {model.name}", "dim")
    return model


def read_line(console: Console, prompt: str = "you> ") -> str | None:
    """One line typed by the user; None at EOF (Ctrl-D, or the end of piped input)."""
    console.write(prompt, "bold")
    line = sys.stdin.readline()
    if not line:
        console.line()
        return None
    return line.rstrip("\n")


_HIDDEN = re.compile(
    "[\x00-\x1f\x7f-\x9f\xad\u034f\u061c\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u17b4\u17b5"
    "\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb"
    "\ud800-\udfff\ue000-\uf8ff\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff\U000f0000-\U0010ffff]")
"""What a terminal would not show as it is, or would obey: controls (escape sequences included), format
characters (bidi overrides and isolates, zero-width ones), line separators, private use, lone surrogates
and the other default-ignorable code points."""


def visible(text: str, *, strict: bool = False) -> str:
    """`text` with every hidden character written as its code (`\\u202e`), so a terminal shows it instead
    of obeying it; newlines and tabs stay unless `strict` (identifiers: run IDs, tool names)."""
    def code(m: re.Match[str]) -> str:
        ch = m.group()
        if not strict and ch in "\n\t":
            return ch
        return f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}"

    return _HIDDEN.sub(code, text)


def hides(text: str) -> bool:
    """Whether `text` holds a hidden character other than a newline or a tab."""
    return any(m.group() not in "\n\t" for m in _HIDDEN.finditer(text))


def compact(text: str, limit: int = 200) -> str:
    """A tool result on one line: JSON compacted when it is JSON, at most `limit` characters."""
    try:
        text = json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
    except (ValueError, TypeError):
        text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass
class EventSummary:
    """What a run's events came to: the last answer, a pause, an error, what was re-run."""

    answer: str = ""
    interrupted: Any = None
    error: BaseException | None = None
    reruns: list[Any] = field(default_factory=list)
    decisions: list[Any] = field(default_factory=list)


async def print_events(events: Any, console: Console, *, tools: bool = True) -> EventSummary:
    """Print an agent run's events as they arrive: assistant tokens live, tool calls and results, retries."""
    summary = EventSummary()
    try:
        async for event in events:
            if event.error is not None:
                summary.error = event.error
                console.note(f"[error] {type(event.error).__name__}: {visible(str(event.error))}", "red")
            elif event.output is not None:
                await _print_output(event.output, console, summary, tools, _inside(event))
            elif event.action is not None:
                _print_action(event.action, console, summary)
    except WaypointError as err:  # raised by the iterator: the run (or resume) did not start
        summary.error = err
        console.note(f"[error] {type(err).__name__}: {visible(str(err))}", "red")
    return summary


def _inside(event: Any) -> str:
    """` · researcher` for what an agent inside the one the chapter runs said or did (chapter 10); else ''."""
    path = tuple(getattr(event, "run_path", ()) or ())
    return " · " + " › ".join(path[1:]) if len(path) > 1 else ""


async def _print_output(output: Any, console: Console, summary: EventSummary, tools: bool, inside: str = "") -> None:
    if output.role == "assistant":
        if output.stream is not None:
            started = False
            async for chunk in output.stream:
                if chunk.content:
                    if not started:
                        console.write(f"[assistant{inside}] ", "cyan")
                        started = True
                    console.write(visible(chunk.content))  # a model's text is shown, never obeyed
            if started:
                console.line()
        message = await output.get_message()
        if output.stream is None and message.content:
            console.line(console.style(f"[assistant{inside}] ", "cyan") + visible(message.content))
        if message.content and not inside:
            summary.answer = message.content
        if tools:
            for call in message.tool_calls:
                console.line(f"[tool call{inside}] {visible(call.name, strict=True)}({visible(call.arguments)})",
                             "yellow")
    elif output.role == "tool":
        message = await output.get_message()
        if tools:
            console.line(f"[tool result{inside}] {visible(compact(message.content), strict=True)}", "dim")


def _print_action(action: Any, console: Console, summary: EventSummary) -> None:
    if action.interrupted is not None:
        summary.interrupted = action.interrupted
    if action.retry is not None:
        console.note(f"\n[retry] {action.retry.what} call failed, retrying: {visible(action.retry.error)}", "yellow")
    if action.rerun is not None:
        summary.reruns.append(action.rerun)
        console.line(f"[rerun] {visible(action.rerun.name, strict=True)} had started and not finished (a crash, or a failed turn): "
                     f"it runs again with the same idempotency key {action.rerun.idempotency_key[:12]}…", "yellow")
    if action.decision is not None:
        summary.decisions.append(action.decision)
