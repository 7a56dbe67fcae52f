"""Recovery across a fleet, on a real PostgreSQL server: three `waypoint worker`s and a `waypoint serve` share
50 runs (half queued for the workers, half started over HTTP in the service); workers and the service are
SIGKILLed at random inside side effects and new ones started; nobody calls resume. Every run ends completed,
or paused where a person must answer; no side effect recorded in the ledger runs again, and one runs twice
only where a killed process was inside it (tests/procs/recovery_graphs.py, agent "fleet-r")."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from service_support import PROCS, ServeProcess, wait_until

pytest.importorskip("fastapi")

RUNS = 50
LEASE = "1.5"
KILLS = 5


def journal(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def in_flight(path: Path, pid: int) -> set[tuple[str, str]]:
    """(run, call) whose side effect `pid` started and has not finished."""
    open_calls: set[tuple[str, str]] = set()
    for w in journal(path):
        if w[0] == "effect" and w[-1] == str(pid):
            (open_calls.add if w[3] == "start" else open_calls.discard)((w[1], w[2]))
    return open_calls


class Fleet:
    def __init__(self, tmp: Path, url: str) -> None:
        self.tmp, self.url, self.log = tmp, url, tmp / "journal"
        self.env = {"RECOVERY_JOURNAL": str(self.log), "RECOVERY_LEASE": LEASE, "RECOVERY_EFFECT": "0.4",
                    "RECOVERY_GATE": str(tmp / "no-gate")}
        self.workers: list[subprocess.Popen] = []
        self.services: list[ServeProcess] = []
        self.killed: dict[int, set[tuple[str, str]]] = {}  # pid -> the ledger's recorded calls when it was killed
        self.inside: dict[int, set[tuple[str, str]]] = {}  # pid -> the effects it was inside when killed
        self.n = 0

    def worker(self) -> subprocess.Popen:
        self.n += 1
        env = {**os.environ, "PYTHONPATH": str(PROCS), **self.env}
        cmd = [sys.executable, "-m", "waypoint.cmd.main", "worker", "--db", self.url, "--graphs",
               "recovery_graphs:fleet", "--concurrency", "4", "--poll", "0.2", "--pool", "6", "--drain", "5"]
        err = open(self.tmp / f"worker{self.n}.err", "w")
        proc = subprocess.Popen(cmd, cwd=self.tmp, env=env, stdout=subprocess.DEVNULL, stderr=err)
        err.close()
        self.workers.append(proc)
        return proc

    def service(self) -> ServeProcess:
        s = ServeProcess(self.tmp, agents="recovery_graphs:fleet_runner", args=("--db", self.url), env=self.env)
        self.services.append(s)
        return s

    def kill(self, pid: int, pg, db: str) -> None:
        os.kill(pid, signal.SIGKILL)
        for p in [*self.workers, *(s.proc for s in self.services)]:
            if p.pid == pid:
                p.wait(10)
        self.killed[pid] = recorded_calls(pg, db)
        self.inside[pid] = in_flight(self.log, pid)

    def live(self) -> list[int]:
        return [p.pid for p in self.workers if p.poll() is None] + \
            [s.proc.pid for s in self.services if s.proc.poll() is None]

    def close(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        for s in self.services:
            if s.proc.poll() is None:
                s.proc.kill()
            s.stop()

    def logs(self) -> str:
        return "".join(p.read_text() for p in self.tmp.glob("worker*.err")) + \
            "".join("".join(s.output) for s in self.services)


@pytest.fixture
def fleet(tmp_path, pg_url):
    f = Fleet(tmp_path, pg_url)
    yield f
    f.close()


def recorded_calls(pg, db: str) -> set[tuple[str, str]]:
    return {(cid, key.rsplit(":", 1)[1]) for cid, key in
            pg.sql("SELECT checkpoint_id, call_id FROM waypoint_ledger", db=db) if "|result:" in key}


def statuses(pg, db: str) -> dict[str, str]:
    return dict(pg.sql("SELECT c.checkpoint_id, c.status FROM waypoint_checkpoints c WHERE c.version = "
                       "(SELECT MAX(m.version) FROM waypoint_checkpoints m WHERE m.checkpoint_id = c.checkpoint_id)",
                       db=db))


def at_rest(pg, db: str) -> bool:
    """Every run exists and is completed or paused for a person."""
    s = statuses(pg, db)
    return len(s) == RUNS and set(s.values()) <= {"completed", "interrupted"}


async def submit(url: str, ids: list[str]) -> None:
    import waypoint.middleware  # noqa: F401 - the ApprovalInfo type the paused runs carry
    from waypoint.stores import RunQueue, SQLStore

    store = SQLStore(url)
    queue = RunQueue(store)
    for cid in ids:
        await queue.submit("fleet-r", f"work for {cid}", cid)
    await store.close()


@pytest.mark.soak
def test_three_workers_and_a_service_killed_at_random_every_run_ends_each_effect_once(pg, pg_url, fleet):
    from pg import database_of

    seed = int(os.environ.get("RECOVERY_SEED", random.randrange(1 << 30)))
    rnd, db = random.Random(seed), database_of(pg_url)
    ids = [f"{'ask' if i % 5 == 0 else 'run'}-{i:02d}" for i in range(RUNS)]
    queued, served = ids[::2], ids[1::2]
    for _ in range(3):
        fleet.worker()
    service = fleet.service()
    with service.client() as c:
        for cid in served:
            assert c.post("/runs", json={"agent": "fleet-r", "input": f"work for {cid}", "checkpoint_id": cid}
                          ).status_code == 201
    # The service first, inside a side effect of its runs; then processes chosen at random among those inside one.
    wait_until(lambda: in_flight(fleet.log, service.proc.pid), timeout=30, what="the service inside an effect")
    fleet.kill(service.proc.pid, pg, db)
    asyncio.run(submit(pg_url, queued))
    fleet.service()
    for _ in range(KILLS - 1):  # (on a loaded machine the runs may all come to rest first: then no more kills)
        inside = wait_until(lambda: [p for p in fleet.live() if in_flight(fleet.log, p)] or at_rest(pg, db),
                            timeout=90, what=f"a process inside an effect, or every run at rest (seed {seed})")
        if inside is True:
            break
        victim = rnd.choice(inside)
        is_service = any(s.proc.pid == victim for s in fleet.services)
        fleet.kill(victim, pg, db)
        fleet.service() if is_service else fleet.worker()
    # Nobody resumes anything: every run comes to rest by itself.
    started = time.monotonic()
    wait_until(lambda: at_rest(pg, db), timeout=120, what=f"every run at rest (seed {seed})")
    settled = time.monotonic() - started
    final = statuses(pg, db)
    assert {cid for cid, st in final.items() if st == "interrupted"} == {c for c in ids if c.startswith("ask")}
    assert all(final[c] == "completed" for c in ids if c.startswith("run"))

    lines = journal(fleet.log)
    starts: dict[tuple[str, str], list[str]] = defaultdict(list)
    for w in lines:
        if w[0] == "effect" and w[3] == "start":
            starts[w[1], w[2]].append(w[-1])
    expected = {(c, f"call-{t}") for c in ids if c.startswith("run") for t in range(3)}
    assert set(starts) == expected  # the paused runs' effects never ran: a person must answer first
    killed = {str(p): rec for p, rec in fleet.killed.items()}
    again = {call: pids for call, pids in starts.items() if len(pids) > 1}
    for call, pids in again.items():  # ran again only after a process was killed inside it, before its record
        for pid in pids[:-1]:
            assert pid in killed and call not in killed[pid], (seed, call, pids)
    assert all(len(set(p)) == len(p) for p in again.values())  # never twice in one process
    for pid, inside in fleet.inside.items():  # what a killed process was inside ran again, elsewhere
        assert inside and all(call in again and str(pid) in again[call][:-1] for call in inside), (seed, pid, inside)
    done = defaultdict(int)
    for w in lines:
        if w[0] == "effect" and w[3] == "done":
            done[w[1], w[2]] += 1
    assert all(done[call] >= 1 for call in expected)
    models: dict[tuple[str, str], list[str]] = defaultdict(list)
    for w in lines:
        if w[0] == "model":
            models[w[1], w[2]].append(w[-1])
    for key, pids in models.items():  # a model step ran again only where a killed process was inside it
        assert all(pid in killed for pid in pids[:-1]), (seed, key, pids)
    logs = fleet.logs()
    assert "recovery: continuing run" in logs, logs[-3000:]
    assert settled < 90
