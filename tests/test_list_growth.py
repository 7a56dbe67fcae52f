"""A long list of items that can change in place, declared without a reducer (issue 34 §3): a step costs what it
appended, not the list's length, and an item changed in place is still stored — at the latest once the list grew
by an eighth, or when the run stops — and from then on at every step (engine/keep/checkpoint.py, path 4)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from waypoint.engine import END, START, Graph, RunCancelled
from waypoint.engine.codec import Serializer
from waypoint.stores import SQLiteStore

LENGTH = 700


class Counting(Serializer):
    """Counts the list items each `pack` encodes: what a write of a list part looked at."""

    def __init__(self) -> None:
        super().__init__()
        self.items = 0

    def pack(self, value: Any, *, root: str = "value") -> bytes:
        if type(value) is list:
            self.items += len(value)
        return super().pack(value, root=root)


def build(db, edits: dict[int, Any], serializer: Serializer | None = None):
    """Appends one dict a step until the list holds LENGTH; at a length in `edits`, that edit runs first."""
    g = Graph(name="long-dicts", state=lambda: {"items": []})

    def grow(n: int, state: dict[str, Any]) -> int:
        if n in edits:
            edits[n](state["items"])
        state["items"].append({"n": n, "tags": []})
        return n + 1

    g.add_node("grow", grow)
    g.add_edge(START, "grow")
    g.add_branch("grow", lambda n: "grow" if n < LENGTH else END, ends=["grow", END])
    return g.compile(store=SQLiteStore(db), max_steps=LENGTH + 5, serializer=serializer)


async def stored_lists(app, checkpoint_id: str, first: int, last: int) -> dict[int, list[Any]]:
    """The list each version from `first` to `last` holds, read back from the file."""
    return {v: (await app.get_run(checkpoint_id, version=v)).state["items"] for v in range(first, last + 1)}


async def test_a_long_list_of_dicts_costs_what_a_step_appended(tmp_path):
    counting = Counting()
    app = build(tmp_path / "cost.db", {}, counting)
    assert await app.ainvoke(0, checkpoint_id="c") == LENGTH
    # Every step encoding the whole list would look at ~LENGTH² / 2 = 245,000 items; the full comparisons made
    # while the list is short, and then once per eighth it grew, look at about 110,000 (~64,000 of them while it
    # is under 256, where each write compares it in full).
    assert counting.items < 0.6 * LENGTH * LENGTH / 2, counting.items
    snap = await build(tmp_path / "cost.db", {}).get_run("c")
    assert snap.state["items"] == [{"n": n, "tags": []} for n in range(LENGTH)]


async def test_an_item_changed_in_place_is_stored_once_the_list_grew_by_an_eighth_then_at_every_step(tmp_path):
    db = tmp_path / "edit.db"

    def tag(items: list[Any]) -> None:
        items[5]["tags"].append("edited")  # written long ago, changed in place

    def tag_again(items: list[Any]) -> None:
        items[6]["tags"].append("again")

    app = build(db, {400: tag, 500: tag_again})
    assert await app.ainvoke(0, checkpoint_id="e") == LENGTH
    versions = await stored_lists(app, "e", 400, 510)
    at = {len(items): items for items in versions.values()}
    first = min(n for n, items in at.items() if items[5]["tags"] == ["edited"])
    assert first <= 401 + 401 // 8 + 1, f"the edit at length 400 was first stored at length {first}"
    assert all(items[5]["tags"] == ["edited"] for n, items in at.items() if n >= first)
    # seen changed in place once: compared in full at each write from then on, so the next edit is in its own step
    assert at[501][6]["tags"] == ["again"]
    final = (await app.get_run("e")).state["items"]
    assert final[5]["tags"] == ["edited"] and final[6]["tags"] == ["again"] and len(final) == LENGTH


@pytest.mark.parametrize("change", ["replace", "insert", "remove"])
async def test_a_change_to_the_list_itself_is_stored_in_the_step_that_made_it(tmp_path, change):
    edits = {
        "replace": lambda items: items.__setitem__(7, {"n": "new", "tags": []}),
        "insert": lambda items: items.insert(0, {"n": "first", "tags": []}),
        "remove": lambda items: items.pop(3),
    }
    app = build(tmp_path / "list.db", {400: edits[change]})
    assert await app.ainvoke(0, checkpoint_id="l") == LENGTH
    expected = [{"n": n, "tags": []} for n in range(401)]
    edits[change](expected)
    versions = await stored_lists(app, "l", 399, 403)
    assert expected in versions.values(), f"no version holds the list as the step that changed it left it ({change})"


async def test_an_in_place_change_made_just_before_the_run_stops_is_stored(tmp_path):
    def tag(items: list[Any]) -> None:
        items[0]["tags"].append("last")

    app = build(tmp_path / "stop.db", {LENGTH - 1: tag})
    assert await app.ainvoke(0, checkpoint_id="s") == LENGTH
    assert (await app.get_run("s")).state["items"][0]["tags"] == ["last"]


def _marking(db, stop):
    """A long dict list with no reducer; each step after the first marks the next item done in place (after its "side
    effect", journalled in `done`), and every step appends a log line; `stop(n)` runs after step n's work (a
    shutdown, a cancel)."""
    done: list[int] = []
    g = Graph(name="marking", state=lambda: {"items": [{"i": i, "done": False} for i in range(300)]})

    async def work(n: int, state: dict[str, Any]) -> int:
        items = state["items"]
        if n:  # the first step only appends: from then on the list is presumed to only grow
            todo = next(k for k, item in enumerate(items) if not item["done"])
            done.append(todo)
            items[todo]["done"] = True  # in place
        items.append({"i": len(items), "done": True})
        await stop(n)
        return n + 1

    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_branch("work", lambda n: "work" if n < 12 else END, ends=["work", END])
    return g.compile(store=SQLiteStore(db), max_steps=40), done


async def test_a_shutdown_at_a_step_boundary_stores_what_its_finished_steps_changed_in_place(tmp_path):
    from waypoint.engine import ProcessStopping, Shutdown

    db, shutdown = tmp_path / "stop.db", Shutdown()

    async def stop(n: int) -> None:
        if n == 5:
            shutdown.request()  # the run stops before its next step, its lease given up

    app, done = _marking(db, stop)
    with shutdown.scope(), pytest.raises(ProcessStopping):
        await app.ainvoke(0, checkpoint_id="s")
    assert done == [0, 1, 2, 3, 4]
    snap = await app.get_run("s")
    assert snap.meta.status == "running" and [item["i"] for item in snap.state["items"][:6] if item["done"]] == \
        [0, 1, 2, 3, 4]
    again, redone = _marking(db, lambda n: asyncio.sleep(0))
    assert await again.ainvoke(None, checkpoint_id="s") == 12
    assert redone == list(range(5, 11))  # the next process does the rest, nothing twice


async def test_a_cancel_at_a_step_boundary_stores_what_its_finished_steps_changed_in_place(tmp_path):
    import logging

    import threading

    db, seen = tmp_path / "cancel.db", threading.Event()  # set on the lease thread

    class Asked(logging.Handler):  # the moment this process reads the request (engine/keep/lease.py logs it)
        def emit(self, record: logging.LogRecord) -> None:
            if "cancel requested" in record.getMessage():
                seen.set()

    async def stop(n: int) -> None:
        if n == 5:
            await app.cancel("c", when="after_step", by="tester")
            assert await asyncio.to_thread(seen.wait, 30)

    handler, logger = Asked(), logging.getLogger("waypoint")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        app, done = _marking(db, stop)
        with pytest.raises(RunCancelled):
            await app.ainvoke(0, checkpoint_id="c")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert done == [0, 1, 2, 3, 4]
    snap = await app.get_run("c")
    assert snap.meta.error == "cancelled" and [item["i"] for item in snap.state["items"][:6] if item["done"]] == \
        [0, 1, 2, 3, 4]
