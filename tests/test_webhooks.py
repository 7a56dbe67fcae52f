"""Notifications (issue 32, section 3): `create_app(webhooks=...)` / `waypoint serve --webhook URL` post each served
run's pause, expired pause, completion and failure — signed, retried with backoff, off the runs' path, once per
event however many services share the database — to a real HTTP receiver on 127.0.0.1 that the test starts.
Every wait is for an event (a request, a look of the notifier, a log line), polled with a deadline."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from service_support import SERVE_TOKEN, TOKEN, ServeProcess, Served, approval_agent, wait_until  # noqa: E402

from waypoint.engine import END, START, Graph, Interrupt, get_resume_context  # noqa: E402
from waypoint.service import WebhookError, Webhooks, create_app, verify_signature  # noqa: E402
from waypoint.service._webhooks import events_of  # noqa: E402
from waypoint.stores import MemoryStore, SQLiteStore, SQLStore  # noqa: E402
from waypoint.stores.deliveries import deliveries_for, row_of  # noqa: E402

SECRET = "webhook-secret-5e4d3c2b1a"
POLL = 0.1
BACKOFF = 0.3


# --- the receiver -------------------------------------------------------------------------------------------------

@dataclass
class Request:
    headers: dict[str, str]
    body: bytes
    at: float
    status: int | None = None

    @property
    def data(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class Receiver:
    """An HTTP server on 127.0.0.1 in a thread: records every POST (`requests`), answers 200, or the statuses
    queued by `fail(n, status)` first; after `hold()` every request waits (unanswered) until `release()`."""

    requests: list[Request] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.gate.set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = Request({k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                receiver.requests.append(request)
                receiver.gate.wait(60)
                request.status = receiver.failures.pop(0) if receiver.failures else 200
                try:
                    self.send_response(request.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:  # the sender gave up waiting
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhook-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/waypoint?token=in-the-url"

    def fail(self, n: int, status: int = 503) -> None:
        self.failures += [status] * n

    def hold(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def answered(self) -> list[Request]:
        return [r for r in self.requests if r.status is not None and 200 <= r.status < 300]

    def wait_for(self, n: int, timeout: float = 30.0, *, ok: bool = True) -> list[Request]:
        """The first `n` requests (answered 2xx, if `ok`) once they have arrived."""
        got = wait_until(lambda: len(self.answered() if ok else self.requests) >= n, timeout,
                         f"{n} webhook request(s) (got {[r.data['event'] for r in self.requests]})")
        assert got
        return (self.answered() if ok else self.requests)[:n]

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    """A port nothing listens on (a refused connection)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- what is served ----------------------------------------------------------------------------------------------

def quick_graph() -> Graph:
    g = Graph(name="quick")
    g.add_node("double", lambda x: x * 2)
    g.add_edge(START, "double")
    g.add_edge("double", END)
    return g


def broken_graph() -> Graph:
    def explode(x: Any) -> Any:
        raise RuntimeError("the disk is full")

    g = Graph(name="broken")
    g.add_node("explode", explode)
    g.add_edge(START, "explode")
    g.add_edge("explode", END)
    return g


def refund_graph() -> Graph:
    def review(amount: int) -> str:
        is_target, _, answer = get_resume_context()
        if not is_target:
            raise Interrupt({"question": f"refund {amount}?"})
        return f"refunded {amount}" if answer == "yes" else f"declined: {answer}"

    g = Graph(name="refunds")
    g.add_node("review", review)
    g.add_edge(START, "review")
    g.add_edge("review", END)
    return g


def hooked(targets: Any, store: Any, urls: list[str], *, recover: bool = True, **settings: Any) -> Any:
    hooks = Webhooks(urls=tuple(urls), secret=SECRET, **{"poll": POLL, "backoff": BACKOFF, **settings})
    return create_app(targets, store, auth=TOKEN, webhooks=hooks, recover=recover)


def looked(app: Any, n: int = 3, timeout: float = 30.0) -> None:
    """Wait until the app's notifier has looked at the store `n` more times (each look finds and registers every
    event written before it began, so what was not posted by then is not coming)."""
    notifier = app.state.waypoint.notifier
    start = notifier.looks
    wait_until(lambda: notifier.looks >= start + n, timeout, f"{n} looks of the notifier")


def run_script(db: Path, graph: Graph, input: Any, cid: str) -> None:
    """Run `graph` on the SQLite file `db` in this process, outside any service (a script, a worker)."""
    async def main() -> None:
        store = SQLiteStore(db)
        try:
            await graph.compile(store=store).ainvoke(input, checkpoint_id=cid)
        except Exception:  # noqa: BLE001 - a pause or a failure is what some tests want
            pass
        finally:
            await store.close()

    asyncio.run(main())


def approve(client: Any, run: dict) -> dict:
    pending = run["interrupts"][0]
    r = client.post(f"/runs/{run['checkpoint_id']}/resume", json={
        "answers": [{"action": "approve", "interrupt_id": pending["id"], "digest": pending["digest"]}],
        "expected_version": run["version"], "wait": True})
    assert r.status_code == 200, r.text
    return r.json()


# --- what is posted --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_a_pause_posts_waiting_with_the_pending_call_as_the_page_shows_it_then_its_completion(kind, tmp_path):
    calls: list[str] = []
    store = SQLiteStore(tmp_path / "runs.db") if kind == "sqlite" else MemoryStore()
    with Receiver() as rx:
        app = hooked({"ops": approval_agent(calls)}, store, [rx.url])
        with Served(app) as served, served.client() as client:
            run = client.post("/runs", json={"agent": "ops", "input": "uptime", "checkpoint_id": "w1",
                                             "wait": True}).json()
            assert run["status"] == "interrupted"
            (waiting,) = rx.wait_for(1)
            body = waiting.data
            assert (body["event"], body["run_id"], body["graph"], body["version"], body["status"], body["error"]) == \
                ("waiting", "w1", "ops", run["version"], "interrupted", None)
            (pending,) = body["pending"]
            assert pending == run["interrupts"][0]  # exactly as GET /runs/{id} and the page show it
            (listed,) = client.get("/approvals").json()["approvals"]
            assert {k: listed[k] for k in pending} == pending  # and as GET /approvals lists it
            assert (pending["tool"], pending["arguments"], pending["kind"]) == ("execute", {"command": "uptime"},
                                                                                "approval")
            assert pending["id"] and pending["digest"] and body["at"] == run["updated_at"]
            assert waiting.headers["content-type"] == "application/json"
            assert waiting.headers["waypoint-event"] == "waiting"
            assert waiting.headers["waypoint-delivery"] == body["id"]
            assert calls == []

            done = approve(client, run)
            assert done["status"] == "completed" and calls == ["uptime"]
            completed = rx.wait_for(2)[1].data
            assert (completed["event"], completed["run_id"], completed["status"], completed["version"],
                    completed["pending"]) == ("completed", "w1", "completed", done["version"], [])
            assert completed["id"] != body["id"]
            looked(app)
            assert [r.data["event"] for r in rx.requests] == ["waiting", "completed"]  # each once


def test_a_failed_run_executed_by_a_script_posts_failed_with_its_error(tmp_path):
    db = tmp_path / "runs.db"
    with Receiver() as rx:
        app = hooked({"broken": broken_graph()}, SQLiteStore(db), [rx.url])
        with Served(app):
            run_script(db, broken_graph(), 1, "f1")  # not executed by the service: found in the store
            (failed,) = rx.wait_for(1)
            body = failed.data
            assert (body["event"], body["run_id"], body["graph"], body["status"]) == ("failed", "f1", "broken", "failed")
            assert "the disk is full" in body["error"] and body["pending"] == []
            looked(app)
            assert len(rx.requests) == 1


def test_the_signature_verifies_with_the_key_and_fails_with_another(tmp_path):
    with Receiver() as rx:
        app = hooked({"quick": quick_graph()}, SQLiteStore(tmp_path / "runs.db"), [rx.url])
        with Served(app) as served, served.client() as client:
            client.post("/runs", json={"agent": "quick", "input": 21, "checkpoint_id": "s1", "wait": True})
            (posted,) = rx.wait_for(1)
    header = posted.headers["waypoint-signature"]
    assert verify_signature(SECRET, posted.body, header)
    assert not verify_signature("another-secret-0123456789", posted.body, header)
    assert not verify_signature(SECRET, posted.body.replace(b'"s1"', b'"s2"'), header)
    t, v1 = (part.split("=", 1)[1] for part in header.split(","))
    assert abs(int(t) - time.time()) < 300
    assert not verify_signature(SECRET, posted.body, header, now=int(t) + 301)  # a replay, later
    # what any receiver computes (docs/service.md): HMAC-SHA256 of "<t>.<body>" with the key, in hex
    assert hmac.compare_digest(v1, hmac.new(SECRET.encode(), f"{t}.".encode() + posted.body, hashlib.sha256).hexdigest())
    assert not hmac.compare_digest(v1, hmac.new(b"another-secret-0123456789", f"{t}.".encode() + posted.body,
                                                hashlib.sha256).hexdigest())


def test_a_receiver_failing_twice_gets_the_event_once_after_retries_with_backoff(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="waypoint.webhooks")
    with Receiver() as rx:
        rx.fail(2, 503)
        app = hooked({"quick": quick_graph()}, SQLiteStore(tmp_path / "runs.db"), [rx.url])
        with Served(app) as served, served.client() as client:
            client.post("/runs", json={"agent": "quick", "input": 1, "checkpoint_id": "r1", "wait": True})
            rx.wait_for(1)
            looked(app, 5)
    first, second, third = rx.requests
    assert [r.status for r in rx.requests] == [503, 503, 200]
    assert first.body == second.body == third.body  # the same delivery, the same ID
    assert first.headers["waypoint-delivery"] == third.headers["waypoint-delivery"] == third.data["id"]
    assert second.at - first.at >= BACKOFF and third.at - second.at >= 2 * BACKOFF  # backoff, doubling
    warned = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert len(warned) == 2 and all("'r1'" in w and "'completed'" in w and "HTTP 503" in w for w in warned)


def test_bounded_attempts_then_given_up_and_logged_naming_the_run_and_event(tmp_path, caplog):
    """A receiver answering 500 for ever and one refusing connections: 3 attempts each, then an error in the log
    naming the run and the event; the healthy receiver beside them gets the event once."""
    caplog.set_level(logging.WARNING, logger="waypoint.webhooks")
    with Receiver() as bad, Receiver() as good:
        bad.fail(1000, 500)
        refused = f"http://127.0.0.1:{free_port()}/hook"
        app = hooked({"quick": quick_graph()}, SQLiteStore(tmp_path / "runs.db"), [bad.url, refused, good.url],
                     attempts=3, backoff=0.1)
        with Served(app) as served, served.client() as client:
            client.post("/runs", json={"agent": "quick", "input": 1, "checkpoint_id": "g1", "wait": True})
            good.wait_for(1)

            def gave_up() -> list[str]:
                return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "gave up" in r.getMessage()]

            wait_until(lambda: len(gave_up()) == 2, 30, "two give-ups")
            hooks = app.state.waypoint.notifier.hooks
            looked(app, int(2 * hooks.delay(hooks.attempts, 1.0) / POLL) + 2)  # past when a 4th try would be due
        assert len(bad.requests) == 3 and len(good.requests) == 1
    for message in gave_up():
        assert "'completed' event of run 'g1'" in message and "after 3 attempts" in message
    assert any("ConnectError" in m for m in gave_up()) and any("HTTP 500" in m for m in gave_up())
    assert all("in-the-url" not in r.getMessage() for r in caplog.records)  # a URL's secret is never logged


def test_a_receiver_that_hangs_does_not_slow_the_runs(tmp_path, caplog):
    """The receiver answers nothing: each run starts while the previous run's post hangs, and none waits for it —
    were a post on a run's path (or on the event loop the runs share), a run would take the timeout."""
    caplog.set_level(logging.WARNING, logger="waypoint.webhooks")
    timeout, runs = 3.0, 5
    with Receiver() as rx:
        rx.hold()
        app = hooked({"quick": quick_graph()}, SQLiteStore(tmp_path / "runs.db"), [rx.url], timeout=timeout)
        with Served(app) as served, served.client() as client:
            took = []
            for i in range(runs):
                began = time.monotonic()
                r = client.post("/runs", json={"agent": "quick", "input": i, "checkpoint_id": f"h{i}", "wait": True})
                took.append(time.monotonic() - began)
                assert r.status_code == 201 and r.json()["status"] == "completed"
                wait_until(lambda: any(q.data["run_id"] == f"h{i}" for q in rx.requests), 30, f"h{i}'s post")
            assert max(took) < timeout / 2, f"runs beside a hanging receiver took {took}"
            assert all(q.status is None for q in rx.requests)  # none answered while the runs ran
            wait_until(lambda: any("no answer within 3 s" in r.getMessage() for r in caplog.records), 30,
                       "a timed-out attempt")
            rx.release()

            def states() -> list[str]:
                with sqlite3.connect(tmp_path / "runs.db") as conn:
                    return [s for (s,) in conn.execute("SELECT state FROM waypoint_deliveries")]

            wait_until(lambda: states() == ["delivered"] * runs, 60, "every run's event delivered once it answers")


def test_two_serve_processes_on_one_sqlite_file_post_each_event_once(tmp_path):
    db = str(tmp_path / "shared.db")
    with Receiver() as rx:
        env = {"WAYPOINT_WEBHOOK_SECRET": SECRET}
        args = ("--webhook", rx.url)
        a_dir, b_dir = tmp_path / "a", tmp_path / "b"
        a_dir.mkdir()
        b_dir.mkdir()
        with ServeProcess(a_dir, agents="service_agent:build,service_agent:steps", db=db, args=args, env=env) as a, \
                ServeProcess(b_dir, agents="service_agent:build,service_agent:steps", db=db, args=args, env=env) as b, \
                a.client() as ca, b.client() as cb:
            for i, client in enumerate([ca, cb, ca, cb, ca, cb]):
                r = client.post("/runs", json={"agent": "steps", "input": {"n": 3}, "checkpoint_id": f"s{i}",
                                               "wait": True})
                assert r.json()["status"] == "completed", r.text
            run = ca.post("/runs", json={"agent": "ops", "input": "please run the command uptime",
                                         "checkpoint_id": "ops-1", "wait": True}).json()
            assert run["status"] == "interrupted", run
            assert approve(cb, run)["status"] == "completed"  # paused in A, approved through B
            expected = {(f"s{i}", "completed") for i in range(6)} | {("ops-1", "waiting"), ("ops-1", "completed")}
            wait_until(lambda: {(r.data["run_id"], r.data["event"]) for r in rx.answered()} == expected, 60,
                       "every event posted")
            # both services look every second (Webhooks.poll) with a 30 s overlap: a second copy of any event
            # would come at their next looks
            deadline = time.monotonic() + 4 * Webhooks.poll
            wait_until(lambda: time.monotonic() > deadline or len(rx.requests) > len(expected), 30, "a duplicate")
            outputs = a.stop() + b.stop()
    assert sorted((r.data["run_id"], r.data["event"]) for r in rx.requests) == sorted(expected)
    assert len({r.data["id"] for r in rx.requests}) == len(expected)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*), SUM(attempts), MIN(state), MAX(state) FROM waypoint_deliveries"
                            ).fetchone() == (len(expected), len(expected), "delivered", "delivered")
    assert "webhooks:" not in outputs, outputs


def test_a_service_killed_mid_attempt_leaves_the_delivery_to_another_once_its_claim_lapses(tmp_path):
    """Service A claims the event and is SIGKILLed while its post hangs; service B on the same file posts it — the
    same delivery ID and body — once A's claim has lapsed on the database's clock (twice the timeout plus 10 s),
    not before."""
    db, timeout = str(tmp_path / "shared.db"), 1.0
    hold = 2 * timeout + 10
    with Receiver() as rx:
        rx.hold()
        env = {"WAYPOINT_WEBHOOK_SECRET": SECRET}
        args = ("--webhook", rx.url, "--webhook-timeout", str(timeout))
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        with ServeProcess(tmp_path / "a", agents="service_agent:steps", db=db, args=args, env=env) as a, a.client() as ca:
            ca.post("/runs", json={"agent": "steps", "input": {"n": 1}, "checkpoint_id": "k1", "wait": True})
            (first,) = rx.wait_for(1, ok=False)  # A's attempt, hanging
            a.proc.kill()
            a.proc.wait(10)
        rx.release()
        with ServeProcess(tmp_path / "b", agents="service_agent:steps", db=db, args=args, env=env):
            second = rx.wait_for(2, timeout=hold + 30, ok=False)[1]

            def delivered() -> list:
                with sqlite3.connect(db) as conn:
                    return conn.execute("SELECT state, attempts FROM waypoint_deliveries").fetchall()

            wait_until(lambda: delivered() == [("delivered", 1)], 30, "B's attempt recorded")
    assert second.status == 200 and second.body == first.body and len(rx.requests) == 2
    assert second.headers["waypoint-delivery"] == first.headers["waypoint-delivery"] == first.data["id"]
    assert second.at - first.at >= hold - 1.0  # B waited for the claim to lapse


def test_a_service_started_on_old_runs_posts_nothing_for_them(tmp_path):
    """Runs that stopped an hour before the service started are history (not posted); one that stopped within
    the lookback before it started (a restart's gap) is."""
    db = tmp_path / "runs.db"
    run_script(db, quick_graph(), 1, "old-done")
    run_script(db, broken_graph(), 1, "old-failed")
    run_script(db, refund_graph(), 5, "old-paused")
    with sqlite3.connect(db) as conn:  # as if they had stopped an hour ago
        conn.execute("UPDATE waypoint_checkpoints SET updated_at = updated_at - 3600")
    run_script(db, quick_graph(), 2, "recent-done")
    with Receiver() as rx:
        app = hooked({"quick": quick_graph(), "broken": broken_graph(), "refunds": refund_graph()},
                     SQLiteStore(db), [rx.url])
        with Served(app) as served, served.client() as client:
            client.post("/runs", json={"agent": "quick", "input": 3, "checkpoint_id": "new-done", "wait": True})
            rx.wait_for(2)
            looked(app)
    assert sorted(r.data["run_id"] for r in rx.requests) == ["new-done", "recent-done"]


def test_an_approval_nobody_answers_posts_waiting_then_expired_then_completed(tmp_path):
    """A real deadline: an approval paused (expires_after=3) by another process, expired by this service's recovery;
    the `expired` event carries what the pause waited on and its origin names the paused version."""
    procs = Path(__file__).parent / "procs"
    env = {**os.environ, "EFFECTS": str(tmp_path / "effects.txt")}
    db = tmp_path / "app.db"
    with Receiver() as rx:
        with ServeProcess(tmp_path, agents="deadline_app:ops", db=str(db), args=("--webhook", rx.url),
                          env={"WAYPOINT_WEBHOOK_SECRET": SECRET, "EFFECTS": env["EFFECTS"], "DEADLINE_EXPIRES": "3"}):
            out = subprocess.run([sys.executable, str(procs / "deadline_app.py"), str(db), "pause", "d1", "--expires",
                                  "3"], capture_output=True, text=True, timeout=120, env=env)
            paused = json.loads(out.stdout.strip().splitlines()[-1])["d1"]
            got = rx.wait_for(3, timeout=3 + 60)
    events = [(r.data["event"], r.data["run_id"]) for r in got]
    # the pause is posted before its deadline; the expiry and the end may be found in one look and posted at once
    assert events[0] == ("waiting", "d1") and sorted(events[1:]) == [("completed", "d1"), ("expired", "d1")], events
    by_event = {r.data["event"]: r.data for r in got}
    waiting, expired = by_event["waiting"], by_event["expired"]
    assert waiting["pending"][0]["id"] == paused["iid"] and waiting["pending"][0]["deadline"] == paused["deadline"]
    assert expired["pending"] == waiting["pending"]  # what the expired pause waited on
    assert expired["origin"] == f"d1@{waiting['version']} expired"
    assert not (tmp_path / "effects.txt").exists()  # the tool never ran


def test_which_events_a_version_carries():
    from waypoint.engine import CheckpointMeta

    def meta(status: str, origin: str | None = None, error: str | None = None) -> CheckpointMeta:
        return CheckpointMeta(checkpoint_id="x", version=3, status=status, step=1, fingerprint="f", created_at=1.0,
                              updated_at=2.0, origin=origin, error=error)

    assert events_of(meta("interrupted")) == ["waiting"]
    assert events_of(meta("interrupted", error="cancelled")) == []  # a cancel waits for nobody
    assert events_of(meta("interrupted", origin="x@2 update_state")) == []  # an edit is not a new wait
    assert events_of(meta("interrupted", origin="x@2 migrate goto b (from a)")) == []  # nor is a migration
    assert events_of(meta("completed")) == ["completed"] and events_of(meta("failed", error="E: e")) == ["failed"]
    assert events_of(meta("running")) == [] and events_of(meta("running", origin="y@4")) == []
    assert events_of(meta("running", origin="x@2 expired")) == ["expired"]
    assert events_of(meta("completed", origin="x@2 expired")) == ["expired", "completed"]


# --- refused starts -------------------------------------------------------------------------------------------

def test_a_start_with_a_webhook_but_no_key_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("WAYPOINT_WEBHOOK_SECRET", raising=False)
    with pytest.raises(WebhookError, match="WAYPOINT_WEBHOOK_SECRET"):
        create_app({"quick": quick_graph()}, MemoryStore(), auth=TOKEN, webhooks="http://127.0.0.1:9/hook")
    env = {k: v for k, v in os.environ.items() if k != "WAYPOINT_WEBHOOK_SECRET"}
    env["WAYPOINT_TOKEN"] = SERVE_TOKEN
    waypoint = str(Path(sys.executable).parent / "waypoint")
    base = [waypoint, "serve", "--db", str(tmp_path / "runs.db"), "--agents", "service_agent:steps", "--port", "0"]
    env["PYTHONPATH"] = str(Path(__file__).parent / "procs")
    cases = [({}, "http://127.0.0.1:9/hook", "no key: set WAYPOINT_WEBHOOK_SECRET"),
             ({"WAYPOINT_WEBHOOK_SECRET": "short"}, "http://127.0.0.1:9/hook", "at least 16"),
             ({"WAYPOINT_WEBHOOK_SECRET": SECRET}, "ftp://127.0.0.1/hook/T0KEN-IN-PATH", "not an http:// or https:// URL")]
    for extra, url, said in cases:
        out = subprocess.run([*base, "--webhook", url], env={**env, **extra}, capture_output=True, text=True,
                             timeout=60, cwd=tmp_path)
        assert out.returncode == 2 and said in out.stderr, (out.returncode, out.stderr)
        assert "http://127.0.0.1:" not in out.stdout  # nothing was served
        assert out.stderr.count("\n") == 1  # one line, no traceback
        assert "T0KEN-IN-PATH" not in out.stderr  # a URL's path is not shown: it often holds a secret


# --- the ledger under two services, on SQLite and Postgres ---------------------------------------------------

@pytest.fixture(params=["sqlite", "postgres"])
def two_stores(request, tmp_path):
    """Two store objects on one database: what two services hold."""
    if request.param == "sqlite":
        return SQLiteStore(tmp_path / "d.db"), SQLiteStore(tmp_path / "d.db")
    url = request.getfixturevalue("pg_url")
    return SQLStore(url), SQLStore(url)


async def test_the_ledger_registers_and_claims_each_delivery_once_and_a_lapsed_claim_moves_on(two_stores):
    a, b = (deliveries_for(s) for s in two_stores)
    try:
        rows = [row_of(f"run-{i}", 1.5, 3, "completed", "rcv", b"{}") for i in range(20)]
        won_a, won_b = await asyncio.gather(a.register(rows), b.register(rows))
        assert sorted(won_a + won_b) == sorted(r["id"] for r in rows) and not set(won_a) & set(won_b)
        assert await a.register(rows) == [] and await b.known([rows[0]["id"], "wh_none"]) == {rows[0]["id"]}
        claims_a, claims_b = await asyncio.gather(a.claim(["rcv"], 15, 30.0), b.claim(["rcv"], 15, 30.0))
        assert len(claims_a) + len(claims_b) == 20
        assert not {d.id for d in claims_a} & {d.id for d in claims_b}
        assert await a.claim(["other"], 10, 30.0) == []
        one = (claims_a or claims_b)[0]
        for d in claims_a + claims_b:
            if d.id != one.id:
                assert await (a if d in claims_a else b).finish(d, "delivered")
        stale = dataclasses.replace(one, claim="not-the-token")
        assert not await a.finish(stale, "delivered")  # only the claim's holder writes the outcome
        assert await a.finish(one, "pending", delay=0.0, error="HTTP 503")  # a failed attempt: due again now
        short = await b.claim(["rcv"], 10, 3.0)  # claimed, and its service "dies" here
        assert [d.id for d in short] == [one.id] and short[0].attempts == 1
        assert await a.claim(["rcv"], 10, 30.0) == []  # held, by the database's clock
        deadline = time.monotonic() + 20
        while not (again := await a.claim(["rcv"], 10, 30.0)):  # once the claim lapsed on the database's clock
            assert time.monotonic() < deadline, "the lapsed claim was never taken again"
            await asyncio.sleep(0.05)
        assert [d.id for d in again] == [one.id]
        assert not await b.finish(short[0], "delivered")  # the dead claim's outcome is refused
        assert await a.finish(again[0], "failed", error="gave up")
        assert await a.claim(["rcv"], 10, 30.0) == []  # delivered and given up: never claimed again
        assert await a.prune(older_than=-1.0) == 20
    finally:
        for s in two_stores:
            await s.close()



async def test_the_events_query_reads_the_stopped_versions_since_a_time_page_by_page(two_stores, monkeypatch):
    """What a look reads (SQL, and the memory ledger through the public store API): versions written at or after
    `since` that may carry an event, oldest first, however many pages."""
    import waypoint.stores.deliveries as deliveries
    from waypoint.engine import CheckpointMeta

    monkeypatch.setattr(deliveries, "_PAGE", 2)
    store = two_stores[0]
    memory = MemoryStore()
    statuses = ["running", "interrupted", "running", "completed", "failed", "running", "interrupted"]
    for target in (store, memory):
        for run in ("a", "b"):
            for v, status in enumerate(statuses, 1):
                meta = CheckpointMeta(checkpoint_id=run, version=v, status=status, step=v, fingerprint="fp",
                                      created_at=1.0, updated_at=100.0 + v + (0.5 if run == "b" else 0.0),
                                      origin=f"{run}@{v - 1} expired" if v == 6 else None,
                                      lease_owner="x" if status == "running" else None,
                                      lease_expires=1e12 if status == "running" else None)
                await target.put(meta, b"h", {}, [], expected_version=v - 1 if v > 1 else None, takeover=True)
    want = [(run, v) for v in (4, 5, 6, 7) for run in ("a", "b")]  # since 104: v4 on (v1-3 are older)
    for ledger in (deliveries_for(store), deliveries_for(memory)):
        found = await ledger.stopped_since(104.0)
        assert [(m.checkpoint_id, m.version) for m in found] == want
    for s in two_stores:
        await s.close()


@pytest.mark.parametrize("header", ["t=\u00b2,v1=00", "t={now},v1=\u00e9", "t={now},v1=", "v1=00", "", "t=,v1=x",
                                    "t=1e9,v1=00", "t={now}" + ",v1=" + "0" * 64, "t=-5,v1=00", "t=nan,v1=00"])
def test_a_malformed_signature_header_is_refused_never_raises(header):
    body = b'{"event":"completed"}'
    header = header.format(now=int(time.time()))
    assert verify_signature(SECRET, body, header) is False
    good = f"t={int(time.time())},v1=" + hmac.new(SECRET.encode(), f"{int(time.time())}.".encode() + body,
                                                 hashlib.sha256).hexdigest()
    assert verify_signature(SECRET, body, good) and not verify_signature(SECRET, body, good, now=float("nan"))
