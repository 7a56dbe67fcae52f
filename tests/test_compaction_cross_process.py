"""Compaction across processes: the summary call is a step of its own. A process SIGKILLed after that step (inside
the model call that follows it) leaves the summary stored; the process that continues the run sends it and never
asks for it again — and the stored run, read by `waypoint runs`, still holds every original message."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

PROCS = Path(__file__).parent / "procs"
SCRIPT = PROCS / "compaction_proc.py"
WAYPOINT = Path(sys.executable).parent / "waypoint"


def start(db: Path, journal: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(SCRIPT), str(db), "chat", "--journal", str(journal), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(journal: Path) -> list[list[str]]:
    return [line.split() for line in journal.read_text().splitlines()] if journal.exists() else []


def wait_until(condition, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_sigkill_after_the_summary_step_never_asks_for_the_summary_again(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    first = start(db, journal, "--block-after-summary")
    try:
        # the model was called with the summary: the summary's step was stored before that call began
        wait_until(lambda: any(l[0] == "model" and l[3] != "-" for l in lines(journal)) or first.poll() is not None)
        assert first.poll() is None, first.communicate()[1]
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    second = start(db, journal, "--continue-run")
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert json.loads(out.splitlines()[-1]) == {"content": "done after 2 looks"}

    said = lines(journal)
    p1, p2 = str(first.pid), str(second.pid)
    summaries = [l for l in said if l[0] == "summary"]
    assert summaries == [["summary", p1, "3"]]  # once, by the first process, of the user's message and look 0
    looks = [l for l in said if l[0] == "look"]
    assert looks == [["look", "0", p1], ["look", "1", p1]]  # no tool ran again either
    models = [l for l in said if l[0] == "model"]
    assert [m[1] for m in models] == [p1, p1, p1, p2]
    # the second process sends what the first stored: system, the first process's summary, the latest call+result
    assert models[-1][2:] == ["system,user,assistant,tool", f"SUMMARY-BY-{p1}"]
    assert models[-2][2:] == models[-1][2:]

    code, shown, err = _runs("show", "chat", "--json", db=db)
    assert code == 0, err
    run = json.loads(shown)
    assert [m["role"] for m in run["messages"]] == ["system", "user", "assistant", "tool", "assistant", "tool",
                                                     "assistant"]  # every original kept
    assert run["compaction"]["covers"] == 4 and run["compaction"]["summary"] == f"SUMMARY-BY-{p1}"
    code, history, err = _runs("history", "chat", "--json", db=db)
    assert code == 0, err
    versions = [v["version"] for v in json.loads(history)]
    for version in versions:  # each version the history lists shows the conversation as it then was, whole
        code, shown, err = _runs("show", "chat", "--version", str(version), "--json", db=db)
        assert code == 0, err
        roles = [m["role"] for m in json.loads(shown)["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"][:len(roles)]


def _runs(*args: str, db: Path) -> tuple[int, str, str]:
    proc = subprocess.run([str(WAYPOINT), "runs", *args, "--db", str(db)], capture_output=True, text=True,
                          timeout=60, cwd=db.parent, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1",
                                                          "PYTHONPATH": str(PROCS)})
    return proc.returncode, proc.stdout, proc.stderr
