"""Agents across processes: a tool's pause resumed by another process, and a crash between two sibling
tool calls — the finished call does not run again, the unfinished one runs again with the same key."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "procs" / "agent_proc.py"


def start(db, cid, mode, *extra, journal):
    return subprocess.Popen([sys.executable, str(SCRIPT), str(db), cid, mode, "--journal", str(journal), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run(db, cid, mode, *extra, journal):
    proc = start(db, cid, mode, *extra, journal=journal)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, [json.loads(line) for line in out.splitlines() if line.strip()], err


def journal_lines(journal: Path) -> list[list[str]]:
    return [line.split() for line in journal.read_text().splitlines()]


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_tool_pause_is_resumed_by_another_process(tmp_path):
    db, journal = tmp_path / "agent.db", tmp_path / "journal"
    code, out, err = run(db, "acct", "pause", journal=journal)
    assert code == 2, err
    (iid,) = out[-1]["interrupt"]
    code, out, err = run(db, "acct", "pause", "--resume", json.dumps({iid: "yes"}), journal=journal)
    assert code == 0, err
    said = [o["content"] for o in out if "role" in o]  # parallel calls: results come as they finish
    assert sorted(said[:2]) == ["100", "transferred 5"] and said[2:] == ["transferred 5; 100"]
    lines = journal_lines(journal)
    # the first process starts both parallel calls (in either order); the second runs only the approved one
    assert len(lines) == 3 and sorted(l[0] for l in lines[:2]) == ["balance", "transfer"] and lines[2][0] == "transfer"
    (first,) = [l for l in lines[:2] if l[0] == "transfer"]
    assert first[2] != lines[2][2] and first[3] == lines[2][3]  # another process, the same call key


def test_sigkill_between_sibling_tool_calls_reruns_only_the_unfinished_one(tmp_path):
    db, journal = tmp_path / "agent.db", tmp_path / "journal"
    proc = start(db, "job", "crash", "--slow-sleep", "60", journal=journal)

    def fast_recorded() -> bool:
        try:
            with sqlite3.connect(db, timeout=5) as conn:
                rows = conn.execute("SELECT call_id FROM waypoint_ledger WHERE checkpoint_id = 'job'").fetchall()
        except sqlite3.OperationalError:
            return False
        keys = {r[0].rsplit("|", 1)[-1] for r in rows}
        slept = journal.exists() and any(l[0] == "slow" for l in journal_lines(journal))  # its effect happened
        return {"result:0:call_1", "start:1:call_2"} <= keys and slept

    wait_until(fast_recorded)  # fast finished (its result is in the ledger); slow started, sleeping
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    code, out, err = run(db, "job", "crash", "--continue-run", "--takeover", journal=journal)
    assert code == 0, err
    first = journal_lines(journal)
    assert [l[0] for l in first] == ["fast", "slow", "slow"]  # fast: once; slow: again
    assert first[1][3] == first[2][3]  # the same idempotency key across the crash
    assert {"rerun": "slow", "key": first[1][3]} in out  # and the events say it was re-run
    assert out[-1] == {"role": "assistant", "content": "fast result; slow result"}


@pytest.mark.parametrize("lease", ["1", "600"], ids=["lease-ran-out", "owner-dead-lease-live"])
def test_a_turn_abandoned_after_a_crash_inside_a_call_tells_the_model_the_call_started(tmp_path, lease):
    """A process is SIGKILLed inside `slow` (started, its side effect perhaps done, no result recorded); another
    process abandons that turn with new input (`force_new_run=True`). The history the model then reads says the
    call started and its outcome is unknown, with its idempotency key — not that it did not run, which would have
    the model ask again and a person approve an operation that may already have happened — while the call that
    finished keeps its result. With a lease still live on the store, the turn is abandoned at once all the same:
    its owner is a process this host can see is gone."""
    import waypoint.engine.agents  # noqa: F401 - registers AgentState and Message, which the stored run holds
    from waypoint.engine import read_run
    from waypoint.stores import SQLiteStore

    db, journal = tmp_path / "agent.db", tmp_path / "journal"
    proc = start(db, "job", "crash", "--slow-sleep", "60", "--lease", lease, journal=journal)
    wait_until(lambda: journal.exists() and any(l[0] == "slow" for l in journal_lines(journal)))
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    (key,) = [l[3] for l in journal_lines(journal) if l[0] == "slow"]

    def lease_over() -> bool:  # on SQLite's clock, which every process on this host reads
        with sqlite3.connect(db, timeout=5) as conn:
            return conn.execute("SELECT lease_expires < (julianday('now') - 2440587.5) * 86400.0 FROM "
                                "waypoint_checkpoints WHERE checkpoint_id = 'job' ORDER BY version DESC LIMIT 1"
                                ).fetchone()[0] == 1

    if lease == "1":
        wait_until(lease_over)
    else:
        assert not lease_over()
    code, out, err = run(db, "job", "crash", "--abandon-with", "what happened?", journal=journal)
    assert code == 0, err

    async def messages():
        store = SQLiteStore(db)
        try:
            return (await read_run(store, "job")).state.messages
        finally:
            await store.close()

    import asyncio

    history = asyncio.run(messages())
    abandoned = {m.tool_call_id: m.content for m in history[:history.index(next(
        m for m in history if m.role == "user" and m.content == "what happened?"))] if m.role == "tool"}
    assert abandoned["call_1"] == "fast result"
    assert abandoned["call_2"].startswith("[abandoned] this call was started and its outcome is unknown "
                                          f"(idempotency key {key})"), abandoned["call_2"]
