"""Claims about processes, tested with processes: a real SQLite file, real SIGKILL, real races."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "procs" / "crash_graphs.py"


def start(db, cid, mode, *extra, journal=None):
    cmd = [sys.executable, str(SCRIPT), str(db), cid, mode, *extra]
    if journal:
        cmd += ["--journal", str(journal)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.strip(), err.strip()


def run(db, cid, mode, *extra, journal=None):
    return finish(start(db, cid, mode, *extra, journal=journal))


def wait_for_line(journal: Path, line: str, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if journal.exists() and any(l.startswith(line + " ") for l in journal.read_text().splitlines()):
            return
        time.sleep(0.01)
    raise AssertionError(f"{line!r} never appeared in the journal: {journal.read_text() if journal.exists() else ''}")


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def newest_version(db: Path, checkpoint_id: str) -> int:
    import sqlite3

    try:
        with sqlite3.connect(db, timeout=5) as conn:
            row = conn.execute("SELECT MAX(version) FROM waypoint_checkpoints WHERE checkpoint_id = ?",
                               (checkpoint_id,)).fetchone()
    except sqlite3.OperationalError:  # the file or its schema is not there yet
        return 0
    return row[0] or 0


def starts(journal: Path) -> Counter:
    """How many times each node started (every journal line but '<node> done <pid>')."""
    return Counter(l.split()[0] for l in journal.read_text().splitlines() if l.split()[1] != "done")


def test_interrupt_in_one_process_resume_in_another(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = run(db, "ticket-1", "approval", journal=journal)
    assert code == 2, err
    (iid,) = json.loads(out)["interrupt"]
    code, out, err = run(db, "ticket-1", "approval", "--resume", json.dumps({iid: "yes"}), journal=journal)
    assert code == 0, err
    assert json.loads(out) == ["prepare", "approved=yes", "act"]
    assert starts(journal) == Counter({"prepare": 1, "approve": 1, "act": 1})


@pytest.mark.parametrize("trigger", ["any", "all"])
def test_sigkill_mid_run_then_resume_reruns_only_the_inflight_step(tmp_path, trigger):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    proc = start(db, "job-7", "linear", "--trigger", trigger, "--sleep-at", "n2", journal=journal)
    wait_for_line(journal, "n2")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    # The dead process still holds a live lease: a resumer must not take over silently...
    code, _, err = run(db, "job-7", "linear", "--trigger", trigger, "--continue-run", journal=journal)
    assert code == 3 and "lease held by" in err and "takeover=True" in err
    # ...but may, when it knows the owner is dead.
    code, out, err = run(db, "job-7", "linear", "--trigger", trigger, "--continue-run", "--takeover",
                         journal=journal)
    assert code == 0, err
    assert json.loads(out) == ["n0", "n1", "n2", "n3", "n4"]
    assert starts(journal) == Counter({"n0": 1, "n1": 1, "n2": 2, "n3": 1, "n4": 1})


def test_expired_lease_lets_a_new_process_take_over(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    proc = start(db, "job-8", "linear", "--lease", "1.0", "--sleep-at", "n1", journal=journal)
    wait_for_line(journal, "n1")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    time.sleep(1.2)  # the lease (1 s) has run out: no takeover flag needed
    code, out, err = run(db, "job-8", "linear", "--lease", "1.0", "--continue-run", journal=journal)
    assert code == 0, err
    assert starts(journal) == Counter({"n0": 1, "n1": 2, "n2": 1, "n3": 1, "n4": 1})


def test_dag_task_finished_before_the_crash_is_not_rerun(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    proc = start(db, "fan", "fanout", "--trigger", "all", "--sleep-at", "slow", journal=journal)
    wait_for_line(journal, "fast done")
    wait_until(lambda: newest_version(db, "fan") >= 2)  # the claim, then the commit after 'fast'
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    code, out, err = run(db, "fan", "fanout", "--trigger", "all", "--continue-run", "--takeover",
                         journal=journal)
    assert code == 0, err
    assert json.loads(out) == {"join": True}
    assert starts(journal) == Counter({"fast": 1, "slow": 2, "join": 1})


def test_two_processes_resume_the_same_paused_run_exactly_one_proceeds(tmp_path):
    db, journal, barrier = tmp_path / "runs.db", tmp_path / "journal", tmp_path / "go"
    code, out, err = run(db, "race", "approval", journal=journal)
    assert code == 2, err
    (iid,) = json.loads(out)["interrupt"]
    rivals = [start(db, "race", "approval", "--resume", json.dumps({iid: f"p{i}"}), "--barrier", str(barrier),
                    journal=journal) for i in range(2)]
    wait_until(lambda: len(list(tmp_path.glob("go.ready.*"))) == 2)  # both up and spinning on the barrier
    barrier.touch()
    results = [finish(p) for p in rivals]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 3], results
    loser_err = next(err for code, _, err in results if code == 3)
    assert "another writer" in loser_err or "lease held by" in loser_err
    counts = starts(journal)
    assert counts["approve"] == 1 and counts["act"] == 1  # the loser ran no node


def test_two_processes_compare_and_set_on_one_file(tmp_path):
    """The store alone: N processes race to write version 2 of the same run; exactly one wins."""
    db, barrier = tmp_path / "cas.db", tmp_path / "go"
    code = f"""
import asyncio, os, sys, time
from waypoint.engine.errors import CheckpointConflict
from waypoint.engine.keep.store import CheckpointMeta
from waypoint.stores import SQLiteStore
async def main():
    store = SQLiteStore({str(db)!r})
    meta = lambda v: CheckpointMeta(checkpoint_id="r", version=v, status="running", step=v, fingerprint="f",
                                    created_at=1.0, updated_at=2.0)
    if sys.argv[1] == "init":
        await store.put(meta(1), b"h", {{}}, [], expected_version=None)
        return 0
    await store.list()  # connected before the race
    open({str(barrier)!r} + ".ready." + sys.argv[1], "w").close()
    while not os.path.exists({str(barrier)!r}):
        time.sleep(0.001)
    try:
        await store.put(meta(2), sys.argv[1].encode(), {{}}, [], expected_version=1)
        return 0
    except CheckpointConflict:
        return 3
sys.exit(asyncio.run(main()))
"""
    assert subprocess.run([sys.executable, "-c", code, "init"]).returncode == 0
    procs = [subprocess.Popen([sys.executable, "-c", code, f"w{i}"]) for i in range(4)]
    wait_until(lambda: len(list(tmp_path.glob("go.ready.*"))) == 4)
    barrier.touch()
    codes = sorted(p.wait(30) for p in procs)
    assert codes == [0, 3, 3, 3]


def test_processes_writing_one_file_at_once_all_succeed(tmp_path):
    """Writers in several processes contend for the file lock; none fails with 'database is locked'."""
    db, barrier = tmp_path / "busy.db", tmp_path / "go"
    code = f"""
import asyncio, os, sys, time
from waypoint.engine.keep.store import Blob, CheckpointMeta
from waypoint.stores import SQLiteStore
async def main():
    store = SQLiteStore({str(db)!r})
    await store.list()  # open (and create) the database before the race
    open({str(barrier)!r} + ".ready." + sys.argv[1], "w").close()
    while not os.path.exists({str(barrier)!r}):
        time.sleep(0.001)
    cid = "run-" + sys.argv[1]
    for v in range(1, 151):
        meta = CheckpointMeta(checkpoint_id=cid, version=v, status="running", step=v, fingerprint="f",
                              created_at=1.0, updated_at=time.time())
        await store.put(meta, b"h", {{"run": f"{{cid}}-{{v}}"}}, [Blob(hash=f"{{cid}}-{{v}}", data=os.urandom(300))],
                        expected_version=v - 1 or None)
    await store.close()
asyncio.run(main())
"""
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)], stderr=subprocess.PIPE, text=True)
             for i in range(3)]
    wait_until(lambda: len(list(tmp_path.glob("go.ready.*"))) == 3)
    barrier.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    import sqlite3

    with sqlite3.connect(db) as conn:
        counts = dict(conn.execute("SELECT checkpoint_id, MAX(version) FROM waypoint_checkpoints GROUP BY 1"))
    assert counts == {"run-0": 150, "run-1": 150, "run-2": 150}


@pytest.mark.parametrize("trigger", ["any", "all"])
def test_partial_resume_of_parallel_interrupts_across_processes(tmp_path, trigger):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = run(db, "review", "parallel", "--trigger", trigger, journal=journal)
    assert code == 2, err
    paused = json.loads(out)
    ids = dict(zip(paused["names"], paused["interrupt"]))
    assert set(ids) == {"legal", "security"}
    code, out, err = run(db, "review", "parallel", "--trigger", trigger,
                         "--resume", json.dumps({ids["legal"]: "ok"}), journal=journal)
    assert code == 2, err
    assert json.loads(out)["interrupt"] == [ids["security"]]  # same ID, still pending
    code, out, err = run(db, "review", "parallel", "--trigger", trigger,
                         "--resume", json.dumps({ids["security"]: "fine"}), journal=journal)
    assert code == 0, err
    assert json.loads(out) == {"join": True}
    # each approval ran once to pause and once when it was answered; the unanswered one did not re-run
    assert starts(journal) == Counter({"legal": 2, "security": 2, "join": 1})


def test_a_sync_node_blocking_the_event_loop_keeps_its_lease(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    owner = start(db, "blk", "blocking", "--lease", "0.5", "--block", "4", journal=journal)
    wait_for_line(journal, "block")
    time.sleep(1.0)  # twice the lease, with the owner's event loop blocked the whole time
    code, _, err = run(db, "blk", "blocking", "--lease", "0.5", "--continue-run", journal=journal)
    assert code == 3 and "lease held by" in err, err  # still held: nobody takes the run over
    code, out, err = finish(owner)
    assert code == 0, err
    assert starts(journal) == Counter({"block": 1, "after": 1})


def test_a_process_that_lost_its_lease_stops_before_its_next_step(tmp_path):
    """durability="exit" writes nothing per step: only the lease tells the owner it lost the run. The owner
    is frozen (SIGSTOP, as a long GC pause or a VM freeze would) until its lease expires — a live owner
    on this host is never taken over — and another process continues the run meanwhile."""
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    opts = ("--durability", "exit", "--lease", "0.6")
    code, out, err = run(db, "ch", "chain", *opts, journal=journal)
    assert code == 2, err
    resume = json.dumps({json.loads(out)["interrupt"][0]: "go"})
    first = start(db, "ch", "chain", *opts, "--resume", resume, journal=journal)
    wait_for_line(journal, "c1")
    first.send_signal(signal.SIGSTOP)  # frozen past its lease: another process may take the run over
    try:
        wait_until(lambda: lease_expired(db, "ch"))
        # the first process's answer was stored with its claim: the takeover continues with it, and
        # sending it again is refused (an answer is given once)
        code, _, err = run(db, "ch", "chain", *opts, "--resume", resume, journal=journal)
        assert code == 4 and "already answered" in err, err
        code, out, err = run(db, "ch", "chain", *opts, "--continue-run", journal=journal)
    finally:
        first.send_signal(signal.SIGCONT)
    assert code == 0, err
    assert json.loads(out) == ["c1", "c2", "c3", "c4", "c5", "c6"]
    code, _, err = finish(first)
    assert code == 3 and ("lost its lease" in err or "starts nothing more" in err), err
    lines = [line.split() for line in journal.read_text().splitlines()]
    second_pid = lines[-1][-1]
    takeover_at = next(i for i, parts in enumerate(lines) if parts[-1] == second_pid)
    first_after = [p[0] for p in lines[takeover_at:] if p[-1] == str(first.pid)]
    assert len(first_after) <= 1, lines  # at most the step it was in when it noticed


def lease_expired(db: Path, checkpoint_id: str) -> bool:
    import sqlite3

    with sqlite3.connect(db, timeout=5) as conn:
        (expires,) = conn.execute("SELECT lease_expires FROM waypoint_checkpoints WHERE checkpoint_id = ? "
                                  "ORDER BY version DESC LIMIT 1", (checkpoint_id,)).fetchone()
    return expires is not None and expires < time.time()


@pytest.mark.parametrize("after", [3, 10, 20])
def test_sigkill_during_a_large_state_commit_leaves_a_readable_run(tmp_path, after):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    proc = start(db, "big", "bigstate", "--steps", "60", journal=journal)
    wait_until(lambda: journal.exists() and journal.read_text().count("grow") >= after)
    time.sleep(0.005 * after)  # somewhere inside the stream of 1 MiB commits that follows
    assert proc.poll() is None, "the run finished before the kill: nothing was tested"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    code, out, err = run(db, "big", "bigstate", "--steps", "60", "--continue-run", "--takeover", journal=journal)
    assert code == 0, err
    assert json.loads(out) == "intact"  # every item, before and after the kill, reads back as written


def test_sqlstore_shared_by_two_processes_lets_exactly_one_resumer_proceed(tmp_path):
    db, journal, barrier = tmp_path / "runs.db", tmp_path / "journal", tmp_path / "go"
    code, out, err = run(db, "race", "approval", "--sqlstore", journal=journal)
    assert code == 2, err
    (iid,) = json.loads(out)["interrupt"]
    rivals = [start(db, "race", "approval", "--sqlstore", "--resume", json.dumps({iid: f"p{i}"}),
                    "--barrier", str(barrier), journal=journal) for i in range(2)]
    wait_until(lambda: len(list(tmp_path.glob("go.ready.*"))) == 2)
    barrier.touch()
    results = [finish(p) for p in rivals]
    assert sorted(code for code, _, _ in results) == [0, 3], results
    assert starts(journal)["act"] == 1
