"""`waypoint serve`: the service on uvicorn, bound to 127.0.0.1 unless told otherwise.

    waypoint serve --db URL --agents module:attr[,module:attr...] [--queue] [--host 127.0.0.1] [--port 8000]
                   [--max-body BYTES] [--session-ttl SECONDS] [--header-timeout SECONDS]
                   [--body-timeout SECONDS] [--keep-alive SECONDS] [--max-connections N]
                   [--no-recover] [--max-attempts N] [--drain SECONDS] [--on-busy POLICY]
                   [--webhook URL ...] [--webhook-timeout SECONDS] [--webhook-attempts N]

The token comes from `WAYPOINT_TOKEN` (and `WAYPOINT_READ_TOKEN` for read-only viewers); without one, or
with one shorter than 16 characters, the command refuses to start (exit code 2); a port another process listens
on is one line and exit code 1, before anything starts. Runs started or resumed over HTTP execute
in this process — or, with `--queue`, in `waypoint worker` processes on the same database (`--db` a
Postgres URL, or a SQLite file for workers on this machine), whose events reach this service from the store.
Stopping it (Ctrl-C, SIGTERM) drains: it takes no new connection, lets each run it executes finish the step it
is in (up to `--drain` seconds; a run still inside a step then is stopped where it is), and leaves every run
`running` as last saved with its lease ended — never stored as cancelled: the next process continues it at
once (its recovery, or a worker).
A request's headers and body must arrive within their timeouts (service/_protocol.py), an idle connection
is closed after `--keep-alive`, and past `--max-connections` a request is answered 503. Runs of the
served agents whose process died are continued by this process (with `--queue`, by the workers), at start
and while it runs (automatic recovery; `--no-recover` turns it off; a run is given up after `--max-attempts` takeovers in a row without
progress).
With `--webhook URL` (repeatable) the served runs' pauses, expiries, completions and failures are posted to each
URL, signed with the key in `WAYPOINT_WEBHOOK_SECRET` — without which it refuses to start (exit code 2).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from waypoint.engine import WaypointError
from waypoint.engine.keep import ON_BUSY
from waypoint.stores import open_store

from ._auth import MIN_TOKEN_LENGTH, READ_TOKEN_ENV, TOKEN_ENV, Auth
from ._guard import MAX_BODY
from ._recovery import MAX_ATTEMPTS
from ._protocol import BODY_TIMEOUT, HEADER_TIMEOUT, KEEP_ALIVE, MAX_CONNECTIONS, deadline_protocol
from ._sessions import SESSION_TTL
from ._state import DRAIN_SECONDS
from ._service import create_app
from ._targets import ServiceError, load_targets
from ._webhooks import SECRET_ENV, Webhooks

__all__ = ["main", "serve"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="waypoint serve", description="Serve agents and graphs over HTTP, with an "
                                "approval page at /ui. The token comes from $WAYPOINT_TOKEN.")
    p.add_argument("--db", default=os.environ.get("WAYPOINT_DB") or ".waypoint/waypoint.db",
                   help="a SQLite file, or a URL: sqlite:///path, postgresql+asyncpg://... "
                        "(default: $WAYPOINT_DB or .waypoint/waypoint.db)")
    p.add_argument("--agents", required=True, metavar="MODULE:ATTR[,...]",
                   help="the ChatModelAgents, Runners or graphs to serve (or functions returning one)")
    p.add_argument("--queue", action="store_true",
                   help="hand starts and resumes to `waypoint worker` processes on the same database (a run queue) "
                        "instead of executing them in this process")
    p.add_argument("--host", default="127.0.0.1", help="the address to bind (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="the port (0: any free one; default: %(default)s)")
    p.add_argument("--max-body", type=int, default=MAX_BODY, metavar="BYTES",
                   help="the largest request body accepted (413 over it; default: %(default)s)")
    p.add_argument("--session-ttl", type=float, default=SESSION_TTL, metavar="SECONDS",
                   help="how long a login on the page lasts (default: %(default)s)")
    p.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT, metavar="SECONDS",
                   help="close a connection whose request line and headers take longer (default: %(default)s)")
    p.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT, metavar="SECONDS",
                   help="close a connection whose request body takes longer after its headers (default: %(default)s)")
    p.add_argument("--keep-alive", type=float, default=KEEP_ALIVE, metavar="SECONDS",
                   help="close a connection idle this long between requests (default: %(default)s)")
    p.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, metavar="N",
                   help="connections served at once; a request past them is answered 503 (default: %(default)s)")
    p.add_argument("--no-recover", dest="recover", action="store_false",
                   help="do not continue runs whose process died (by default they are continued here, at start "
                        "and while serving)")
    p.add_argument("--max-attempts", type=int, default=MAX_ATTEMPTS, metavar="N",
                   help="give a recovered run up (stored failed) after N takeovers in a row that made no progress "
                        "(default: %(default)s)")
    p.add_argument("--drain", type=float, default=DRAIN_SECONDS, metavar="SECONDS",
                   help="on SIGTERM, how long runs may finish the step they are in before they are stopped where "
                        "they are (either way the next process continues them; default: %(default)s)")
    p.add_argument("--on-busy", choices=ON_BUSY, default="reject",
                   help="new input for an agent's chat whose turn is executing, when POST /runs does not say: refuse "
                        "it (409), or queue it to run after the turn, after stopping it at its next step, or after "
                        "stopping and dropping it (default: %(default)s)")
    p.add_argument("--webhook", action="append", default=[], metavar="URL",
                   help="post each served run's pause, expired pause, completion and failure to URL, signed with "
                        f"${SECRET_ENV} (repeatable: every URL gets every event)")
    p.add_argument("--webhook-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="an attempt that gets no 2xx answer within this is tried again (default: %(default)s)")
    p.add_argument("--webhook-attempts", type=int, default=8, metavar="N",
                   help="attempts per event before it is given up, logged (default: %(default)s)")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run `waypoint serve ...` until stopped; returns the exit code (2: it could not start)."""
    args = _parser().parse_args(argv)
    if not os.environ.get(TOKEN_ENV) and not os.environ.get(READ_TOKEN_ENV):
        print(f"waypoint serve: no service token: set {TOKEN_ENV} (at least {MIN_TOKEN_LENGTH} characters; make one "
              f"with: python -c 'import secrets; print(secrets.token_urlsafe(24))'), and optionally "
              f"{READ_TOKEN_ENV} for read-only viewers of the page", file=sys.stderr)
        return 2
    if args.max_body < 1 or args.session_ttl <= 0 or args.max_connections < 1 or args.max_attempts < 1 or \
            not all(0 < t < float("inf") for t in (args.header_timeout, args.body_timeout, args.keep_alive)) or \
            not 0 <= args.drain < float("inf"):
        print("waypoint serve: --max-body, --session-ttl, --header-timeout, --body-timeout, --keep-alive, "
              "--max-connections and --max-attempts must be positive, --drain at least 0 (and the times finite)",
              file=sys.stderr)
        return 2
    try:
        auth = Auth()
        hooks = Webhooks(urls=tuple(args.webhook), timeout=args.webhook_timeout,
                         attempts=args.webhook_attempts) if args.webhook else None
        targets = load_targets(args.agents)
        if "://" not in args.db and args.db != "memory":
            Path(args.db).parent.mkdir(parents=True, exist_ok=True)
        store = open_store(args.db)
        if args.queue and args.db == "memory":
            raise ServiceError("--queue needs a database the workers share (a Postgres URL, or a SQLite file), "
                               "not --db memory")
    except (WaypointError, ValueError, OSError) as err:  # AuthError, ServiceError, MissingDriver, ...
        print(f"waypoint serve: {err}", file=sys.stderr)
        return 2
    if not _is_loopback(args.host):
        print(f"waypoint serve: binding {args.host}: other machines can reach this service; put it behind TLS "
              f"(the token travels in every request)", file=sys.stderr)
    try:
        asyncio.run(serve(targets, store, host=args.host, port=args.port, auth=auth, log_level=args.log_level,
                          queue=args.queue or None,
                          max_body=args.max_body, session_ttl=args.session_ttl,
                          header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                          keep_alive=args.keep_alive, max_connections=args.max_connections,
                          recover=args.recover, max_attempts=args.max_attempts, drain_seconds=args.drain,
                          webhooks=hooks, on_busy=args.on_busy,
                          banner=f"(database {args.db}{'; runs executed by workers' if args.queue else ''}; "
                                 f"{_posting(hooks)}"
                                 f"token from ${TOKEN_ENV}"
                                 f"{' and $' + READ_TOKEN_ENV if os.environ.get(READ_TOKEN_ENV) else ''})"))
    except CannotListen as err:  # the address is taken: nothing was started
        print(f"waypoint serve: {err}", file=sys.stderr)
        return 1
    except ServiceError as err:
        print(f"waypoint serve: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


class CannotListen(ServiceError):
    """The address and port cannot be bound (another process listens there, or the address is not this
    machine's)."""


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address `host` names (as asyncio's `create_server` binds them), before anything
    starts — so a port in use is one line (`CannotListen`), not uvicorn's startup and shutdown around a
    traceback. Port 0: any free one, the same on every address."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise CannotListen(f"cannot listen on {host}:{port}: {err.strerror}; pass --host with an address of this "
                           "machine") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except OSError as err:
        for sock in sockets:
            sock.close()
        taken = err.errno == errno.EADDRINUSE
        raise CannotListen(f"cannot listen on {host}:{port}: {err.strerror}" + (
            " (another process listens there: stop it, or pass another --port; --port 0 takes any free one)"
            if taken else "")) from None
    return sockets


async def serve(targets: Any, store: Any, *, host: str = "127.0.0.1", port: int = 8000, auth: Any = None,
                log_level: str = "info", banner: str = "", max_body: int = MAX_BODY,
                session_ttl: float = SESSION_TTL, header_timeout: float = HEADER_TIMEOUT,
                body_timeout: float = BODY_TIMEOUT, keep_alive: float = KEEP_ALIVE,
                max_connections: int = MAX_CONNECTIONS, queue: Any = None, recover: bool = True,
                max_attempts: int = MAX_ATTEMPTS, drain_seconds: float = DRAIN_SECONDS, webhooks: Any = None,
                on_busy: str = "reject") -> None:
    """Serve `targets` on `store` with uvicorn until stopped; prints the page's address once listening. A
    request's headers and body must arrive within `header_timeout` / `body_timeout` seconds (else its
    connection is closed), an idle connection closes after `keep_alive` seconds, and past `max_connections`
    connections a request is answered 503. `queue` (True or a `RunQueue`): workers execute the runs.
    `recover`, `max_attempts`: automatic recovery; `drain_seconds`: the drain when stopped; `webhooks`:
    notifications; `on_busy`: new input to a busy chat (`create_app`)."""
    import uvicorn

    sockets: list[socket.socket] = []
    try:
        sockets = listen(host, port)  # first: a port in use starts nothing (no recovery, no lifespan)
        app = create_app(targets, store, auth=auth, max_body=max_body, session_ttl=session_ttl, queue=queue,
                         recover=recover, max_attempts=max_attempts, drain_seconds=drain_seconds,
                         webhooks=webhooks, on_busy=on_busy)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                                http=deadline_protocol(header_timeout, body_timeout), timeout_keep_alive=keep_alive,
                                limit_concurrency=max_connections,
                                timeout_graceful_shutdown=3)  # event streams never end by themselves
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=sockets))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()
            names = ", ".join(app.state.waypoint.targets)
            print(f"waypoint serve: http://{_url_host(bound[0])}:{bound[1]}/ui serving {names} {banner}".rstrip(),
                  flush=True)
        await task
    finally:
        for sock in sockets:
            sock.close()
        await store.close()


def _posting(hooks: Webhooks | None) -> str:
    if hooks is None:
        return ""
    return f"events posted to {len(hooks.urls)} webhook{'s' if len(hooks.urls) > 1 else ''}, signed with ${SECRET_ENV}; "


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


if __name__ == "__main__":
    sys.exit(main())
