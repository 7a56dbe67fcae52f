"""B11 (Waypoint only): recovery with nobody calling resume. A process executing a run is SIGKILLed inside a
step; a **new** `waypoint serve` or `waypoint worker` is started on the same SQLite file at that moment; the
figure is the time from the kill to the run's newest version being `completed` (read from the file every
5 ms), the new process's start included. The graph (bench/_b11_graph.py): prepare -> hold, where "hold" cues
the kill and then waits for a gate file, which exists by the time the new process continues it.

Cases:
  serve-same-host    the victim is a `waypoint serve` that started the run over HTTP; its owner is provably
                     dead (same host, PID gone): continued at once (target ≤ 2 s)
  worker-same-host   the victim is a `waypoint worker` executing a run queued with `RunQueue.submit`
  serve-other-host   the victim is a process whose lease owner names another host (bench/_b11_graph.py run
                     as a script): nothing here can tell it is dead, so the run waits for its lease to expire
                     ($B11_LEASE, 5 s here; target ≤ lease + 2 s)
  worker-other-host  the same, recovered by a `waypoint worker`

Figures: seconds (kill -> completed), past_lease (seconds minus the lease; the other-host cases).

    python -m bench.b11_recovery --impl waypoint --case serve-same-host
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._harness import ROOT, child_parser, emit, error_payload

CASES = ("serve-same-host", "worker-same-host", "serve-other-host", "worker-other-host")
LEASE = 5.0
TOKEN = "b11-bench-token-7c8d9e"


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "WAYPOINT_TOKEN": TOKEN, "B11_LEASE": str(LEASE),
            "B11_INSIDE": str(tmp / "inside"), "B11_GATE": str(tmp / "gate")}


def _waypoint() -> str:
    return str(Path(sys.executable).parent / "waypoint")


def _serve(tmp: Path, db: Path) -> subprocess.Popen:
    return subprocess.Popen([_waypoint(), "serve", "--db", str(db), "--agents", "bench._b11_graph:for_serve",
                             "--port", "0", "--log-level", "warning"], cwd=tmp, env=_env(tmp), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def _worker(tmp: Path, db: Path) -> subprocess.Popen:
    return subprocess.Popen([_waypoint(), "worker", "--db", str(db), "--graphs", "bench._b11_graph:for_worker",
                             "--poll", "0.5"], cwd=tmp, env=_env(tmp), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _port(proc: subprocess.Popen) -> int:
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("waypoint serve: http://"):
            return int(line.split()[2].removesuffix("/ui").rsplit(":", 1)[1])
    raise RuntimeError("waypoint serve did not start")


def _status(db: Path, checkpoint_id: str) -> str | None:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            row = conn.execute("SELECT status FROM waypoint_checkpoints WHERE checkpoint_id = ? ORDER BY version "
                               "DESC LIMIT 1", (checkpoint_id,)).fetchone()
    except sqlite3.OperationalError:  # not created yet
        return None
    return row[0] if row else None


def _wait(condition: Any, timeout: float, what: str, poll: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen in {timeout} s")
        time.sleep(poll)


def _start_victim(case: str, tmp: Path, db: Path, cid: str) -> subprocess.Popen:
    if case == "serve-same-host":
        import httpx

        victim = _serve(tmp, db)
        port = _port(victim)
        httpx.post(f"http://127.0.0.1:{port}/runs", json={"agent": "b11", "input": "go", "checkpoint_id": cid},
                   headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).raise_for_status()
        return victim
    if case == "worker-same-host":
        victim = _worker(tmp, db)
        asyncio.run(_submit(db, cid))
        return victim
    return subprocess.Popen([sys.executable, "-m", "bench._b11_graph", str(db), cid, "elsewhere-b11"], cwd=tmp,
                            env=_env(tmp), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _submit(db: Path, cid: str) -> None:
    from waypoint.stores import RunQueue, SQLiteStore

    store = SQLiteStore(str(db))
    await RunQueue(store).submit("b11", "go", cid)
    await store.close()


def measure(case: str) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="waypoint-b11-"))
    db, cid = tmp / "runs.db", "b11-run"
    procs: list[subprocess.Popen] = []
    try:
        victim = _start_victim(case, tmp, db, cid)
        procs.append(victim)
        _wait(lambda: (tmp / "inside").exists(), 60, "the run inside its step")
        victim.kill()
        killed = time.monotonic()
        victim.wait(10)
        (tmp / "gate").touch()
        procs.append(_serve(tmp, db) if case.startswith("serve") else _worker(tmp, db))
        _wait(lambda: _status(db, cid) == "completed", 3 * LEASE + 30, "the run completed", poll=0.005)
        seconds = time.monotonic() - killed
        figures = {"seconds": seconds}
        if case.endswith("other-host"):
            figures["past_lease"] = seconds - LEASE
        return figures
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    args = child_parser(CASES, __doc__).parse_args()
    if args.impl != "waypoint":
        emit({"na": "Waypoint only (DBOS recovers a dead executor's workflows only when that executor starts again)"})
        return
    try:
        payload: dict[str, Any] = {"figures": measure(args.case)}
    except Exception as exc:  # noqa: BLE001 - reported in the table
        payload = error_payload(exc)
    emit(payload) if args.json else print(payload)


if __name__ == "__main__":
    main()
