"""The service's door, against `waypoint serve` in a child process: the token is checked before a body is
read, bodies are limited, short tokens are refused at start, wrong tokens are slowed, answers carry
`nosniff` / `no-store`, and the page's cookie is an opaque, expiring, revocable session — never the token."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import statistics
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from service_support import PROCS, SERVE_TOKEN, ServeProcess  # noqa: E402

LOGIN = {"X-Requested-With": "waypoint"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with ServeProcess(tmp_path_factory.mktemp("limits"), args=("--max-body", "65536", "--session-ttl", "2")) as s:
        yield s


def _raw_post(server: ServeProcess, headers: str, first: bytes, timeout: float = 10.0) -> bytes:
    """Send a POST's head and the first bytes of a body it promises to be far longer; return what the server
    answers without the rest (b"" when it waits for the body instead)."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        sock.sendall(f"POST /runs HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n"
                     f"{headers}\r\n".encode() + first)
        try:
            return sock.recv(4096)
        except TimeoutError:
            return b""


def test_the_token_is_checked_before_a_body_is_read(server):
    big = "Content-Length: 41943040\r\n"  # 40 MiB promised, 1 KiB sent
    for auth in ("", f"Authorization: Bearer wrong-{SERVE_TOKEN}\r\n", "Authorization: Basic abc\r\n"):
        answer = _raw_post(server, big + auth, b'{"input": "' + b"x" * 1024)
        assert answer.startswith(b"HTTP/1.1 401"), (auth, answer[:200])
    chunked = "Transfer-Encoding: chunked\r\n"
    assert _raw_post(server, chunked, b"400\r\n" + b"x" * 1024 + b"\r\n").startswith(b"HTTP/1.1 401")


def test_a_body_over_the_limit_is_413_read_or_not(server):
    auth = f"Authorization: Bearer {SERVE_TOKEN}\r\n"
    answer = _raw_post(server, auth + "Content-Length: 41943040\r\n", b"{")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]  # refused on its Content-Length, unread
    with server.client() as c:
        def chunks():
            yield b'{"agent": "ops", "input": "'
            for _ in range(100):
                yield b"x" * 1024
            yield b'"}'

        r = c.post("/runs", content=chunks(), headers={"Content-Type": "application/json"})  # no Content-Length
        assert r.status_code == 413 and "65536 bytes" in r.json()["detail"]
        r = c.post("/runs", json={"agent": "ops", "input": "x" * 60_000, "checkpoint_id": "under-limit"})
        assert r.status_code == 201


def test_answers_are_never_sniffed_or_cached(server):
    with server.client() as c, server.client(token=None) as anonymous:
        for r in (c.get("/runs"), c.get("/approvals"), c.get("/runs/none"), anonymous.get("/runs"),
                  c.post("/runs", json={"agent": "nobody", "input": "x"}), c.get("/openapi.json")):
            assert r.headers["x-content-type-options"] == "nosniff", r.url
            assert r.headers["cache-control"] == "no-store", r.url
        with c.stream("GET", "/events") as events:
            assert events.headers["cache-control"] == "no-store"
            assert events.headers["x-content-type-options"] == "nosniff"


def test_the_login_never_echoes_a_token(server):
    with server.client(token=None) as c:
        for body in ({"token": 12345678901234567890}, {"token": SERVE_TOKEN, "extra": SERVE_TOKEN},
                     {"token": "y" * 5000}):
            r = c.post("/ui/login", json=body, headers=LOGIN)
            assert r.status_code == 422, r.text
            assert "12345678901234567890" not in r.text and SERVE_TOKEN not in r.text and "yyyy" not in r.text
            assert all(set(d) == {"loc", "msg", "type"} for d in r.json()["detail"])


def _login(client: httpx.Client) -> tuple[str, str]:
    r = client.post("/ui/login", json={"token": SERVE_TOKEN}, headers=LOGIN)
    assert r.status_code == 200, r.text
    return client.cookies["waypoint_session"], r.json()["csrf"]


def test_the_pages_cookie_is_an_opaque_session_that_can_read_but_not_write_alone(server):
    with server.client(token=None) as page:
        session, key = _login(page)
        assert SERVE_TOKEN not in session and len(session) >= 40
    # what another server on this host receives: the cookie, without the page's write key
    with httpx.Client(base_url=server.url, cookies={"waypoint_session": session}) as other:
        assert other.get("/runs").status_code == 200
        r = other.post("/runs", json={"agent": "ops", "input": "ls", "checkpoint_id": "stolen"})
        assert r.status_code == 403
        assert other.delete("/runs/under-limit").status_code == 403
        assert other.post("/ui/logout").status_code == 403  # nor log the person out
        r = other.get("/runs", headers={"Authorization": f"Bearer {session}"})
        assert r.status_code == 401  # the session ID is no token
        r = other.post("/runs", json={"agent": "ops", "input": "ls", "checkpoint_id": "with-key"},
                       headers={"X-Waypoint-CSRF": key})
        assert r.status_code == 201  # the page itself (cookie and key) may
        assert other.post("/ui/logout", headers={"X-Waypoint-CSRF": key}).status_code == 204
    with httpx.Client(base_url=server.url, cookies={"waypoint_session": session}) as replay:
        assert replay.get("/runs").status_code == 401  # logged out is revoked, server-side


def test_a_session_expires_on_the_server(server):
    with server.client(token=None) as page:
        session, _ = _login(page)
    with httpx.Client(base_url=server.url, cookies={"waypoint_session": session}) as replay:
        assert replay.get("/runs").status_code == 200
        deadline = time.monotonic() + 10
        while replay.get("/runs").status_code == 200:  # --session-ttl 2 (the cookie is sent regardless)
            assert time.monotonic() < deadline, "the session never expired"
            time.sleep(0.2)
        assert replay.get("/runs").status_code == 401


def test_over_https_the_cookie_is_host_prefixed_and_secure():
    from service_support import approval_agent

    from waypoint.service import create_app
    from waypoint.stores import MemoryStore

    import asyncio

    async def login() -> httpx.Response:
        app = create_app(approval_agent([]), MemoryStore(), auth=SERVE_TOKEN)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://waypoint.test") as c:
            return await c.post("/ui/login", json={"token": SERVE_TOKEN}, headers=LOGIN)

    cookie = asyncio.run(login()).headers["set-cookie"]
    assert cookie.startswith("__Host-waypoint_session=") and "Secure" in cookie and "Path=/;" in cookie
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Domain" not in cookie


def _serve(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WAYPOINT_")}, "PYTHONPATH": str(PROCS), **env}
    waypoint = str(Path(sys.executable).parent / "waypoint")
    return subprocess.run([waypoint, "serve", "--db", str(tmp_path / "x.db"), "--agents", "service_agent:build",
                           "--port", "0", *args], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)


def test_serve_refuses_short_tokens_and_says_what_to_do_without_one(tmp_path):
    for env, name in (({"WAYPOINT_TOKEN": "1234"}, "$WAYPOINT_TOKEN"),
                      ({"WAYPOINT_TOKEN": SERVE_TOKEN, "WAYPOINT_READ_TOKEN": "short-token"}, "$WAYPOINT_READ_TOKEN")):
        out = _serve(tmp_path, env)
        assert out.returncode == 2 and name in out.stderr and "at least 16" in out.stderr, out.stderr
        assert "1234" not in out.stderr and "short-token" not in out.stderr
    out = _serve(tmp_path, {})
    assert out.returncode == 2 and "WAYPOINT_TOKEN" in out.stderr
    assert "auth=" not in out.stderr  # not a CLI option: the CLI speaks of what a CLI user can set
    assert not (tmp_path / "x.db").exists()


def test_repeated_wrong_tokens_are_slowed_and_the_page_is_not(tmp_path):
    with ServeProcess(tmp_path) as server, server.client(token=f"wrong-{SERVE_TOKEN}") as bad, \
            server.client(token=None) as page:
        _login(page)
        took = []
        for _ in range(6):  # 5 free, then 0.25 s
            t0 = time.monotonic()
            assert bad.get("/runs").status_code == 401
            took.append(time.monotonic() - t0)
        assert statistics.median(took[:5]) < 0.2 and took[5] >= 0.25, took  # not slowed; then the first delay
        # a burst in parallel takes turns: one guess per delay (0.5 s, 1 s, 2 s), however many connections
        codes, barrier = [], threading.Barrier(3)

        def guess() -> None:
            with server.client(token=f"guess-{SERVE_TOKEN}") as c:
                barrier.wait()
                codes.append(c.get("/runs").status_code)

        threads = [threading.Thread(target=guess) for _ in range(3)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        t1 = time.monotonic()
        r = page.get("/runs")  # the page's session meanwhile: answered at once, not queued behind the guesses
        assert r.status_code == 200 and time.monotonic() - t1 < 1.5  # the guesses take 3.5 s: it is not behind them
        for t in threads:
            t.join(30)
        assert codes == [401] * 3 and time.monotonic() - t0 >= 3.0
        assert good_token_works(server)


def good_token_works(server: ServeProcess) -> bool:
    with server.client() as c:
        return c.get("/runs").status_code == 200


def _closed_after(sock: socket.socket, since: float, limit: float = 10.0, trickle: bytes = b"") -> float:
    """Seconds from `since` until the server closed `sock` (sending `trickle` a byte every 0.2 s meanwhile)."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + limit
    sent = 0
    while time.monotonic() < deadline:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - since
        except TimeoutError:
            pass
        except OSError:  # reset
            return time.monotonic() - since
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent:sent + 1])
            except OSError:
                return time.monotonic() - since
            sent += 1
    raise AssertionError(f"the server held the connection for {limit} s")


def test_slow_and_partial_requests_are_cut_off(tmp_path):
    args = ("--header-timeout", "1.5", "--body-timeout", "1.5", "--keep-alive", "1")
    with ServeProcess(tmp_path, args=args) as server, server.client() as c:
        def connect(first: bytes = b"") -> tuple[socket.socket, float]:
            sock = socket.create_connection((server.host, server.port))
            sock.sendall(first)
            return sock, time.monotonic()

        auth = f"Authorization: Bearer {SERVE_TOKEN}\r\n"
        held = {
            "nothing": connect(),
            "half the headers": connect(b"GET /runs HTTP/1.1\r\nHost: x\r\nX-A: "),
            "a tenth of the body": connect(f"POST /runs HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json"
                                           f"\r\nContent-Length: 1000\r\n\r\n".encode() + b'{"input": "'),
        }
        t0 = time.monotonic()
        assert c.get("/approvals").status_code == 200 and time.monotonic() - t0 < 1  # others are answered meanwhile
        took = {what: _closed_after(sock, since) for what, (sock, since) in held.items()}
        trickled, t_trickle = connect(b"G")
        took["a byte every 0.2 s"] = _closed_after(trickled, t_trickle, trickle=b"ET /runs HTTP/1.1\r\nX-Slow: " + b"a" * 100)
        kept, t_kept = connect(f"GET /agents HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
        kept.settimeout(5)
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")
        took["idle after an answer"] = _closed_after(kept, time.monotonic())
        for sock, _ in [*held.values(), (trickled, 0), (kept, 0)]:
            sock.close()
        assert all(0.9 <= t <= 4.0 for t in took.values()), took  # each at its deadline, none extended
        assert c.get("/approvals").status_code == 200
        assert [r["checkpoint_id"] for r in c.get("/runs").json()["runs"]] == []  # the cut-off POST started nothing
    assert "Traceback" not in server.stop()


def test_connections_past_the_limit_are_answered_503(tmp_path):
    with ServeProcess(tmp_path, args=("--max-connections", "3")) as server, server.client() as c:
        idle = [socket.create_connection((server.host, server.port)) for _ in range(3)]
        time.sleep(0.2)
        r = c.get("/agents")
        assert r.status_code == 503
        for sock in idle:
            sock.close()
        time.sleep(0.2)
        assert c.get("/agents").status_code == 200


@pytest.mark.parametrize("option", [("--header-timeout", "0"), ("--body-timeout", "-1"), ("--keep-alive", "inf"),
                                    ("--max-connections", "0")])
def test_serve_refuses_limits_that_are_not_positive(tmp_path, option):
    out = _serve(tmp_path, {"WAYPOINT_TOKEN": SERVE_TOKEN}, *option)
    assert out.returncode == 2 and option[0] in out.stderr and "positive" in out.stderr, out.stderr
