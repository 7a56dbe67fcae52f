"""Server-Sent Events: tokens arrive while the model still produces them, reconnection with Last-Event-ID
replays exactly what was missed, and a reader the log cannot serve (new, fallen behind, or after a
restart) gets a snapshot of the stored run first."""

from __future__ import annotations

import time

import httpx
import pytest

pytest.importorskip("fastapi")

from service_support import Served, approval_agent, events  # noqa: E402

from waypoint.service import create_app  # noqa: E402
from waypoint.stores import SQLiteStore  # noqa: E402

TOKEN = "sse-token-77aa-1b2c"


def test_the_first_token_arrives_before_the_run_ends(tmp_path):
    calls: list[str] = []
    delay = 0.15  # between chunks of 4 characters: "I will run that." is 4 chunks, ~0.45 s
    app = create_app(approval_agent(calls, delay=delay), SQLiteStore(tmp_path / "runs.db"), auth=TOKEN)
    with Served(app) as s, s.client(TOKEN) as c:
        r = c.post("/runs", json={"input": "uptime", "checkpoint_id": "live"})
        assert r.status_code == 201
        t0 = time.monotonic()
        seen = []
        with c.stream("GET", "/runs/live/events", headers={"Last-Event-ID": str(r.json()["last_event_id"])}) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            for ident, kind, data in events(resp):
                seen.append((kind, data, time.monotonic() - t0))
                if kind == "token" and len([k for k, *_ in seen if k == "token"]) == 1:
                    run = c.get("/runs/live").json()  # the run has not ended when the first token is here
                    assert run["status"] == "running" and run["active"]
                if kind == "end":
                    break
    kinds = [k for k, *_ in seen]
    assert kinds[0] == "started" and kinds[-2:] == ["interrupt", "end"]
    tokens = [(d["text"], t) for k, d, t in seen if k == "token"]
    assert "".join(text for text, _ in tokens) == "I will run that."
    first, end = tokens[0][1], seen[-1][2]
    assert end - first >= 2 * delay  # the first token came well before the end, not in one burst at the end
    message = next(d for k, d, _ in seen if k == "message")
    assert message["tool_calls"][0]["arguments"] == {"command": "uptime"}
    assert next(d for k, d, _ in seen if k == "tool_call") == {"call_id": "call_1", "name": "execute",
                                                               "arguments": {"command": "uptime"},
                                                               "arguments_json": '{"command": "uptime"}',
                                                               "run_path": ["ops"]}
    interrupt = next(d for k, d, _ in seen if k == "interrupt")
    assert interrupt["interrupts"][0]["tool"] == "execute" and interrupt["version"] == seen[-1][1]["version"]


def _collect(client, path: str, headers: dict, until: str) -> list[tuple[int, str, dict]]:
    """(the local part of each event's ID, kind, data): a run another service executed (or this one before a restart)
    relayed its tokens, so its IDs read `<local>.<relayed number>` (service/_events.py)."""
    out = []
    with client.stream("GET", path, headers=headers) as resp:
        for ident, kind, data in events(resp):
            out.append((int(ident.partition(".")[0]), kind, data))
            if kind == until:
                break
    return out


def test_reconnecting_with_last_event_id_replays_what_was_missed(tmp_path):
    calls: list[str] = []
    app = create_app(approval_agent(calls), SQLiteStore(tmp_path / "runs.db"), auth=TOKEN)
    with Served(app) as s, s.client(TOKEN) as c:
        assert c.post("/runs", json={"input": "uptime", "checkpoint_id": "re", "wait": True}).status_code == 201
        everything = _collect(c, "/runs/re/events", {"Last-Event-ID": "0"}, "snapshot")
        assert [k for _, k, _ in everything] == ["snapshot"]  # an ID the log never had: a snapshot
        # all events of the start, from the ID the start returned
        start_id = c.post("/runs", json={"input": "ls", "checkpoint_id": "re2"}).json()["last_event_id"]
        full = _collect(c, "/runs/re2/events", {"Last-Event-ID": str(start_id)}, "end")
        ids = [i for i, _, _ in full]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        # a reader that dropped after the 3rd event gets exactly the rest, in order, no snapshot
        rest = _collect(c, "/runs/re2/events", {"Last-Event-ID": str(ids[2])}, "end")
        assert [(i, k) for i, k, _ in rest] == [(i, k) for i, k, _ in full[3:]]
        # the same with ?after= (for clients that cannot set headers)
        assert [i for i, _, _ in _collect(c, f"/runs/re2/events?after={ids[2]}", {}, "end")] == ids[3:]


def test_a_new_reader_gets_a_snapshot_then_live_events(tmp_path):
    calls: list[str] = []
    app = create_app(approval_agent(calls), SQLiteStore(tmp_path / "runs.db"), auth=TOKEN)
    with Served(app) as s, s.client(TOKEN) as c:
        run = c.post("/runs", json={"input": "uptime", "checkpoint_id": "snap", "wait": True}).json()
        got = []
        with c.stream("GET", "/runs/snap/events") as resp:
            for ident, kind, data in events(resp):
                got.append((kind, data))
                if kind == "snapshot":
                    assert data["status"] == "interrupted" and data["interrupts"][0]["id"] == run["interrupts"][0]["id"]
                    shown = data["interrupts"][0]
                    r = c.post("/runs/snap/resume", json={"answers": [{"action": "approve", "interrupt_id": shown["id"],
                                                                       "digest": shown["digest"]}]})
                    assert r.status_code == 200
                if kind == "end":
                    break
    kinds = [k for k, _ in got]
    assert kinds[0] == "snapshot" and "started" in kinds and "decision" in kinds and kinds[-1] == "end"
    assert next(d for k, d in got if k == "tool_result")["content"] == "ran uptime"
    assert got[-1][1]["status"] == "completed"
    assert calls == ["uptime"]


def test_after_a_restart_a_reconnect_gets_the_stored_run(tmp_path):
    calls: list[str] = []
    db = tmp_path / "runs.db"
    with Served(create_app(approval_agent(calls), SQLiteStore(db), auth=TOKEN)) as s, s.client(TOKEN) as c:
        start_id = c.post("/runs", json={"input": "uptime", "checkpoint_id": "rs"}).json()["last_event_id"]
        last = _collect(c, "/runs/rs/events", {"Last-Event-ID": str(start_id)}, "end")[-1][0]
    with Served(create_app(approval_agent(calls), SQLiteStore(db), auth=TOKEN)) as s, s.client(TOKEN) as c:
        (snap,) = _collect(c, "/runs/rs/events", {"Last-Event-ID": str(last)}, "snapshot")
        assert snap[2]["status"] == "interrupted" and snap[2]["interrupts"][0]["tool"] == "execute"
        assert snap[0] > last  # IDs keep increasing across the restart


def test_the_service_stream_announces_pauses_of_every_run(tmp_path):
    app = create_app(approval_agent([]), SQLiteStore(tmp_path / "runs.db"), auth=TOKEN)
    with Served(app) as s, s.client(TOKEN) as c:
        seen = []
        with c.stream("GET", "/events") as resp:
            for _, kind, data in events(resp):
                seen.append((kind, data.get("checkpoint_id")))
                if kind == "snapshot":
                    for cid in ("a", "b"):
                        assert c.post("/runs", json={"input": "ls", "checkpoint_id": cid}).status_code == 201
                if [k for k, _ in seen].count("interrupt") == 2:
                    break
    assert {cid for k, cid in seen if k == "interrupt"} == {"a", "b"}


def test_a_reader_that_falls_behind_the_log_gets_a_snapshot():
    from waypoint.service._events import EventLog, stream

    async def scenario():
        log = EventLog(size=3)
        for n in range(3):
            log.append("token", {"n": n})
        reader = stream(log, log.ids[0], snapshot=lambda: _value({"snapshot": True}))
        assert await reader.__anext__() == b"retry: 2000\n\n"
        assert b'"n":1' in await reader.__anext__()
        for n in range(3, 12):  # the log trims what the reader has not read yet
            log.append("token", {"n": n})
        assert b'"n":2' in await reader.__anext__()  # the rest of the batch it had taken
        nxt = await reader.__anext__()
        assert b"event: snapshot" in nxt and f"id: {log.last_id}".encode() in nxt
        log.append("token", {"n": 12})
        assert b'"n":12' in await reader.__anext__()
        await reader.aclose()
        assert log.readers == 0

    import asyncio

    asyncio.run(scenario())


async def _value(v):
    return v


def test_events_need_the_token(tmp_path):
    app = create_app(approval_agent([]), SQLiteStore(tmp_path / "runs.db"), auth=TOKEN)
    with Served(app) as s:
        assert httpx.get(f"{s.url}/events", timeout=5).status_code == 401


def _first(client, path: str) -> tuple[int, str, dict]:
    with client.stream("GET", path) as resp:
        for ident, kind, data in events(resp):
            return int(ident.partition(".")[0]), kind, data  # the local part (as _collect)
    raise AssertionError(f"{path}: no event")


def test_a_run_deleted_by_another_process_never_replays_its_events_to_the_next_run_on_its_id(tmp_path):
    """Two services on one database: A holds run X's events; X is deleted through B and started again (through
    B, then through A). A reader of X on A naming an old event ID gets a snapshot of the new run, and a reader
    of A's /events that reconnects is replayed no event of a run that is gone (the old X's arguments)."""
    import json

    db = tmp_path / "runs.db"
    apps = [create_app(approval_agent([]), SQLiteStore(db), auth=TOKEN) for _ in range(2)]
    with Served(apps[0]) as a, Served(apps[1]) as b, a.client(TOKEN) as ca, b.client(TOKEN) as cb:
        hub_before = _first(ca, "/events")[0]
        start = ca.post("/runs", json={"input": "cat /secret-old", "checkpoint_id": "X"}).json()["last_event_id"]
        old = _collect(ca, "/runs/X/events", {"Last-Event-ID": str(start)}, "end")
        assert any("secret-old" in json.dumps(d) for _, _, d in old)
        ca.post("/runs", json={"input": "cat /gone-here", "checkpoint_id": "Z", "wait": True})
        assert ca.delete("/runs/Z").status_code == 204  # deleted through A itself
        assert cb.delete("/runs/X").status_code == 204  # through B: A learns of it only from the store
        for where in (cb, ca):  # the new run on X started through B, then (deleted again) through A
            assert where.post("/runs", json={"input": "ls", "checkpoint_id": "X", "wait": True}).status_code == 201
            for seen in (start, old[0][0], old[len(old) // 2][0], old[-1][0]):
                _, kind, data = _first(ca, f"/runs/X/events?after={seen}")
                assert kind == "snapshot" and data["interrupts"][0]["arguments"] == {"command": "ls"}, (kind, data)
            assert where.delete("/runs/X").status_code == 204
        ca.post("/runs", json={"input": "ls", "checkpoint_id": "X", "wait": True})
        ca.post("/runs", json={"input": "pwd", "checkpoint_id": "Y", "wait": True})
        replayed = []
        with ca.stream("GET", f"/events?after={hub_before}") as resp:  # a reconnect: the log is replayed
            for _, kind, data in events(resp):
                replayed.append((kind, data))
                if kind == "end" and data["checkpoint_id"] == "Y":
                    break
        text = json.dumps([d for _, d in replayed])
        assert "secret-old" not in text and "gone-here" not in text, replayed
        shown = [(k, d["checkpoint_id"]) for k, d in replayed if k in ("started", "interrupt", "end")]
        assert shown == [("started", "X"), ("interrupt", "X"), ("end", "X"),
                         ("started", "Y"), ("interrupt", "Y"), ("end", "Y")], shown


def test_every_agent_event_says_which_agent_of_a_composition_it_comes_from(tmp_path):
    """boss calls the agent tool researcher, which asks for execute under approval; both name their call
    "call_0". Over HTTP each token, message, tool call, tool result and decision carries its `run_path`, and
    the pause says it is the researcher's call."""
    from service_support import SERVED, ServeProcess

    agent_kinds = {"token", "message", "tool_call", "tool_result", "decision", "retry", "rerun"}
    with ServeProcess(tmp_path, agents=SERVED + ",service_agent:boss") as server, server.client() as c:
        start = c.post("/runs", json={"agent": "boss", "input": "uptime", "checkpoint_id": "team"}).json()
        first = _collect(c, "/runs/team/events", {"Last-Event-ID": str(start["last_event_id"])}, "end")
        (pause,) = next(d for _, k, d in first if k == "interrupt")["interrupts"]
        assert pause["run_path"] == ["boss", "researcher"] and pause["call_id"] == "call_0"
        assert c.get("/approvals").json()["approvals"][0]["run_path"] == ["boss", "researcher"]
        r = c.post("/runs/team/resume", json={"answers": [{"action": "approve", "interrupt_id": pause["id"],
                                                            "digest": pause["digest"]}]})
        rest = _collect(c, "/runs/team/events", {"Last-Event-ID": str(r.json()["last_event_id"])}, "end")
    seen = [(k, d) for _, k, d in first + rest if k in agent_kinds]
    assert {k for k, _ in seen} >= {"token", "message", "tool_call", "tool_result", "decision"}
    assert all(d.get("run_path") in (["boss"], ["boss", "researcher"]) for _, d in seen), seen
    calls = [(d["name"], d["call_id"], d["run_path"]) for k, d in seen if k == "tool_call"]
    assert calls == [("researcher", "call_0", ["boss"]), ("execute", "call_0", ["boss", "researcher"])]
    results = [(d["name"], d["run_path"]) for k, d in seen if k == "tool_result"]
    assert results == [("execute", ["boss", "researcher"]), ("researcher", ["boss"])]
    (decision,) = [d for k, d in seen if k == "decision"]
    assert (decision["tool"], decision["verb"], decision["run_path"]) == ("execute", "approved", ["boss", "researcher"])
    assert server.ran() == ["uptime"]
