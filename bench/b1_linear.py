"""B1: linear graph of 100 trivial nodes, each adds 1 to a counter; one invoke. Figure: µs per node-step.

Cases:
  nostore  Waypoint: no store, default trigger ("any", Pregel) · LangGraph: no checkpointer
  ainvoke  as nostore, both through `ainvoke` (sync nodes: Waypoint runs each on a thread, LangGraph in its executor)
  memory   Waypoint: MemoryStore, durability="step" · LangGraph: InMemorySaver, durability="sync"
  sqlite   Waypoint: SQLiteStore(file), durability="step" · LangGraph: SqliteSaver(file), durability="sync"
           (each as shipped: Waypoint WAL + synchronous=NORMAL, LangGraph WAL + sqlite's default FULL)
  sqlite-normal, sqlite-full  as sqlite with both on synchronous=NORMAL / FULL (bench/_stores.py)

    python -m bench.b1_linear --impl waypoint --case nostore
"""

from __future__ import annotations

from typing import Any

from bench._harness import Target, child_main
from bench._stores import langgraph_saver, waypoint_store

N_NODES = 100
CASES = ("nostore", "ainvoke", "memory", "sqlite", "sqlite-normal", "sqlite-full")
ASYNC_CASES = ("ainvoke",)


def _expect(value: Any, want: Any) -> None:
    if value != want:
        raise AssertionError(f"wrong result: {value!r} != {want!r}")


def make_waypoint(case: str, api: str) -> Target:
    store, close = waypoint_store("nostore" if case == "ainvoke" else case)  # first: a missing store class is "n/a", not an error
    from waypoint.engine import END, START, Graph

    g = Graph(name="b1")
    for i in range(N_NODES):
        g.add_node(f"n{i}", lambda x: x + 1)
    g.add_edge(START, "n0")
    for i in range(N_NODES - 1):
        g.add_edge(f"n{i}", f"n{i + 1}")
    g.add_edge(f"n{N_NODES - 1}", END)
    opts: dict[str, Any] = {"max_steps": 200}
    if store is not None:
        opts.update(store=store, durability="step")
    app = g.compile(**opts)

    def run_opts(i: int) -> dict[str, Any]:
        return {"checkpoint_id": f"b1-{i}"} if store is not None else {}

    if api == "async":
        call = lambda i: app.ainvoke(0, **run_opts(i))  # noqa: E731
    else:
        call = lambda i: app.invoke(0, **run_opts(i))  # noqa: E731
    return Target(call=call, divisor=N_NODES, check=lambda r: _expect(r, N_NODES), close=close)


def make_langgraph(case: str, api: str) -> Target:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class S(TypedDict):
        n: int

    def step(s: S) -> dict[str, int]:
        return {"n": s["n"] + 1}

    saver, close = langgraph_saver("nostore" if case == "ainvoke" else case, api)
    g = StateGraph(S)
    for i in range(N_NODES):
        g.add_node(f"n{i}", step)
    g.add_edge(START, "n0")
    for i in range(N_NODES - 1):
        g.add_edge(f"n{i}", f"n{i + 1}")
    g.add_edge(f"n{N_NODES - 1}", END)
    app = g.compile(checkpointer=saver)
    kw: dict[str, Any] = {"durability": "sync"} if saver is not None else {}

    def config(i: int) -> dict[str, Any]:
        # recursion_limit defaults to 25 supersteps: a 100-node chain needs more.
        return {"recursion_limit": 1000, "configurable": {"thread_id": f"b1-{i}"}}

    if api == "async":
        call = lambda i: app.ainvoke({"n": 0}, config(i), **kw)  # noqa: E731
    else:
        call = lambda i: app.invoke({"n": 0}, config(i), **kw)  # noqa: E731
    return Target(call=call, divisor=N_NODES, check=lambda r: _expect(r, {"n": N_NODES}), close=close)


def make(impl: str, case: str, api: str) -> Target:
    return make_waypoint(case, api) if impl == "waypoint" else make_langgraph(case, api)


if __name__ == "__main__":
    child_main(make, CASES, "us_per_step", __doc__, async_cases=ASYNC_CASES)
