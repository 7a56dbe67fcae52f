"""The HTTP API against a real uvicorn on 127.0.0.1: every status code, and compare-and-set under
concurrent resumes (exactly one 200, one 409, and the tool runs once)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("fastapi")

from service_support import Served, approval_agent  # noqa: E402

from waypoint.engine import END, START, Graph, Interrupt, get_resume_context  # noqa: E402
from waypoint.service import create_app  # noqa: E402
from waypoint.stores import SQLiteStore  # noqa: E402

TOKEN = "test-token-5f1c2d"


def refund_graph() -> Graph:
    def review(amount: int) -> str:
        is_target, _, answer = get_resume_context()
        if not is_target:
            raise Interrupt({"question": f"refund {amount}?"})
        return f"refunded {amount}" if answer == "yes" or answer == {"approved": True} else f"declined: {answer}"

    g = Graph(name="refunds")
    g.add_node("review", review)
    g.add_edge(START, "review")
    g.add_edge("review", END)
    return g


@pytest.fixture
def calls():
    return []


@pytest.fixture
def served(tmp_path, calls):
    app = create_app({"ops": approval_agent(calls), "refunds": refund_graph()}, SQLiteStore(tmp_path / "runs.db"),
                     auth=TOKEN)
    with Served(app) as s:
        yield s


@pytest.fixture
def client(served):
    with served.client() as c:
        yield c


def paused(client, cid: str, command: str = "uptime") -> dict:
    """Start an agent run and wait until it pauses for approval; returns the run."""
    r = client.post("/runs", json={"agent": "ops", "input": command, "checkpoint_id": cid, "wait": True})
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["status"] == "interrupted" and run["interrupts"][0]["kind"] == "approval"
    return run


def wait_status(client, cid: str, status: str, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = client.get(f"/runs/{cid}").json()
        if run["status"] == status and not run["active"]:
            return run
        assert time.monotonic() < deadline, run
        time.sleep(0.02)


def test_start_get_approve_complete(client, calls):
    run = paused(client, "t1")
    (pending,) = run["interrupts"]
    assert (pending["tool"], pending["arguments"], pending["arguments_json"]) == ("execute", {"command": "uptime"},
                                                                                  '{"command": "uptime"}')
    assert pending["paused_at"] == run["updated_at"] and pending["version"] == run["version"]
    assert [h["status"] for h in run["history"]][0] == "interrupted" and len(run["history"]) == run["version"]
    assert calls == []  # nothing runs before the approval
    r = client.post("/runs/t1/resume", json={"answers": [{"action": "approve", "interrupt_id": pending["id"],
                                                          "digest": pending["digest"]}],
                                             "expected_version": run["version"]})
    assert r.status_code == 200, r.text
    assert r.json()["version"] == run["version"] + 1 and r.json()["status"] == "running"  # the claim
    done = wait_status(client, "t1", "completed")
    assert calls == ["uptime"]
    assert done["messages"][-1] == {"role": "assistant", "content": "The tool said: ran uptime"}
    assert done["decisions"][0]["verb"] == "approved" and done["interrupts"] == []
    old = client.get("/runs/t1", params={"version": run["version"]}).json()
    assert old["status"] == "interrupted" and old["newest_version"] == done["version"]


def test_reject_with_reason_reaches_the_model_and_the_tool_never_runs(client, calls):
    run = paused(client, "t2", "rm -rf /tmp/x")
    iid = run["interrupts"][0]["id"]
    r = client.post("/runs/t2/resume", json={"answers": [{"action": "reject", "interrupt_id": iid,
                                                          "reason": "too risky"}], "wait": True})
    assert r.status_code == 200 and r.json()["status"] == "completed"
    assert calls == []
    tool_msg = [m for m in r.json()["messages"] if m["role"] == "tool"][0]
    assert tool_msg["content"] == "tool 'execute' disapproved: too risky"


def test_respond_supplies_the_result_without_running_the_tool(client, calls):
    run = paused(client, "t3")
    r = client.post("/runs/t3/resume", json={"answers": [{"action": "respond", "interrupt_id": run["interrupts"][0]["id"],
                                                          "output": "up 3 days"}], "wait": True})
    assert r.status_code == 200 and calls == []
    assert r.json()["messages"][-1]["content"] == "The tool said: up 3 days"


def test_a_plain_graph_run_over_http(client):
    r = client.post("/runs", json={"agent": "refunds", "input": 120, "checkpoint_id": "g1", "wait": True})
    assert r.status_code == 201 and r.json()["kind"] == "graph"
    (pending,) = r.json()["interrupts"]
    assert pending["kind"] == "interrupt" and pending["info"] == {"question": "refund 120?"}
    r = client.post("/runs/g1/resume", json={"answers": [{"action": "respond", "interrupt_id": pending["id"],
                                                          "output": "yes"}], "wait": True})
    assert r.status_code == 200 and r.json()["output"] == "refunded 120"
    r = client.post("/runs", json={"agent": "refunds", "input": 5, "checkpoint_id": "g2", "wait": True})
    iid = r.json()["interrupts"][0]["id"]
    r = client.post("/runs/g2/resume", json={"answers": [{"action": "restart", "interrupt_id": iid}]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "answers", 0, "action"]
    r = client.post("/runs/g2/resume", json={"answers": [{"action": "reject", "interrupt_id": iid, "reason": "no"}],
                                             "wait": True})
    assert r.json()["output"] == "declined: {'approved': False, 'reason': 'no'}"


def test_not_found(client):
    assert client.get("/runs/nope").status_code == 404
    assert client.post("/runs/nope/resume", json={}).status_code == 404
    assert client.delete("/runs/nope").status_code == 404
    assert client.get("/runs/nope/events").status_code == 404
    paused(client, "t4")
    r = client.get("/runs/t4", params={"version": 99})
    assert r.status_code == 404 and "no version 99" in r.json()["detail"]


def test_stale_resumes_are_409_with_the_current_version(client, calls):
    run = paused(client, "t5")
    iid, version = run["interrupts"][0]["id"], run["version"]
    r = client.post("/runs/t5/resume", json={"answers": [{"action": "approve", "interrupt_id": iid}],
                                             "expected_version": version - 1})
    assert r.status_code == 409 and r.json()["current_version"] == version and r.json()["status"] == "interrupted"
    assert "moved on" in r.json()["detail"]
    assert client.get("/runs/t5").json()["version"] == version  # the refused resume wrote nothing
    digest = run["interrupts"][0]["digest"]
    ok = client.post("/runs/t5/resume", json={"answers": [{"action": "approve", "interrupt_id": iid, "digest": digest}],
                                              "wait": True})
    assert ok.status_code == 200 and ok.json()["status"] == "completed"
    again = client.post("/runs/t5/resume", json={"answers": [{"action": "approve", "interrupt_id": iid}],
                                                 "expected_version": version})
    assert again.status_code == 409 and again.json()["current_version"] == ok.json()["version"]
    assert again.json()["status"] == "completed"
    assert calls == ["uptime"]


def test_an_interrupt_that_is_no_longer_pending_is_409_listing_what_is(client):
    run = paused(client, "t6")
    r = client.post("/runs/t6/resume", json={"answers": [{"action": "approve", "interrupt_id": "0123456789abcdef",
                                                          "digest": run["interrupts"][0]["digest"]}]})
    assert r.status_code == 409 and r.json()["pending"] == [run["interrupts"][0]["id"]]


def test_new_input_for_a_paused_run_is_409(client):
    paused(client, "t7")
    r = client.post("/runs", json={"agent": "ops", "input": "ls", "checkpoint_id": "t7"})
    assert r.status_code == 409 and r.json()["status"] == "interrupted"
    r = client.post("/runs", json={"agent": "ops", "input": "ls", "checkpoint_id": "t7", "force_new_run": True,
                                   "wait": True})
    assert r.status_code == 201 and r.json()["interrupts"][0]["arguments"] == {"command": "ls"}


def test_bad_input_is_422_naming_the_field(client):
    cases = [
        ({"agent": "ops"}, ["body", "input"]),
        ({"agent": "nobody", "input": "x"}, ["body", "agent"]),
        ({"input": "x"}, ["body", "agent"]),  # two are served: say which
        ({"agent": "ops", "input": {"not": "messages"}}, ["body", "input"]),
        ({"agent": "ops", "input": "x", "checkpoint_id": "a/b"}, ["body", "checkpoint_id"]),
        ({"agent": "ops", "input": "x", "color": "red"}, ["body", "color"]),
    ]
    for body, loc in cases:
        r = client.post("/runs", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"][0]["loc"] == loc, (body, r.json())
    run = paused(client, "t8")
    iid = run["interrupts"][0]["id"]
    resumes = [
        ({"answers": [{"action": "maybe", "interrupt_id": iid}]}, ["body", "answers", 0]),
        ({"answers": [{"action": "approve"}]}, ["body", "answers", 0, "approve", "interrupt_id"]),
        ({"answers": [{"action": "approve", "interrupt_id": iid, "digest": "d"},
                      {"action": "reject", "interrupt_id": iid}]},
         ["body", "answers", 1, "interrupt_id"]),
        ({"answers": []}, ["body", "answers"]),  # it waits on an answer
        ({"expected_version": 0}, ["body", "expected_version"]),
    ]
    for body, loc in resumes:
        r = client.post("/runs/t8/resume", json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"][0]["loc"][:len(loc)] == loc, (body, r.json())
    assert client.get("/runs", params={"before": "garbage!"}).json()["detail"][0]["loc"] == ["query", "before"]
    assert client.get("/runs", params={"limit": 0}).status_code == 422
    assert client.get("/runs/t8").json()["version"] == run["version"]  # nothing was written


def test_list_filters_and_pages(client):
    for i in range(5):
        paused(client, f"p{i}")
    client.post("/runs", json={"agent": "refunds", "input": 1, "checkpoint_id": "g", "wait": True})
    r = client.post("/runs/g/resume", json={"answers": [{"action": "respond", "output": "yes", "interrupt_id":
                                                         client.get("/runs/g").json()["interrupts"][0]["id"]}],
                                            "wait": True})
    assert r.json()["status"] == "completed"
    seen, cursor = [], None
    while True:
        page = client.get("/runs", params={"status": "interrupted", "limit": 2, **({"before": cursor} if cursor else {})})
        assert page.status_code == 200
        seen += [row["checkpoint_id"] for row in page.json()["runs"]]
        cursor = page.json()["next"]
        if cursor is None:
            break
    assert seen == [f"p{i}" for i in reversed(range(5))]  # newest first, each once
    done = client.get("/runs", params={"status": "completed"}).json()["runs"]
    assert [(row["checkpoint_id"], row["graph"]) for row in done] == [("g", "refunds")]


def test_delete(client):
    paused(client, "d1")
    assert client.delete("/runs/d1").status_code == 204
    assert client.get("/runs/d1").status_code == 404
    assert client.delete("/runs/d1").status_code == 404


def test_a_running_run_is_409_to_a_resumer_and_to_delete_unless_forced(tmp_path):
    calls: list[str] = []
    app = create_app(approval_agent(calls, delay=0.3), SQLiteStore(tmp_path / "runs.db"), auth=TOKEN)
    with Served(app) as s, s.client() as c:
        assert c.post("/runs", json={"input": "uptime", "checkpoint_id": "slow"}).status_code == 201
        run = c.get("/runs/slow").json()
        assert run["status"] == "running" and run["active"] and run["lease"]["alive"]
        r = c.post("/runs/slow/resume", json={})
        assert r.status_code == 409 and r.json()["status"] == "running" and "lease" in r.json()["detail"]
        assert c.delete("/runs/slow").status_code == 409
        assert c.delete("/runs/slow", params={"force": True}).status_code == 204
        assert c.get("/runs/slow").status_code == 404


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
def test_a_service_whose_clock_runs_ahead_does_not_delete_a_live_run_without_force(tmp_path, request, monkeypatch, db):
    """Another process executes the run under a 30 s lease; the service's wall clock is 120 s ahead, so the lease
    looks long expired to it. Without force the delete is judged by the store, on its clock, in the delete's own
    transaction: 409, and the run goes on to complete. (It used to be deleted.)"""
    from waypoint.stores import SQLStore

    url = request.getfixturevalue("pg_url") if db == "postgres" else None
    def store():
        return SQLStore(url) if url else SQLiteStore(tmp_path / "runs.db")

    gate, entered = threading.Event(), threading.Event()

    def work(x):
        entered.set()
        assert gate.wait(30)
        return x

    g = Graph(name="elsewhere")
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    result: list = []
    owner = threading.Thread(target=lambda: result.append(g.compile(store=store(), lease_seconds=30.0).invoke(
        "x", checkpoint_id="live")))
    owner.start()
    try:
        assert entered.wait(30)
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 120)
        app = create_app({"elsewhere": g}, store(), auth=TOKEN)
        with Served(app) as s, s.client() as c:
            r = c.delete("/runs/live")
            assert r.status_code == 409 and "force" in r.json()["detail"], r.text
            assert c.get("/runs/live").json()["lease"]["alive"] is True  # judged on the store's clock too
        monkeypatch.setattr(time, "time", real)
    finally:
        gate.set()
        owner.join(30)
    assert result == ["x"]


def test_the_openapi_document_is_served_behind_the_token(served, client):
    doc = client.get("/openapi.json")
    assert doc.status_code == 200
    paths = doc.json()["paths"]
    assert {"/runs", "/runs/{checkpoint_id}", "/runs/{checkpoint_id}/resume", "/runs/{checkpoint_id}/events",
            "/approvals", "/events", "/agents"} <= set(paths)
    assert set(paths["/runs/{checkpoint_id}/resume"]["post"]["responses"]) >= {"200", "401", "403", "404", "409", "422"}
    assert doc.json()["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    answers = doc.json()["components"]["schemas"]["ResumeRun"]["properties"]["answers"]["items"]
    assert set(answers["discriminator"]["mapping"]) == {"approve", "reject", "respond", "restart"}
    with served.client(token=None) as anonymous:
        assert anonymous.get("/openapi.json").status_code == 401


def _race(served_pair, cid: str, iid: str, digest: str, answers: list | None = None) -> list[int]:
    """POST the same approval from two threads at the same moment; the status codes, sorted."""
    barrier, codes = threading.Barrier(2), []
    answers = answers if answers is not None else []

    def resume(server):
        with server.client() as c:
            barrier.wait()
            r = c.post(f"/runs/{cid}/resume", json={"answers": [{"action": "approve", "interrupt_id": iid,
                                                                 "digest": digest}]})
            codes.append(r.status_code)
            answers.append(r.json())

    threads = [threading.Thread(target=resume, args=(s,)) for s in served_pair]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return sorted(codes)


def test_two_concurrent_resumes_one_200_one_409_and_the_tool_runs_once(served, client, calls):
    for n in range(3):  # a few rounds: whichever request comes first, exactly one wins
        run = paused(client, f"race{n}", f"deploy {n}")
        pending = run["interrupts"][0]
        assert _race([served, served], f"race{n}", pending["id"], pending["digest"]) == [200, 409]
        wait_status(client, f"race{n}", "completed")
    assert calls == ["deploy 0", "deploy 1", "deploy 2"]


def test_two_servers_on_one_database_one_200_one_409(tmp_path):
    calls: list[str] = []
    apps = [create_app(approval_agent(calls), SQLiteStore(tmp_path / "runs.db"), auth=TOKEN) for _ in range(2)]
    with Served(apps[0]) as a, Served(apps[1]) as b, a.client() as c:
        run = paused(c, "shared")
        assert _race([a, b], "shared", run["interrupts"][0]["id"], run["interrupts"][0]["digest"]) == [200, 409]
        wait_status(c, "shared", "completed")
    assert calls == ["uptime"]


class _BothReadFirst:
    """A store whose claims of run `checkpoint_id` wait until a second claim arrives: both resumers have read
    the same version before either writes, so only the store's compare-and-set can tell them apart."""

    def __init__(self, store, checkpoint_id, version):
        self._store, self._cid, self._version = store, checkpoint_id, version
        self.claims = 0
        self.second = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def put(self, meta, header, parts, blobs, *, expected_version, **fence):
        if meta.checkpoint_id == self._cid and expected_version == self._version:
            self.claims += 1
            if self.claims == 1:
                await asyncio.wait_for(self.second.wait(), 10)
            else:
                self.second.set()
        return await self._store.put(meta, header, parts, blobs, expected_version=expected_version, **fence)


def test_the_409_comes_from_the_stores_compare_and_set(tmp_path):
    calls: list[str] = []
    store = SQLiteStore(tmp_path / "runs.db")
    with Served(create_app(approval_agent(calls), store, auth=TOKEN)) as s, s.client() as c:
        run = paused(c, "cas")
    gate = _BothReadFirst(SQLiteStore(tmp_path / "runs.db"), "cas", run["version"])
    answers: list[dict] = []
    with Served(create_app(approval_agent(calls), gate, auth=TOKEN)) as s, s.client() as c:
        assert _race([s, s], "cas", run["interrupts"][0]["id"], run["interrupts"][0]["digest"], answers) == [200, 409]
        assert gate.claims == 2  # both got as far as writing the claim
        wait_status(c, "cas", "completed")
    assert calls == ["uptime"]
    (lost,) = [a for a in answers if "detail" in a]
    assert f"moved past version {run['version']}" in lost["detail"]  # the store's compare-and-set said so
    assert lost["current_version"] > run["version"]


def test_stopping_the_server_drains_its_runs_and_the_next_server_continues_them_unasked(tmp_path):
    """The server stops while its run is inside a model step: the step finishes (the drain), the run stops at the
    step boundary — left `running` with its lease ended, not stored as cancelled (a shutdown is no decision) — and
    the next server's recovery continues it with no resume call, to the approval it needs."""
    import sqlite3

    calls: list[str] = []
    db = tmp_path / "runs.db"
    with Served(create_app(approval_agent(calls, delay=0.5), SQLiteStore(db), auth=TOKEN)) as s, s.client() as c:
        assert c.post("/runs", json={"input": "uptime", "checkpoint_id": "cut"}).status_code == 201
        assert c.get("/runs/cut").json()["status"] == "running"
    with sqlite3.connect(db) as conn:
        status, error, lease_left = conn.execute(
            "SELECT status, error, lease_expires - (julianday('now') - 2440587.5) * 86400.0 FROM waypoint_checkpoints "
            "WHERE checkpoint_id = 'cut' ORDER BY version DESC LIMIT 1").fetchone()
        errors = [e for (e,) in conn.execute("SELECT error FROM waypoint_checkpoints WHERE checkpoint_id = 'cut'")]
    assert (status, error) == ("running", None) and lease_left <= 0  # left for the next process, at once
    assert "cancelled" not in errors
    with Served(create_app(approval_agent(calls), SQLiteStore(db), auth=TOKEN)) as s, s.client() as c:
        deadline = time.monotonic() + 30
        while (run := c.get("/runs/cut").json())["status"] != "interrupted":
            assert time.monotonic() < deadline, run
            time.sleep(0.05)
        assert run["interrupts"][0]["arguments"] == {"command": "uptime"}  # recovery continued it, unasked
    assert calls == []


def test_mounted_under_a_prefix_in_an_existing_app(tmp_path):
    from fastapi import FastAPI

    from waypoint.service import create_router

    calls: list[str] = []
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"ok": True}

    router = create_router({"ops": approval_agent(calls)}, SQLiteStore(tmp_path / "runs.db"), auth=TOKEN)
    app.include_router(router, prefix="/waypoint")
    with Served(app) as s, s.client() as c:
        assert c.get("/health").json() == {"ok": True}
        run = c.post("/waypoint/runs", json={"input": "ls", "checkpoint_id": "m1", "wait": True}).json()
        assert run["status"] == "interrupted"
        assert c.get("/runs/m1").status_code == 404  # only under the prefix
        page = c.get("/waypoint/ui/runs/m1").text
        assert '<base href="/waypoint/">' in page and 'src="ui/static/app.js"' in page
        r = c.post("/waypoint/ui/login", json={"token": TOKEN}, headers={"X-Requested-With": "waypoint"})
        assert "Path=/waypoint/" in r.headers["set-cookie"]
        answer = {"answers": [{"action": "approve", "interrupt_id": run["interrupts"][0]["id"],
                               "digest": run["interrupts"][0]["digest"]}], "wait": True}
        assert c.post("/waypoint/runs/m1/resume", json=answer).json()["status"] == "completed"
    assert calls == ["ls"]
    assert router.service.logs.hub.closed  # the router's lifespan ran in the app's shutdown


def test_a_damaged_run_is_500_to_read_and_does_not_hide_the_other_approvals(tmp_path, served, client):
    import sqlite3

    paused(client, "fine")
    paused(client, "damaged", "ls")
    with sqlite3.connect(tmp_path / "runs.db") as db:
        db.execute("UPDATE waypoint_blobs SET data = x'00' WHERE checkpoint_id = 'damaged'")
    r = client.get("/runs/damaged")
    assert r.status_code == 500 and "cannot be read" in r.json()["detail"]
    listed = client.get("/approvals").json()
    assert [a["checkpoint_id"] for a in listed["approvals"]] == ["fine"] and listed["unreadable"] == ["damaged"]


def test_restart_runs_the_call_again_with_new_arguments(client, calls):
    run = paused(client, "t9", "rm -rf /")
    r = client.post("/runs/t9/resume", json={"answers": [{"action": "restart", "interrupt_id": run["interrupts"][0]["id"],
                                                          "replace_input": {"command": "ls /"}}],
                                             "expected_version": run["version"], "wait": True})
    assert r.status_code == 200 and r.json()["status"] == "completed"
    assert calls == ["ls /"]
    assert r.json()["decisions"][0]["verb"] == "restarted"


def test_the_public_names():
    import waypoint.service as service

    assert set(service.__all__) == {"create_app", "create_router", "Service", "Auth", "AuthError", "ServiceError",
                                    "load_targets", "open_store", "Webhooks", "WebhookError", "verify_signature"}
    for name in service.__all__:
        assert hasattr(service, name)


class _MovesOnAfterTheLook:
    """A store that, right after the service has looked at run `checkpoint_id` for a resume, lets `move_on()`
    change the run (as another client would) before the service's claim: the claim must be made on the
    version the service looked at, or it would act on a stale check."""

    def __init__(self, store, checkpoint_id, move_on):
        self._store, self._cid, self._move_on = store, checkpoint_id, move_on
        self.armed = False

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def history(self, checkpoint_id, *, limit=None):
        found = await self._store.history(checkpoint_id, limit=limit)
        if self.armed and checkpoint_id == self._cid and limit == 1:
            self.armed = False
            await self._move_on()
        return found


def test_the_claim_is_made_on_the_version_the_answer_was_checked_against(tmp_path):
    import json as _json

    from waypoint.engine import ChatModelAgent, Message, Runner, ToolCall, tool
    from waypoint.engine.models import ScriptedChatModel
    from waypoint.middleware import ApprovalMiddleware, ApprovalResult

    ran: list[str] = []

    @tool
    def execute(command: str) -> str:
        """Run it."""
        ran.append(command)
        return f"ran {command}"

    def reply(messages, tools):  # the same call ID every turn: the same pause address, the same ID today
        last = messages[-1]
        if last.role == "tool":
            return Message.assistant(f"The tool said: {last.content}")
        return Message.assistant("ok", tool_calls=[ToolCall(id="call_0", name="execute",
                                                            arguments=_json.dumps({"command": last.content}))])

    agent = ChatModelAgent(name="ops", model=ScriptedChatModel([reply] * 100), tools=[execute],
                           middlewares=[ApprovalMiddleware(tools={"execute"})])
    inner = SQLiteStore(tmp_path / "runs.db")
    runner = Runner(agent, store=inner)

    async def move_on():  # another client rejects the call, and a new turn asks for another command
        snap = await runner.app.get_run("turns")
        async for _ in runner.resume_with_params("turns", {snap.interrupts.contexts[0].id:
                                                           ApprovalResult(approved=False)}):
            pass
        async for _ in runner.run("rm -rf /srv", checkpoint_id="turns"):
            pass

    store = _MovesOnAfterTheLook(inner, "turns", move_on)
    with Served(create_app({"ops": agent}, store, auth=TOKEN)) as s, s.client() as c:
        first = paused(c, "turns", "uptime")
        shown = first["interrupts"][0]
        store.armed = True
        r = c.post("/runs/turns/resume", json={"answers": [{"action": "approve", "interrupt_id": shown["id"],
                                                            "digest": shown["digest"]}]})
        assert r.status_code == 409 and f"moved past version {first['version']}" in r.json()["detail"], r.text
        now = c.get("/runs/turns").json()
        assert now["status"] == "interrupted" and now["interrupts"][0]["arguments"] == {"command": "rm -rf /srv"}
    assert ran == []  # neither the rejected call nor the new one ran on an answer made for another


def test_the_service_folder_reads_bottom_up():
    """Each module of service/ imports only modules listed above it in docs/service.md's "Where things are"
    (no import circle: `_api` <-> `_service` <-> `_ui` was one)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    table = (root / "docs" / "service.md").read_text().split("## Where things are", 1)[1]
    order = [m.group(1) for m in re.finditer(r"^\| `service/(_?\w+)\.py`", table, re.M)]
    modules = {p.stem for p in (root / "service").glob("*.py")} - {"__init__"}
    assert set(order) == modules, "docs/service.md's table lists every module of service/ once"
    for i, name in enumerate(order):
        text = (root / "service" / f"{name}.py").read_text()
        imported = set(re.findall(r"^\s*from \.(_?\w+) import", text, re.M))
        assert imported <= set(order[:i]), (name, sorted(imported - set(order[:i])))


class _HeldClaims:
    """A store whose writes wait until `release` is set (so a request can be given up before the claim)."""

    def __init__(self, store):
        self._store = store
        self.release = asyncio.Event()
        self.writing = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self._store, name)

    async def put(self, meta, header, parts, blobs, *, expected_version, **fence):
        self.writing.set()
        await self.release.wait()
        return await self._store.put(meta, header, parts, blobs, expected_version=expected_version, **fence)


def test_a_request_given_up_before_the_claim_still_has_its_run_announced_to_the_end():
    """The handler awaiting the claim is cancelled (the client went away, the server stopped): the run goes on,
    and its stream and the service's stream still get `started` and `end`."""
    import httpx

    from waypoint.stores import MemoryStore

    async def main() -> tuple[list[str], list[str], str]:
        store = _HeldClaims(MemoryStore())
        app = create_app({"refunds": refund_graph()}, store, auth=TOKEN, recover=False)
        service = app.state.waypoint
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with app.router.lifespan_context(app):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                request = asyncio.create_task(c.post("/runs", headers=headers, json={
                    "agent": "refunds", "input": {"amount": 5}, "checkpoint_id": "gone"}))
                await asyncio.wait_for(store.writing.wait(), 10)
                request.cancel()
                await asyncio.gather(request, return_exceptions=True)
                store.release.set()
                for _ in range(500):
                    run = (await c.get("/runs/gone", headers=headers)).json()
                    if run.get("status") == "interrupted" and not run["active"]:
                        break
                    await asyncio.sleep(0.01)
                kinds = [e.kind for e in service.logs.runs["gone"].events]
                hub = [e.kind for e in service.logs.hub.events]
                return kinds, hub, run["status"]

    kinds, hub, status = asyncio.run(main())
    assert status == "interrupted"
    assert kinds[0] == "started" and kinds[-1] == "end" and "interrupt" in kinds, kinds
    assert "started" in hub and "end" in hub, hub
