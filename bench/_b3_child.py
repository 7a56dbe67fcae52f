"""B3's two processes (run as a script by bench.b3_resume, never imported by the harness).

    python bench/_b3_child.py pause  <impl> <sync> <db>          # run until the middle node pauses
    python bench/_b3_child.py resume <impl> <sync> <db> <iid> [m1,m2,...]   # NEW process: resume

The optional module list is imported right after the public imports (and timed with them): the
modules an earlier resume loaded lazily during its invoke, so that resume_ms then excludes ALL imports.

`sync` is "" (the library's default) or a `PRAGMA synchronous` value. Both print one JSON line.

Nothing but `sys` and `time` is imported before the resume process's first clock reading, so
`import_ms` is every import the resume needs (asyncio included for Waypoint: its API is async).
The graph is built identically by both processes (same names, same structure):

  prepare -> ask -> finish;  input 1;  "ask" pauses with {"q": "ok?"}; resumed with "yes";
  result "yes:2"
"""

import sys
import time

T_START = time.perf_counter()


def waypoint_graph(sync: str, db: str):
    from waypoint.engine import END, START, Graph, Interrupt, get_resume_context
    from waypoint.stores import SQLiteStore

    def ask(x):
        is_target, has_data, data = get_resume_context()
        if not is_target:
            raise Interrupt({"q": "ok?", "x": x})
        return {"x": x, "answer": data}

    t0 = time.perf_counter()
    store = SQLiteStore(db, synchronous=sync) if sync else SQLiteStore(db)
    t1 = time.perf_counter()
    g = Graph(name="b3")
    g.add_node("prepare", lambda x: x + 1)
    g.add_node("ask", ask)
    g.add_node("finish", lambda d: f"{d['answer']}:{d['x']}")
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "ask")
    g.add_edge("ask", "finish")
    g.add_edge("finish", END)
    app = g.compile(store=store, durability="step")
    t2 = time.perf_counter()
    return app, store, t1 - t0, t2 - t1


def langgraph_graph(sync: str, db: str, stack):
    from typing import TypedDict

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    class S(TypedDict, total=False):
        x: int
        answer: str
        out: str

    def ask(s):
        return {"answer": interrupt({"q": "ok?", "x": s["x"]})}

    t0 = time.perf_counter()
    saver = stack.enter_context(SqliteSaver.from_conn_string(db))
    if sync:
        saver.conn.execute(f"PRAGMA synchronous={sync}")
    t1 = time.perf_counter()
    g = StateGraph(S)
    g.add_node("prepare", lambda s: {"x": s["x"] + 1})
    g.add_node("ask", ask)
    g.add_node("finish", lambda s: {"out": f"{s['answer']}:{s['x']}"})
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "ask")
    g.add_edge("ask", "finish")
    g.add_edge("finish", END)
    app = g.compile(checkpointer=saver)
    t2 = time.perf_counter()
    return app, t1 - t0, t2 - t1


CONFIG = {"configurable": {"thread_id": "b3"}}


def pause(impl: str, sync: str, db: str) -> dict:
    if impl == "waypoint":
        import asyncio

        from waypoint.engine import GraphInterrupted

        async def run() -> str:
            app, store, _, _ = waypoint_graph(sync, db)
            try:
                await app.ainvoke(1, checkpoint_id="b3")
            except GraphInterrupted as exc:
                return exc.info.contexts[0].id
            finally:
                await store.close()
            raise AssertionError("the run did not pause")

        return {"iid": asyncio.run(run())}
    import contextlib

    with contextlib.ExitStack() as stack:
        app, _, _ = langgraph_graph(sync, db, stack)
        out = app.invoke({"x": 1}, CONFIG, durability="sync")
    if not out.get("__interrupt__"):
        raise AssertionError(f"the run did not pause: {out!r}")
    return {"iid": out["__interrupt__"][0].id}


def _preimport(names: list[str]) -> None:
    """Import, now, the modules a previous resume loaded lazily during its invoke (in their order)."""
    import importlib

    for name in names:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - e.g. a private name that is not importable by itself
                pass


def resume(impl: str, sync: str, db: str, iid: str, preload: list[str]) -> dict:
    if impl == "waypoint":
        import asyncio

        import waypoint.engine  # noqa: F401 - what the resume needs, timed as imports
        from waypoint.stores import SQLiteStore  # noqa: F401
        _preimport(preload)
        t_imported = time.perf_counter()
        t_imported_wall = time.time_ns()
        modules_imported = len(sys.modules)
        marks: dict = {}

        async def run():
            app, store, open_s, compile_s = waypoint_graph(sync, db)
            t_inv = time.perf_counter()
            out = await app.ainvoke(None, checkpoint_id="b3", resume={iid: "yes"})
            marks["done"] = time.perf_counter()
            marks.update(open=open_s, compile=compile_s, invoke=marks["done"] - t_inv)
            await store.close()
            return out

        out = asyncio.run(run())
    else:
        import contextlib

        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: F401 - timed as imports
        from langgraph.graph import StateGraph  # noqa: F401
        from langgraph.types import Command, interrupt  # noqa: F401
        _preimport(preload)
        t_imported = time.perf_counter()
        t_imported_wall = time.time_ns()
        modules_imported = len(sys.modules)
        marks = {}
        with contextlib.ExitStack() as stack:
            app, open_s, compile_s = langgraph_graph(sync, db, stack)
            t_inv = time.perf_counter()
            res = app.invoke(Command(resume="yes"), CONFIG, durability="sync")
            marks["done"] = time.perf_counter()
            marks.update(open=open_s, compile=compile_s, invoke=marks["done"] - t_inv)
        out = res.get("out")
    if out != "yes:2":
        raise AssertionError(f"wrong result after resume: {out!r}")
    with open("/proc/self/status") as f:
        hwm_kb = int(next(line for line in f if line.startswith("VmHWM")).split()[1])
    return {
        "import_ms": (t_imported - T_START) * 1e3,
        "resume_ms": (marks["done"] - t_imported) * 1e3,
        "open_ms": marks["open"] * 1e3,
        "compile_ms": marks["compile"] * 1e3,
        "invoke_ms": marks["invoke"] * 1e3,
        "peak_rss_mb": hwm_kb / 1024,
        "imported_wall_ns": t_imported_wall,
        "modules_at_import": modules_imported,
        "modules_after_resume": len(sys.modules),
        "lazy_modules": list(sys.modules)[modules_imported:],
    }


def main() -> None:
    phase, impl, sync, db, *rest = sys.argv[1:]
    try:
        if phase == "pause":
            payload = pause(impl, sync, db)
        else:
            payload = resume(impl, sync, db, rest[0], [n for n in (rest[1] if len(rest) > 1 else "").split(",") if n])
    except Exception as exc:  # noqa: BLE001
        payload = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}
    import json

    sys.stdout.write(json.dumps(payload) + "\n")


if __name__ == "__main__":
    main()
