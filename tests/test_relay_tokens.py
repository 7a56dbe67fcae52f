"""Tokens of runs executed elsewhere (issue 33 §1): a `waypoint worker` executes a streaming agent, `waypoint serve`
processes that do not execute it follow it over SSE, and every token reaches a reader once — across a reconnect to
a second service with `Last-Event-ID` — while a reader that fell too far behind gets a snapshot. Real processes,
a real SQLite file shared by them, a real Postgres server. Also the relayed log's store contract: numbering,
fencing on who holds the run, trimming."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from service_support import ServeProcess, wait_until  # noqa: E402
from test_service_workers import Stream, spawn_worker  # noqa: E402


def _serve(tmp: Path, desk: Path, db: str) -> ServeProcess:
    return ServeProcess(tmp, agents="desk_agent:talk", db=db, args=("--queue",), env={"DESK_DIR": str(desk)})


def _tokens(stream: Stream) -> list[str]:
    with stream.cond:
        return [d["text"] for _t, k, d in stream.events if k == "token"]


def _relayed_count(db: str, pg: Any, cid: str) -> int:
    """The newest relayed number of run `cid`, read straight from the database."""
    if db.startswith("postgresql"):
        from pg import database_of

        try:
            return pg.sql("SELECT COALESCE(MAX(n), 0) FROM waypoint_run_events WHERE checkpoint_id = $1", cid,
                          db=database_of(db))[0][0]
        except Exception:  # noqa: BLE001 - not migrated yet
            return 0
    try:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT COALESCE(MAX(n), 0) FROM waypoint_run_events WHERE checkpoint_id = ?",
                                (cid,)).fetchone()[0]
    except sqlite3.Error:
        return 0


def _words(first: int, last: int) -> list[str]:
    return [f"w{i} " for i in range(first, last)]


def _worker_ready(db: str, pg: Any) -> bool:
    if db.startswith("postgresql"):
        from pg import database_of

        try:
            return pg.sql("SELECT COUNT(*) FROM waypoint_workers WHERE graph = 'talk'", db=database_of(db))[0][0] > 0
        except Exception:  # noqa: BLE001
            return False
    try:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT COUNT(*) FROM waypoint_workers WHERE graph = 'talk'").fetchone()[0] > 0
    except sqlite3.Error:
        return False


@pytest.fixture(params=["sqlite", "postgres"])
def shared_db(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "runs.db"), None
    pg = request.getfixturevalue("pg")
    return request.getfixturevalue("pg_url"), pg


def test_a_workers_tokens_reach_a_reader_once_across_a_reconnect_to_another_service(shared_db, tmp_path, procs):
    db, pg = shared_db
    desk = tmp_path / "desk"
    desk.mkdir()
    procs.append(spawn_worker(db, desk, tmp_path, graphs="desk_agent:talk_compiled"))
    wait_until(lambda: _worker_ready(db, pg), 60, "the worker")
    with _serve(tmp_path, desk, db) as a, _serve(tmp_path, desk, db) as b, a.client() as c:
        started = c.post("/runs", json={"agent": "talk", "input": "0-20 @g1 20-40 @g2 40-60", "checkpoint_id": "tok-1"})
        assert started.status_code == 201, started.text
        first = Stream(a, "/runs/tok-1/events", started.json()["last_event_id"])
        first.wait_for("token", lambda d: d["text"] == "w19 ")
        assert _tokens(first) == _words(0, 20)
        assert all(d["run_path"] == ["talk"] for _t, k, d in first.events if k == "token")
        left_at = first.ids[-1]
        first.close()
        first.thread.join(10)
        assert "." in left_at, left_at  # the relayed number travels in the ID
        (desk / "g1").touch()  # 20 more tokens while nobody reads
        wait_until(lambda: _relayed_count(db, pg, "tok-1") >= 40, 30, "tokens w20-w39 relayed")
        second = Stream(b, "/runs/tok-1/events", left_at)  # another service: it never saw the local ID
        assert second.wait_for("snapshot")["status"] == "running"
        second.wait_for("token", lambda d: d["text"] == "w39 ")
        (desk / "g2").touch()
        end = second.wait_for("end")
        assert end["status"] == "completed", end
        message = second.wait_for("message")
        assert message["content"] == "".join(_words(0, 60))
        assert _tokens(first) + _tokens(second) == _words(0, 60)  # every token once: no gap, no repeat
        kinds = second.kinds()
        assert kinds.index("token") > kinds.index("snapshot") and max(
            i for i, k in enumerate(kinds) if k == "token") < kinds.index("message")  # never a token after its message
        second.close()


def test_a_reader_too_far_behind_gets_a_snapshot_and_then_what_happens_next(tmp_path, procs):
    from waypoint.stores._relay_sql import KEEP

    db = str(tmp_path / "runs.db")
    desk = tmp_path / "desk"
    desk.mkdir()
    procs.append(spawn_worker(db, desk, tmp_path, graphs="desk_agent:talk_compiled"))
    wait_until(lambda: _worker_ready(db, None), 60, "the worker")
    many = KEEP + 100
    with _serve(tmp_path, desk, db) as a, _serve(tmp_path, desk, db) as b, a.client() as c:
        started = c.post("/runs", json={"agent": "talk", "input": f"0-5 @g1 5-{many} @g2 {many}-{many + 5}",
                                        "checkpoint_id": "far-1"})
        assert started.status_code == 201, started.text
        first = Stream(a, "/runs/far-1/events", started.json()["last_event_id"])
        first.wait_for("token", lambda d: d["text"] == "w4 ")
        left_at = first.ids[-1]
        first.close()
        first.thread.join(10)
        (desk / "g1").touch()
        wait_until(lambda: _relayed_count(db, None, "far-1") >= many, 60, "the tokens relayed")
        second = Stream(b, "/runs/far-1/events", left_at)
        assert second.wait_for("snapshot")["status"] == "running"
        (desk / "g2").touch()
        assert second.wait_for("end")["status"] == "completed"
        assert _tokens(second) == _words(many, many + 5)  # trimmed ones are not half-given: the snapshot, then live
        second.close()


# --- the relayed log's store contract ------------------------------------------------------------------------


async def test_relayed_events_are_numbered_fenced_on_the_holder_and_trimmed(store):
    from waypoint.engine import END, START, Graph
    from waypoint.engine.errors import LeaseLost
    from waypoint.stores._relay_sql import KEEP

    if True:
        g = Graph(name="g")
        g.add_node("a", lambda x: x)
        g.add_edge(START, "a")
        g.add_edge("a", END)
        app = g.compile(store=store)
        metas: list[Any] = []

        class Seen:
            def on_checkpoint(self, event):
                metas.append(event.meta)

        await app.ainvoke(1, checkpoint_id="r", callbacks=[Seen()])
        running = next(m for m in metas if m.status == "running")
        owner, inc = running.lease_owner, running.created_at
        # the run just ended under this owner: its last events still go in (the tail of its last step)
        assert await store.append_events("r", [("token", json.dumps({"text": "a"}))], incarnation=inc, base=1,
                                         holder=owner) == [1]
        with pytest.raises(LeaseLost):  # anyone else: never
            await store.append_events("r", [("token", "{}")], incarnation=inc, base=1, holder="someone-else")
        with pytest.raises(LeaseLost):  # another incarnation of the ID: never
            await store.append_events("r", [("token", "{}")], incarnation=inc + 1, base=1, holder=owner)
        batch = [("token", json.dumps({"text": str(i)})) for i in range(KEEP + 5)]
        for at in range(0, len(batch), 1000):
            await store.append_events("r", batch[at:at + 1000], incarnation=inc, base=1, holder=owner)
        oldest, newest, rows = await store.read_events("r", incarnation=inc, after=0, limit=10)
        assert newest == KEEP + 6 and oldest == newest - KEEP + 1  # trimmed to the newest KEEP
        assert [r[0] for r in rows] == list(range(oldest, oldest + 10))
        _o, _n, tail = await store.read_events("r", incarnation=inc, after=newest - 2, limit=10)
        assert [(n, base, kind, json.loads(d)) for n, base, kind, d in tail] == [
            (newest - 1, 1, "token", {"text": str(KEEP + 3)}), (newest, 1, "token", {"text": str(KEEP + 4)})]
        _o, _n, other = await store.read_events("r", incarnation=inc + 1, after=0, limit=10)
        assert other == []
        with pytest.raises(ValueError):
            await store.append_events("r", [("token", "x" * (70 * 1024))], incarnation=inc, base=1, holder=owner)


# --- the relay in the executing process --------------------------------------------------------------------


class _Words:
    """Streams "a ", "b ", "c " (one model call, no tools)."""

    name = "words"

    async def generate(self, messages, **_):
        from waypoint.engine import Message

        return Message.assistant("a b c ")

    async def stream(self, messages, **_):
        from waypoint.engine import Message

        for word in ("a ", "b ", "c "):
            yield Message.assistant(word)


async def test_a_relay_writes_a_model_calls_tokens_before_its_step_and_a_failure_never_fails_the_run(caplog):
    from waypoint.engine import ChatModelAgent
    from waypoint.engine.errors import StoreUnavailable
    from waypoint.stores import MemoryStore
    from waypoint.stores.relay import Relay

    store = MemoryStore()
    app = ChatModelAgent(name="w", model=_Words()).compile(store=store, streaming=True)
    relay = Relay(store, "ok-1", app.name, every=60.0)  # no timed flush: only the model call's end writes
    await app.ainvoke("hi", checkpoint_id="ok-1", callbacks=[relay])
    (head,) = await store.history("ok-1", limit=1)
    _o, _n, rows = await store.read_events("ok-1", incarnation=head.created_at)  # written before the run ended
    await relay.aclose()
    assert [json.loads(d) for _n, _b, _k, d in rows] == [{"text": t, "run_path": ["w"]} for t in ("a ", "b ", "c ")]
    assert relay.relayed == 3

    class Down(MemoryStore):
        async def append_events(self, *args, **kwargs):
            raise StoreUnavailable("the database went away")

    down = Down()
    app = ChatModelAgent(name="w", model=_Words()).compile(store=down, streaming=True)
    relay = Relay(down, "down-1", app.name)
    with caplog.at_level("WARNING", logger="waypoint.worker"):
        out = await app.ainvoke("hi", checkpoint_id="down-1", callbacks=[relay])
        await relay.aclose()
    assert out.content == "a b c "  # the run is unharmed
    assert any("run 'down-1'" in r.getMessage() and "went away" in r.getMessage() for r in caplog.records)


async def test_a_relay_that_lost_the_run_stops_relaying_and_says_so(caplog):
    from waypoint.engine import ChatModelAgent
    from waypoint.stores import MemoryStore
    from waypoint.stores.relay import Relay

    store = MemoryStore()
    app = ChatModelAgent(name="w", model=_Words()).compile(store=store, streaming=True)
    relay = Relay(store, "lost-1", app.name)
    relay.on_checkpoint(type("E", (), {"data": 1, "meta": None})())
    await app.ainvoke("hi", checkpoint_id="lost-1", callbacks=[relay])
    relay.holder = "a-process-that-never-held-it"
    relay.on_chunk(type("E", (), {"node_path": ("model",), "data": __import__("waypoint.engine", fromlist=["Message"])
                                  .Message.assistant("late")})())
    with caplog.at_level("WARNING", logger="waypoint.worker"):
        await relay.aclose()
    (head,) = await store.history("lost-1", limit=1)
    _o, _n, rows = await store.read_events("lost-1", incarnation=head.created_at)
    assert "late" not in "".join(d for *_x, d in rows)
    assert any("run 'lost-1'" in r.getMessage() and "no longer relayed" in r.getMessage() for r in caplog.records)


def test_tokens_of_a_run_another_service_executes_reach_a_reader_of_this_one_once(tmp_path, procs):
    """No queue: service A executes the run, service B (same SQLite file) only follows it from the store."""
    db = str(tmp_path / "runs.db")
    desk = tmp_path / "desk"
    desk.mkdir()
    args = {"agents": "desk_agent:talk", "db": db, "env": {"DESK_DIR": str(desk)}}
    with ServeProcess(tmp_path, **args) as a, ServeProcess(tmp_path, **args) as b, a.client() as c:
        started = c.post("/runs", json={"agent": "talk", "input": "0-20 @g1 20-40", "checkpoint_id": "tok-a"})
        assert started.status_code == 201, started.text
        local = Stream(a, "/runs/tok-a/events", started.json()["last_event_id"])
        local.wait_for("token", lambda d: d["text"] == "w19 ")
        wait_until(lambda: _relayed_count(db, None, "tok-a") >= 20, 30, "w0-w19 relayed by service A")
        elsewhere = Stream(b, "/runs/tok-a/events")  # B executes nothing: the tokens come from the relayed log
        assert elsewhere.wait_for("snapshot")["status"] == "running"
        (desk / "g1").touch()
        assert elsewhere.wait_for("end")["status"] == "completed"
        assert elsewhere.wait_for("message")["content"] == "".join(_words(0, 40))
        assert _tokens(elsewhere) == _words(20, 40)  # the ones after it came: each once, none before its snapshot
        assert _tokens(local) == _words(0, 40)
        local.close()
        elsewhere.close()
