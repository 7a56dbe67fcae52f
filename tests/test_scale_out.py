"""Scale-out on a real Postgres server, with real processes: worker processes sharing queued runs (one of
them SIGKILLed mid-run), migrations started at once by several processes, and the cross-process
guarantees of tests/test_cross_process.py repeated on Postgres."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from test_cross_process import finish, start, starts, wait_for_line, wait_until
from waypoint.stores._sql import SCHEMA_VERSION

PROCS = Path(__file__).parent / "procs"
RUNS = 200
LEASE = 1.5


@pytest.fixture
def fleet():
    """Worker processes started by a test (append them); whatever is still running at the end is killed."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=10)


def spawn_worker(url: str, journal: Path, cwd: Path, *, concurrency: int = 20) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(PROCS), "FLEET_JOURNAL": str(journal), "FLEET_LEASE": str(LEASE)}
    cmd = [sys.executable, "-m", "waypoint.cmd.main", "worker", "--db", url, "--graphs", "fleet:build",
           "--concurrency", str(concurrency), "--poll", "0.2", "--pool", "6", "--drain", "10"]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def lines(journal: Path) -> list[list[str]]:
    return [line.split() for line in journal.read_text().splitlines()] if journal.exists() else []


def in_flight(journal: Path, pid: int) -> set[str]:
    """Runs whose side effect `pid` started and has not finished."""
    open_calls: set[str] = set()
    for words in lines(journal):
        if words[0] == "effect" and words[-1] == str(pid):
            (open_calls.add if words[3] == "start" else open_calls.discard)(words[1])
    return open_calls


async def submit_all(url: str, ids: list[str]) -> list[dict]:
    import waypoint.middleware  # noqa: F401 - registers ApprovalInfo, which the paused runs' interrupts carry
    from waypoint.stores import RunQueue, SQLStore

    store = SQLStore(url)
    queue = RunQueue(store)
    for cid in ids:
        await queue.submit("fleet", f"pay {cid}", cid)
    paused = [await queue.wait(cid, timeout=60) for cid in ids]
    await store.close()
    return [p.interrupts if p.outcome == "interrupted" else {"unexpected": p.outcome, "error": p.error} for p in paused]


async def resume_all(url: str, answers: dict[str, dict]) -> None:
    from waypoint.middleware import ApprovalResult
    from waypoint.stores import RunQueue, SQLStore

    store = SQLStore(url)
    queue = RunQueue(store)
    for cid, interrupts in answers.items():
        await queue.resume(cid, {iid: ApprovalResult(approved=True) for iid in interrupts})
    await store.close()


async def wait_all(url: str, ids: list[str]) -> list:
    from waypoint.stores import RunQueue, SQLStore

    store = SQLStore(url)
    queue = RunQueue(store)
    done = [await queue.wait(cid, timeout=60) for cid in ids]
    await store.close()
    return done


@pytest.mark.soak
def test_three_workers_two_hundred_approvals_one_worker_sigkilled(pg, pg_url, tmp_path, fleet):
    """The acceptance case of docs/scale-out.md: every run completes; nothing committed runs again."""
    from pg import database_of

    db, journal = database_of(pg_url), tmp_path / "journal"
    workers = [spawn_worker(pg_url, journal, tmp_path) for _ in range(3)]
    fleet.extend(workers)
    victim = workers[0]
    ids = [f"run-{i:03d}" for i in range(RUNS)]
    started = time.monotonic()
    paused = asyncio.run(submit_all(pg_url, ids))
    assert all(len(p) == 1 and "unexpected" not in p for p in paused), [p for p in paused if len(p) != 1][:3]
    asyncio.run(resume_all(pg_url, dict(zip(ids, paused))))
    # Kill the victim inside a side effect, once it has done some work of this phase.
    wait_until(lambda: sum(1 for w in lines(journal) if w[0] == "effect" and w[3] == "done"
                           and w[-1] == str(victim.pid)) >= 5 and in_flight(journal, victim.pid), timeout=30)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    killed_inside = in_flight(journal, victim.pid)
    ledger_at_kill = {(cid, key.split("result:", 1)[1]) for cid, key in
                      pg.sql("SELECT checkpoint_id, call_id FROM waypoint_ledger", db=db) if "|result:" in key}
    held_by_victim = {cid for (cid,) in pg.sql(
        "SELECT checkpoint_id FROM waypoint_queue WHERE state = 'claimed' AND worker LIKE $1", f"%:{victim.pid}:%",
        db=db)}
    done = asyncio.run(wait_all(pg_url, ids))
    elapsed = time.monotonic() - started
    for w in workers[1:]:
        w.send_signal(signal.SIGTERM)
    for w in workers[1:]:
        out, err = w.communicate(timeout=30)
        assert w.returncode == 0, err
    assert [d.outcome for d in done] == ["completed"] * RUNS, [(d.checkpoint_id, d.outcome, d.error) for d in done
                                                               if d.outcome != "completed"][:5]
    by = {}  # run -> the pid whose execution of the side effect the run went on with (its recorded result)
    for d in done:
        assert re.fullmatch(r"done: moved 5 by \d+", d.output.content), d.output.content
        by[d.checkpoint_id] = d.output.content.rsplit(" ", 1)[1]
    assert killed_inside and killed_inside <= held_by_victim
    recovered = {d.checkpoint_id for d in done if d.attempts > 1}
    assert killed_inside <= recovered  # the runs it was inside were taken over by the others

    effects: dict[str, list[str]] = defaultdict(list)  # run -> pids that started its side effect
    models: Counter = Counter()  # (run, messages seen) -> model calls
    model_pids: dict[tuple, list[str]] = defaultdict(list)
    for words in lines(journal):
        if words[0] == "effect" and words[3] == "start":
            effects[words[1]].append(words[-1])
        elif words[0] == "model":
            models[words[1], words[2]] += 1
            model_pids[words[1], words[2]].append(words[-1])
    assert set(effects) == set(ids)
    # Which execution each run went on with, against the journal: a result whose execution has no journal line
    # means the journal lost one; the victim's result in a run it was killed inside would mean a path recorded a
    # call as done without its result (the effect never returned there).
    unjournaled = {cid: pid for cid, pid in by.items() if pid not in effects[cid]}
    assert not unjournaled, f"the journal lost the start of these executions (run: pid of the result): {unjournaled}"
    unfinished = {cid for cid in killed_inside if by[cid] == str(victim.pid)}
    assert not unfinished, f"runs went on with the result of a call the victim was killed inside: {unfinished}"
    recorded = {cid for cid, _call in ledger_at_kill}
    assert all(len(effects[cid]) == 1 for cid in recorded)  # recorded in the ledger: never run again
    # Run twice: only calls the victim started and had not recorded (in flight for the ledger: inside the
    # tool, or between its end and the ledger's commit), each once more, by another worker.
    twice = {cid for cid, pids in effects.items() if len(pids) > 1}
    assert killed_inside <= twice <= held_by_victim - recorded
    odd = {c: effects[c] for c in twice if not (len(effects[c]) == 2 and effects[c][0] == str(victim.pid) != effects[c][1])}
    assert not odd, f"side effects run twice other than once by the victim, then once by another (run: pids): {odd}"
    # A model step ran again only in a run the victim held, and only the one it was inside.
    again = {key for key, n in models.items() if n > 1}
    assert all(models[k] == 2 and k[0] in held_by_victim and model_pids[k][0] == str(victim.pid) for k in again)
    assert len({k[0] for k in again}) == len(again)  # at most one step per run
    assert elapsed < 90, f"the fleet took {elapsed:.0f} s"


def test_an_idle_fleet_drains_on_sigterm_and_exits_zero(pg_url, tmp_path, fleet):
    worker = spawn_worker(pg_url, tmp_path / "journal", tmp_path)
    fleet.append(worker)
    ready, _, _ = select.select([worker.stderr], [], [], 60)
    assert ready and "concurrency" in worker.stderr.readline()  # its banner: its signal handlers are in place
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=20)
    assert worker.returncode == 0 and "stopped after 0 work item(s)" in err, err


def test_processes_migrating_a_new_database_at_once_all_succeed(pg, pg_url, tmp_path):
    """Four processes open a fresh Postgres database at the same moment: the advisory lock lets them
    migrate one after the other (without it, racing CREATE TABLEs fail)."""
    from pg import database_of

    barrier = tmp_path / "go"
    code = f"""
import asyncio, os, sys, time
from waypoint.stores import SQLStore
async def main():
    store = SQLStore({pg_url!r})
    open({str(barrier)!r} + ".ready." + sys.argv[1], "w").close()
    while not os.path.exists({str(barrier)!r}):
        time.sleep(0.001)
    await store.list()
    await store.close()
asyncio.run(main())
"""
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)], stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    wait_until(lambda: len(list(tmp_path.glob("go.ready.*"))) == 4)
    barrier.touch()
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    assert pg.sql("SELECT version FROM waypoint_schema", db=database_of(pg_url)) == [(SCHEMA_VERSION,)]


def test_two_processes_resume_the_same_paused_run_on_postgres_exactly_one_proceeds(pg_url, tmp_path):
    journal, barrier = tmp_path / "journal", tmp_path / "go"
    code, out, err = finish(start(pg_url, "race", "approval", journal=journal))
    assert code == 2, err
    (iid,) = json.loads(out)["interrupt"]
    rivals = [start(pg_url, "race", "approval", "--resume", json.dumps({iid: f"p{i}"}), "--barrier", str(barrier),
                    journal=journal) for i in range(2)]
    wait_until(lambda: len(list(tmp_path.glob("go.ready.*"))) == 2)
    barrier.touch()
    results = [finish(p) for p in rivals]
    assert sorted(code for code, _, _ in results) == [0, 3], results
    counts = starts(journal)
    assert counts["approve"] == 1 and counts["act"] == 1  # the loser ran no node


def test_sigkill_mid_node_on_postgres_then_resume_reruns_only_that_node(pg, pg_url, tmp_path):
    journal = tmp_path / "journal"
    proc = start(pg_url, "job-7", "linear", "--sleep-at", "n2", "--lease", "8.0", journal=journal)
    wait_for_line(journal, "n2")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    code, _, err = finish(start(pg_url, "job-7", "linear", "--continue-run", "--lease", "8.0", journal=journal))
    assert code == 3 and "lease held by" in err  # the dead owner's lease (8 s: room for a loaded machine) is live
    wait_until(lambda: lease_expired(pg, pg_url, "job-7"), timeout=30)  # on the database's clock
    code, out, err = finish(start(pg_url, "job-7", "linear", "--continue-run", "--lease", "8.0", journal=journal))
    assert code == 0, err
    assert json.loads(out) == ["n0", "n1", "n2", "n3", "n4"]
    assert starts(journal) == Counter({"n0": 1, "n1": 1, "n2": 2, "n3": 1, "n4": 1})


def lease_expired(pg, url: str, checkpoint_id: str) -> bool:
    """Whether the run's newest lease has run out on the database's clock."""
    from pg import database_of

    return pg.sql("SELECT lease_expires < EXTRACT(EPOCH FROM clock_timestamp()) FROM waypoint_checkpoints WHERE "
                  "checkpoint_id = $1 ORDER BY version DESC LIMIT 1", checkpoint_id, db=database_of(url)) == [(True,)]


def test_the_worker_command_refuses_a_bad_graph_spec_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "waypoint.cmd.main", "worker", "--db", str(tmp_path / "q.db"),
                          "--graphs", "no_such_module:thing"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no_such_module" in out.stderr, out.stderr
