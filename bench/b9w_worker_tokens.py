"""B9w (Waypoint only): B9's SSE token delay with the run executed in a `waypoint worker`, read through a
`waypoint serve --queue` that does not execute it (the tokens travel through the store's relayed log).

One worker process and one service process share the store; this process is the client. It starts the `b9chat`
agent (its model streams 200 tokens 10 ms apart, each stamped with `time.time_ns()` when produced, in the
worker), reads GET /runs/{id}/events from the service and takes receive time - stamp, over `REPEATS` runs.

Figures: sse_p50_ms, sse_p99_ms, tokens (received of expected); sse_steady_p99_ms leaves out each run's first
`FIRST` tokens (those produced before the client's stream was open: the POST answers once the claim is seen).

Cases: "sqlite" (a SQLite file: the service polls the relayed log every 50 ms while someone reads); "postgres"
(NOTIFY wakes the service) when $WAYPOINT_BENCH_POSTGRES_URL names a database, else n/a.

    python -m bench.b9w_worker_tokens --impl waypoint --case sqlite
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench._harness import child_parser, emit, error_payload
from bench._stores import temp_db

CASES = ("sqlite", "postgres")
TOKEN = "b9w-bench-token-7a8b9c"
REPEATS = 3
FIRST = 10


def p(values: list[float], q: float) -> float:
    import statistics

    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1e3 if len(values) > 1 else 0.0


def _waypoint() -> str:
    return str(Path(sys.executable).parent / "waypoint")


def start(db: str, root: Path) -> tuple[subprocess.Popen, subprocess.Popen, str]:
    env = {**os.environ, "WAYPOINT_TOKEN": TOKEN, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent),
                                                                                os.environ.get("PYTHONPATH", "")])}
    log = open(root / "worker.log", "w")  # noqa: SIM115 - kept open for the worker's life
    worker = subprocess.Popen([_waypoint(), "worker", "--db", db, "--graphs", "bench._b9w_graph:compiled",
                               "--poll", "0.2"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    serve = subprocess.Popen([_waypoint(), "serve", "--db", db, "--agents", "bench._b9w_graph:agent", "--queue",
                              "--port", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             cwd=root)
    assert serve.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = serve.stdout.readline()
        if line.startswith("waypoint serve: http://"):
            return worker, serve, line.split()[2].removesuffix("/ui")
        if not line and serve.poll() is not None:
            break
    raise AssertionError("waypoint serve did not start")


async def one_run(url: str, cid: str) -> list[float]:
    import httpx

    from bench._b9_server import N_TOKENS

    out: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        deadline = time.monotonic() + 60
        while True:  # the worker may not be registered yet: "queued" until it is
            r = await c.post("/runs", json={"agent": "b9chat", "input": "go", "checkpoint_id": cid})
            assert r.status_code == 201, r.text
            if r.json()["status"] == "running" or time.monotonic() > deadline:
                break
            await c.delete(f"/runs/{cid}")
            await asyncio.sleep(0.5)
        headers = {"Last-Event-ID": str(r.json()["last_event_id"])}
        async with c.stream("GET", f"/runs/{cid}/events", headers=headers) as resp:
            kind = None
            async for line in resp.aiter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: ") and kind == "token":
                    out.append((time.time_ns() - int(json.loads(line[6:])["text"])) / 1e9)
                elif line.startswith("data: ") and kind == "end":
                    break
    assert len(out) == N_TOKENS, f"{len(out)} tokens of {N_TOKENS}"
    return out


async def measure(db: str, root: Path) -> dict[str, Any]:
    from waypoint.service import open_store

    store = open_store(db)
    try:
        await store.list(limit=1)  # the schema exists before the processes start
    finally:
        await store.close()
    worker, serve, url = start(db, root)
    try:
        delays: list[float] = []
        steady: list[float] = []
        for i in range(REPEATS):
            got = await one_run(url, f"b9w-{i}")
            delays += got
            steady += got[FIRST:]
    finally:
        for proc in (serve, worker):
            proc.terminate()
        for proc in (serve, worker):
            proc.wait(30)
    return {"figures": {"sse_p50_ms": p(delays, 50), "sse_p99_ms": p(delays, 99), "tokens": float(len(delays)),
                        "sse_steady_p99_ms": p(steady, 99), "sse_first_max_ms": max(delays[:FIRST]) * 1e3}}


def main(argv: list[str] | None = None) -> None:
    args = child_parser(CASES, __doc__).parse_args(argv)
    if args.impl == "langgraph":
        emit({"na": "LangGraph ships no HTTP service (B9 is Waypoint only)"})
        return
    path, clean = temp_db()
    path.parent.mkdir(parents=True, exist_ok=True)
    if args.case == "postgres":
        db = os.environ.get("WAYPOINT_BENCH_POSTGRES_URL")
        if not db:
            emit({"na": "set WAYPOINT_BENCH_POSTGRES_URL=postgresql+asyncpg://... to run B9w on Postgres"})
            clean()
            return
    else:
        db = str(path)
    try:
        payload = asyncio.run(measure(db, path.parent))
    except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not crash the table
        print(f"B9w FAIL: {type(exc).__name__}: {exc}", file=sys.stderr)
        payload = error_payload(exc)
    finally:
        clean()
    emit(payload)


if __name__ == "__main__":
    main()
