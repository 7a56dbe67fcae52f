"""B2: agent-like loop on a SQLite file with per-step durability; the state's message list grows.

A 2-node cycle: "model" appends a ~500-byte message ({"role", "content": 480 chars, "turn"}) to the
messages list, "tool" appends another, then a branch loops back to "model" until ITERATIONS rounds
are done (2 node-steps per iteration: 200 iterations = 400 steps).

- Waypoint: `Graph(state=Chat)` (a registered dataclass with `messages: list[Message]`, the message
  type Waypoint's agents store: ~500 bytes each), nodes append to `state.messages`; `SQLiteStore(file)`,
  `durability="step"`; `await app.ainvoke(...)`. Case `it200-dicts` stores plain dicts instead: dicts can
  change in place, so every step re-encodes the list to compare it (growth shows there).
- LangGraph: `StateGraph` with `messages: Annotated[list, operator.add]` (plain dicts), nodes return
  `{"messages": [msg]}`; `SqliteSaver(file)`, `durability="sync"`; sync `app.invoke(...)`.

Figures (one measured invoke per process, after a 3-iteration warm-up on another file):
  wall_ms              the whole invoke of the measured run
  bytes_per_step       database bytes at the end ÷ steps (2 × iterations). The store is closed first
                       (LangGraph: its connection), then `PRAGMA wal_checkpoint(TRUNCATE)` is run on
                       the file from a new connection; bytes = main file + any WAL left (0 after that)
  last10_over_first10  time of the last 10 iterations ÷ time of the first 10. An iteration is measured
                       between successive entries into "model" (model step + its checkpoint + tool step
                       + its checkpoint), so "first 10" = model entries 0→10 and "last 10" = entries
                       N-11→N-1 (the final round has no following model entry).
  first10_ms, last10_ms  the two numerator/denominator times
  median_last10_over_first10  the same windows, the median iteration of each (robust to one pause)

Cases (the number is the iteration count; the growth curve uses it50 / it100 / it200):
  it50, it100, it200  Waypoint SQLiteStore as shipped (WAL, synchronous=NORMAL) ·
                      LangGraph SqliteSaver as shipped (WAL, sqlite's default synchronous=FULL)
  it200-normal        as it200, both connections at synchronous=NORMAL (LangGraph: `PRAGMA
                      synchronous=NORMAL` run on the saver's connection)
  it200-full          as it200, both at synchronous=FULL (Waypoint: `SQLiteStore(synchronous="FULL")`)
  it3000, it3000-dicts  the long run (6,000 steps): does a step's cost grow with the history? (Waypoint
                      only: LangGraph's quadratic rewrite makes it impractical)
  …-reduce            the same graph written LangGraph's way: `messages: Annotated[list, add_messages]`,
                      nodes return `Update({"messages": [msg], ...})` instead of appending to the state

`--iters N` overrides a case's iteration count (`--case it200 --iters 3000` is `it3000`).

    python -m bench.b2_agent_loop --impl waypoint --case it200
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import operator
import os
import sqlite3
import statistics
import time
from pathlib import Path
from typing import Annotated, Any

from bench._harness import child_parser, emit, error_payload
from bench._stores import temp_db

CASES = ("it50", "it100", "it200", "it200-delta", "it200-normal", "it200-full", "it200-dicts", "it3000", "it3000-dicts",
         "it3000-reduce", "it3000-dicts-reduce")
WARMUP_ITERATIONS = 3
CONTENT = 480  # characters of content: the message is ~500 bytes once encoded


def parse_case(case: str) -> tuple[int, str, bool, bool]:
    """(iterations, synchronous setting or "" for the library's own default, dict messages?, reducers?)."""
    head, *flags = case.split("-")
    sync = next((f.upper() for f in flags if f in ("normal", "full")), "")
    return int(head.removeprefix("it")), sync, "dicts" in flags, "reduce" in flags


def msg(role: str, turn: int) -> dict[str, Any]:
    return {"role": role, "content": (role[0] * CONTENT), "turn": turn}


def db_bytes(path: Path) -> int:
    """File size after folding the WAL into the main file (the caller has closed its connections)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()
    wal = Path(str(path) + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def figures(wall_ns: int, stamps: list[int], iterations: int, size: int) -> dict[str, Any]:
    if len(stamps) != iterations:
        raise AssertionError(f"model ran {len(stamps)} times, expected {iterations}")
    first = stamps[10] - stamps[0]
    last = stamps[iterations - 1] - stamps[iterations - 11]
    each = [b - a for a, b in zip(stamps, stamps[1:])]
    steps = 2 * iterations
    return {
        "figures": {
            "wall_ms": wall_ns / 1e6,
            "bytes_per_step": size / steps,
            "last10_over_first10": last / first,
            "first10_ms": first / 1e6,
            "last10_ms": last / 1e6,
            # the same windows, each iteration's median: one pause of the machine (or of the garbage
            # collector) inside a 4 ms window does not decide it
            "median_last10_over_first10": statistics.median(each[-10:]) / statistics.median(each[:10]),
        },
        "steps": steps,
        "db_bytes": size,
    }


# --------------------------------------------------------------------------- Waypoint


def run_waypoint(iterations: int, sync: str, dicts: bool = False, reduce: bool = False) -> dict[str, Any]:
    from dataclasses import dataclass, field, make_dataclass

    from waypoint.engine import END, START, Graph, Message
    from waypoint.engine.codec.serde import register_type
    from waypoint.stores import SQLiteStore

    if reduce:  # imported only here, so the other cases also run against releases without reducers
        from waypoint.engine import Update, add_messages

    @register_type(name="bench.Chat")
    @dataclass
    class Chat:
        messages: list[Any] = field(default_factory=list)
        turns: int = 0

    if reduce:  # made with make_dataclass: the annotations must be objects (this module postpones them, and
        # a class made inside a function cannot have its string annotations resolved)
        ReducedChat = register_type(name="bench.ReducedChat")(make_dataclass("ReducedChat", [
            ("messages", Annotated[list[Any], add_messages], field(default_factory=list)), ("turns", int, 0)]))

    def message(role: str, turn: int) -> Any:
        if dicts:
            return msg(role, turn)
        return Message(role=role, content=role[0] * CONTENT, name=f"turn-{turn}",
                       tool_call_id=f"call_{turn}" if role == "tool" else None)

    def build(path: Path, n: int, stamps: list[int]) -> tuple[Any, Any]:
        g = Graph(name="b2", state=ReducedChat if reduce else Chat)

        def model(x: int, state: Any) -> Any:
            stamps.append(time.perf_counter_ns())
            if reduce:
                turn = state.turns + 1
                return Update({"messages": [message("assistant", turn)], "turns": turn}, output=turn)
            state.turns += 1
            state.messages.append(message("assistant", state.turns))
            return state.turns

        def tool(x: int, state: Any) -> Any:
            if reduce:
                return Update({"messages": [message("tool", state.turns)]}, output=x)
            state.messages.append(message("tool", state.turns))
            return x

        g.add_node("model", model)
        g.add_node("tool", tool)
        g.add_edge(START, "model")
        g.add_edge("model", "tool")
        g.add_branch("tool", lambda t: "model" if t < n else END, ends=["model", END])
        store = SQLiteStore(path, synchronous=sync) if sync else SQLiteStore(path)
        return g.compile(store=store, durability="step", max_steps=2 * n + 5), store

    async def main() -> dict[str, Any]:
        wpath, wclean = temp_db()
        try:  # warm-up on another file: lazy imports, first statements, codec caches
            app, store = build(wpath, WARMUP_ITERATIONS, [])
            await app.ainvoke(0, checkpoint_id="warm")
            await store.close()
        finally:
            wclean()
        path, clean = temp_db()
        try:
            stamps: list[int] = []
            app, store = build(path, iterations, stamps)
            gc.collect()
            t0 = time.perf_counter_ns()
            out = await app.ainvoke(0, checkpoint_id="b2")
            wall = time.perf_counter_ns() - t0
            snap = await app.get_run("b2")
            if out != iterations or len(snap.state.messages) != 2 * iterations \
                    or snap.meta.status != "completed":
                raise AssertionError(f"wrong result: out={out!r}, messages={len(snap.state.messages)}, "
                                     f"status={snap.meta.status}")
            await store.close()
            return figures(wall, stamps, iterations, db_bytes(path))
        finally:
            clean()

    return asyncio.run(main())


# --------------------------------------------------------------------------- LangGraph


def run_langgraph(iterations: int, sync: str, delta: bool = False) -> dict[str, Any]:
    """`delta`: the message list in LangGraph's `DeltaChannel` (its incremental history: only each step's writes
    are stored, a snapshot every 100 updates), instead of `operator.add`, which stores the whole list per step."""
    from typing import TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    if delta:  # the functional form: evaluated here (this module's annotations are strings)
        from langgraph.channels.delta import DeltaChannel

        appended = DeltaChannel(lambda state, writes: [*state, *(m for w in writes for m in w)])
        S = TypedDict("S", {"messages": Annotated[list, appended]})  # noqa: N806
    else:
        S = TypedDict("S", {"messages": Annotated[list, operator.add]})  # noqa: N806

    def build(path: Path, n: int, stamps: list[int], stack: contextlib.ExitStack) -> Any:
        def model(s: S) -> dict[str, Any]:
            stamps.append(time.perf_counter_ns())
            return {"messages": [msg("assistant", len(s["messages"]) // 2 + 1)]}

        def tool(s: S) -> dict[str, Any]:
            m = msg("tool", (len(s["messages"]) + 1) // 2)
            if delta:  # DeltaChannel turns role dicts into LangChain messages: a tool message needs its call's ID
                m["tool_call_id"] = f"call-{m['turn']}"
            return {"messages": [m]}

        g = StateGraph(S)
        g.add_node("model", model)
        g.add_node("tool", tool)
        g.add_edge(START, "model")
        g.add_edge("model", "tool")
        g.add_conditional_edges("tool", lambda s: "model" if len(s["messages"]) < 2 * n else END,
                                ["model", END])
        saver = stack.enter_context(SqliteSaver.from_conn_string(str(path)))
        if sync:
            saver.conn.execute(f"PRAGMA synchronous={sync}")
        return g.compile(checkpointer=saver)

    def config(thread: str, n: int) -> dict[str, Any]:
        return {"recursion_limit": 2 * n + 10, "configurable": {"thread_id": thread}}

    wpath, wclean = temp_db()
    try:
        with contextlib.ExitStack() as stack:
            app = build(wpath, WARMUP_ITERATIONS, [], stack)
            app.invoke({"messages": []}, config("warm", WARMUP_ITERATIONS), durability="sync")
    finally:
        wclean()
    path, clean = temp_db()
    try:
        stamps: list[int] = []
        with contextlib.ExitStack() as stack:
            app = build(path, iterations, stamps, stack)
            gc.collect()
            t0 = time.perf_counter_ns()
            out = app.invoke({"messages": []}, config("b2", iterations), durability="sync")
            wall = time.perf_counter_ns() - t0
        if len(out["messages"]) != 2 * iterations:
            raise AssertionError(f"wrong result: {len(out['messages'])} messages")
        return figures(wall, stamps, iterations, db_bytes(path))
    finally:
        clean()


def measure(impl: str, case: str, iters: int | None = None) -> dict[str, Any]:
    iterations, sync, dicts, reduce = parse_case(case)
    iterations = iters or iterations
    if impl == "langgraph" and iterations > 1000:  # quadratic: 3,000 iterations write ~9 GB
        return {"na": "LangGraph rewrites the whole list per step: too slow beyond 1,000 iterations"}
    if impl == "waypoint":
        sync = "" if sync == "NORMAL" else sync  # NORMAL is the store's default
        return run_waypoint(iterations, sync, dicts, reduce)
    sync = "" if sync == "FULL" else sync  # FULL is sqlite's (and so SqliteSaver's) default
    return run_langgraph(iterations, sync, delta="delta" in case.split("-"))


def main(argv: list[str] | None = None) -> None:
    parser = child_parser(CASES, __doc__)
    parser.add_argument("--iters", type=int, default=None, help="iterations (overrides the case's count)")
    args = parser.parse_args(argv)
    os.environ.setdefault("LANGSMITH_TRACING", "false")
    try:
        payload = measure(args.impl, args.case, args.iters)
    except Exception as exc:  # noqa: BLE001 - a benchmark reports, it does not crash the table
        if not args.json:
            import traceback

            traceback.print_exc()
        payload = error_payload(exc)
    emit(payload)


if __name__ == "__main__":
    main()
