"""Run every benchmark side by side and print one markdown table (``make bench``).

    python -m bench.run_all                 # all workloads, 5 process runs per cell
    python -m bench.run_all --runs 7 --only b1,b4      # any of b1,b2,b3,b4,b5,b6,b7,b8,b9,b10,b11,b12

Also writes the table, with the date/machine/version lines, to bench/results/latest.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time

from bench._harness import Cell, Row, dbos_version, langgraph_version, render_table, run_rows, write_results

ROWS: dict[str, list[Row]] = {
    "b1": [
        Row("B1 linear, 100 nodes", "no store", "bench.b1_linear", "us_per_step", "µs/step",
            "nostore", "nostore", "≤ 0.10"),
        Row("B1 linear, 100 nodes", "no store, sync nodes, both ainvoke (B1a)", "bench.b1_linear", "us_per_step",
            "µs/step", "ainvoke", "ainvoke", "≤ 0.10"),
        Row("B1 linear, 100 nodes", "memory (WP MemoryStore step · LG InMemorySaver sync)", "bench.b1_linear",
            "us_per_step", "µs/step", "memory", "memory"),
        Row("B1 linear, 100 nodes", "SQLite file as shipped (WP step, NORMAL · LG SqliteSaver sync, FULL)",
            "bench.b1_linear", "us_per_step", "µs/step", "sqlite", "sqlite", "≤ 0.25"),
        Row("B1 linear, 100 nodes", "SQLite file, both synchronous=NORMAL", "bench.b1_linear",
            "us_per_step", "µs/step", "sqlite", "sqlite-normal"),
        Row("B1 linear, 100 nodes", "SQLite file, both synchronous=FULL", "bench.b1_linear",
            "us_per_step", "µs/step", "sqlite-full", "sqlite"),
    ],
    "b2": [
        Row("B2 agent loop, 200 it.", "wall time, SQLite as shipped (WP NORMAL · LG FULL)", "bench.b2_agent_loop",
            "wall_ms", "ms", "it200", "it200", "≤ 0.5"),
        Row("B2 agent loop, 200 it.", "wall time, both synchronous=NORMAL", "bench.b2_agent_loop",
            "wall_ms", "ms", "it200", "it200-normal"),
        Row("B2 agent loop, 200 it.", "wall time, both synchronous=FULL", "bench.b2_agent_loop",
            "wall_ms", "ms", "it200-full", "it200"),
        Row("B2 agent loop, 200 it.", "DB bytes ÷ steps at 400 steps", "bench.b2_agent_loop",
            "bytes_per_step", "B/step", "it200", "it200", "≤ 0.05"),
        Row("B2 agent loop, 200 it.", "DB bytes ÷ steps at 400 steps, against LangGraph's DeltaChannel (incremental "
            "history)", "bench.b2_agent_loop", "bytes_per_step", "B/step", "it200", "it200-delta", "≤ 0.25"),
        Row("B2 agent loop, 200 it.", "last 10 iterations ÷ first 10 (1 = flat)", "bench.b2_agent_loop",
            "last10_over_first10", "×", "it200", "it200", "≤ 1.3 (WP)"),
        Row("B2 agent loop, 200 it.", "last 10 ÷ first 10, both synchronous=NORMAL", "bench.b2_agent_loop",
            "last10_over_first10", "×", "it200", "it200-normal"),
        Row("B2 agent loop, 200 it.", "last 10 ÷ first 10, WP storing plain dicts (re-encoded per step)",
            "bench.b2_agent_loop", "last10_over_first10", "×", "it200-dicts", "it200"),
        Row("B2 agent loop, 200 it.", "time of the first 10 iterations (as shipped)", "bench.b2_agent_loop",
            "first10_ms", "ms", "it200", "it200"),
        Row("B2 agent loop, 200 it.", "time of the last 10 iterations (as shipped)", "bench.b2_agent_loop",
            "last10_ms", "ms", "it200", "it200"),
        Row("B2 growth curve", "DB bytes ÷ steps at 100 steps (50 it.)", "bench.b2_agent_loop",
            "bytes_per_step", "B/step", "it50", "it50"),
        Row("B2 growth curve", "DB bytes ÷ steps at 200 steps (100 it.)", "bench.b2_agent_loop",
            "bytes_per_step", "B/step", "it100", "it100"),
        # 3,000 iterations (6,000 steps): does a step's cost grow with the history? Waypoint only (LangGraph
        # rewrites the whole list per step: ~9 GB here). Each case also with the median iteration per window.
        *(Row("B2 long run, 3,000 it. (WP only)", f"last 10 ÷ first 10{' (median iteration)' if metric.startswith('median') else ''}, {label}",
              "bench.b2_agent_loop", metric,
              "×", case, None, "≤ 1.3" if metric == "last10_over_first10" and case != "it3000-dicts" else "—")
          for case, label in (("it3000", "Message list, no reducer"), ("it3000-reduce", "Message list, add_messages"),
                              ("it3000-dicts-reduce", "dict list, add_messages"),
                              ("it3000-dicts", "dict list, no reducer (re-encoded per step)"))
          for metric in ("last10_over_first10", "median_last10_over_first10")),
        Row("B2 long run, 3,000 it. (WP only)", "wall time, Message list, no reducer", "bench.b2_agent_loop",
            "wall_ms", "ms", "it3000", None),
    ],
    "b7": [
        Row("B7 ReAct agent, 20 it.", "ms per iteration, SQLite as shipped (WP step · LG SqliteSaver sync)",
            "bench.b7_react", "ms_per_iteration", "ms", "sqlite", "sqlite", "≤ 0.2"),
        Row("B7 ReAct agent, 20 it.", "ms per iteration, both synchronous=NORMAL", "bench.b7_react",
            "ms_per_iteration", "ms", "sqlite", "sqlite-normal"),
    ],
    "b12": [
        Row("B12 supervisor → agent tool → 2 tools, 10 it.",
            "ms per inner iteration, SQLite as shipped (WP step · LG SqliteSaver sync)", "bench.b12_composition",
            "ms_per_iteration", "ms", "sqlite", "sqlite", "≤ 0.2"),
        Row("B12 supervisor → agent tool → 2 tools, 10 it.", "ms per inner iteration, both synchronous=NORMAL",
            "bench.b12_composition", "ms_per_iteration", "ms", "sqlite", "sqlite-normal"),
        Row("B12 supervisor → agent tool → 2 tools, 10 it.", "ms per inner iteration, both synchronous=FULL",
            "bench.b12_composition", "ms_per_iteration", "ms", "sqlite-full", "sqlite"),
    ],
    "b3": [
        Row("B3 cold resume (new process)", "resume excl. all imports, SQLite as shipped (WP NORMAL · LG FULL)",
            "bench.b3_resume", "resume_ms", "ms", "sqlite", "sqlite", "≤ 0.25"),
        Row("B3 cold resume (new process)", "resume excl. all imports, both synchronous=NORMAL",
            "bench.b3_resume", "resume_ms", "ms", "sqlite", "sqlite-normal"),
        Row("B3 cold resume (new process)", "resume excl. all imports, both synchronous=FULL",
            "bench.b3_resume", "resume_ms", "ms", "sqlite-full", "sqlite"),
        Row("B3 cold resume (new process)", "resume incl. modules loaded lazily by the first invoke",
            "bench.b3_resume", "resume_lazy_ms", "ms", "sqlite", "sqlite"),
        Row("B3 cold resume (new process)", "imports: everything the resume loads", "bench.b3_resume",
            "import_ms", "ms", "sqlite", "sqlite", "≤ 0.15"),
        Row("B3 cold resume (new process)", "imports: the public imports only", "bench.b3_resume",
            "import_public_ms", "ms", "sqlite", "sqlite"),
        Row("B3 cold resume (new process)", "peak RSS of the resume process", "bench.b3_resume",
            "peak_rss_mb", "MB", "sqlite", "sqlite", "≤ 0.6"),
    ],
    "b4": [
        Row("B4 fan-out 50 + join", "no store (WP trigger=all)", "bench.b4_fanout", "us_per_task", "µs/task",
            "nostore", "nostore", "≤ 0.2"),
        Row("B4 fan-out 50 + join", "no store (WP trigger=any)", "bench.b4_fanout", "us_per_task", "µs/task",
            "nostore-any", "nostore", "≤ 0.2"),
        Row("B4 fan-out 50 + join", "no store, sync nodes, both ainvoke (WP trigger=all; B4a)", "bench.b4_fanout",
            "us_per_task", "µs/task", "ainvoke", "ainvoke", "≤ 0.10"),
        Row("B4 fan-out 50 + join", "no store, async def nodes, both ainvoke (WP trigger=all)", "bench.b4_fanout",
            "us_per_task", "µs/task", "async-nodes", "async-nodes", "≤ 0.2"),
        Row("B4 fan-out 50 + join", "SQLite file as shipped (WP step, NORMAL, trigger=all · LG sync, FULL)",
            "bench.b4_fanout", "us_per_task", "µs/task", "sqlite", "sqlite"),
        Row("B4 fan-out 50 + join", "SQLite file, both synchronous=NORMAL", "bench.b4_fanout",
            "us_per_task", "µs/task", "sqlite", "sqlite-normal"),
        Row("B4 fan-out 50 + join", "SQLite file, both synchronous=FULL", "bench.b4_fanout",
            "us_per_task", "µs/task", "sqlite-full", "sqlite"),
    ],
    "b5": [
        Row("B5 500 concurrent runs", "runs/s end to end (pause + resume each; higher is better)",
            "bench.b5_concurrent", "runs_per_s", "runs/s", "sqlite", None),
        Row("B5 500 concurrent runs", "peak RSS", "bench.b5_concurrent", "peak_rss_mb", "MB", "sqlite", None),
        Row("B5 500 concurrent runs", "runs verified completed exactly once", "bench.b5_concurrent", "runs_ok",
            "of 500", "sqlite", None, "500"),
    ],
    "b8": [
        *(Row("B8 queue on Postgres, 500 runs", f"runs/s, {n} worker process{'es' if n > 1 else ''} (higher is better)",
              "bench.b8_queue", "runs_per_s", "runs/s", f"w{n}", None) for n in (1, 2, 4)),
        *(Row("B8 queue on Postgres, 500 runs", f"queue item latency p50, {n} worker(s)", "bench.b8_queue", "p50_ms",
              "ms", f"w{n}", None) for n in (1, 2, 4)),
        *(Row("B8 queue on Postgres, 500 runs", f"queue item latency p99, {n} worker(s)", "bench.b8_queue", "p99_ms",
              "ms", f"w{n}", None) for n in (1, 2, 4)),
        Row("B8 queue on Postgres, 500 runs", "runs verified completed exactly once (4 workers)", "bench.b8_queue",
            "runs_ok", "of 500", "w4", None, "500"),
    ],
    "b9": [
        Row("B9 HTTP service, 50 clients", "get-run: requests/s (higher is better)", "bench.b9_service", "get_rps",
            "req/s", "sqlite", None),
        Row("B9 HTTP service, 50 clients", "get-run: p99 latency", "bench.b9_service", "get_p99_ms", "ms",
            "sqlite", None),
        Row("B9 HTTP service, 50 clients", "resume (answers once claimed): requests/s (higher is better)",
            "bench.b9_service", "resume_rps", "req/s", "sqlite", None),
        Row("B9 HTTP service, 50 clients", "resume: p99 latency", "bench.b9_service", "resume_p99_ms", "ms",
            "sqlite", None),
        Row("B9 HTTP service, 50 clients", "SSE: model token -> client, p50", "bench.b9_service", "sse_p50_ms", "ms",
            "sqlite", None),
        Row("B9 HTTP service, 50 clients", "SSE: model token -> client, p99", "bench.b9_service", "sse_p99_ms", "ms",
            "sqlite", None),
        Row("B9 HTTP service, 50 clients", "runs completed after the resumes", "bench.b9_service", "runs_ok",
            "of 1500", "sqlite", None, "1500"),
        Row("B9 HTTP service, 50 clients", "get-run requests/s on Postgres ($WAYPOINT_BENCH_POSTGRES_URL)",
            "bench.b9_service", "get_rps", "req/s", "postgres", None),
        Row("B9 HTTP service, 50 clients", "resume requests/s on Postgres", "bench.b9_service", "resume_rps",
            "req/s", "postgres", None),
        Row("B9w tokens of a run in a worker", "SSE: model token (in the worker) -> client of serve --queue, p50",
            "bench.b9w_worker_tokens", "sse_p50_ms", "ms", "sqlite", None),
        Row("B9w tokens of a run in a worker", "SSE: model token (in the worker) -> client of serve --queue, p99",
            "bench.b9w_worker_tokens", "sse_p99_ms", "ms", "sqlite", None),
        Row("B9w tokens of a run in a worker", "the same on Postgres ($WAYPOINT_BENCH_POSTGRES_URL), p50",
            "bench.b9w_worker_tokens", "sse_p50_ms", "ms", "postgres", None),
        Row("B9w tokens of a run in a worker", "the same on Postgres, p99",
            "bench.b9w_worker_tokens", "sse_p99_ms", "ms", "postgres", None),
    ],
    "b10": [
        Row("B10 durable workflow, 100 steps", "ms per step, SQLite, both synchronous=FULL (WP step · DBOS workflow)",
            "bench.b10_dbos", "ms_per_step", "ms/step", "sqlite-full", "sqlite-full", "≤ 0.1", peer="dbos"),
        Row("B10 durable workflow, 100 steps", "ms per step, SQLite synchronous=FULL, against a bare fsync'd commit of "
            "the same bytes per step", "bench.b10_dbos", "ms_per_step", "ms/step", "sqlite-full", "sqlite-full",
            "≤ 1.3", peer="floor"),
    ],
    "b11": [
        Row("B11 recovery, no resume call", "SIGKILL → completed: dead owner on this host, new `waypoint serve`",
            "bench.b11_recovery", "seconds", "s", "serve-same-host", None, "≤ 2 s", peer="dbos"),
        Row("B11 recovery, no resume call", "SIGKILL → completed: dead owner on this host, new `waypoint worker`",
            "bench.b11_recovery", "seconds", "s", "worker-same-host", None, "≤ 2 s", peer="dbos"),
        Row("B11 recovery, no resume call", "SIGKILL → completed: owner on another host (5 s lease), new serve",
            "bench.b11_recovery", "seconds", "s", "serve-other-host", None, "≤ lease + 2 s", peer="dbos"),
        Row("B11 recovery, no resume call", "the same, past the lease", "bench.b11_recovery", "past_lease", "s",
            "serve-other-host", None, "≤ 2 s", peer="dbos"),
        Row("B11 recovery, no resume call", "SIGKILL → completed: owner on another host (5 s lease), new worker",
            "bench.b11_recovery", "seconds", "s", "worker-other-host", None, "≤ lease + 2 s", peer="dbos"),
        Row("B11 recovery, no resume call", "the same, past the lease", "bench.b11_recovery", "past_lease", "s",
            "worker-other-host", None, "≤ 2 s", peer="dbos"),
    ],
    "b6": [
        Row("B6 import", "engine: time", "bench.b6_import", "import_ms", "ms", "engine", "engine"),
        Row("B6 import", "engine: peak RSS", "bench.b6_import", "peak_rss_mb", "MB", "engine", "engine"),
        Row("B6 import", "resume (engine + SQLite store): time", "bench.b6_import", "import_ms", "ms",
            "resume", "resume", "≤ 0.15"),
        Row("B6 import", "resume (engine + SQLite store): peak RSS", "bench.b6_import", "peak_rss_mb", "MB",
            "resume", "resume", "≤ 0.6"),
    ],
}


def _nproc() -> int:
    """CPUs this process may use (what `nproc` prints), not the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def header() -> str:
    return "\n".join([
        f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {platform.platform()}, nproc {_nproc()}",
        f"- python: {platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        f"- langgraph: {langgraph_version()}",
        f"- dbos: {dbos_version()} (B10's peer; B11 is Waypoint only)",
        "- APIs: both sides call sync `invoke(...)` for graphs (Waypoint's `ainvoke` runs sync nodes on a thread, "
        "so a blocking node never stalls a shared loop; its `invoke` owns its loop and runs them inline), and "
        "Waypoint's agents run through their async `Runner` (B7, B12), except rows that say otherwise",
        "- SQLite settings: Waypoint `SQLiteStore` = WAL + `synchronous=NORMAL` (its default); LangGraph "
        "`SqliteSaver` = WAL + sqlite's default `synchronous=FULL` (fsync per commit). \"as shipped\" rows "
        "compare the defaults; \"both NORMAL\" / \"both FULL\" rows put both on one setting",
    ])


def growth_curve(results: dict[tuple, dict[str, Cell]]) -> str:
    """B2's DB bytes per step at 100 / 200 / 400 steps for both columns (medians), and 400 ÷ 100."""
    lines = ["B2 growth curve: database bytes ÷ steps (median of the runs; separate runs of 50 / 100 / 200 "
             "iterations)", "", "| steps | Waypoint B/step | LangGraph B/step | ratio (WP/LG) |", "|---|---|---|---|"]
    med: dict[tuple[str, str], float | None] = {}
    for case in ("it50", "it100", "it200"):
        for impl in ("waypoint", "langgraph"):
            cell = results.get(("bench.b2_agent_loop", impl, case), {}).get("bytes_per_step")
            med[impl, case] = statistics.median(cell.values) if cell and cell.values else None
        wp, lg = med["waypoint", case], med["langgraph", case]
        steps = 2 * int(case.removeprefix("it"))
        lines.append(f"| {steps} | {_b(wp)} | {_b(lg)} | {f'{wp / lg:.3f}' if wp and lg else '—'} |")
    growth = []
    for impl, label in (("waypoint", "Waypoint"), ("langgraph", "LangGraph")):
        a, b = med[impl, "it50"], med[impl, "it200"]
        growth.append(f"{label} {b / a:.2f}×" if a and b else f"{label} —")
    lines += ["", "Bytes/step at 400 steps ÷ at 100 steps (1 = flat): " + ", ".join(growth) + "."]
    return "\n".join(lines)


def _b(v: float | None) -> str:
    return "—" if v is None else f"{v:,.0f}"


def failed_jobs(results: dict[tuple, dict[str, Cell]]) -> list[str]:
    """Jobs that reported an error (B5's exactly-once check reports its failures as one)."""
    out = []
    for (module, impl, case), cells in results.items():
        cell = cells.get("*")
        if cell is not None and cell.status and cell.status.startswith("error"):
            out.append(f"{module} {impl} {case}: {cell.status}")
    return out


def compile_bytecode(log) -> None:
    """Write Waypoint's .pyc files first, as `pip install .` does for every installed package.

    LangGraph's modules in site-packages were compiled when pip installed them; an editable checkout
    compiles on first import, which PYTHONDONTWRITEBYTECODE (set on these machines) forbids, so
    without this step every measured process would compile Waypoint's source from scratch.
    """
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    folders = [str(root / d) for d in ("engine", "stores", "middleware", "service", "cmd") if (root / d).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *folders], check=True)
    log("compiled Waypoint's bytecode (as an installed package would have it)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="separate process runs per cell (default 5)")
    p.add_argument("--only", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    p.add_argument("--quiet", action="store_true", help="no per-process progress on stderr")
    args = p.parse_args(argv)
    picked = [w.strip().lower() for w in args.only.split(",") if w.strip()]
    unknown = [w for w in picked if w not in ROWS]
    if unknown:
        p.error(f"unknown workload(s) {unknown}; choose from {list(ROWS)}")
    rows = [r for w in picked for r in ROWS[w]]

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    compile_bytecode(log)
    t0 = time.perf_counter()
    results = run_rows(rows, args.runs, log)
    text = header() + "\n\n" + render_table(rows, results, args.runs)
    if "b2" in picked:
        text += "\n\n" + growth_curve(results)
    text += f"\nTotal bench time: {time.perf_counter() - t0:.0f} s.\n"
    failures = failed_jobs(results)
    if failures:
        text += "\n" + "\n".join(f"**FAIL** {f}" for f in failures) + "\n"
    print(text)
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr, flush=True)
    path = write_results(text)
    log(f"written to {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
