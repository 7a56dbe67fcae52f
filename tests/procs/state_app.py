"""One version of a graph whose state class changes between deploys, for tests/test_deploys.py.

    python tests/procs/state_app.py DB VERSION pause [legacy]   # prints {"iid": ...}; legacy: no state schema kept
    python tests/procs/state_app.py DB VERSION resume IID       # prints {"out": ...} or {"error": ..., "kind": ...}
    python tests/procs/state_app.py DB VERSION migrate JSON     # update_state(run-1, JSON): {"origin", "status"}

Versions of the state `Tally` (registered under one name in each): v1 (`count: int`, `note: str`), v2-type
(`count: str`), v2-removed (no `note`), v2-added (a `tags` list with a default), v2-required (an `owner` without a
default); model-v1 / model-v2-type: the same as a pydantic model; `<version>-dag`: the graph with trigger="all".
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import field, make_dataclass

from pydantic import BaseModel, create_model

from waypoint.engine import END, START, Graph, GraphInterrupted, Interrupt, WaypointError, get_resume_context
from waypoint.engine.codec.serde import register_type
from waypoint.stores import SQLiteStore

FIELDS = {
    "v1": [("count", int, 0), ("note", str, "")],
    "v2-type": [("count", str, ""), ("note", str, "")],
    "v2-removed": [("count", int, 0)],
    "v2-added": [("count", int, 0), ("note", str, ""), ("tags", list[str], None)],
    "v2-required": [("owner", str), ("count", int, 0), ("note", str, "")],
}


def state_class(version: str) -> type:
    if version.startswith("model"):
        count = int if version == "model-v1" else str
        cls = create_model("Tally", count=(count, count()), note=(str, ""), __base__=BaseModel)
    else:
        specs = [(n, t) if len(rest) == 0 else (n, t, field(default_factory=list) if rest[0] is None else
                                                field(default=rest[0])) for n, t, *rest in FIELDS[version]]
        cls = make_dataclass("Tally", specs)
    return register_type(cls, name="tests.deploys.Tally")


def bump(x, state):
    state.note = "bumped"
    return x


def ask(x):
    if not get_resume_context()[0]:
        raise Interrupt({"question": "go on?"})
    return x


def finish(x, state):
    return f"{state.count!r} {getattr(state, 'note', None)!r}"


def build(version: str) -> Graph:
    g = Graph(name="tally", state=state_class(version))
    g.add_node("bump", bump)
    g.add_node("ask", ask)
    g.add_node("finish", finish)
    g.add_edge(START, "bump")
    g.add_edge("bump", "ask")
    g.add_edge("ask", "finish")
    g.add_edge("finish", END)
    return g


def graph(version: str, store: SQLiteStore):
    if version.endswith("-dag"):  # the same graph as a DAG, which resumes only under the fingerprint that wrote it
        return build(version[:-4]).compile(store=store, trigger="all")
    return build(version).compile(store=store)


def tally_v1() -> Graph:
    """v1, for `waypoint runs ... --graph state_app:tally_v1`."""
    return build("v1")


def tally_v2_type() -> Graph:
    """v2-type, for `waypoint runs migrate ... --graph state_app:tally_v2_type`."""
    return build("v2-type")


async def main(db: str, version: str, phase: str, arg: str | None) -> dict:
    store = SQLiteStore(db)
    try:
        if phase == "pause" and arg == "legacy":  # as a Waypoint that kept no state schema wrote it
            from waypoint.engine.shape import GraphShape

            GraphShape.state_schema = property(lambda self: None)  # type: ignore[assignment]
        app = graph(version, store)
        try:
            if phase == "pause":
                try:
                    await app.ainvoke(1, checkpoint_id="run-1")
                except GraphInterrupted as paused:
                    return {"iid": paused.info.contexts[0].id}
                return {"error": "the run did not pause"}
            if phase == "migrate":
                meta = await app.update_state("run-1", json.loads(arg or "{}"))
                return {"origin": meta.origin, "status": meta.status, "version": meta.version}
            return {"out": await app.ainvoke(None, checkpoint_id="run-1", resume={arg: True})}
        except WaypointError as err:
            return {"error": str(err), "kind": type(err).__name__}
    finally:
        await store.close()


if __name__ == "__main__":
    db, version, phase, *rest = sys.argv[1:]
    print(json.dumps(asyncio.run(main(db, version, phase, rest[0] if rest else None))))
