"""Automatic recovery with real processes on a real database: `waypoint serve` SIGKILLed inside a tool, a new
`waypoint serve` on the same SQLite file, and no resume call — the run completes by itself, nothing finished
runs again, a paused run stays paused, a live process's run is not taken; a run that kills every process
that continues it is given up (tests/procs/recovery_graphs.py journals what really ran)."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path

import httpx
import pytest

from service_support import ServeProcess, run_until, wait_until

AGENTS = "recovery_graphs:pair,recovery_graphs:asks,recovery_graphs:suicide"

pytest.importorskip("fastapi")


def journal(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def serve(tmp: Path, gate: Path, *args: str, **env: str) -> ServeProcess:
    return ServeProcess(tmp, agents=AGENTS, args=args,
                        env={"RECOVERY_JOURNAL": str(tmp / "journal"), "RECOVERY_GATE": str(gate), **env})


def ledger_results(db: Path, checkpoint_id: str) -> list[str]:
    with sqlite3.connect(db, timeout=10) as conn:
        return [k for (k,) in conn.execute("SELECT call_id FROM waypoint_ledger WHERE checkpoint_id = ?",
                                           (checkpoint_id,)) if "result:" in k]


def newest(db: Path, checkpoint_id: str) -> tuple:
    with sqlite3.connect(db, timeout=10) as conn:
        return conn.execute("SELECT status, lease_owner, error, version FROM waypoint_checkpoints WHERE "
                            "checkpoint_id = ? ORDER BY version DESC LIMIT 1", (checkpoint_id,)).fetchone()


def test_a_killed_service_s_run_completes_in_a_new_service_with_no_resume_call(tmp_path):
    db, log = tmp_path / "runs.db", tmp_path / "journal"
    keeper_gate, killed_gate = tmp_path / "keeper-gate", tmp_path / "killed-gate"
    # A live service executing a run of its own, held inside the slow tool: recovery must never take it.
    with serve(tmp_path, keeper_gate, "--no-recover") as keeper, keeper.client() as k:
        assert k.post("/runs", json={"agent": "pair", "input": "go", "checkpoint_id": "live"}).status_code == 201
        wait_until(lambda: ["tool", "live", "slow", "start", str(keeper.proc.pid)] in journal(log), what="live held")
        victim = serve(tmp_path, killed_gate)
        with victim.client() as v:
            assert v.post("/runs", json={"agent": "asks", "input": "deploy", "checkpoint_id": "paused"}).json()
            run_until(v, "paused", "interrupted")
            assert v.post("/runs", json={"agent": "pair", "input": "go", "checkpoint_id": "orphan"}).status_code == 201
            # Inside the slow tool, once the quick one's result is in the ledger: then SIGKILL.
            wait_until(lambda: ["tool", "orphan", "slow", "start", str(victim.proc.pid)] in journal(log)
                       and any(k.endswith(":call_q") for k in ledger_results(db, "orphan")), what="orphan held")
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        victim.stop()
        assert newest(db, "orphan")[0] == "running"
        killed_gate.touch()  # the slow tool may finish in the next process
        with serve(tmp_path, killed_gate) as rescuer, rescuer.client() as r:
            done = run_until(r, "orphan", "completed", timeout=30)  # nobody asked: recovery continued it
            assert "both done: quick done, slow done" in done["output"]["content"]
            out = "".join(rescuer.output)
            assert "recovery: continuing run 'orphan'" in out and "is gone from this host" in out
            # The same look saw the live run and the paused one: neither was touched.
            status, owner, _, _ = newest(db, "live")
            assert status == "running" and owner.split(":")[1] == str(keeper.proc.pid)
            assert newest(db, "paused")[0] == "interrupted"
            assert "'live'" not in out and "'paused'" not in out
        keeper_gate.touch()
        run_until(k, "live", "completed", timeout=30)  # its own process finished it

    lines = journal(log)
    ran = Counter(tuple(w[:-1]) for w in lines)
    # orphan: the model step that asked for the tools and the recorded quick call ran once; the slow call,
    # in flight at the kill, ran again (once) in the rescuer; the final model step once.
    models = [w[2] for w in lines if w[:2] == ["model", "orphan"]]
    assert len(models) == 2 and len(set(models)) == 2, lines
    assert ran["tool", "orphan", "quick", "start"] == 1
    slow_pids = [w[-1] for w in lines if w[:4] == ["tool", "orphan", "slow", "start"]]
    assert slow_pids == [str(victim.proc.pid), str(rescuer.proc.pid)]
    assert ran["tool", "orphan", "slow", "done"] == 1
    assert ran["node", "paused", "asks"] == 1  # never continued
    assert ran["tool", "live", "slow", "start"] == 1 and ran["tool", "live", "quick", "start"] == 1


def test_a_run_that_kills_every_process_continuing_it_is_given_up(tmp_path):
    db, log, gate = tmp_path / "runs.db", tmp_path / "journal", tmp_path / "gate"
    # The first service starts the run; its node kills the service (SIGKILL, from inside).
    first = serve(tmp_path, gate, "--max-attempts", "2")
    with first.client() as c, contextlib.suppress(httpx.HTTPError):
        c.post("/runs", json={"agent": "suicide", "input": "x", "checkpoint_id": "doomed"}, timeout=5)
    first.proc.wait(20)
    assert first.proc.returncode == -signal.SIGKILL
    # Two more services continue it by themselves as they start (takeovers 1 and 2), and die of it.
    for _ in (1, 2):
        again = subprocess.Popen(first.proc.args, cwd=tmp_path, env=first.env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        assert again.wait(30) == -signal.SIGKILL
    # The next one gives it up: stored failed, with why, and nothing ran.
    with serve(tmp_path, gate, "--max-attempts", "2") as last, last.client() as c:
        failed = run_until(c, "doomed", "failed", timeout=30)
        assert "gave up after 2 attempts" in failed["error"] and "resume it by hand" in failed["error"]
        assert "gave up after 2 attempts" in "".join(last.output)
    runs = [w for w in journal(log) if w[:3] == ["node", "doomed", "suicide"]]
    assert len(runs) == 3  # the first execution and two takeovers; never a fourth
    assert [w for w in journal(log) if w[:3] == ["node", "doomed", "first"]] and \
        len([w for w in journal(log) if w[:3] == ["node", "doomed", "first"]]) == 1  # its committed step: once
    # A resume by hand gives it a fresh count (here the node survives, and the run completes).
    with serve(tmp_path, gate, "--no-recover", RECOVERY_SURVIVE="1") as fixed, fixed.client() as c:
        r = c.post("/runs/doomed/resume", json={"wait": True})
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    assert newest(db, "doomed")[0] == "completed"


# --- a graceful stop drains: a deploy strands no approved call ------------------------------------------

def approve_first(c: httpx.Client, cid: str) -> None:
    """Start run `cid` of `fleet_runner` (its first call needs approval) and approve that call over HTTP."""
    assert c.post("/runs", json={"agent": "fleet-r", "input": "go", "checkpoint_id": cid}).status_code == 201
    run = run_until(c, cid, "interrupted")
    (pending,) = run["interrupts"]
    r = c.post(f"/runs/{cid}/resume", json={"answers": [{"action": "approve", "interrupt_id": pending["id"],
                                                         "digest": pending["digest"]}],
                                            "expected_version": run["version"]})
    assert r.status_code == 200, r.text


def never_cancelled(db: Path, cid: str) -> bool:
    with sqlite3.connect(db, timeout=10) as conn:
        return all(e != "cancelled" for (e,) in conn.execute("SELECT error FROM waypoint_checkpoints WHERE "
                                                             "checkpoint_id = ?", (cid,)))


@pytest.mark.parametrize("drain, effect", [(10.0, 1.5), (0.3, 5.0)], ids=["step-finishes", "step-cut"])
def test_sigterm_drains_and_the_next_service_continues_an_approved_call_unasked(tmp_path, drain, effect):
    """SIGTERM while an approved call runs. With time to drain, the call finishes and is recorded, the run stops
    at the step boundary; with too little, the call is stopped where it is. Either way the service exits 0 and
    leaves the run `running`, its lease ended — not cancelled: no pause was lost, `GET /approvals` asks nobody —
    and the next service continues it with no resume call and no second approval, running the approved call
    again only if it was cut (flagged rerun), every other call once. (A shutdown used to store the run cancelled
    and strand the approval.)"""
    db, log = tmp_path / "runs.db", tmp_path / "journal"
    env = {"RECOVERY_EFFECT": str(effect)}
    first = ServeProcess(tmp_path, agents="recovery_graphs:fleet_runner", args=("--drain", str(drain)),
                         env={"RECOVERY_JOURNAL": str(log), **env})
    with first, first.client() as c:
        approve_first(c, "ask-1")
        wait_until(lambda: ["effect", "ask-1", "call-0", "start", str(first.proc.pid)] in journal(log), what="inside")
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(drain + 20) in (0, -signal.SIGTERM), first.stop()  # uvicorn re-raises SIGTERM
    status, _owner, error, _v = newest(db, "ask-1")
    assert (status, error) == ("running", None) and never_cancelled(db, "ask-1")
    finished = ["effect", "ask-1", "call-0", "done", str(first.proc.pid)] in journal(log)
    assert finished == (drain > effect)  # the drain let the step finish, or the call was cut
    with ServeProcess(tmp_path, agents="recovery_graphs:fleet_runner", env={"RECOVERY_JOURNAL": str(log), **env}) as nxt, \
            nxt.client() as c:
        assert c.get("/approvals").json()["approvals"] == []  # nobody is asked again
        done = run_until(c, "ask-1", "completed", timeout=60)
        assert done["messages"][-1]["content"] == "done after 3 effects"
    starts = Counter(w[2] for w in journal(log) if w[:2] == ["effect", "ask-1"] and w[3] == "start")
    assert starts == Counter({"call-0": 1 if finished else 2, "call-1": 1, "call-2": 1}), starts
    assert never_cancelled(db, "ask-1")
