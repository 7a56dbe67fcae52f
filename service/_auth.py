"""Who may call the service: tokens and their scopes (`Auth`), and how one request proves itself (`Gate`).

A request proves itself with `Authorization: Bearer <token>`, or — for the approval page, whose
`EventSource` cannot set headers — with the session cookie its login set (service/_sessions.py: an
opaque, expiring, revocable session ID, never the token). A session-authenticated request that changes
something must also carry the session's write key (`X-Waypoint-CSRF`), which only the page's own origin
can read: the cookie alone cannot approve, start or delete anything.

What a token may do is a set of scopes: `read` (get, list, events, approvals), `start`, `resume`, `cancel`,
`delete`. No token, an unknown one or an ended session: 401 (repeated wrong tokens from one client are
slowed down: service/_throttle.py). A known token without the scope: 403. A token's value never appears
in a response, an error or a log line. The check needs only the request's headers: it runs before the
body is read (service/_guard.py).
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPBearer
from waypoint.engine import WaypointError

from ._sessions import CSRF_KEY_HEADER, Session, Sessions, token_key
from ._throttle import Busy, Throttle

__all__ = ["Auth", "AuthError", "Gate", "Identity", "SCOPES", "TOKEN_ENV", "READ_TOKEN_ENV", "MIN_TOKEN_LENGTH",
           "LOGIN_HEADER", "LOGIN_VALUE", "LOGINS_FREE", "session_cookie"]

SCOPES = frozenset({"read", "start", "resume", "cancel", "delete"})
TOKEN_ENV = "WAYPOINT_TOKEN"
READ_TOKEN_ENV = "WAYPOINT_READ_TOKEN"
MIN_TOKEN_LENGTH = 16
"""Shorter tokens are refused at start (a 4-digit token was guessed in under a second)."""
LOGIN_HEADER = "x-requested-with"
LOGIN_VALUE = "waypoint"
"""What the page's login form sends: a form or a link on another site cannot."""
LOGINS_FREE = 10
"""Page logins with one token per minute before each further one waits its turn (0.25 s, doubling to 1 s)."""

Decide = Callable[[str], Union[Iterable[str], bool, None, Awaitable[Union[Iterable[str], bool, None]]]]
"""`decide(token)` -> the token's scopes; True for every scope; None / False / empty for an unknown token."""

_bearer = HTTPBearer(auto_error=False, description="a Waypoint service token (WAYPOINT_TOKEN)")
_COOKIE = re.compile(r"^(__Host-)?waypoint_session(-[0-9a-f]{8})?$")


class AuthError(WaypointError):
    """The service cannot be set up with the auth it was given (no token configured, a bad scope)."""


class Auth:
    """Which tokens the service accepts and what each may do.

    `auth` is one of: None — the environment: `WAYPOINT_TOKEN` (every scope) and, optionally,
    `WAYPOINT_READ_TOKEN` (`read` only); a string — one token with every scope; a mapping token ->
    scopes; or a callable `decide(token)` (sync or async) returning the token's scopes, True (every
    scope), or None/False for a token it does not know. With no token at all, or one shorter than
    `MIN_TOKEN_LENGTH` characters, `AuthError`: the service never runs open or guessable.
    """

    def __init__(self, auth: str | Mapping[str, Iterable[str]] | Decide | None = None) -> None:
        self._decide: Decide | None = None
        self._tokens: dict[str, frozenset[str]] = {}
        if auth is None:
            full, read = os.environ.get(TOKEN_ENV, ""), os.environ.get(READ_TOKEN_ENV, "")
            if not full and not read:
                raise AuthError(f"no service token: set {TOKEN_ENV} (and optionally {READ_TOKEN_ENV} for "
                                "read-only viewers), or pass auth= (a token, a mapping token -> scopes, or a callable)")
            for name, value in ((TOKEN_ENV, full), (READ_TOKEN_ENV, read)):
                _long_enough(value, f"${name}")
            self._tokens = {t: s for t, s in ((read, frozenset({"read"})), (full, SCOPES)) if t}
        elif isinstance(auth, str):
            if not auth:
                raise AuthError("auth= is an empty token")
            _long_enough(auth, "auth=")
            self._tokens = {auth: SCOPES}
        elif isinstance(auth, Mapping):
            for token, scopes in auth.items():
                self._tokens[token] = _scopes(scopes)
            if not self._tokens or "" in self._tokens:
                raise AuthError("auth= maps no token (or an empty one)")
            for token in self._tokens:
                _long_enough(token, "a token in auth=")
        elif callable(auth):
            self._decide = auth
        else:
            raise AuthError(f"auth= must be a token, a mapping or a callable, not {type(auth).__name__}")

    async def scopes(self, token: str) -> frozenset[str] | None:
        """The scopes of `token`, or None when it is not a valid token."""
        if not token:
            return None
        if self._decide is not None:
            answer = self._decide(token)
            if inspect.isawaitable(answer):
                answer = await answer
            if answer is True:
                return SCOPES
            if not answer:
                return None
            return _scopes(answer) or None
        found = None
        given = token.encode("utf-8", "replace")
        for known, scopes in self._tokens.items():  # compare every one, in constant time
            if hmac.compare_digest(known.encode("utf-8", "replace"), given):
                found = scopes
        return found


def _long_enough(token: str, where: str) -> None:
    if token and len(token) < MIN_TOKEN_LENGTH:
        raise AuthError(f"{where} is {len(token)} characters long; a service token needs at least "
                        f"{MIN_TOKEN_LENGTH} (make one: python -c 'import secrets; print(secrets.token_urlsafe(24))')")


def _scopes(scopes: Iterable[str]) -> frozenset[str]:
    if isinstance(scopes, str):
        scopes = [scopes]
    out = frozenset(scopes)
    unknown = out - SCOPES
    if unknown:
        raise AuthError(f"unknown scope(s) {sorted(unknown)}; scopes are {sorted(SCOPES)}")
    return out


def session_cookie(base: str, tls: bool) -> tuple[str, str]:
    """(cookie name, path) of the page's session for a service mounted at `base` ("" at the root).
    Over HTTPS the name has the `__Host-` prefix, which needs `Path=/`; a hash of the base keeps two
    services on one origin apart."""
    suffix = "-" + hashlib.sha256(base.encode()).hexdigest()[:8] if base else ""
    return (f"__Host-waypoint_session{suffix}", "/") if tls else (f"waypoint_session{suffix}", base + "/")


@dataclass(frozen=True)
class Identity:
    """Who a request is: its scopes, and its page session (None for a bearer token)."""

    scopes: frozenset[str]
    session: Session | None = None


_UNAUTHORIZED = "a valid bearer token is required (Authorization: Bearer <token>), or log in on the page"


class Gate:
    """Authenticates requests from their headers alone, and decides what each may do."""

    def __init__(self, auth: Auth, sessions: Sessions, throttle: Throttle | None = None,
                 logins: Throttle | None = None) -> None:
        self.auth, self.sessions, self.throttle = auth, sessions, throttle or Throttle()
        self.logins = logins or Throttle(free=LOGINS_FREE, first_delay=0.25, max_delay=1.0, queue=64)
        """Page logins per token: past `LOGINS_FREE` a minute, each waits its turn (a token cannot churn
        through sessions, its own or anyone's)."""

    async def check_token(self, request: Request, token: str) -> frozenset[str] | None:
        """`token`'s scopes, in its client's turn (slowed after repeated failures); 429 when too many wait."""
        client = request.client.host if request.client else "?"
        try:
            return await self.throttle.check(client, lambda: self.auth.scopes(token), lambda s: s is None)
        except Busy:
            raise HTTPException(429, "too many wrong tokens from this address; try again later",
                                headers={"Retry-After": str(int(self.throttle.max_delay) + 1)}) from None

    async def login(self, request: Request, token: str) -> tuple[frozenset[str], str, Session] | None:
        """Open a page session for `token`: (its scopes, the session ID for the cookie, the session), or None
        for a token that is not valid (checked like a bearer token, slowed when wrong). Logins with one token
        take turns once it has logged in `LOGINS_FREE` times within a minute; 429 when too many wait."""
        scopes = await self.check_token(request, token)
        if scopes is None:
            return None

        async def open_session() -> tuple[str, Session]:
            return self.sessions.open(token)

        try:
            session_id, session = await self.logins.check(token_key(token), open_session, lambda _: True)
        except Busy:
            raise HTTPException(429, "too many logins with this token at once; log in again in a few seconds",
                                headers={"Retry-After": str(int(self.logins.max_delay) + 1)}) from None
        return scopes, session_id, session

    async def identify(self, request: Request) -> Identity:
        """The request's identity, or HTTPException 401 (429 for a client that keeps guessing)."""
        header = request.headers.get("authorization")
        if header is not None:  # a header wins; one that is not a bearer token never falls back to the cookie
            scheme, _, token = header.partition(" ")
            scopes = await self.check_token(request, token.strip()) if scheme.lower() == "bearer" else None
            if scopes is None:
                raise _unauthorized()
            return Identity(scopes)
        tls = request.url.scheme == "https"
        for name, value in request.cookies.items():
            if not _COOKIE.match(name) or (tls and not name.startswith("__Host-")):
                continue
            session = self.sessions.find(value)
            if session is None:
                continue
            scopes = await self.auth.scopes(session.token)
            if scopes is None:  # its token was taken away: so is the session
                self.sessions.close(value)
                continue
            return Identity(scopes, session)
        raise _unauthorized()

    def allow(self, identity: Identity, scope: str, request: Request) -> None:
        """403 unless `identity` holds `scope`; a page session's write must carry its write key."""
        if identity.session is not None and request.method not in ("GET", "HEAD", "OPTIONS") \
                and not identity.session.allows_write(request.headers.get(CSRF_KEY_HEADER)):
            raise HTTPException(403, f"a request authenticated by the page's session must send {CSRF_KEY_HEADER} "
                                "(the write key its login returned); log in on the page again")
        if scope not in identity.scopes:
            raise HTTPException(403, f"this token may not {scope} runs (it may: {', '.join(sorted(identity.scopes))})")

    def require(self, scope: str) -> Any:
        """A FastAPI dependency: the request's identity (checked already by the route, or now) holding `scope`."""
        if scope not in SCOPES:
            raise AuthError(f"unknown scope {scope!r}; scopes are {sorted(SCOPES)}")

        async def check(request: Request, _: Any = Depends(_bearer)) -> frozenset[str]:  # (names the scheme)
            identity = getattr(request.state, "waypoint_identity", None)
            if identity is None:
                identity = await self.identify(request)
                self.allow(identity, scope, request)
            return identity.scopes

        return check


def _unauthorized() -> HTTPException:
    return HTTPException(401, _UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
