"""B6: import cost in a fresh interpreter. Figures: wall ms of `python -c "<import>"`, peak RSS MB.

Cases:
  engine  Waypoint: `import waypoint.engine` · LangGraph: `from langgraph.graph import StateGraph`
  resume  what a resume from a SQLite file needs —
          Waypoint: `import waypoint.engine; from waypoint.stores import SQLiteStore` ·
          LangGraph: `from langgraph.graph import StateGraph; from langgraph.checkpoint.sqlite import SqliteSaver`

This process (itself fresh) runs the child once to warm the page cache, then times REPS children with
`time.perf_counter_ns` around `subprocess.run` (interpreter start-up included, as a user sees it) and
reports the median. Peak RSS is the warm-up child's own `VmHWM` (it appends a read of
/proc/self/status to the snippet). Not `getrusage(RUSAGE_CHILDREN).ru_maxrss`: Linux carries the
*parent's* high-water mark across fork+exec into the child's ru_maxrss, so a small import would read
as this benchmark process's ~20 MB. Off Linux it falls back to ru_maxrss, with that caveat.

    python -m bench.b6_import --impl langgraph --case engine
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time

from bench._harness import child_parser, emit, error_payload

CASES = ("engine", "resume")
REPS = 3
SNIPPETS = {
    ("waypoint", "engine"): "import waypoint.engine",
    ("waypoint", "resume"): "import waypoint.engine; from waypoint.stores import SQLiteStore",
    ("langgraph", "engine"): "from langgraph.graph import StateGraph",
    ("langgraph", "resume"): ("from langgraph.graph import StateGraph; "
                              "from langgraph.checkpoint.sqlite import SqliteSaver"),
}


HWM_SUFFIX = (
    "\nimport sys\n"
    "sys.stdout.write(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')))"
)


def _run(code: str) -> tuple[int, str]:
    t0 = time.perf_counter_ns()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    elapsed = time.perf_counter_ns() - t0
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise ImportError(lines[-1] if lines else f"exit code {proc.returncode}")
    return elapsed, proc.stdout


def _peak_rss_mb(code: str) -> float:
    """Run `code` once (the warm-up) and return its peak RSS in MiB."""
    if sys.platform.startswith("linux"):
        _, out = _run(code + HWM_SUFFIX)
        return int(out.split()[-2]) / 1024  # "VmHWM:   71008 kB"
    _run(code)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def measure(impl: str, case: str) -> dict:
    code = SNIPPETS[(impl, case)]
    try:
        rss_mb = _peak_rss_mb(code)  # also the warm-up (page cache, .pyc files)
    except ImportError as exc:
        if impl == "waypoint" and case == "resume" and "SQLiteStore" in str(exc):
            return {"na": str(exc)}
        raise
    samples = [_run(code)[0] for _ in range(REPS)]
    return {"figures": {"import_ms": statistics.median(samples) / 1e6, "peak_rss_mb": rss_mb},
            "reps": REPS, "code": code}


def main(argv: list[str] | None = None) -> None:
    args = child_parser(CASES, __doc__).parse_args(argv)
    try:
        payload = measure(args.impl, args.case)
    except Exception as exc:  # noqa: BLE001
        payload = error_payload(exc)
    emit(payload)


if __name__ == "__main__":
    main()
