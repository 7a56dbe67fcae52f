"""Benchmark harness: one fresh process per measurement, medians and min–max across processes.

Two halves, both standard-library only (so importing this costs nothing measurable):

* **Child side** (`child_main`, `emit`): what a workload module runs as
  ``python -m bench.<module> --impl waypoint|langgraph --case <case> --json``. It builds the graph,
  warms up once, times several invocations with `time.perf_counter_ns`, and prints ONE JSON line:
  ``{"figures": {...}}``, ``{"na": reason}`` or ``{"error": "Type: message"}``.
* **Parent side** (`Row`, `run_rows`, `render_table`): runs every (module, impl, case) job N times,
  interleaving jobs so a noisy neighbour hits both columns alike, and renders one markdown table:
  workload | case | Waypoint | LangGraph | ratio (Waypoint/LangGraph) | target.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
IMPLS = ("waypoint", "langgraph", "dbos", "floor")
PEERS = {"langgraph": "LangGraph", "dbos": "DBOS", "floor": "bare fsync'd commit"}
CHILD_TIMEOUT_S = 180


# --------------------------------------------------------------------------- child side


class NotAvailable(Exception):
    """The implementation lacks what this case needs (reported as "n/a", not as an error)."""


@dataclass
class Target:
    """One benchmarkable invocation, as built by a workload's ``make(impl, case, api)``.

    ``call(i)`` runs invocation number ``i`` (sync, or returns an awaitable when ``api == "async"``);
    ``check(result)`` raises if the result is wrong; the reported figure is
    median-ns-per-call / ``divisor`` / 1000 (µs per step or per task).
    """

    call: Callable[[int], Any]
    divisor: int
    check: Callable[[Any], None] | None = None
    close: Callable[[], Any] | None = None  # may return an awaitable
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Budget:
    """How many timed invocations a process makes: at least `min_reps`, more while under `seconds`."""

    min_reps: int = 5
    max_reps: int = 500
    seconds: float = 1.0


def emit(payload: dict[str, Any]) -> None:
    """Print the one JSON line the parent reads."""
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def error_payload(exc: BaseException) -> dict[str, Any]:
    first = (str(exc).strip().splitlines() or [""])[0]
    return {"error": f"{type(exc).__name__}: {first}".rstrip(": ")}


def _summary(samples_ns: list[int], divisor: int) -> dict[str, Any]:
    med = statistics.median(samples_ns)
    return {"per_unit_us": med / divisor / 1000, "per_invoke_ms": med / 1e6, "reps": len(samples_ns)}


class _Samples(list):
    """Timings of one target, with the stop rule both loops share (at least min_reps, then until the
    time budget or max_reps runs out)."""

    def __init__(self, budget: Budget) -> None:
        super().__init__()
        self.budget = budget
        self.deadline = time.perf_counter() + budget.seconds

    def more(self) -> bool:
        b = self.budget
        return len(self) < b.min_reps or (time.perf_counter() < self.deadline and len(self) < b.max_reps)


def _checked(target: Target, res: Any) -> None:
    if target.check:
        target.check(res)


def _measure_sync(target: Target, budget: Budget) -> list[int]:
    _checked(target, target.call(0))  # warm-up
    gc.collect()
    samples, res = _Samples(budget), None
    while samples.more():  # the sync call is timed bare: no coroutine around it
        t0 = time.perf_counter_ns()
        res = target.call(len(samples) + 1)
        samples.append(time.perf_counter_ns() - t0)
    _checked(target, res)
    return list(samples)


async def _measure_async(target: Target, budget: Budget) -> list[int]:
    _checked(target, await target.call(0))  # warm-up
    gc.collect()
    samples, res = _Samples(budget), None
    while samples.more():
        t0 = time.perf_counter_ns()
        res = await target.call(len(samples) + 1)
        samples.append(time.perf_counter_ns() - t0)
    _checked(target, res)
    return list(samples)


async def _maybe_await(x: Any) -> Any:
    return await x if asyncio.iscoroutine(x) or isinstance(x, asyncio.Future) else x


def _run_target(make: Callable[..., Target], impl: str, case: str, api: str, budget: Budget) -> dict[str, Any]:
    if api == "async":

        async def amain() -> dict[str, Any]:
            target = make(impl, case, api)  # built inside the loop: async stores may need one
            try:
                samples = await _measure_async(target, budget)
            finally:
                if target.close:
                    await _maybe_await(target.close())
            return {**_summary(samples, target.divisor), **target.notes}

        return asyncio.run(amain())
    target = make(impl, case, api)
    try:
        samples = _measure_sync(target, budget)
    finally:
        if target.close:
            result = target.close()
            if asyncio.iscoroutine(result):
                asyncio.run(result)
    return {**_summary(samples, target.divisor), **target.notes}


def child_parser(cases: tuple[str, ...], description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--impl", choices=IMPLS, required=True)
    p.add_argument("--case", choices=cases, required=True)
    p.add_argument("--api", choices=("default", "sync", "async"), default="default",
                   help="default: both call sync invoke (Waypoint's ainvoke puts sync nodes on a thread)")
    p.add_argument("--json", action="store_true", help="print one JSON line (what the harness reads)")
    return p


def child_main(make: Callable[..., Target], cases: tuple[str, ...], metric: str, description: str,
               budget: Budget = Budget(), argv: list[str] | None = None,
               async_cases: tuple[str, ...] = (), waypoint_api: str = "sync") -> None:
    """Entry point of a workload module: build, warm up, time, print the result.

    `async_cases` always use the async API (e.g. cases whose nodes are `async def`); `waypoint_api` is the
    Waypoint side's default (an agent's `Runner` is async only).
    """
    args = child_parser(cases, description).parse_args(argv)
    # Both sides call sync invoke: the nodes are sync functions, which Waypoint's ainvoke runs on a thread
    # (so they never stall a shared event loop) and its invoke runs on the run's own loop.
    api = args.api if args.api != "default" else (waypoint_api if args.impl == "waypoint" else "sync")
    if args.case in async_cases:
        api = "async"
    try:
        out = _run_target(make, args.impl, args.case, api, budget)
        payload: dict[str, Any] = {"figures": {metric: out.pop("per_unit_us")}, "api": api, **out}
    except NotAvailable as exc:
        payload = {"na": str(exc)}
    except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not crash the table
        if not args.json:
            traceback.print_exc()
        payload = error_payload(exc)
    if args.json:
        emit(payload)
    else:
        print(json.dumps(payload, indent=2))


# --------------------------------------------------------------------------- parent side


@dataclass(frozen=True)
class Row:
    """One table row: `metric` from job (module, impl, case) for each column.

    ``wp_case`` / ``lg_case`` name the case each implementation runs (None: not applicable, shown "—"); the
    second column is ``peer`` (LangGraph unless the row says DBOS: B10). Rows sharing a (module, impl, case)
    share one job, so a peer's figure can be shown twice.
    """

    workload: str
    case: str
    module: str
    metric: str
    unit: str
    wp_case: str | None
    lg_case: str | None
    target: str = "—"
    peer: str = "langgraph"


@dataclass
class Cell:
    values: list[float] = field(default_factory=list)
    status: str | None = None  # "n/a", "not installed", "error: ..." — wins over values when set


def langgraph_installed() -> bool:
    return importlib.util.find_spec("langgraph") is not None


def peer_installed(peer: str) -> bool:
    return peer == "floor" or importlib.util.find_spec(peer) is not None  # "floor": the standard library's sqlite3


def dbos_version() -> str:
    try:
        from importlib.metadata import version

        return f"dbos {version('dbos')}"
    except Exception:  # noqa: BLE001
        return "not installed"


def langgraph_version() -> str:
    try:
        from importlib.metadata import version

        return (f"langgraph {version('langgraph')}, langgraph-checkpoint {version('langgraph-checkpoint')}, "
                f"langgraph-checkpoint-sqlite {version('langgraph-checkpoint-sqlite')}")
    except Exception:  # noqa: BLE001
        return "not installed"


def run_child(module: str, impl: str, case: str) -> dict[str, Any]:
    """Run one fresh measurement process and return its parsed JSON line (or an error payload)."""
    cmd = [sys.executable, "-m", module, "--impl", impl, "--case", case, "--json"]
    env = {**os.environ, "LANGSMITH_TRACING": "false"}
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {CHILD_TIMEOUT_S}s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return {"error": (err[-1] if err else f"exit code {proc.returncode}, no output")[:160]}


def run_rows(rows: list[Row], runs: int, log: Callable[[str], None] = lambda s: None) -> dict[tuple, dict[str, Cell]]:
    """Run every job `runs` times (interleaved) and return {(module, impl, case): {metric: Cell}}."""
    jobs: list[tuple[str, str, str]] = []
    for r in rows:
        for impl, case in (("waypoint", r.wp_case), (r.peer, r.lg_case)):
            if case is not None and (r.module, impl, case) not in jobs:
                jobs.append((r.module, impl, case))
    results: dict[tuple, dict[str, Cell]] = {j: {} for j in jobs}
    status: dict[tuple, str] = {}
    for j in jobs:
        if j[1] != "waypoint" and not peer_installed(j[1]):
            status[j] = "not installed"
    for run in range(1, runs + 1):
        for job in jobs:
            if job in status:  # n/a, not installed or failed: one answer is enough
                continue
            t0 = time.perf_counter()
            payload = run_child(*job)
            log(f"[run {run}/{runs}] {job[0]} {job[1]:9s} {job[2]:12s} {time.perf_counter() - t0:5.1f}s "
                f"{json.dumps(payload.get('figures') or payload)}")
            if "na" in payload:
                status[job] = "n/a"
            elif "error" in payload:
                status[job] = "error: " + payload["error"]
            else:
                for metric, value in payload["figures"].items():
                    results[job].setdefault(metric, Cell()).values.append(float(value))
    for job, st in status.items():
        results[job] = {"*": Cell(status=st)}
    return results


def _fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _cell_text(cell: Cell | None, unit: str) -> tuple[str, float | None]:
    if cell is None:
        return "—", None
    if cell.status:
        text = cell.status.replace("|", "/")
        return (text if len(text) <= 90 else text[:89] + "…"), None
    if not cell.values:
        return "error: no figure", None
    med = statistics.median(cell.values)
    return f"{_fmt(med)} {unit} ({_fmt(min(cell.values))}–{_fmt(max(cell.values))})", med


def _lookup(results: dict[tuple, dict[str, Cell]], module: str, impl: str, case: str | None,
            metric: str) -> Cell | None:
    if case is None:
        return None
    cells = results.get((module, impl, case), {})
    return cells.get("*") or cells.get(metric) or Cell(status="error: no figure")


def _ratio_text(wp: float | None, lg: float | None, target: str) -> str:
    if wp is None or lg is None or lg == 0:
        return "—"
    r = wp / lg
    text = f"{r:.0f}" if r >= 10 else f"{r:.2g}"
    if target.startswith("≤"):
        try:
            text += " ✓" if r <= float(target.lstrip("≤ ").split()[0]) else " ✗"
        except ValueError:
            pass
    return text


def render_table(rows: list[Row], results: dict[tuple, dict[str, Cell]], runs: int) -> str:
    """One table per peer (LangGraph first, then DBOS), in the order the rows came."""
    lines: list[str] = []
    for peer in dict.fromkeys(r.peer for r in rows):
        name = PEERS.get(peer, peer)
        if lines:
            lines.append("")
        lines += [f"| workload | case | Waypoint | {name} | ratio (Waypoint/{name}) | target |", "|---|---|---|---|---|---|"]
        for r in (r for r in rows if r.peer == peer):
            wp_text, wp = _cell_text(_lookup(results, r.module, "waypoint", r.wp_case, r.metric), r.unit)
            lg_text, lg = _cell_text(_lookup(results, r.module, peer, r.lg_case, r.metric), r.unit)
            ratio = _ratio_text(wp, lg, r.target)
            lines.append(f"| {r.workload} | {r.case} | {wp_text} | {lg_text} | {ratio} | {r.target} |")
    lines.append("")
    lines.append(f"Each cell: median of {runs} separate process runs (min–max). Lower is better.")
    return "\n".join(lines)


def write_results(text: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "latest.md"
    path.write_text(text + "\n", encoding="utf-8")
    return path
