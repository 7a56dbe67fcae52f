"""`waypoint serve` with a run queue: starts and resumes go to `waypoint worker` processes on Postgres, the API
answers as when the service executes runs itself (claims, 409s before anything runs, `wait`), and the events
of runs executed elsewhere reach the service's streams from the store (Postgres NOTIFY; SQLite polling) —
real processes, real databases. Also: a sync node sleeping in `waypoint serve` does not stall other requests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from service_support import ServeProcess, events, wait_until  # noqa: E402

PROCS = Path(__file__).parent / "procs"
LEASE = 2.0


def spawn_worker(db: str, desk: Path, cwd: Path, *, graphs: str = "desk_agent:compiled",
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(PROCS), "DESK_DIR": str(desk), "DESK_LEASE": str(LEASE), **(env or {})}
    cmd = [sys.executable, "-m", "waypoint.cmd.main", "worker", "--db", db, "--graphs", graphs,
           "--poll", "0.2", "--pool", "4", "--drain", "5"]
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def serve(tmp: Path, desk: Path, *, db: str | None = None, queue: bool = True) -> ServeProcess:
    return ServeProcess(tmp, agents="desk_agent:build", db=db, args=("--queue",) if queue else (),
                        env={"DESK_DIR": str(desk)})


def acts(desk: Path) -> list[list[str]]:
    """Each time the tool really ran: [command, pid]."""
    path = desk / "acts"
    return [line.rsplit(" ", 1) for line in path.read_text().splitlines()] if path.exists() else []


class Stream:
    """One Server-Sent Events stream read in a thread: `wait_for` an event as it arrives."""

    def __init__(self, server: ServeProcess, path: str, last_event_id: Any = None, *, until: str | None = None) -> None:
        self.until = until  # the kind of event after which it hangs up (and the service sees the reader leave)
        self.events: list[tuple[float, str, Any]] = []
        self.ids: list[str | None] = []
        self.cond = threading.Condition()
        self.client = server.client()
        headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
        self.thread = threading.Thread(target=self._read, args=(path, headers), daemon=True)
        self.thread.start()

    def _read(self, path: str, headers: dict) -> None:
        try:
            with self.client.stream("GET", path, headers=headers) as resp:
                for ident, kind, data in events(resp):
                    with self.cond:
                        self.events.append((time.monotonic(), kind, data))
                        self.ids.append(ident)
                        self.cond.notify_all()
                    if kind == self.until:
                        break
        except Exception:  # noqa: BLE001 - closed by the test
            pass

    def wait_for(self, kind: str, where: Any = lambda d: True, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for _t, k, d in self.events:
                    if k == kind and where(d):
                        return d
                left = deadline - time.monotonic()
                assert left > 0, f"no {kind} event in {timeout} s; got {[k for _, k, _ in self.events]}"
                self.cond.wait(left)

    def kinds(self) -> list[str]:
        with self.cond:
            return [k for _, k, _ in self.events]

    def close(self) -> None:
        self.client.close()


async def submit_directly(db: str, graph: str, input: Any, checkpoint_id: str) -> None:
    from waypoint.stores import RunQueue, SQLStore

    store = SQLStore(db)
    try:
        await RunQueue(store).submit(graph, input, checkpoint_id)
    finally:
        await store.close()


async def resume_directly(db: str, checkpoint_id: str, interrupt_id: str) -> None:
    from waypoint.middleware import ApprovalResult
    from waypoint.stores import RunQueue, SQLStore

    store = SQLStore(db)
    try:
        await RunQueue(store).resume(checkpoint_id, {interrupt_id: ApprovalResult(approved=True)})
    finally:
        await store.close()


def live_workers(pg: Any, db: str) -> int:
    try:
        return pg.sql("SELECT COUNT(*) FROM waypoint_workers WHERE graph = 'desk' AND until > "
                      "EXTRACT(EPOCH FROM clock_timestamp())", db=db)[0][0]
    except Exception:  # noqa: BLE001 - not migrated yet
        return 0


def test_the_service_hands_runs_to_two_workers_on_postgres_and_streams_their_events_live(pg, pg_url, tmp_path, procs):
    from pg import database_of

    desk = tmp_path / "desk"
    desk.mkdir()
    procs.extend(spawn_worker(pg_url, desk, tmp_path) for _ in range(2))
    pids = {str(p.pid) for p in procs}
    wait_until(lambda: live_workers(pg, database_of(pg_url)) == 2, 60, "two live workers")
    with serve(tmp_path, desk, db=pg_url) as s, s.client() as c:
        page = Stream(s, "/events")  # what the approval page follows
        started = c.post("/runs", json={"agent": "desk", "input": "hold deploy", "checkpoint_id": "t-1"})
        assert started.status_code == 201, started.text
        assert started.json()["status"] == "running" and started.json()["version"] == 1  # a worker's claim
        run = Stream(s, "/runs/t-1/events", started.json()["last_event_id"])
        paused = run.wait_for("interrupt")
        assert page.wait_for("interrupt", lambda d: d["checkpoint_id"] == "t-1")["version"] == paused["version"]
        (approval,) = c.get("/approvals").json()["approvals"]
        assert (approval["checkpoint_id"], approval["tool"], approval["arguments"]) == ("t-1", "act",
                                                                                      {"command": "hold deploy"})
        assert approval["id"] == paused["interrupts"][0]["id"] and c.get("/ui").status_code == 200
        view = c.get("/runs/t-1").json()
        assert view["status"] == "interrupted" and not view["active"]
        iid, digest = approval["id"], approval["digest"]

        # The 409s of bound answers still come before anything runs (nothing is queued for them)
        stale = c.post("/runs/t-1/resume", json={"answers": [{"action": "approve", "interrupt_id": iid,
                                                             "digest": "0" * 64}]})
        assert stale.status_code == 409 and "nothing ran" in stale.json()["detail"], stale.text
        moved = c.post("/runs/t-1/resume", json={"answers": [{"action": "approve", "interrupt_id": iid}],
                                                 "expected_version": view["version"] - 1})
        assert moved.status_code == 409 and moved.json()["current_version"] == view["version"], moved.text
        assert acts(desk) == [] and c.get("/runs/t-1").json()["version"] == view["version"]

        approve = {"answers": [{"action": "approve", "interrupt_id": iid, "digest": digest}]}
        resumed = c.post("/runs/t-1/resume", json=approve)
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["status"] == "running" and resumed.json()["version"] == view["version"] + 1
        again = c.post("/runs/t-1/resume", json={**approve, "takeover": True})  # twice: refused, never run twice
        assert again.status_code == 409 and "the workers continue a run" in again.json()["detail"], again.text
        result = run.wait_for("tool_result")  # live: the worker's model holds its next step meanwhile
        assert (result["name"], result["content"], result["run_path"]) == ("act", "did hold deploy", ["desk"])
        assert run.kinds().count("end") == 1 and not (desk / "gate").exists()
        (desk / "gate").touch()
        end = run.wait_for("end", lambda d: d["status"] == "completed")
        assert page.wait_for("end", lambda d: d["checkpoint_id"] == "t-1" and d["status"] == "completed")
        kinds = run.kinds()
        assert kinds.index("interrupt") < kinds.index("started", kinds.index("interrupt")) < kinds.index("tool_result")
        assert [k for k in kinds if k in ("started", "interrupt", "end")] == ["started", "interrupt", "end",
                                                                            "started", "end"]
        assert run.wait_for("tool_call")["arguments_json"] == '{"command": "hold deploy"}'
        assert run.wait_for("message", lambda d: d["content"].startswith("Done"))["content"] == "Done: did hold deploy"
        done = c.get("/runs/t-1").json()
        assert done["status"] == "completed" and done["version"] == end["version"]
        ((command, pid),) = acts(desk)  # the tool ran once, in a worker
        assert command == "hold deploy" and pid in pids

        # wait: true answers with the run once it stopped, as when the service executes it
        waited = c.post("/runs", json={"agent": "desk", "input": "status", "checkpoint_id": "t-2", "wait": True})
        assert waited.status_code == 201 and waited.json()["status"] == "interrupted", waited.text
        (pending,) = waited.json()["interrupts"]
        finished = c.post("/runs/t-2/resume", json={"answers": [{"action": "reject", "interrupt_id": pending["id"],
                                                                 "reason": "not now"}], "wait": True})
        assert finished.status_code == 200 and finished.json()["status"] == "completed", finished.text
        assert "disapproved: not now" in finished.json()["messages"][-2]["content"]
        # new input for a paused run is still refused the same way
        c.post("/runs", json={"agent": "desk", "input": "restart", "checkpoint_id": "t-3", "wait": True})
        exists = c.post("/runs", json={"agent": "desk", "input": "other", "checkpoint_id": "t-3"})
        assert exists.status_code == 409 and "force_new_run" in exists.json()["detail"], exists.text
        over = c.post("/runs", json={"agent": "desk", "input": "other", "checkpoint_id": "t-3", "force_new_run": True,
                                     "wait": True})
        assert over.status_code == 201 and over.json()["interrupts"][0]["arguments"] == {"command": "other"}, over.text
        # a run another program queued (not this service): the page's stream has it, from the store's NOTIFY
        (desk / "gate").unlink()
        asyncio.run(submit_directly(pg_url, "desk", "hold directly", "t-4"))
        assert page.wait_for("started", lambda d: d["checkpoint_id"] == "t-4")["how"] == "start"
        (direct,) = page.wait_for("interrupt", lambda d: d["checkpoint_id"] == "t-4")["interrupts"]
        assert direct["arguments"] == {"command": "hold directly"}
        asyncio.run(resume_directly(pg_url, "t-4", direct["id"]))
        wait_until(lambda: len((desk / "holding").read_text().splitlines()) == 2, 30, "t-4 holding")
        # a reader that comes in the middle gets the run as it is, then only what happens after that
        late = Stream(s, "/runs/t-4/events")
        snap = late.wait_for("snapshot")
        assert snap["status"] == "running" and snap["messages"][-1]["content"] == "did hold directly"
        (desk / "gate").touch()
        assert late.wait_for("end")["status"] == "completed"
        assert "tool_result" not in late.kinds() and late.kinds().count("message") == 1, late.kinds()
        late.close()
        run.close()
        page.close()
    assert [a[0] for a in acts(desk)] == ["hold deploy", "hold directly"]


def test_a_worker_sigkilled_mid_run_is_taken_over_and_the_stream_follows_it(pg, pg_url, tmp_path, procs):
    from pg import database_of

    desk = tmp_path / "desk"
    desk.mkdir()
    procs.extend(spawn_worker(pg_url, desk, tmp_path) for _ in range(2))
    wait_until(lambda: live_workers(pg, database_of(pg_url)) == 2, 60, "two live workers")
    with serve(tmp_path, desk, db=pg_url) as s, s.client() as c:
        paused = c.post("/runs", json={"agent": "desk", "input": "hold the line", "checkpoint_id": "k-1",
                                       "wait": True}).json()
        (approval,) = paused["interrupts"]
        run = Stream(s, "/runs/k-1/events")
        run.wait_for("snapshot")
        resumed = c.post("/runs/k-1/resume", json={"answers": [{"action": "approve", "interrupt_id": approval["id"],
                                                                "digest": approval["digest"]}]})
        assert resumed.status_code == 200, resumed.text
        # the tool ran and was recorded; the model's next step holds inside a worker: the stream has the result
        holder = int(wait_until(lambda: (desk / "holding").exists() and (desk / "holding").read_text().split()[1]))
        assert run.wait_for("tool_result")["content"] == "did hold the line"
        assert "end" not in run.kinds()[run.kinds().index("snapshot"):]
        victim = next(p for p in procs if p.pid == holder)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        (desk / "gate").touch()
        end = run.wait_for("end", timeout=60)  # the other worker takes it over once the lease expires
        assert end["status"] == "completed", end
        done = c.get("/runs/k-1").json()
        assert done["status"] == "completed" and done["messages"][-1]["content"] == "Done: did hold the line"
        assert [a[0] for a in acts(desk)] == ["hold the line"]  # recorded in the ledger: never run again
        holders = (desk / "holding").read_text().split()
        assert len(holders) == 4 and holders[3] != str(holder)  # the model step ran again, in the other worker
        run.close()


def test_an_answer_queued_while_no_worker_runs_applies_to_its_pause_or_to_nothing(pg, pg_url, tmp_path, procs):
    """With every worker gone, a start is answered "queued" and an approve waits in the queue; the run is
    answered elsewhere meanwhile; the next worker's compare-and-set refuses the stale approve, which the
    waiting request gets as a 409 — the tool never runs."""
    import sys

    from pg import database_of
    from waypoint.engine import Runner
    from waypoint.middleware import ApprovalResult
    from waypoint.stores import SQLStore

    desk, db = tmp_path / "desk", database_of(pg_url)
    desk.mkdir()
    procs.append(spawn_worker(pg_url, desk, tmp_path))
    wait_until(lambda: live_workers(pg, db) == 1, 60, "a live worker")
    with serve(tmp_path, desk, db=pg_url) as s, s.client() as c:
        (approval,) = c.post("/runs", json={"agent": "desk", "input": "deploy", "checkpoint_id": "q-1",
                                            "wait": True}).json()["interrupts"]
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(30) == 0
        queued = c.post("/runs", json={"agent": "desk", "input": "later", "checkpoint_id": "q-2"})
        assert queued.status_code == 201 and queued.json()["status"] == "queued", queued.text
        assert queued.json()["version"] is None
        follower = Stream(s, "/runs/q-2/events")  # followed before any worker claims it: a snapshot "queued"
        assert follower.wait_for("snapshot")["status"] == "queued"
        answered: dict[str, Any] = {}

        def approve() -> None:
            with s.client() as waiting:
                answered["r"] = waiting.post("/runs/q-1/resume", json={"wait": True, "answers": [
                    {"action": "approve", "interrupt_id": approval["id"], "digest": approval["digest"]}]})

        waiter = threading.Thread(target=approve)
        waiter.start()
        wait_until(lambda: pg.sql("SELECT kind, state FROM waypoint_queue WHERE checkpoint_id = 'q-1'", db=db)
                   == [("resume", "queued")], 30, "the approve queued")
        twice = c.post("/runs/q-1/resume", json={"answers": [{"action": "reject", "interrupt_id": approval["id"]}]})
        assert twice.status_code == 409 and "already has work in the queue" in twice.json()["detail"], twice.text

        async def reject_elsewhere() -> None:  # a person answers with another program meanwhile
            sys.path.insert(0, str(PROCS))
            from desk_agent import build

            store = SQLStore(pg_url)
            try:
                async for _ in Runner(build(), store=store).resume_with_params(
                        "q-1", {approval["id"]: ApprovalResult(approved=False, reason="changed my mind")}):
                    pass
            finally:
                await store.close()

        asyncio.run(reject_elsewhere())
        procs.append(spawn_worker(pg_url, desk, tmp_path))
        waiter.join(60)
        r = answered["r"]
        assert r.status_code == 409 and "moved past version" in r.json()["detail"], r.text
        run = c.get("/runs/q-1").json()
        assert run["status"] == "completed" and "changed my mind" in run["messages"][-2]["content"]
        assert wait_until(lambda: c.get("/runs/q-2").json().get("status") == "interrupted", 30, "q-2 ran")
        assert follower.wait_for("interrupt")["interrupts"][0]["arguments"] == {"command": "later"}
        assert follower.kinds()[:2] == ["snapshot", "started"], follower.kinds()
        follower.close()
    assert acts(desk) == []  # the stale approve never ran the tool


def test_a_run_a_worker_executes_on_sqlite_reaches_the_services_streams_by_polling(tmp_path, procs):
    """Not submitted through the service: a worker executes it, queued by another program; the service (no
    queue of its own) follows it from the SQLite file."""
    from waypoint.middleware import ApprovalResult
    from waypoint.stores import RunQueue, SQLiteStore

    desk, db = tmp_path / "desk", tmp_path / "runs.db"
    desk.mkdir()
    procs.append(spawn_worker(str(db), desk, tmp_path))

    async def queue(call: Any) -> Any:
        store = SQLiteStore(db)
        try:
            return await call(RunQueue(store))
        finally:
            await store.close()

    with serve(tmp_path, desk, queue=False) as s, s.client() as c:
        # a reader that left while a run was at rest comes back after it moved: it gets exactly what it missed
        asyncio.run(queue(lambda q: q.submit("desk", "again", "w-2")))
        (pending,) = wait_until(lambda: c.get("/runs/w-2").json().get("interrupts"), 30, "w-2 paused")
        first = Stream(s, "/runs/w-2/events", until="snapshot")
        first.thread.join(10)
        left_at = first.ids[0]  # the snapshot's ID: the last event of the run's log when it was read
        asyncio.run(queue(lambda q: q.resume("w-2", {pending["id"]: ApprovalResult(approved=True)})))
        wait_until(lambda: c.get("/runs/w-2").json()["status"] == "completed", 30, "w-2 completed")
        back = Stream(s, "/runs/w-2/events", left_at)
        assert back.wait_for("end")["status"] == "completed"
        assert back.kinds()[:1] == ["started"] and "snapshot" not in back.kinds()
        assert back.wait_for("tool_result")["content"] == "did again"
        # deleted by another program while read: the reader is told, and its stream ends
        asyncio.run(queue(lambda q: q.store.delete("w-2")))
        back.wait_for("deleted")
        back.thread.join(10)
        assert not back.thread.is_alive()
        back.close()

        page = Stream(s, "/events")
        page.wait_for("snapshot")
        asyncio.run(queue(lambda q: q.submit("desk", "hold tight", "w-1")))
        paused = page.wait_for("interrupt", lambda d: d["checkpoint_id"] == "w-1")
        assert page.wait_for("started", lambda d: d["checkpoint_id"] == "w-1")["how"] == "start"
        (pending,) = paused["interrupts"]
        assert (pending["tool"], pending["arguments"]) == ("act", {"command": "hold tight"})
        run = Stream(s, "/runs/w-1/events")
        assert run.wait_for("snapshot")["status"] == "interrupted"
        asyncio.run(queue(lambda q: q.resume("w-1", {pending["id"]: ApprovalResult(approved=True)})))
        assert run.wait_for("started")["how"] == "resume"
        assert run.wait_for("tool_result")["content"] == "did hold tight"  # live: the model still holds
        assert "end" not in run.kinds() and not (desk / "gate").exists()
        (desk / "gate").touch()
        assert run.wait_for("end")["status"] == "completed"
        assert run.wait_for("message", lambda d: d["content"].startswith("Done"))["content"] == "Done: did hold tight"
        assert page.wait_for("end", lambda d: d["checkpoint_id"] == "w-1" and d["status"] == "completed")
        assert c.get("/runs/w-1").json()["status"] == "completed"
        run.close()
        page.close()
    assert [a[0] for a in acts(desk)] == ["again", "hold tight"]


def test_a_models_hostile_text_from_a_worker_reaches_the_streams_escaped_and_breaks_nothing(tmp_path, procs):
    """A service with a queue on a SQLite file and a worker on it: the model's lone surrogate and bidi control
    reach the run's stream and the page's from the store, exactly and escaped; other runs are unaffected."""
    from urllib.parse import quote

    from service_support import raw_input, wait_for_worker

    desk, db = tmp_path / "desk", tmp_path / "runs.db"
    desk.mkdir()
    worker = spawn_worker(str(db), desk, tmp_path, graphs="desk_agent:raw",
                          env={"SERVICE_TOOL_LOG": str(tmp_path / "ran.txt"), "SERVICE_GATE": str(tmp_path / "gate")})
    procs.append(worker)

    wait_for_worker(db, "raw")
    surrogate, bidi = '{"command": "ls \\ud800"}', '{"command": "echo hi \\u202e#"}'
    cid = "evil\u202e-1"
    with ServeProcess(tmp_path, agents="service_agent:raw", args=("--queue",)) as s, s.client() as c:
        page = Stream(s, "/events")
        page.wait_for("snapshot")
        r = c.post("/runs", json={"agent": "raw", "input": raw_input(("execute", surrogate), ("execute", bidi)),
                                  "checkpoint_id": cid})
        assert r.status_code == 201 and r.json()["status"] == "running", r.text
        run = Stream(s, f"/runs/{quote(cid)}/events", r.json()["last_event_id"])
        paused = run.wait_for("interrupt")
        calls = [d for _, k, d in run.events if k == "tool_call"]
        assert [d["arguments"] for d in calls] == [{"command": "ls \ud800"}, {"command": "echo hi \u202e#"}]
        assert [d["arguments_json"] for d in calls] == [surrogate, bidi]
        shown = page.wait_for("interrupt", lambda d: d["checkpoint_id"] == cid)["interrupts"]
        assert [p["arguments"]["command"] for p in shown] == ["ls \ud800", "echo hi \u202e#"]
        assert [p["id"] for p in shown] == [p["id"] for p in paused["interrupts"]]
        plain = c.post("/runs", json={"agent": "raw", "input": raw_input(("execute", '{"command": "uptime"}')),
                                      "checkpoint_id": "plain", "wait": True})
        assert plain.status_code == 201 and plain.json()["status"] == "interrupted", plain.text
        listed = c.get("/approvals").json()
        assert listed["unreadable"] == [] and len(listed["approvals"]) == 3
        assert page.wait_for("interrupt", lambda d: d["checkpoint_id"] == "plain")
        run.close()
        page.close()
    assert not (tmp_path / "ran.txt").exists()  # nothing was approved, so nothing ran


@pytest.mark.parametrize("db", ["sqlite", "postgres"])
def test_a_run_this_service_executes_is_announced_once_though_it_follows_the_store(db, tmp_path, request):
    """The service follows every run in the store (polling SQLite, NOTIFY on Postgres), yet a run it executes
    itself has each event once — while it runs and after it ended — and a resume by another program then
    follows in the same stream."""
    from service_support import TOKEN, Served, approval_agent

    from waypoint.engine import Runner
    from waypoint.middleware import ApprovalResult
    from waypoint.service import create_app
    from waypoint.stores import SQLiteStore, SQLStore

    def open_store() -> Any:
        return SQLStore(request.getfixturevalue("pg_url")) if db == "postgres" else SQLiteStore(tmp_path / "runs.db")

    here: list[str] = []
    app = create_app(approval_agent(here, delay=0.1), open_store(), auth=TOKEN)  # 4 tokens a turn, 0.1 s apart
    with Served(app) as s, s.client() as c:
        r = c.post("/runs", json={"input": "uptime", "checkpoint_id": "once"})
        run = Stream(s, "/runs/once/events", r.json()["last_event_id"])
        (pending,) = run.wait_for("interrupt")["interrupts"]
        run.wait_for("end")
        elsewhere: list[str] = []

        async def approve_elsewhere() -> None:
            store = open_store()
            try:
                runner = Runner(approval_agent(elsewhere), store=store, streaming=True)
                async for _ in runner.resume_with_params("once", {pending["id"]: ApprovalResult(approved=True)}):
                    pass
            finally:
                await store.close()

        asyncio.run(approve_elsewhere())
        assert run.wait_for("end", lambda d: d["status"] == "completed")["version"] == c.get("/runs/once").json()["version"]
        assert run.wait_for("tool_result")["content"] == "ran uptime"
        kinds = run.kinds()
        assert [k for k in kinds if k in ("started", "interrupt", "end")] == ["started", "interrupt", "end",
                                                                            "started", "end"], kinds
        versions = [d["version"] for _, k, d in run.events if k == "checkpoint"]
        assert versions == sorted(set(versions)), versions
        assert kinds.count("message") == 2 and kinds.count("tool_result") == 1, kinds
        run.close()
    assert (here, elsewhere) == ([], ["uptime"])


def test_postgres_announces_a_runs_transitions_and_its_deletion_not_its_steps(pg_url):
    """What a service hears (NOTIFY): the claim, the end, the deletion — never each step, whose commits a
    NOTIFY would serialise with every other notifying commit of the database."""
    from conftest import linear

    from waypoint.stores import SQLStore

    async def main() -> tuple[list, int]:
        store = SQLStore(pg_url)
        heard: list[tuple] = []
        deleted = asyncio.Event()

        def on(cid: Any, version: int, status: str) -> None:
            heard.append((cid, version, status))
            if status == "deleted":
                deleted.set()

        listening = await store.listen_runs(on)
        try:
            await linear("five", *[lambda x: x + 1] * 5, store=store).ainvoke(0, checkpoint_id="t")
            newest = (await store.history("t", limit=1))[0].version
            await store.delete("t")
            await asyncio.wait_for(deleted.wait(), 30)  # delivered in commit order: the last one
        finally:
            await listening.close()
            await store.close()
        return heard, newest

    heard, newest = asyncio.run(main())
    assert newest > 3 and heard == [("t", 1, "running"), ("t", newest, "completed"), ("t", 0, "deleted")]


def test_serve_refuses_a_queue_on_a_database_no_worker_can_share(tmp_path):
    env = {**os.environ, "WAYPOINT_TOKEN": "serve-token-9a8b7c6d5e4f", "PYTHONPATH": str(PROCS)}
    out = subprocess.run([str(Path(sys.executable).parent / "waypoint"), "serve", "--db", "memory", "--queue",
                          "--agents", "desk_agent:build", "--port", "0"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--queue needs a database the workers share" in out.stderr, out.stderr


def test_a_sync_node_sleeping_in_one_run_does_not_stall_other_requests(tmp_path):
    """Issue 20, item 4: a plain `def` node that sleeps runs off the event loop in `waypoint serve`."""
    with ServeProcess(tmp_path, agents="service_agent:sleepy,service_agent:steps", args=("--drain", "0")) as s, \
            s.client() as c:  # (stopped at the end with its node still asleep: no drain to wait out)
        marker = tmp_path / "sleeping"
        t0 = time.monotonic()
        r = c.post("/runs", json={"agent": "sleepy", "input": {"marker": str(marker), "seconds": 20},
                                  "checkpoint_id": "slow"})
        answered = time.monotonic() - t0
        assert r.status_code == 201, r.text
        assert answered < 5.0, f"POST /runs waited {answered:.1f} s for the node sleeping 20 s"
        wait_until(marker.exists, 20, "the node sleeping")
        t0 = time.monotonic()
        assert c.get("/agents").status_code == 200
        other = c.post("/runs", json={"agent": "steps", "input": {"n": 2}, "checkpoint_id": "quick", "wait": True})
        took = time.monotonic() - t0
        assert other.status_code == 201 and other.json()["status"] == "completed", other.text
        assert took < 5.0, f"another request waited {took:.1f} s for the node sleeping 20 s"
        assert c.get("/runs/slow").json()["status"] == "running"  # the node still sleeps


def _freeze_at_claim(pg: Any, db: str, cid: str, pid: int, out: dict, ready: threading.Event) -> None:
    """SIGSTOP worker `pid` the moment it claims the queued work of run `cid` (before its run claim is written)."""
    import asyncpg

    async def main() -> None:
        conn = await asyncpg.connect(host=pg.socket_dir, user="postgres", database=db)
        ready.set()
        end = time.monotonic() + 20
        try:
            while time.monotonic() < end:
                if await conn.fetchval("SELECT state FROM waypoint_queue WHERE checkpoint_id = $1", cid) == "claimed":
                    os.kill(pid, signal.SIGSTOP)
                    out["version"] = await conn.fetchval(
                        "SELECT MAX(version) FROM waypoint_checkpoints WHERE checkpoint_id = $1", cid)
                    return
        finally:
            await conn.close()

    asyncio.run(main())


def test_a_queued_approve_another_resumer_beat_is_never_answered_as_claimed(pg, pg_url, tmp_path, procs):
    """The service queues an approve; the worker claims the work and freezes before its run claim; meanwhile
    `waypoint runs resume --reject` answers the same pause. The service must not take the reject's version for
    its approve's claim: its answer is "queued" (not yet applied), never "running" at someone else's version."""
    from pg import database_of

    desk = tmp_path / "desk"
    desk.mkdir()
    worker = spawn_worker(pg_url, desk, tmp_path, env={"DESK_LEASE": "30"})
    procs.append(worker)
    tried = []
    with serve(tmp_path, desk, db=pg_url) as s, s.client() as c:
        for attempt in range(8):
            cid = f"race-{attempt}"
            paused = c.post("/runs", json={"agent": "desk", "input": f"hold {attempt}", "checkpoint_id": cid,
                                           "wait": True})
            assert paused.status_code == 201 and paused.json()["status"] == "interrupted", paused.text
            version, (pending,) = paused.json()["version"], paused.json()["interrupts"]
            out, ready, answer = {}, threading.Event(), {}
            freezer = threading.Thread(target=_freeze_at_claim,
                                       args=(pg, database_of(pg_url), cid, worker.pid, out, ready))
            freezer.start()
            ready.wait(10)

            def approve() -> None:
                with s.client() as c2:
                    answer["r"] = c2.post(f"/runs/{cid}/resume", json={"answers": [
                        {"action": "approve", "interrupt_id": pending["id"], "digest": pending["digest"]}]})

            approver = threading.Thread(target=approve)
            approver.start()
            freezer.join(30)
            if out.get("version") != version:  # the worker wrote its claim before it froze: try again
                os.kill(worker.pid, signal.SIGCONT)
                approver.join(30)
                tried.append(out.get("version"))
                continue
            cli = subprocess.run([sys.executable, "-m", "waypoint.cmd.main", "runs", "--db", pg_url, "resume", cid,
                                  "--reject", pending["id"], "--reason", "no", "--graph", "desk_agent:build"],
                                 cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(PROCS), "DESK_DIR": str(desk)},
                                 capture_output=True, text=True, timeout=60)
            approver.join(30)
            os.kill(worker.pid, signal.SIGCONT)
            assert cli.returncode == 0, cli.stderr
            r = answer["r"]
            assert not (r.status_code == 200 and r.json()["status"] != "queued"), r.text
            wait_until(lambda: c.get(f"/runs/{cid}").json()["status"] == "completed", 30, "the reject's end")
            assert [a[0] for a in acts(desk)] == []  # the approve was never applied
            return
    raise AssertionError(f"never froze the worker between its claims: {tried}")


def test_every_version_of_a_run_that_writes_fast_reaches_its_stream(tmp_path, procs):
    """A worker runs 200 steps between two of the service's looks (SQLite polling, 0.5 s): the reader that
    follows from the start's `last_event_id` gets one `checkpoint` per stored version, in order, and `started`
    at the claim the start answered."""
    import sqlite3

    from waypoint.stores import open_store

    desk = tmp_path / "desk"
    desk.mkdir()
    db = str(tmp_path / "runs.db")
    procs.append(spawn_worker(db, desk, tmp_path, graphs="desk_agent:many_compiled"))
    with ServeProcess(tmp_path, agents="desk_agent:many", db=db, args=("--queue",),
                      env={"DESK_DIR": str(desk)}) as s, s.client() as c:
        wait_until(lambda: sqlite3.connect(db).execute("SELECT COUNT(*) FROM waypoint_workers WHERE graph = 'many' "
                                                       "AND until > ?", (time.time(),)).fetchone()[0], 30, "a worker")
        r = c.post("/runs", json={"agent": "many", "input": 0, "checkpoint_id": "fast"})
        assert r.status_code == 201 and r.json()["status"] == "running", r.text
        stream = Stream(s, "/runs/fast/events", r.json()["last_event_id"])
        assert stream.wait_for("end", timeout=60)["status"] == "completed"
        stream.close()

    async def stored() -> list[int]:
        store = open_store(db)
        try:
            return sorted(m.version for m in await store.history("fast"))
        finally:
            await store.close()

    got = [d["version"] for _t, kind, d in stream.events if kind == "checkpoint"]
    assert got == asyncio.run(stored()) and len(got) > 200, got
    assert [d["version"] for _t, kind, d in stream.events if kind == "started"] == [r.json()["version"]]
