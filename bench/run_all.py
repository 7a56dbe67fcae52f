"""Run every benchmark side by side and print one markdown table (``make bench``).

    python -m bench.run_all                 # all workloads, 5 process runs per cell
    python -m bench.run_all --runs 7 --only b1,b4

Also writes the table, with the date/machine/version lines, to bench/results/latest.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time

from bench._harness import Row, langgraph_version, render_table, run_rows, write_results

ROWS: dict[str, list[Row]] = {
    "b1": [
        Row("B1 linear, 100 nodes", "no store", "bench.b1_linear", "us_per_step", "µs/step",
            "nostore", "nostore", "≤ 0.10"),
        Row("B1 linear, 100 nodes", "memory (WP MemoryStore step · LG InMemorySaver sync)", "bench.b1_linear",
            "us_per_step", "µs/step", "memory", "memory"),
        Row("B1 linear, 100 nodes", "SQLite file (WP step · LG SqliteSaver sync)", "bench.b1_linear",
            "us_per_step", "µs/step", "sqlite", "sqlite", "≤ 0.25"),
    ],
    "b4": [
        Row("B4 fan-out 50 + join", "no store (WP trigger=all)", "bench.b4_fanout", "us_per_task", "µs/task",
            "nostore", "nostore", "≤ 0.2"),
        Row("B4 fan-out 50 + join", "no store (WP trigger=any)", "bench.b4_fanout", "us_per_task", "µs/task",
            "nostore-any", "nostore", "≤ 0.2"),
        Row("B4 fan-out 50 + join", "no store, async def nodes, both ainvoke (WP trigger=all)", "bench.b4_fanout",
            "us_per_task", "µs/task", "async-nodes", "async-nodes", "≤ 0.2"),
        Row("B4 fan-out 50 + join", "SQLite file (WP step, trigger=all · LG SqliteSaver sync)", "bench.b4_fanout",
            "us_per_task", "µs/task", "sqlite", "sqlite"),
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
        "- APIs: Waypoint `await app.ainvoke(...)` inside one event loop; LangGraph sync `invoke(...)` "
        "(its faster path here: ainvoke measured slower in B1 and B4), except rows that say otherwise",
    ])


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

    t0 = time.perf_counter()
    results = run_rows(rows, args.runs, log)
    text = header() + "\n\n" + render_table(rows, results, args.runs)
    text += f"\nTotal bench time: {time.perf_counter() - t0:.0f} s.\n"
    print(text)
    path = write_results(text)
    log(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
