"""Workers under what real fleets meet, with real worker processes on a real Postgres server: a process frozen
past its lease (SIGSTOP), clocks that disagree, a dead worker's runs taken over, a database that is down or
restarts. Each test fails on a fleet that lacks the rule it is named for (docs/scale-out.md states them)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from test_cross_process import wait_until

PROCS = Path(__file__).parent / "procs"


@pytest.fixture
def fleet():
    """Worker processes started by a test (append them); whatever is still running at the end is killed."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.communicate(timeout=10)


def worker(url: str, graphs: str, journal: Path, cwd: Path, *, lease: float, skew: float = 0.0,
           claim: float | None = None, poll: float = 0.2, concurrency: int = 4, recover: bool = True,
           pool: int = 4, log: Path | None = None, **env: str) -> subprocess.Popen:
    """`waypoint worker --graphs lease_graphs:<graphs>` in a process (tests/procs/worker_proc.py); its log goes to
    the file `log` when given (read while it runs), else to a pipe."""
    environ = {**os.environ, "PYTHONPATH": str(PROCS), "FLEET_JOURNAL": str(journal), "FLEET_LEASE": str(lease),
               "WAYPOINT_TEST_SKEW": str(skew), **env}
    if claim is not None:
        environ["WAYPOINT_TEST_CLAIM_SECONDS"] = str(claim)
    cmd = [sys.executable, str(PROCS / "worker_proc.py"), "--db", url, "--graphs", f"lease_graphs:{graphs}",
           "--concurrency", str(concurrency), "--poll", str(poll), "--pool", str(pool), "--drain", "10",
           *([] if recover else ["--no-recover"])]
    stderr = open(log, "w") if log is not None else subprocess.PIPE  # noqa: SIM115 - the child holds it
    return subprocess.Popen(cmd, cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=stderr, text=True)


def lines(journal: Path) -> list[list[str]]:
    return [line.split() for line in journal.read_text().splitlines()] if journal.exists() else []


def queue_call(url: str, fn):
    """Run `fn(queue)` (a coroutine function) on a fresh store and loop."""
    import waypoint.engine.models  # noqa: F401 - registers Message, which the agents' outputs are
    from waypoint.stores import RunQueue, SQLStore

    async def main():
        store = SQLStore(url)
        try:
            return await fn(RunQueue(store))
        finally:
            await store.close()

    return asyncio.run(main())


def submit(url: str, graph: str, ids: list[str], input: object = "go") -> None:
    async def go(queue):
        for cid in ids:
            await queue.submit(graph, input, cid)

    queue_call(url, go)


def wait_all(url: str, ids: list[str], timeout: float = 60) -> list:
    async def go(queue):
        return [await queue.wait(cid, timeout=timeout) for cid in ids]

    return queue_call(url, go)


def stop(proc: subprocess.Popen, log: Path | None = None) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
        err = log.read_text() if log is not None else err
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # its tasks' stacks, to say where it hangs
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"worker {proc.pid} did not stop within 30 s of SIGTERM:\n{err[-4000:]}") from None
    assert proc.returncode == 0, err
    return err


# --- 1. a frozen process starts no tool call --------------------------------------------------------------

@pytest.mark.parametrize("wake", ["while-b-reruns-call-1", "after-b-completed"])
def test_a_worker_frozen_past_its_lease_starts_no_tool_call_once_it_wakes(pg, pg_url, tmp_path, fleet, wake):
    """Worker A is frozen (SIGSTOP) inside call 1 of two sequential calls, past its lease. Worker B takes the run
    over, runs call 1 again (flagged rerun) and call 2, and completes it. A wakes — while B is still inside call 1
    (nobody has recorded call 2 yet), or once B is done. Either way call 1 returns inside A and A starts nothing
    more: not call 2, not the next model step — and records nothing: the tool ledger holds B's result of call 1,
    the one the run went on with. (What stops A is its lease check before the call — its deadline
    passed, or its renewal was refused; the ledger's refusal of a second `start:` is the line behind it,
    tested in tests/test_lease.py.)"""
    journal = tmp_path / "journal"
    a = worker(pg_url, "sequential", journal, tmp_path, lease=1.5, EFFECT_SECONDS="2")
    fleet.append(a)
    submit(pg_url, "sequential", ["seq-1"])
    wait_until(lambda: ["effect", "seq-1", "call-1", "start", "first", str(a.pid)] in lines(journal), timeout=30)
    a.send_signal(signal.SIGSTOP)
    b = worker(pg_url, "sequential", journal, tmp_path, lease=1.5, EFFECT_SECONDS="2")
    fleet.append(b)
    if wake == "while-b-reruns-call-1":
        wait_until(lambda: ["effect", "seq-1", "call-1", "start", "rerun", str(b.pid)] in lines(journal), timeout=30)
        a.send_signal(signal.SIGCONT)
    (done,) = wait_all(pg_url, ["seq-1"])
    assert done.outcome == "completed", done
    assert done.output.content == f"done: effect 1 done by {b.pid}, effect 2 done by {b.pid}", done
    a.send_signal(signal.SIGCONT)
    stop(a)  # A drains: its run task ends (or would start call 2 first) before it exits
    stop(b)
    starts = [(w[2], w[4], w[-1]) for w in lines(journal) if w[0] == "effect" and w[3] == "start"]
    assert starts == [("call-1", "first", str(a.pid)), ("call-1", "rerun", str(b.pid)),
                      ("call-2", "first", str(b.pid))], starts
    models = [w[-1] for w in lines(journal) if w[0] == "model"]
    assert models.count(str(a.pid)) == 1  # A's first model step; none after it woke
    recorded = pg.sql("SELECT call_id, encode(result, 'escape') FROM waypoint_ledger WHERE checkpoint_id = 'seq-1' "
                      "AND call_id LIKE '%|result:%'", db=pg_url.split("@/", 1)[1].split("?")[0])
    call_1 = [text for key, text in recorded if key.endswith(":call-1")]
    assert len(call_1) == 1 and f"effect 1 done by {b.pid}" in call_1[0], recorded


# --- 2. leases on one clock ---------------------------------------------------------------------------------

@pytest.mark.parametrize("victim_skew, thief_skew", [(0.0, 10.0), (-10.0, 0.0)], ids=["thief-ahead", "victim-behind"])
def test_a_worker_with_a_skewed_clock_never_takes_a_live_run(pg_url, tmp_path, fleet, victim_skew, thief_skew):
    """Two workers whose wall clocks are 10 s apart, 3 s leases: the healthy owner keeps all four of its runs and
    no node runs twice, whichever clock is off (the store's clock judges every lease and claim)."""
    journal = tmp_path / "journal"
    ids = [f"skew-{i}" for i in range(4)]
    victim = worker(pg_url, "slow", journal, tmp_path, lease=3.0, skew=victim_skew, WORK_SECONDS="7")
    fleet.append(victim)
    submit(pg_url, "slow", ids)
    wait_until(lambda: sum(1 for w in lines(journal) if w[0] == "work" and w[2] == "start") == 4, timeout=30)
    thief = worker(pg_url, "slow", journal, tmp_path, lease=3.0, skew=thief_skew, WORK_SECONDS="7")
    fleet.append(thief)
    done = wait_all(pg_url, ids)
    stop(thief)
    stop(victim)
    assert [d.outcome for d in done] == ["completed"] * 4
    starts = Counter((w[1], w[-1]) for w in lines(journal) if w[0] == "work" and w[2] == "start")
    assert starts == Counter({(cid, str(victim.pid)): 1 for cid in ids}), starts
    assert all(d.attempts == 1 and d.worker.split(":")[2] == str(victim.pid) for d in done)


# --- fencing: a deleted run, a skewed editor --------------------------------------------------------------

def test_a_run_deleted_while_a_worker_is_inside_its_call_has_none_of_its_calls_skipped_when_started_again(
        pg, pg_url, tmp_path, fleet):
    """A worker is inside call 1 (4 s, 30 s lease, no renewal due) when the run is deleted (`force`). The call
    returns and its result is refused by the store — the worker's attempt ends there, writing nothing. A new run on
    the same ID (the model gives the same call IDs) then runs both calls: none of its results comes from the run
    that was deleted. (It used to skip call 1, reading the deleted run's result.)"""
    from pg import database_of

    journal, log = tmp_path / "journal", tmp_path / "worker.log"
    w = worker(pg_url, "sequential", journal, tmp_path, lease=30.0, log=log, EFFECT_SECONDS="4")
    fleet.append(w)
    submit(pg_url, "sequential", ["del-1"])
    wait_until(lambda: ["effect", "del-1", "call-1", "start", "first", str(w.pid)] in lines(journal), timeout=30)

    async def delete(queue):
        return await queue.store.delete("del-1")

    assert queue_call(pg_url, delete)
    # the old attempt ends: its result refused, it hands its (deleted) work back — or, without fencing, goes on
    wait_until(lambda: "handing run 'del-1' back" in log.read_text() or any(
        x[:3] == ["effect", "del-1", "call-2"] for x in lines(journal)), timeout=30)
    submit(pg_url, "sequential", ["del-1"])
    (done,) = wait_all(pg_url, ["del-1"])
    err = stop(w, log)
    assert done.outcome == "completed", (done, err[-3000:])
    starts = Counter(x[2] for x in lines(journal) if x[:2] == ["effect", "del-1"] and x[3] == "start")
    assert starts == Counter({"call-1": 2, "call-2": 1}), starts  # the deleted run's call 1, then both anew
    assert "no longer holds the run" in err
    ledger = pg.sql("SELECT COUNT(*) FROM waypoint_ledger WHERE checkpoint_id = 'del-1' AND call_id LIKE "
                    "'%|result:%'", db=database_of(pg_url))
    assert ledger == [(2,)]  # the new run's two results, nothing of the deleted run's


def test_an_editor_whose_clock_runs_ahead_cannot_edit_a_run_a_worker_is_running(pg_url, tmp_path, fleet):
    """A worker runs a run under a 30 s lease; `update_state` from a process whose wall clock is 120 s ahead sees
    the lease long expired — the store, judging on its own clock in the edit's transaction, refuses the edit. The
    node runs once, in the worker, and the run completes with no edit in its history. (It used to be edited, and
    the node ran twice in two processes.)"""
    journal, release = tmp_path / "journal", tmp_path / "release"
    w = worker(pg_url, "stateful", journal, tmp_path, lease=30.0, WORK_UNTIL=str(release))
    fleet.append(w)
    submit(pg_url, "stateful", ["edit-1"])
    wait_until(lambda: ["work", "edit-1", "start", str(w.pid)] in lines(journal), timeout=30)
    editor = f"""
import asyncio, time
_real = time.time
time.time = lambda: _real() + 120
from waypoint.engine import CheckpointConflict
from waypoint.stores import SQLStore
import lease_graphs
async def main():
    store = SQLStore({pg_url!r})
    try:
        await lease_graphs.stateful(store).update_state("edit-1", {{"note": "edited"}})
        print("edited")
    except CheckpointConflict as err:
        print("refused:", err)
    await store.close()
asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", editor], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(PROCS), "FLEET_LEASE": "30"})
    release.touch()  # the node was inside its step throughout the edit
    assert out.stdout.startswith("refused: run 'edit-1' is running"), (out.stdout, out.stderr)
    (done,) = wait_all(pg_url, ["edit-1"])
    stop(w)
    assert done.outcome == "completed"
    assert [x for x in lines(journal) if x[0] == "work" and x[2] == "start"] == [["work", "edit-1", "start",
                                                                                 str(w.pid)]]

    async def origins(queue):
        return [m.origin for m in await queue.store.history("edit-1")]

    assert not any(o and "update_state" in o for o in queue_call(pg_url, origins))


# --- 7. takeover after a worker dies ------------------------------------------------------------------------

def test_a_dead_workers_run_is_taken_over_one_run_lease_after_its_last_renewal(pg_url, tmp_path, fleet):
    """Once a run has written, its lease alone decides the takeover: with 2 s run leases and claims that last
    20 s unrenewed, another worker continues the run about 2 s after the SIGKILL — not when the claim lapses.
    (Recovery is off: on this host it would see the PID gone and not wait for the lease at all, as B11 shows;
    this is the rule for a worker that died on another host.)"""
    journal = tmp_path / "journal"
    victim = worker(pg_url, "slow", journal, tmp_path, lease=2.0, claim=20.0, recover=False, WORK_SECONDS="60")
    fleet.append(victim)
    submit(pg_url, "slow", ["dead-1"])
    wait_until(lambda: ["work", "dead-1", "start", str(victim.pid)] in lines(journal), timeout=30)
    log = tmp_path / "other.log"
    other = worker(pg_url, "slow", journal, tmp_path, lease=2.0, claim=20.0, recover=False, log=log, WORK_SECONDS="0.1")
    fleet.append(other)
    wait_until(lambda: "concurrency" in log.read_text(), timeout=60)  # the other one is up (its banner) and idle
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    victim.wait(10)
    wait_until(lambda: ["work", "dead-1", "start", str(other.pid)] in lines(journal), timeout=40)
    took = time.monotonic() - killed
    (done,) = wait_all(pg_url, ["dead-1"])
    stop(other)
    assert done.outcome == "completed" and done.attempts == 2
    assert took < 10, f"taken over {took:.1f} s after the kill: by the run's 2 s lease, not the claim's 20 s"


# --- 9/10. a database that is down, or restarts ---------------------------------------------------------------

def test_a_worker_started_while_the_database_is_down_waits_for_it(pg, pg_url, tmp_path, fleet):
    """The worker's --db points at a socket directory where no server listens yet: it keeps trying (it used to
    exit 1). Then the server appears there, work is submitted, and the worker does it."""
    from pg import database_of

    queue_call(pg_url, lambda queue: queue.status("none"))  # creates the schema
    later = tmp_path / "sock"
    later.mkdir()
    url = f"postgresql+asyncpg://postgres@/{database_of(pg_url)}?host={later}"
    log = tmp_path / "worker.log"
    proc = worker(url, "slow", tmp_path / "journal", tmp_path, lease=2.0, poll=0.5, log=log, WORK_SECONDS="0")
    fleet.append(proc)
    wait_until(lambda: "claiming work failed" in log.read_text() or proc.poll() is not None, timeout=60)
    assert proc.poll() is None, log.read_text()  # it tried, failed, and is still there
    for name in os.listdir(pg.socket_dir):  # the server comes up at the worker's address
        if name.startswith(".s.PGSQL."):
            os.symlink(Path(pg.socket_dir) / name, later / name)
    submit(pg_url, "slow", ["late-1"])
    (done,) = wait_all(pg_url, ["late-1"], timeout=30)
    stop(proc, log)
    assert done.outcome == "completed" and done.worker.split(":")[2] == str(proc.pid)


def test_the_worker_command_refuses_a_pool_of_one_in_one_line(pg_url, tmp_path):
    out = subprocess.run([sys.executable, "-m", "waypoint.cmd.main", "worker", "--db", pg_url, "--graphs",
                          "lease_graphs:slow", "--pool", "1"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=20, env={**os.environ, "PYTHONPATH": str(PROCS)})
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "--pool 2" in out.stderr and "LISTEN" in out.stderr


# --- 4. a fleet short of connections: a database error is not an outcome, a lease is never lost to it ----------

def limited_role(pg, pg_url: str, limit: int) -> str:
    """A role that may hold `limit` connections, owning the test's database: the URL to log in as it."""
    from pg import database_of

    db = database_of(pg_url)
    role = f"fleet_{db}"  # roles belong to the whole server, shared by the session's tests
    pg.sql(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {limit}")
    pg.sql(f"ALTER DATABASE {db} OWNER TO {role}")
    limited = pg_url.replace("postgres@", f"{role}@")
    queue_call(limited, lambda queue: queue.status("none"))  # the schema, owned by the workers' role
    return limited


@pytest.mark.soak
@pytest.mark.parametrize("recover", [True, False], ids=["recovering", "no-recover"])
def test_a_fleet_with_fewer_connections_than_it_wants_completes_every_run_and_runs_every_call_once(
        pg, pg_url, tmp_path, fleet, recover):
    """Three workers, `--pool 2 --concurrency 16`, 6 s leases, a role that may hold 4 connections — where one
    worker alone wants 3 (its pool's LISTEN and one for runs, plus the one it keeps for renewals) — and ten runs of
    three sequential 7 s calls each: every call longer than the lease (a lease renewed every 2 s: room for a
    loaded machine, where a process may not run for a few seconds — with 3 s leases a CI run under load once saw
    two calls run twice). Leases are renewed on the connection kept
    for them, so none is lost to the shortage: every run completes, each of its 30 calls ran exactly once, no run
    is stored failed, and every worker drains and exits 0. (It used to run one call up to 27 times.)"""
    limited = limited_role(pg, pg_url, 4)
    journal = tmp_path / "journal"
    env = {"EFFECT_SECONDS": "7"}
    workers = []
    for _ in range(3):
        workers.append(worker(limited, "three_calls", journal, tmp_path, lease=6.0, concurrency=16, pool=2,
                              recover=recover, **env))
    fleet.extend(workers)
    ids = [f"starved-{i}" for i in range(10)]
    submit(pg_url, "three_calls", ids)
    done = wait_all(pg_url, ids, timeout=120)
    errs = [stop(w) for w in workers]
    assert [d.outcome for d in done] == ["completed"] * 10, [(d.checkpoint_id, d.outcome, d.error) for d in done]
    starts = Counter((w[1], w[2]) for w in lines(journal) if w[0] == "effect" and w[3] == "start")
    twice = {key for key, n in starts.items() if n > 1}
    assert starts == Counter({(cid, f"call-{n}"): 1 for cid in ids for n in (1, 2, 3)}), (
        [w for w in lines(journal) if tuple(w[1:3]) in twice], [e[-6000:] for e in errs])
    from pg import database_of

    assert pg.sql("SELECT COUNT(*) FROM waypoint_checkpoints WHERE status = 'failed'", db=database_of(pg_url)) == [(0,)]
    assert not any("Traceback" in err or "never retrieved" in err for err in errs), [e[-3000:] for e in errs][:1]
    assert any("too many connections" in err for err in errs)  # the limit did bite
    assert not any("could not be renewed" in err or "lost its lease" in err for err in errs), errs
