"""What the ecosystem extras cost: import time, per-call overhead, and B1 with tracing on vs off.

    python -m bench.ecosystem --runs 5          # every measurement, 5 fresh processes each, interleaved
    python -m bench.ecosystem child b1:sqlite:on   # one measurement process, JSON out

Rows (each cell: median of the runs, min–max):

* import — a fresh interpreter that has imported `waypoint.engine` times what the extra adds:
  `OTelTracing` (+ the SDK's TracerProvider a user configures), `AnthropicChatModel` created (loads
  `anthropic`), the MCP client as a first connection loads it (`mcp.Client`); `OpenAIChatModel` for scale.
* B1 (100 trivial nodes, µs per node-step) with tracing off, on (`OTelTracing` as a callback, the SDK's
  TracerProvider with a BatchSpanProcessor to an exporter that drops spans: the export itself is off the
  run's path, as with OTLP), on without node spans (`node_spans=False`), and on with the trace sampled
  out (what most of a sampled production's runs cost); no store, MemoryStore, SQLite.
* per call — one model call / one tool call through `OTelTracing`'s wrappers vs the bare call (a model and
  a tool that return at once, so the figure is the overhead); one MCP tool call over stdio and streamable
  HTTP (the test server, tests/procs/mcp_server.py) vs the same tool as a local `@tool`; one model call of
  `AnthropicChatModel` vs `OpenAIChatModel` against local stdlib servers (tests/*_server.py).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
MCP_SERVER = TESTS / "procs" / "mcp_server.py"

IMPORTS = {
    "engine": "",
    "otel": "from waypoint.middleware import OTelTracing",
    "otel+sdk": "from waypoint.middleware import OTelTracing; from opentelemetry.sdk.trace import TracerProvider",
    "anthropic": "from waypoint.engine.models import AnthropicChatModel; "
                 "AnthropicChatModel('m', base_url='http://127.0.0.1:9', api_key='k')",
    "mcp": "from waypoint.engine.tools import MCPServerStdio; from mcp import Client",
    "openai": "from waypoint.engine.models import OpenAIChatModel; "
              "OpenAIChatModel('m', base_url='http://127.0.0.1:9/v1', api_key='k')",
}


# --------------------------------------------------------------------------- measurements (child side)

def measure_import(name: str) -> dict[str, float]:
    code = ("import time, json, waypoint.engine; t = time.perf_counter(); "
            f"{IMPORTS[name] or 'pass'}; print(json.dumps({{'ms': (time.perf_counter() - t) * 1000}}))")
    if name == "engine":
        code = ("import time, json; t = time.perf_counter(); import waypoint.engine; "
                "print(json.dumps({'ms': (time.perf_counter() - t) * 1000}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    return json.loads(out.stdout)


async def _timed(call: Any, reps: int) -> float:
    """Median µs of `await call()` over `reps` calls, after a warm-up."""
    for _ in range(min(reps, 20)):
        await call()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        await call()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000


def _tracing(node_spans: bool = True, sampled: bool = True) -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    from waypoint.middleware import OTelTracing

    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF)
    provider.add_span_processor(BatchSpanProcessor(Dropped(), max_queue_size=1 << 16))
    return OTelTracing(tracer_provider=provider, node_spans=node_spans)


async def measure_b1(case: str, mode: str) -> dict[str, float]:
    from bench._stores import waypoint_store
    from waypoint.engine import END, START, Graph

    store, close = waypoint_store(case)
    g = Graph(name="b1")
    for i in range(100):
        g.add_node(f"n{i}", lambda x: x + 1)
    g.add_edge(START, "n0")
    for i in range(99):
        g.add_edge(f"n{i}", f"n{i + 1}")
    g.add_edge("n99", END)
    app = g.compile(max_steps=200, **({"store": store, "durability": "step"} if store is not None else {}))
    callbacks = [] if mode == "off" else [_tracing(node_spans=mode != "nonode", sampled=mode != "unsampled")]
    counter = iter(range(10**9))

    async def call() -> None:
        opts = {"checkpoint_id": f"b1-{next(counter)}"} if store is not None else {}
        assert await app.ainvoke(0, callbacks=callbacks, **opts) == 100

    try:
        return {"us_per_step": await _timed(call, 60) / 100}
    finally:
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result


async def measure_b7(mode: str) -> dict[str, float]:
    """B7's workload (bench/b7_react.py: a ReAct agent, 20 iterations of two sync tools, SQLite per step) with
    `OTelTracing` in the agent's middlewares — where a user feels what tracing costs."""
    from bench import b7_react

    tracing = [] if mode == "off" else [_tracing(node_spans=mode != "nonode")]
    target = b7_react.make_waypoint("sqlite", "async", middlewares=tracing)
    counter = iter(range(10**9))

    async def call() -> None:
        target.check(await target.call(next(counter)))

    try:
        return {"ms_per_iteration": await _timed(call, 15) / b7_react.ITERATIONS / 1000}
    finally:
        result = target.close() if target.close is not None else None
        if asyncio.iscoroutine(result):
            await result


async def measure_wrappers(mode: str) -> dict[str, float]:
    from waypoint.engine import AgentContext, ToolContext
    from waypoint.engine.models import Message, Usage

    class Instant:
        name = "instant"

        async def generate(self, messages: Any, **_: Any) -> Message:
            return Message(role="assistant", content="ok", usage=Usage(prompt_tokens=3, completion_tokens=1,
                                                                         total_tokens=4), finish_reason="stop")

    async def endpoint(args: str) -> str:
        return "ok"

    model, ctx = Instant(), AgentContext(agent_name="a", state=None, checkpoint_id="c")
    tool_ctx = ToolContext(name="t", call_id="c1", checkpoint_id="c", idempotency_key="k" * 32)
    if mode == "on":
        tracing = _tracing()
        model = tracing.wrap_model(model, ctx)
        endpoint = tracing.wrap_invokable_tool_call(endpoint, tool_ctx)
    messages = [Message.user("hi")]
    return {"model_us": await _timed(lambda: model.generate(messages), 3000),
            "tool_us": await _timed(lambda: endpoint("{}"), 3000)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def measure_mcp(transport: str) -> dict[str, float]:
    from waypoint.engine import ToolContext, tool
    from waypoint.engine.tools import MCPServerStdio, MCPServerStreamableHTTP

    journal = Path(tempfile.mkdtemp(prefix="waypoint-bench-")) / "journal"
    ctx = ToolContext(name="add", call_id="c", checkpoint_id=None, idempotency_key="k")
    if transport == "local":
        @tool
        def add(a: int, b: int) -> int:
            """Add."""
            with journal.open("a") as fh:  # what the server's tool does too
                fh.write(f"add {a} {b}\n")
            return a + b

        return {"call_us": await _timed(lambda: add.invoke('{"a": 1, "b": 2}', ctx), 300)}
    proc = None
    if transport == "stdio":
        server: Any = MCPServerStdio(sys.executable, [str(MCP_SERVER), str(journal)])
    else:
        port = _free_port()
        proc = subprocess.Popen([sys.executable, str(MCP_SERVER), str(journal), "--http", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        server = MCPServerStreamableHTTP(f"http://127.0.0.1:{port}/mcp")
    try:
        (add,) = [t for t in await server.list_tools() if t.name == "add"]
        return {"call_us": await _timed(lambda: add.invoke('{"a": 1, "b": 2}', ctx), 200)}
    finally:
        await server.aclose()
        if proc is not None:
            proc.terminate()
            proc.wait()


async def measure_provider(provider: str) -> dict[str, float]:
    sys.path.insert(0, str(TESTS))
    from waypoint.engine.models import Message

    if provider == "anthropic":
        from anthropic_server import AnthropicServer

        from waypoint.engine.models import AnthropicChatModel

        server: Any = AnthropicServer()
        server.RequestHandlerClass.disable_nagle_algorithm = True  # else delayed ACKs add ~40 ms a call
        model: Any = AnthropicChatModel("m", base_url=server.base_url, api_key="k")
    else:
        from chat_server import ChatServer

        from waypoint.engine.models import OpenAIChatModel

        server = ChatServer()
        server.RequestHandlerClass.disable_nagle_algorithm = True
        model = OpenAIChatModel("m", base_url=server.base_url, api_key="k")
    server.push(*["ok"] * 400)
    messages = [Message.user("hi")]
    try:
        return {"call_us": await _timed(lambda: model.generate(messages), 200)}
    finally:
        server.replies.clear()
        server.close()


def child(what: str) -> dict[str, Any]:
    kind, _, rest = what.partition(":")
    if kind == "import":
        return measure_import(rest)
    if kind == "b1":
        case, mode = rest.split(":")
        return asyncio.run(measure_b1(case, mode))
    if kind == "b7":
        return asyncio.run(measure_b7(rest))
    if kind == "wrappers":
        return asyncio.run(measure_wrappers(rest))
    if kind == "mcp":
        return asyncio.run(measure_mcp(rest))
    if kind == "provider":
        return asyncio.run(measure_provider(rest))
    raise SystemExit(f"unknown measurement {what!r}")


# --------------------------------------------------------------------------- table (parent side)

JOBS = [*(f"import:{n}" for n in IMPORTS),
        *(f"b1:{case}:{mode}" for case in ("nostore", "memory", "sqlite") for mode in ("off", "on", "nonode", "unsampled")),
        "b7:off", "b7:on", "b7:nonode", "wrappers:off", "wrappers:on", "mcp:local", "mcp:stdio", "mcp:http", "provider:openai",
        "provider:anthropic"]


def run_jobs(runs: int, log: Any, jobs: list[str] = JOBS) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {j: {} for j in jobs}
    for n in range(runs):
        for job in jobs:  # interleaved: a noisy neighbour hits every row alike
            out = subprocess.run([sys.executable, "-m", "bench.ecosystem", "child", job], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise SystemExit(f"{job} failed: {out.stderr[-2000:]}")
            for key, value in json.loads(out.stdout.strip().splitlines()[-1]).items():
                results[job].setdefault(key, []).append(value)
            log(f"run {n + 1}/{runs} {job}")
    return results


def _cell(values: list[float], unit: str) -> str:
    med = statistics.median(values)
    fmt = (lambda v: f"{v:,.0f}") if med >= 100 else (lambda v: f"{v:.3g}")
    return f"{fmt(med)} {unit} ({fmt(min(values))}–{fmt(max(values))})"


def render(results: dict[str, dict[str, list[float]]]) -> str:
    med = {(j, k): statistics.median(v) for j, d in results.items() for k, v in d.items()}
    lines = ["| what | measured | figure | ratio |", "|---|---|---|---|"]
    base = med["import:engine", "ms"]
    lines.append(f"| import | `import waypoint.engine` (for scale) | {_cell(results['import:engine']['ms'], 'ms')} | — |")
    for name, label in (("otel", "`OTelTracing` (opentelemetry-api)"), ("otel+sdk", "`OTelTracing` + the SDK's "
                        "`TracerProvider`"), ("anthropic", "`AnthropicChatModel(...)` (anthropic, httpx2)"),
                        ("mcp", "the MCP client, as a first connection loads it (mcp)"),
                        ("openai", "`OpenAIChatModel(...)` (openai, for scale)")):
        lines.append(f"| import | {label}, after `waypoint.engine` | {_cell(results[f'import:{name}']['ms'], 'ms')} "
                     f"| {med[f'import:{name}', 'ms'] / base:.1f}× the engine's |")
    for case, label in (("nostore", "no store"), ("memory", "MemoryStore, step"), ("sqlite", "SQLite file, step")):
        off = med[f"b1:{case}:off", "us_per_step"]
        for mode, what in (("off", "tracing off"), ("on", "tracing on (run + node spans)"),
                           ("nonode", "tracing on, `node_spans=False`"),
                           ("unsampled", "tracing on, the trace sampled out (`ALWAYS_OFF` sampler)")):
            v = med[f"b1:{case}:{mode}", "us_per_step"]
            ratio = "1" if mode == "off" else f"{v / off:.2f}× off"
            lines.append(f"| B1 100 nodes, {label} | {what} | "
                         f"{_cell(results[f'b1:{case}:{mode}']['us_per_step'], 'µs/step')} | {ratio} |")
    off = med["b7:off", "ms_per_iteration"]
    for mode, what in (("off", "tracing off"), ("on", "tracing on (run, node, model and tool spans)"),
                       ("nonode", "tracing on, `node_spans=False`")):
        v = med[f"b7:{mode}", "ms_per_iteration"]
        lines.append(f"| B7 ReAct agent, 20 it., SQLite | {what} | {_cell(results[f'b7:{mode}']['ms_per_iteration'], 'ms/it.')}"
                     f" | {'1' if mode == 'off' else f'{v / off:.2f}× off'} |")
    for key, label in (("model_us", "one model call"), ("tool_us", "one tool call")):
        off, on = med["wrappers:off", key], med["wrappers:on", key]
        lines.append(f"| per call, OTelTracing | {label}: bare → traced | {off:.3g} → "
                     f"{_cell(results['wrappers:on'][key], 'µs')} | +{on - off:.3g} µs |")
    local = med["mcp:local", "call_us"]
    lines.append(f"| per call, MCP | the same tool as a local `@tool` | {_cell(results['mcp:local']['call_us'], 'µs')}"
                 " | — |")
    for transport in ("stdio", "http"):
        v = med[f"mcp:{transport}", "call_us"]
        lines.append(f"| per call, MCP | `add` over {'stdio' if transport == 'stdio' else 'streamable HTTP'} | "
                     f"{_cell(results[f'mcp:{transport}']['call_us'], 'µs')} | +{v - local:,.0f} µs |")
    openai = med["provider:openai", "call_us"]
    for provider in ("openai", "anthropic"):
        v = med[f"provider:{provider}", "call_us"]
        lines.append(f"| per call, model SDK | one `generate()` against a local stdlib server, {provider} | "
                     f"{_cell(results[f'provider:{provider}']['call_us'], 'µs')} | {v / openai:.2f}× openai |")
    return "\n".join(lines)


def header() -> str:
    from importlib.metadata import version

    versions = ", ".join(f"{p} {version(p)}" for p in ("opentelemetry-sdk", "mcp", "anthropic", "openai"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return "\n".join([f"- date: {dt.datetime.now().astimezone().isoformat(timespec='seconds')}",
                      f"- machine: {platform.platform()}, nproc {len(os.sched_getaffinity(0))}",
                      f"- python: {platform.python_implementation()} {platform.python_version()}",
                      f"- Waypoint at {commit.strip() or '?'}; {versions}"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", default="table", choices=["table", "child"])
    p.add_argument("what", nargs="?")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--only", default="", help="measure only the jobs starting with this (b1, import, mcp, ...): "
                                               "prints the figures, leaves the table file alone")
    args = p.parse_args()
    if args.command == "child":
        print(json.dumps(child(args.what)))
        return
    subprocess.run([sys.executable, "-m", "compileall", "-q", "engine", "stores", "middleware"], cwd=ROOT)
    started = time.perf_counter()
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.only:
        results = run_jobs(args.runs, log, [j for j in JOBS if j.startswith(args.only)])
        for job, figures in results.items():
            print(job, {k: _cell(v, "") for k, v in figures.items()})
        return
    results = run_jobs(args.runs, log)
    text = f"{header()}\n- total: {time.perf_counter() - started:.0f} s, {args.runs} runs per row\n\n{render(results)}\n"
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "ecosystem.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
