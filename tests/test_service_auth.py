"""Auth on every call: 401 without a valid bearer token, 403 for a token without the scope, the page's
cookie (and its forgery guard), and no token value in a response or a log line."""

from __future__ import annotations

import logging
import statistics
import time

import pytest

pytest.importorskip("fastapi")

from service_support import Served, approval_agent  # noqa: E402

from waypoint.service import Auth, AuthError, create_app  # noqa: E402
from waypoint.service._sessions import Sessions  # noqa: E402
from waypoint.stores import MemoryStore  # noqa: E402

TOKEN = "full-token-0a9b8c7d"
READER = "reader-token-1f2e3d"
WRONG = "wrong-token-c0ffee99"

CALLS = [("GET", "/runs", None), ("GET", "/runs/x", None), ("POST", "/runs", {"input": "ls"}),
         ("POST", "/runs/x/resume", {}), ("DELETE", "/runs/x", None), ("GET", "/runs/x/events", None),
         ("GET", "/approvals", None), ("GET", "/events", None), ("GET", "/agents", None), ("GET", "/openapi.json", None),
         ("GET", "/ui/session", None)]


@pytest.fixture
def served():
    from waypoint.service._throttle import Throttle

    app = create_app(approval_agent([]), MemoryStore(), auth={TOKEN: {"read", "start", "resume", "delete"},
                                                               READER: {"read"}})
    app.state.waypoint.gate.throttle = Throttle(free=10_000)  # wrong tokens are what these tests send: not slowed
    with Served(app) as s:                                   # (the slowing is tested in tests/test_service_limits.py)
        yield s


NEAR_MISSES = [TOKEN[:1], TOKEN[:-1], TOKEN + "0", TOKEN[:-1] + chr(ord(TOKEN[-1]) ^ 1), TOKEN.upper(), f" {TOKEN}0",
               READER[:-1], READER + READER]
"""A valid token's prefixes, longer strings, one character changed, another case: each is no token."""


@pytest.mark.parametrize("authorization", [None, f"Bearer {WRONG}", f"Basic {TOKEN}", "Bearer", TOKEN,
                                           *(f"Bearer {near}" for near in NEAR_MISSES)])
def test_every_call_needs_a_valid_bearer_token(served, authorization):
    headers = {"Authorization": authorization} if authorization is not None else {}
    with served.client(token=None) as c:
        for method, path, body in CALLS:
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            assert WRONG not in r.text and TOKEN not in r.text


def test_a_read_only_token_reads_but_may_not_start_resume_or_delete(served):
    with served.client(TOKEN) as admin, served.client(READER) as reader:
        r = admin.post("/runs", json={"input": "uptime", "checkpoint_id": "r1", "wait": True})
        iid = r.json()["interrupts"][0]["id"]
        assert reader.get("/runs/r1").status_code == 200
        assert reader.get("/approvals").json()["approvals"][0]["id"] == iid
        for method, path, body in [("POST", "/runs/r1/resume", {"answers": [{"action": "approve", "interrupt_id": iid}]}),
                                   ("POST", "/runs", {"input": "ls"}), ("DELETE", "/runs/r1", None)]:
            r = reader.request(method, path, json=body)
            assert r.status_code == 403, (path, r.text)
            assert "may not" in r.json()["detail"] and READER not in r.text
        assert reader.get("/runs/r1").json()["status"] == "interrupted"  # nothing happened
        assert reader.get("/ui/session").json() == {"scopes": ["read"]}


def test_a_callable_decides_and_may_be_async(tmp_path):
    seen = []

    async def decide(token):
        seen.append(len(token))
        return {"read"} if token == READER else None

    with Served(create_app(approval_agent([]), MemoryStore(), auth=decide)) as s:
        with s.client(READER) as c:
            assert c.get("/runs").status_code == 200
            assert c.post("/runs", json={"input": "x"}).status_code == 403
        with s.client(WRONG) as c:
            assert c.get("/runs").status_code == 401
    assert seen == [len(READER), len(READER), len(WRONG)]


def test_tokens_from_the_environment(monkeypatch):
    monkeypatch.setenv("WAYPOINT_TOKEN", TOKEN)
    monkeypatch.setenv("WAYPOINT_READ_TOKEN", READER)
    with Served(create_app(approval_agent([]), MemoryStore())) as s:
        with s.client(TOKEN) as c:
            assert c.post("/runs", json={"input": "x", "wait": True}).status_code == 201
        with s.client(READER) as c:
            assert c.get("/runs").status_code == 200 and c.post("/runs", json={"input": "x"}).status_code == 403


def test_no_token_configured_refuses_to_build_the_service(monkeypatch):
    monkeypatch.delenv("WAYPOINT_TOKEN", raising=False)
    monkeypatch.delenv("WAYPOINT_READ_TOKEN", raising=False)
    with pytest.raises(AuthError, match="WAYPOINT_TOKEN"):
        create_app(approval_agent([]), MemoryStore())
    with pytest.raises(AuthError, match="unknown scope"):
        Auth({TOKEN: {"read", "admin"}})
    with pytest.raises(AuthError, match="empty"):
        Auth("")


def test_the_page_logs_in_to_a_session_and_writes_need_its_write_key(served):
    with served.client(token=None) as c:
        assert c.post("/ui/login", json={"token": WRONG}, headers={"X-Requested-With": "waypoint"}).status_code == 401
        assert c.post("/ui/login", json={"token": TOKEN}).status_code == 403  # no header: a form from elsewhere
        r = c.post("/ui/login", json={"token": TOKEN}, headers={"X-Requested-With": "waypoint"})
        assert r.status_code == 200 and TOKEN not in r.text
        key = r.json()["csrf"]
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("waypoint_session=") and TOKEN not in cookie
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie and "Max-Age=" in cookie
        assert c.get("/runs").status_code == 200  # the cookie authenticates reads
        r = c.post("/runs", json={"input": "ls", "checkpoint_id": "c1"}, headers={"X-Requested-With": "waypoint"})
        assert r.status_code == 403 and "x-waypoint-csrf" in r.json()["detail"]  # the old header is not enough
        r = c.post("/runs", json={"input": "ls", "checkpoint_id": "c1"}, headers={"X-Waypoint-CSRF": "guess"})
        assert r.status_code == 403
        r = c.post("/runs", json={"input": "ls", "checkpoint_id": "c1"}, headers={"X-Waypoint-CSRF": key})
        assert r.status_code == 201
        assert c.post("/ui/logout").status_code == 403  # a forged logout (no write key) is refused
        assert c.get("/runs").status_code == 200
        assert c.post("/ui/logout", headers={"X-Waypoint-CSRF": key}).status_code == 204
        assert c.get("/runs").status_code == 401


def test_the_page_shells_need_no_token_and_carry_no_data(served):
    with served.client(token=None) as c:
        for path in ("/ui", "/ui/runs/anything", "/ui/static/app.js", "/ui/static/style.css"):
            r = c.get(path)
            assert r.status_code == 200, path
            assert "default-src 'self'" in r.headers["content-security-policy"]
        assert '<base href="/">' in c.get("/ui").text
        assert c.get("/ui/static/secrets.txt").status_code == 404


def test_no_token_value_in_a_log_line(served, caplog):
    caplog.set_level(logging.DEBUG)
    with served.client(WRONG) as bad, served.client(TOKEN) as good:
        bad.get("/runs")
        bad.post("/runs", json={"input": "x"})
        good.post("/runs", json={"input": "x", "checkpoint_id": "l1", "wait": True})
        good.post("/runs/l1/resume", json={"answers": [{"action": "approve", "interrupt_id": "nope"}]})
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert TOKEN not in text and WRONG not in text


def test_a_token_taken_away_ends_its_page_sessions():
    valid = {TOKEN}

    async def decide(token):
        return True if token in valid else None

    with Served(create_app(approval_agent([]), MemoryStore(), auth=decide)) as s, s.client(token=None) as page:
        assert page.post("/ui/login", json={"token": TOKEN}, headers={"X-Requested-With": "waypoint"}).status_code == 200
        assert page.get("/runs").status_code == 200
        valid.clear()  # the identity provider revokes the token
        assert page.get("/runs").status_code == 401
        valid.add(TOKEN)
        assert page.get("/runs").status_code == 401  # the session ended with it; log in again


def test_logging_in_again_and_again_with_one_token_never_ends_anothers_session():
    """A read-only viewer who logs in over and over (the reviewer's 10,000 logins) ends only its own oldest
    sessions, never the approver's; and past 10 logins a minute each login with that token waits its turn."""
    app = create_app(approval_agent([]), MemoryStore(), auth={TOKEN: {"read", "start", "resume", "delete"},
                                                               READER: {"read"}})
    service = app.state.waypoint
    service.sessions.limit, service.sessions.per_token = 8, 5  # 10,000 and 1,000 at full size
    login = {"X-Requested-With": "waypoint"}
    with Served(app) as s, s.client(token=None) as admin, s.client(token=None) as viewer:
        key = admin.post("/ui/login", json={"token": TOKEN}, headers=login).json()["csrf"]
        took = []
        for _ in range(12):
            t0 = time.monotonic()
            assert viewer.post("/ui/login", json={"token": READER}, headers=login).status_code == 200
            took.append(time.monotonic() - t0)
            viewer.cookies.clear()
        assert statistics.median(took[:10]) < 0.2 and took[10] >= 0.25 and took[11] >= 0.5, took  # 10 free, then
        # 0.25 s, 0.5 s, ... (the delays are lower bounds: a loaded machine only adds to them)
        assert service.sessions.count(READER) == 5 and len(service.sessions) == 6
        assert admin.get("/ui/session").json() == {"scopes": ["delete", "read", "resume", "start"]}
        r = admin.post("/runs", json={"input": "ls", "checkpoint_id": "still-mine"}, headers={"X-Waypoint-CSRF": key})
        assert r.status_code == 201


def test_past_the_limit_in_all_the_token_holding_the_most_sessions_loses_its_oldest():
    sessions = Sessions(limit=10, per_token=4)
    mine, _ = sessions.open(TOKEN)
    readers = [sessions.open(READER)[0] for _ in range(50)]
    assert sessions.find(mine) is not None and sessions.count(READER) == 4
    assert [sessions.find(r) is not None for r in readers] == [False] * 46 + [True] * 4  # its own oldest went
    others = [sessions.open(f"other-token-{n:02d}-abcdef")[0] for n in range(5)]  # 1 + 4 + 5 = 10 in all
    sessions.open("one-more-token-0123456789")  # 11: the reader's 4 are the most, its oldest ends
    assert sessions.count(READER) == 3 and sessions.find(readers[46]) is None and sessions.find(readers[47])
    assert sessions.find(mine) is not None and all(sessions.find(o) is not None for o in others)
    sessions.close(mine)
    assert sessions.count(TOKEN) == 0 and len(sessions) == 9
