"""B5 (Waypoint only): 500 concurrent runs in one process, each pauses once and is resumed, one SQLite file.

Graph prepare -> ask -> finish (as B3); run i gets input i; "ask" raises `Interrupt` unless it is the
resume target; every node counts its executions per run in an in-memory `Counter`.

1. all 500 `ainvoke(i, checkpoint_id=f"run-{i}")` at once (`asyncio.gather`): each must raise
   `GraphInterrupted` exactly once;
2. all 500 `ainvoke(None, checkpoint_id=.., resume={interrupt_id: "yes"})` at once: each must return
   f"yes:{i}".

Figures:
  runs_per_s   500 ÷ (start of the first ainvoke → last resume done), both phases included
  peak_rss_mb  this process's VmHWM at the end (/proc/self/status)
  runs_ok      runs that passed every check below (must be 500)
Checks (any failure prints FAIL to stderr and reports an error instead of figures):
  - "prepare" and "finish" ran exactly once per run, "ask" exactly twice (paused, then resumed);
  - every run's result is right;
  - `store.list(status="completed", limit=1000)` lists exactly the 500 runs, and `store.list()` with
    no status filter lists no run in any other status.
A 5-run warm-up on another file comes first (lazy imports, first statements).

LangGraph: not run ("n/a"): it has no compare-and-set on its checkpoints, so "exactly once" under
concurrency is not something it claims.

    python -m bench.b5_concurrent --impl waypoint --case sqlite
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections import Counter
from typing import Any

from bench._harness import child_parser, emit, error_payload
from bench._stores import temp_db

CASES = ("sqlite",)
N_RUNS = 500
WARMUP_RUNS = 5


def vm(field: str) -> float:
    """VmHWM / VmRSS of this process in MiB."""
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field)).split()[1]) / 1024


async def run_batch(path: Any, n: int, prefix: str) -> dict[str, Any]:
    from waypoint.engine import END, START, Graph, GraphInterrupted, Interrupt, get_resume_context
    from waypoint.stores import SQLiteStore

    counts: Counter[tuple[str, int]] = Counter()

    def prepare(x: int) -> int:
        counts["prepare", x] += 1
        return x

    def ask(x: int) -> int:
        counts["ask", x] += 1
        is_target, _, data = get_resume_context()
        if not is_target:
            raise Interrupt({"q": "ok?", "run": x})
        return x if data == "yes" else -1

    def finish(x: int) -> str:
        counts["finish", x] += 1
        return f"yes:{x}"

    g = Graph(name="b5")
    g.add_node("prepare", prepare)
    g.add_node("ask", ask)
    g.add_node("finish", finish)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "ask")
    g.add_edge("ask", "finish")
    g.add_edge("finish", END)
    store = SQLiteStore(path)
    app = g.compile(store=store, durability="step")
    ids = [f"{prefix}-{i}" for i in range(n)]
    rss_before = vm("VmRSS")

    gc.collect()
    t0 = time.perf_counter()
    first = await asyncio.gather(*(app.ainvoke(i, checkpoint_id=ids[i]) for i in range(n)),
                                 return_exceptions=True)
    t1 = time.perf_counter()
    problems: list[str] = []
    iids: dict[int, str] = {}
    for i, res in enumerate(first):
        if isinstance(res, GraphInterrupted) and len(res.info.contexts) == 1:
            iids[i] = res.info.contexts[0].id
        else:
            problems.append(f"run {i}: first invoke gave {res!r} instead of one pause")
    resumed = await asyncio.gather(*(app.ainvoke(None, checkpoint_id=ids[i], resume={iid: "yes"})
                                     for i, iid in iids.items()), return_exceptions=True)
    t2 = time.perf_counter()

    ok = set(iids)
    for i, res in zip(iids, resumed):
        if res != f"yes:{i}":
            problems.append(f"run {i}: resume gave {res!r}")
            ok.discard(i)
    for i in range(n):
        got = (counts["prepare", i], counts["ask", i], counts["finish", i])
        if got != (1, 2, 1):
            problems.append(f"run {i}: prepare/ask/finish ran {got} times, expected (1, 2, 1)")
            ok.discard(i)
    completed = {m.checkpoint_id for m in await store.list(status="completed", limit=1000)}
    every = await store.list(limit=1000)
    for m in every:
        if m.status != "completed":
            problems.append(f"{m.checkpoint_id}: final status {m.status!r}")
            ok.discard(int(m.checkpoint_id.rsplit("-", 1)[1]))
    missing = set(ids) - completed
    extra = completed - set(ids)
    if missing or extra or len(every) != n:
        problems.append(f"store.list: {len(completed)} completed ({len(missing)} missing, {len(extra)} unexpected), "
                        f"{len(every)} runs in all, expected {n}")
        for cid in missing:
            ok.discard(int(cid.rsplit("-", 1)[1]))
    await store.close()
    return {"problems": problems, "ok": len(ok), "t_pause": t1 - t0, "t_resume": t2 - t1, "t_total": t2 - t0,
            "rss_before": rss_before}


async def amain() -> dict[str, Any]:
    wpath, wclean = temp_db()
    try:
        warm = await run_batch(wpath, WARMUP_RUNS, "warm")
    finally:
        wclean()
    if warm["problems"]:
        raise AssertionError("FAIL (warm-up): " + "; ".join(warm["problems"][:3]))
    path, clean = temp_db()
    try:
        res = await run_batch(path, N_RUNS, "run")
    finally:
        clean()
    peak = vm("VmHWM")
    if res["problems"]:
        for p in res["problems"][:20]:
            print(f"B5 FAIL: {p}", file=sys.stderr)
        print(f"B5 FAIL: {len(res['problems'])} problem(s); {res['ok']}/{N_RUNS} runs verified", file=sys.stderr)
        raise AssertionError(f"FAIL: {res['ok']}/{N_RUNS} runs verified; first: {res['problems'][0]}")
    return {
        "figures": {"runs_per_s": N_RUNS / res["t_total"], "peak_rss_mb": peak, "runs_ok": float(res["ok"])},
        "runs": N_RUNS,
        "total_ms": round(res["t_total"] * 1e3, 1),
        "pause_phase_ms": round(res["t_pause"] * 1e3, 1),
        "resume_phase_ms": round(res["t_resume"] * 1e3, 1),
        "rss_before_runs_mb": round(res["rss_before"], 1),
    }


def main(argv: list[str] | None = None) -> None:
    args = child_parser(CASES, __doc__).parse_args(argv)
    if args.impl == "langgraph":
        emit({"na": "LangGraph has no compare-and-set on checkpoints (B5 is Waypoint only)"})
        return
    try:
        payload = asyncio.run(amain())
    except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not crash the table
        print(f"B5 FAIL: {type(exc).__name__}: {exc}", file=sys.stderr)
        payload = error_payload(exc)
    emit(payload)


if __name__ == "__main__":
    main()
