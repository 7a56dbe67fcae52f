"""Cancelling runs a `waypoint worker` executes, from a `waypoint serve` that does not (`POST /runs/{id}/cancel`) and
from the command line (`waypoint runs cancel`): real processes on one SQLite file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from service_support import wait_until  # noqa: E402
from test_service_workers import acts, serve, spawn_worker  # noqa: E402

from waypoint.stores import RunQueue, SQLiteStore  # noqa: E402

TIMEOUT = 60.0


def queued(db: Path, cid: str):
    async def read():
        store = SQLiteStore(db)
        try:
            return await RunQueue(store).status(cid)
        finally:
            await store.close()
    return asyncio.run(read())


def held_in_worker(c, desk: Path, cid: str, command: str, holding: int) -> None:
    """Start `cid`, approve its call, and wait until the worker's model holds its next step."""
    started = c.post("/runs", json={"agent": "desk", "input": command, "checkpoint_id": cid})
    assert started.status_code == 201, started.text
    (pending,) = wait_until(lambda: c.get(f"/runs/{cid}").json().get("interrupts"), TIMEOUT, f"{cid} paused")
    answer = {"answers": [{"action": "approve", "interrupt_id": pending["id"], "digest": pending["digest"]}]}
    assert c.post(f"/runs/{cid}/resume", json=answer).status_code == 200
    wait_until(lambda: (desk / "holding").exists() and len((desk / "holding").read_text().splitlines()) >= holding,
               TIMEOUT, f"{cid}'s model holding")


def test_runs_a_worker_executes_are_cancelled_from_the_service_and_the_cli_and_continue_after(tmp_path, procs):
    desk, db = tmp_path / "desk", tmp_path / "runs.db"
    desk.mkdir()
    procs.append(spawn_worker(str(db), desk, tmp_path))
    with serve(tmp_path, desk) as s, s.client() as c:
        held_in_worker(c, desk, "c-1", "hold one", 1)
        held_in_worker(c, desk, "c-2", "hold two", 2)

        asked = c.post("/runs/c-1/cancel", json={"when": "now", "by": "ops@page"})
        assert asked.status_code == 202, asked.text
        assert (asked.json()["when"], asked.json()["by"]) == ("now", "ops@page")
        view = wait_until(lambda: (v := c.get("/runs/c-1").json())["status"] == "interrupted" and v, TIMEOUT,
                          "c-1 cancelled")
        assert view["error"] == "cancelled" and view["cancelled_by"]["by"] == "ops@page" and not view["active"]
        row = wait_until(lambda: (q := queued(db, "c-1")).state == "done" and q, TIMEOUT, "c-1's work recorded")
        assert row.outcome == "interrupted" and "cancelled by ops@page" in row.error and row.attempts == 1

        cli = subprocess.run([sys.executable, "-m", "waypoint.cmd.main", "runs", "--db", str(db), "cancel", "c-2",
                              "--by", "alice", "--wait", str(TIMEOUT), "--json"],
                             capture_output=True, text=True, timeout=TIMEOUT * 2)
        assert cli.returncode == 0, cli.stderr
        said = json.loads(cli.stdout)
        assert (said["by"], said["when"], said["stopped"]["status"], said["stopped"]["error"]) == (
            "alice", "now", "interrupted", "cancelled")
        shown = subprocess.run([sys.executable, "-m", "waypoint.cmd.main", "runs", "--db", str(db), "show", "c-2"],
                               capture_output=True, text=True, timeout=TIMEOUT)
        assert "cancelled by alice, where it was" in shown.stdout, shown.stdout

        # nothing executes them now: a cancel is refused with why; a point the agent does not have is a bad request
        again = c.post("/runs/c-1/cancel", json={"when": "now"})
        assert again.status_code == 409 and "not running" in again.json()["detail"], again.text
        typo = c.post("/runs/c-1/cancel", json={"when": "after:planner"})
        assert typo.status_code == 422 and "names no node" in typo.text, typo.text
        assert c.post("/runs/nope/cancel", json={}).status_code == 404

        (desk / "gate").touch()
        for cid in ("c-1", "c-2"):  # a cancelled run continues from its last finished step
            assert c.post(f"/runs/{cid}/resume", json={}).status_code == 200
        for cid in ("c-1", "c-2"):
            wait_until(lambda cid=cid: c.get(f"/runs/{cid}").json()["status"] == "completed", TIMEOUT, f"{cid} done")
    assert sorted(a[0] for a in acts(desk)) == ["hold one", "hold two"]  # each approved call ran once


def test_a_token_without_the_cancel_scope_cannot_cancel(tmp_path):
    from fastapi.testclient import TestClient
    from service_support import approval_agent

    from waypoint.service import create_app
    from waypoint.stores import MemoryStore

    app = create_app(approval_agent([]), MemoryStore(), auth={"r" * 32: {"read", "start", "resume"}})
    with TestClient(app) as client:
        refused = client.post("/runs/x/cancel", json={}, headers={"Authorization": f"Bearer {'r' * 32}"})
    assert refused.status_code == 403, refused.text
