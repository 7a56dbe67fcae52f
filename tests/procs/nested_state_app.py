"""A graph whose state holds a model of the application's own that changes between deploys, for tests/test_migrate.py.

    python tests/procs/nested_state_app.py DB v1|v2 pause          # prints {"iid": ...}
    python tests/procs/nested_state_app.py DB v1|v2 resume IID     # prints {"out": ...} or {"error", "kind"}
    python tests/procs/nested_state_app.py DB v2 migrate           # update_state(item=Item(n=["seven"]))

`Item.n` is an `int` in v1 and a `list[str]` in v2; both are registered as "nested_state_app.Item", as two deploys
of one module would register them.
"""

from __future__ import annotations

import asyncio
import json
import sys

from pydantic import BaseModel

from waypoint.engine import END, START, Graph, GraphInterrupted, Interrupt, WaypointError, get_resume_context
from waypoint.engine.codec.serde import register_type
from waypoint.stores import SQLiteStore

db, version, phase, *rest = sys.argv[1:]


if version == "v1":
    class Item(BaseModel):
        n: int = 0
else:
    class Item(BaseModel):  # type: ignore[no-redef]
        n: list[str] = []
register_type(Item, name="nested_state_app.Item")


@register_type(name="nested_state_app.State")
class State(BaseModel):
    item: Item = Item()
    note: str = ""


def setup(x, state):
    state.item = Item(n=7)
    return x


def ask(x):
    if not get_resume_context()[0]:
        raise Interrupt({"question": "go on?"})
    return x + 1


async def main() -> dict:
    g = Graph(name="nested", state=State)
    g.add_node("setup", setup)
    g.add_node("ask", ask)
    g.add_edge(START, "setup")
    g.add_edge("setup", "ask")
    g.add_edge("ask", END)
    store = SQLiteStore(db)
    app = g.compile(store=store)
    try:
        if phase == "pause":
            try:
                await app.ainvoke(1, checkpoint_id="n1")
            except GraphInterrupted as paused:
                return {"iid": paused.info.contexts[0].id}
        if phase == "migrate":
            return {"origin": (await app.update_state("n1", {"item": Item(n=["seven"])})).origin}
        try:
            return {"out": await app.ainvoke(None, checkpoint_id="n1", resume={rest[0]: True})}
        except WaypointError as err:
            return {"error": str(err), "kind": type(err).__name__}
    finally:
        await store.close()


print(json.dumps(asyncio.run(main())))
