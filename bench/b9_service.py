"""B9 (Waypoint only): the HTTP service under 50 concurrent clients, and the SSE delay of a model token.

The server (`bench._b9_server`: `waypoint.service` on uvicorn, no access log) runs in a child process on a
store given by the case; this process is the 50 clients (keep-alive HTTP/1.1 connections over asyncio
streams, so the client's own cost stays small). Both share the machine's cores, as a service and its
callers on one box would.

1. N_RUNS runs of B5's graph (prepare -> ask -> finish) are created paused, in this process, on the store.
2. get-run: 50 clients, each GET /runs/{id} of random paused runs, N_GETS requests in all.
3. resume: 50 clients take the paused runs from one queue and POST /runs/{id}/resume with an answer; the
   service answers once the claim is written. Every answer must be 200, and every run must then complete.
4. SSE: one client starts the `b9chat` agent, whose model streams 200 tokens 10 ms apart, each stamped with
   `time.time_ns()` when produced; the client reads GET /runs/{id}/events and takes receive time - stamp.

Figures: get_rps, get_p50_ms, get_p99_ms, resume_rps, resume_p50_ms, resume_p99_ms, sse_p50_ms, sse_p99_ms,
runs_ok (runs completed after the resume phase; must equal N_RUNS).

Cases: "sqlite" (a SQLite file); "postgres" runs when $WAYPOINT_BENCH_POSTGRES_URL names a database
(`postgresql+asyncpg://...`), else it is n/a.

    python -m bench.b9_service --impl waypoint --case sqlite
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from bench._harness import child_parser, emit, error_payload
from bench._stores import temp_db

CASES = ("sqlite", "postgres")
CLIENTS = 50
N_RUNS = 1500
N_GETS = 3000
TOKEN = "b9-bench-token-4e5f6a"


class Conn:
    """One keep-alive HTTP/1.1 connection (requests answered with a Content-Length body)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        data = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
        self.writer.write(head.encode() + data)
        assert self.reader is not None
        lines = (await self.reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def make_paused(db: str, n: int) -> dict[str, str]:
    """`{checkpoint_id: interrupt_id}` of n paused runs of B9's graph."""
    from bench._b9_server import graph
    from waypoint.engine import GraphInterrupted
    from waypoint.service import open_store

    store = open_store(db)
    app = graph().compile(store=store)
    out: dict[str, str] = {}
    for start in range(0, n, 500):
        batch = [f"run-{i}" for i in range(start, min(n, start + 500))]
        results = await asyncio.gather(*(app.ainvoke(i, checkpoint_id=cid) for i, cid in enumerate(batch, start)),
                                       return_exceptions=True)
        for cid, res in zip(batch, results):
            if not isinstance(res, GraphInterrupted):
                raise AssertionError(f"{cid}: expected a pause, got {res!r}")
            out[cid] = res.info.contexts[0].id
    await store.close()
    return out


async def load(port: int, jobs: list[tuple[str, str, Any]]) -> tuple[float, list[float], list[int]]:
    """Run `jobs` (method, path, body) on CLIENTS connections; (wall seconds, latencies in s, statuses)."""
    queue: asyncio.Queue[tuple[str, str, Any]] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    latencies: list[float] = []
    statuses: list[int] = []

    async def client() -> None:
        conn = Conn(port)
        try:
            while not queue.empty():
                method, path, body = queue.get_nowait()
                t = time.perf_counter()
                status, _ = await conn.request(method, path, body)
                latencies.append(time.perf_counter() - t)
                statuses.append(status)
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return time.perf_counter() - t0, latencies, statuses


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] * 1e3 if len(values) > 1 else 0.0


async def sse_latency(port: int) -> list[float]:
    """Token delays (s) from the model's stamp to this client, for one streamed answer."""
    import httpx

    from bench._b9_server import N_TOKENS

    out: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        r = await c.post("/runs", json={"agent": "b9chat", "input": "go", "checkpoint_id": "sse"})
        assert r.status_code == 201, r.text
        headers = {"Last-Event-ID": str(r.json()["last_event_id"])}
        async with c.stream("GET", "/runs/sse/events", headers=headers) as resp:
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


async def completed(db: str, n: int, timeout: float = 60) -> int:
    from waypoint.service import open_store

    store = open_store(db)
    try:
        deadline = time.monotonic() + timeout
        while True:
            done = len(await store.list(status="completed", limit=n + 10))
            if done >= n or time.monotonic() > deadline:
                return done
            await asyncio.sleep(0.1)
    finally:
        await store.close()


def start_server(db: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "bench._b9_server", "--db", db, "--token", TOKEN],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise AssertionError(f"the B9 server did not start: {line!r}")
    return proc, int(line.split()[1])


async def measure(db: str) -> dict[str, Any]:
    paused = await make_paused(db, N_RUNS)
    proc, port = start_server(db)
    try:
        ids = list(paused)
        await load(port, [("GET", f"/runs/{cid}", None) for cid in ids[:200]])  # warm-up
        rng = random.Random(9)
        get_wall, get_lat, get_st = await load(port, [("GET", f"/runs/{rng.choice(ids)}", None)
                                                      for _ in range(N_GETS)])
        answers = [("POST", f"/runs/{cid}/resume",
                    {"answers": [{"action": "respond", "interrupt_id": iid, "output": "yes"}]})
                   for cid, iid in paused.items()]
        res_wall, res_lat, res_st = await load(port, answers)
        ok = await completed(db, N_RUNS)
        sse = await sse_latency(port)
    finally:
        proc.terminate()
        proc.wait(30)
    bad = [s for s in get_st if s != 200] + [s for s in res_st if s != 200]
    if bad or ok != N_RUNS:
        raise AssertionError(f"FAIL: {len(bad)} non-200 answers ({sorted(set(bad))}), {ok}/{N_RUNS} runs completed")
    return {"figures": {
        "get_rps": N_GETS / get_wall, "get_p50_ms": p(get_lat, 50), "get_p99_ms": p(get_lat, 99),
        "resume_rps": N_RUNS / res_wall, "resume_p50_ms": p(res_lat, 50), "resume_p99_ms": p(res_lat, 99),
        "sse_p50_ms": p(sse, 50), "sse_p99_ms": p(sse, 99), "runs_ok": float(ok),
    }, "clients": CLIENTS, "gets": N_GETS, "resumes": N_RUNS}


def main(argv: list[str] | None = None) -> None:
    args = child_parser(CASES, __doc__).parse_args(argv)
    if args.impl == "langgraph":
        emit({"na": "LangGraph ships no HTTP service (B9 is Waypoint only)"})
        return
    if args.case == "postgres":
        url = os.environ.get("WAYPOINT_BENCH_POSTGRES_URL")
        if not url:
            emit({"na": "set WAYPOINT_BENCH_POSTGRES_URL=postgresql+asyncpg://... to run B9 on Postgres"})
            return
        db, clean = url, (lambda: None)
    else:
        path, clean = temp_db()
        db = str(path)
    try:
        payload = asyncio.run(measure(db))
    except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not crash the table
        print(f"B9 FAIL: {type(exc).__name__}: {exc}", file=sys.stderr)
        payload = error_payload(exc)
    finally:
        clean()
    emit(payload)


if __name__ == "__main__":
    main()
