"""Chapter 7 across processes on one SQLite file: the run pauses for approval and the process exits; a new
process approves (the tool runs once, with the stored arguments) or rejects with a reason (the tool
never runs, the model reads exactly why) — for an invokable and for a streamable tool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "procs" / "approval_proc.py"


def run(db, mode, *extra, journal):
    proc = subprocess.run([sys.executable, str(SCRIPT), str(db), "session-7", mode, "--journal", str(journal), *extra],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.strip()], proc.stderr


@pytest.mark.parametrize("mode,tool,result", [
    ("invokable", "execute", "ran echo hello"),
    ("streamable", "tail", "app.log: 1\napp.log: 2\n"),
])
def test_approve_in_another_process(tmp_path, mode, tool, result):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = run(db, mode, journal=journal)
    assert code == 2, err
    paused = out[-1]
    assert paused["prompt"].startswith(f"tool '{tool}' wants to run with arguments")
    assert not journal.exists()  # nothing ran before the approval
    code, out, err = run(db, mode, "--approve", paused["interrupt"], journal=journal)
    assert code == 0, err
    assert {"decision": "approved"} in out and {"tool": result} in out
    assert out[-1] == {"assistant": f"the tool said: {result}"}
    assert len(journal.read_text().splitlines()) == 1  # ran once, in the second process


def test_another_process_reads_what_the_run_waits_for_and_answers_it_without_being_given_the_id(tmp_path):
    """`Runner.pending(id)` in a process that only knows the checkpoint ID: the interrupt ID, tool, arguments and
    digest the paused call was shown with, read without resuming anything; then a third process approves what it
    finds there — nobody passes the interrupt ID by hand."""
    import hashlib

    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = run(db, "invokable", journal=journal)
    assert code == 2, err
    shown = out[-1]["interrupt"]
    versions = _versions(db)
    code, out, err = run(db, "invokable", "--show-pending", journal=journal)
    assert code == 0, err
    assert out == [[{"id": shown, "kind": "approval", "tool": "execute", "call_id": "call_1",
                     "arguments": '{"command": "echo hello"}',
                     "digest": hashlib.sha256(b'{"command": "echo hello"}').hexdigest()}]]
    assert _versions(db) == versions and not journal.exists()  # read, not resumed
    code, out, err = run(db, "invokable", "--approve-pending", journal=journal)
    assert code == 0, err
    assert {"decision": "approved"} in out and out[-1] == {"assistant": "the tool said: ran echo hello"}
    assert len(journal.read_text().splitlines()) == 1
    code, out, err = run(db, "invokable", "--show-pending", journal=journal)
    assert (code, out) == (0, [[]])  # completed: it waits for nothing


def _versions(db) -> int:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM waypoint_checkpoints").fetchone()[0]


@pytest.mark.parametrize("mode,tool", [("invokable", "execute"), ("streamable", "tail")])
def test_reject_with_a_reason_in_another_process(tmp_path, mode, tool):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = run(db, mode, journal=journal)
    assert code == 2, err
    code, out, err = run(db, mode, "--reject", out[-1]["interrupt"], "--reason", "not on a Friday", journal=journal)
    assert code == 0, err
    assert {"tool": f"tool '{tool}' disapproved: not on a Friday"} in out
    assert out[-1] == {"assistant": f"the tool said: tool '{tool}' disapproved: not on a Friday"}
    assert not journal.exists()  # never ran
