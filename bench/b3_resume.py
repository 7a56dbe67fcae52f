"""B3: cold resume in a NEW process. Figures: resume ms excluding imports, import ms, peak RSS MB.

A 3-node graph prepare -> ask -> finish whose middle node pauses:
- Waypoint: `ask` raises `Interrupt` unless `get_resume_context()` says it is the resume target;
  `SQLiteStore(file)`, `durability="step"`; resumed with `ainvoke(None, checkpoint_id=..,
  resume={interrupt_id: "yes"})`.
- LangGraph: `ask` calls `langgraph.types.interrupt(...)`; `SqliteSaver(file)`, `durability="sync"`;
  resumed with `invoke(Command(resume="yes"), config)`.

One measurement = process 1 (`bench/_b3_child.py pause`) runs until the pause on a fresh SQLite file and
exits; then process 2 (`bench/_b3_child.py resume`), a new interpreter, opens the file and resumes to
completion. Measured inside process 2:
  import_ms      first line of the script (after `import sys, time`) to after the imports the resume
                 needs (Waypoint: asyncio, waypoint.engine, waypoint.stores.SQLiteStore; LangGraph:
                 langgraph.graph.StateGraph, langgraph.types.Command/interrupt, SqliteSaver).
                 Interpreter start-up is not in it (see `spawn_to_imported_ms`); modules either side
                 loads lazily during the first invoke are counted in resume_ms, not here
                 (`modules_at_import` vs `modules_after_resume` show how many)
  resume_ms      after the imports until the resume invoke returns: open the store/connection, build
                 and compile the graph, (Waypoint: start the event loop,) run the resume invoke
  peak_rss_mb    process 2's VmHWM from /proc/self/status at its end
This process repeats that REPS times (the first pause process also warms the page cache) and reports
the medians; the parent takes medians of those across separate runs.

Cases:
  sqlite         as shipped: Waypoint WAL + synchronous=NORMAL · LangGraph WAL + sqlite default FULL
  sqlite-normal  both at synchronous=NORMAL (LangGraph: PRAGMA on the saver's connection)
  sqlite-full    both at synchronous=FULL (Waypoint: SQLiteStore(synchronous="FULL"))

    python -m bench.b3_resume --impl waypoint --case sqlite
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench._harness import ROOT, child_parser, emit, error_payload
from bench._stores import temp_db

CASES = ("sqlite", "sqlite-normal", "sqlite-full")
REPS = 3
CHILD = ROOT / "bench" / "_b3_child.py"
FIGURES = ("resume_ms", "import_ms", "peak_rss_mb", "resume_lazy_ms", "import_public_ms")
NOTES = ("open_ms", "compile_ms", "invoke_ms", "invoke_lazy_ms", "spawn_to_imported_ms", "process_ms",
         "modules_at_import", "lazy_module_count")


def _child(*args: str) -> tuple[dict[str, Any], int, int]:
    """Run the child script; (its JSON line, spawn time ns (wall clock), elapsed ns)."""
    env = {**os.environ, "LANGSMITH_TRACING": "false"}
    spawn_wall = time.time_ns()
    t0 = time.perf_counter_ns()
    proc = subprocess.run([sys.executable, str(CHILD), *args], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=120)
    elapsed = time.perf_counter_ns() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise RuntimeError(err[-1] if err else f"child exit code {proc.returncode}, no output")
    payload = json.loads(lines[-1])
    if "error" in payload:
        raise RuntimeError(f"{args[0]} process: {payload['error']}")
    return payload, spawn_wall, elapsed


def _pause_then_resume(impl: str, sync: str, preload: list[str]) -> dict[str, Any]:
    db, cleanup = temp_db()
    try:
        paused, _, _ = _child("pause", impl, sync, str(db))
        res, spawn_wall, elapsed = _child("resume", impl, sync, str(db), paused["iid"], ",".join(preload))
    finally:
        cleanup()
    res["spawn_to_imported_ms"] = (res.pop("imported_wall_ns") - spawn_wall) / 1e6
    res["process_ms"] = elapsed / 1e6
    return res


def measure(impl: str, case: str) -> dict[str, Any]:
    sync = {"sqlite": "", "sqlite-normal": "NORMAL", "sqlite-full": "FULL"}[case]
    if impl == "waypoint" and sync == "NORMAL":
        sync = ""  # the store's default
    if impl == "langgraph" and sync == "FULL":
        sync = ""  # sqlite's default
    samples: dict[str, list[float]] = {k: [] for k in FIGURES + NOTES}
    for _ in range(REPS):
        # A: only the public imports before the clock; whatever the library loads lazily lands in the resume
        lazy = _pause_then_resume(impl, sync, [])
        # B: the same, with A's lazily loaded modules imported up front (timed as imports)
        full = _pause_then_resume(impl, sync, lazy["lazy_modules"])
        for k in ("resume_ms", "import_ms", "peak_rss_mb", "open_ms", "compile_ms", "invoke_ms",
                  "spawn_to_imported_ms", "process_ms", "modules_at_import"):
            samples[k].append(float(full[k]))
        samples["resume_lazy_ms"].append(lazy["resume_ms"])
        samples["import_public_ms"].append(lazy["import_ms"])
        samples["invoke_lazy_ms"].append(lazy["invoke_ms"])
        samples["lazy_module_count"].append(len(lazy["lazy_modules"]))
        samples.setdefault("leftover_lazy", []).append(len(full["lazy_modules"]))
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {"figures": {k: med[k] for k in FIGURES}, "reps": REPS,
            **{k: round(med[k], 3) for k in NOTES + ("leftover_lazy",)}}


def main(argv: list[str] | None = None) -> None:
    args = child_parser(CASES, __doc__).parse_args(argv)
    try:
        payload = measure(args.impl, args.case)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not crash the table
        payload = error_payload(exc)
    emit(payload)


if __name__ == "__main__":
    main()
