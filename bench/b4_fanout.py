"""B4: one node fans out to 50 parallel trivial nodes, then a join. Figure: µs per parallel task.

µs per parallel task = total invoke time / 50.

Cases:
  nostore      Waypoint: no store, trigger="all" (DAG) · LangGraph: no checkpointer
  nostore-any  Waypoint: no store, trigger="any" (Pregel supersteps) · LangGraph: same as nostore
  async-nodes  no store, every node an `async def`, both sides awaited with ainvoke (Waypoint
               trigger="all"). Apples to apples: with plain functions LangGraph's sync invoke runs the
               50 parallel nodes on a thread pool, while Waypoint calls them inline on the event loop.
  sqlite       Waypoint: SQLiteStore(file), durability="step", trigger="all" ·
               LangGraph: SqliteSaver(file), durability="sync" (each as shipped: Waypoint WAL +
               synchronous=NORMAL, LangGraph WAL + sqlite's default FULL)
  sqlite-normal, sqlite-full  as sqlite with both on synchronous=NORMAL / FULL (bench/_stores.py)

Waypoint: "fan" returns its input; p0..p49 each return {f"k{i}": x} (dicts merge by key union at
fan-in); "join" returns len(merged dict) == 50.
LangGraph: 50 static nodes after "fan", each appending to an `Annotated[list, operator.add]`
channel; "join" has one edge from all 50 (`add_edge([...50 names...], "join")`), so it waits for all.

    python -m bench.b4_fanout --impl waypoint --case nostore
"""

from __future__ import annotations

import operator
from typing import Annotated, Any

from bench._harness import Target, child_main
from bench._stores import langgraph_saver, waypoint_store

WIDTH = 50
CASES = ("nostore", "nostore-any", "ainvoke", "async-nodes", "sqlite", "sqlite-normal", "sqlite-full")
ASYNC_CASES = ("ainvoke", "async-nodes")


def _expect(value: Any, want: Any) -> None:
    if value != want:
        raise AssertionError(f"wrong result: {value!r} != {want!r}")


def make_waypoint(case: str, api: str) -> Target:
    store, close = waypoint_store(case if case.startswith("sqlite") else "nostore")
    from waypoint.engine import END, START, Graph

    g = Graph(name="b4")
    names = [f"p{i}" for i in range(WIDTH)]
    if case == "async-nodes":
        async def fan(x: int) -> int:
            return x

        def part(i: int) -> Any:
            async def p(x: int) -> dict[str, int]:
                return {f"k{i}": x}
            return p

        async def join(d: dict[str, int]) -> int:
            return len(d)

        g.add_node("fan", fan)
        for i, name in enumerate(names):
            g.add_node(name, part(i))
        g.add_node("join", join)
    else:
        g.add_node("fan", lambda x: x)
        for i, name in enumerate(names):
            g.add_node(name, lambda x, i=i: {f"k{i}": x})
        g.add_node("join", lambda d: len(d))
    g.add_edge(START, "fan")
    for name in names:
        g.add_edge("fan", name)
        g.add_edge(name, "join")
    g.add_edge("join", END)
    # max_steps is a Pregel-only option: the engine rejects it with trigger="all".
    opts: dict[str, Any] = {"trigger": "any", "max_steps": 200} if case == "nostore-any" else {"trigger": "all"}
    if store is not None:
        opts.update(store=store, durability="step")
    app = g.compile(**opts)

    def run_opts(i: int) -> dict[str, Any]:
        return {"checkpoint_id": f"b4-{i}"} if store is not None else {}

    if api == "async":
        call = lambda i: app.ainvoke(0, **run_opts(i))  # noqa: E731
    else:
        call = lambda i: app.invoke(0, **run_opts(i))  # noqa: E731
    return Target(call=call, divisor=WIDTH, check=lambda r: _expect(r, WIDTH), close=close)


def make_langgraph(case: str, api: str) -> Target:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class S(TypedDict, total=False):
        x: int
        out: Annotated[list, operator.add]
        n: int

    saver, close = langgraph_saver(case if case.startswith("sqlite") else "nostore", api)
    g = StateGraph(S)
    names = [f"p{i}" for i in range(WIDTH)]
    if case == "async-nodes":
        async def fan(s: S) -> dict[str, int]:
            return {"x": s["x"]}

        def part(i: int) -> Any:
            async def p(s: S) -> dict[str, list[int]]:
                return {"out": [i]}
            return p

        async def join(s: S) -> dict[str, int]:
            return {"n": len(s["out"])}

        g.add_node("fan", fan)
        for i, name in enumerate(names):
            g.add_node(name, part(i))
        g.add_node("join", join)
    else:
        g.add_node("fan", lambda s: {"x": s["x"]})
        for i, name in enumerate(names):
            g.add_node(name, lambda s, i=i: {"out": [i]})
        g.add_node("join", lambda s: {"n": len(s["out"])})
    g.add_edge(START, "fan")
    for name in names:
        g.add_edge("fan", name)
    g.add_edge(names, "join")
    g.add_edge("join", END)
    app = g.compile(checkpointer=saver)
    kw: dict[str, Any] = {"durability": "sync"} if saver is not None else {}

    def config(i: int) -> dict[str, Any]:
        return {"configurable": {"thread_id": f"b4-{i}"}}

    def check(r: dict[str, Any]) -> None:
        _expect((r["n"], sorted(r["out"])), (WIDTH, list(range(WIDTH))))

    if api == "async":
        call = lambda i: app.ainvoke({"x": 0}, config(i), **kw)  # noqa: E731
    else:
        call = lambda i: app.invoke({"x": 0}, config(i), **kw)  # noqa: E731
    return Target(call=call, divisor=WIDTH, check=check, close=close)


def make(impl: str, case: str, api: str) -> Target:
    return make_waypoint(case, api) if impl == "waypoint" else make_langgraph(case, api)


if __name__ == "__main__":
    child_main(make, CASES, "us_per_task", __doc__, async_cases=ASYNC_CASES)
