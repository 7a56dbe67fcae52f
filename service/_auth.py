"""Bearer-token auth for every call of the service, with scopes.

A request proves itself with `Authorization: Bearer <token>`, or — for the approval page, which uses
the browser's `EventSource` and cannot set headers — with the `waypoint_token` cookie the page's login
form sets (HttpOnly, SameSite=Strict). A cookie-authenticated request that changes something must also
carry `X-Requested-With: waypoint` (a cross-site form cannot set it), so the cookie cannot be used for
request forgery.

What a token may do is a set of scopes: `read` (get, list, events, approvals), `start`, `resume`,
`delete`. No token, or an unknown one: 401. A known token without the scope: 403. A token's value never
appears in a response, an error or a log line.
"""

from __future__ import annotations

import hmac
import inspect
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Union

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from waypoint.engine import WaypointError

__all__ = ["Auth", "AuthError", "SCOPES", "COOKIE", "CSRF_HEADER", "TOKEN_ENV", "READ_TOKEN_ENV"]

SCOPES = frozenset({"read", "start", "resume", "delete"})
COOKIE = "waypoint_token"
CSRF_HEADER = "x-requested-with"
CSRF_VALUE = "waypoint"
TOKEN_ENV = "WAYPOINT_TOKEN"
READ_TOKEN_ENV = "WAYPOINT_READ_TOKEN"

Decide = Callable[[str], Union[Iterable[str], bool, None, Awaitable[Union[Iterable[str], bool, None]]]]
"""`decide(token)` -> the token's scopes; True for every scope; None / False / empty for an unknown token."""

_bearer = HTTPBearer(auto_error=False, description="a Waypoint service token (WAYPOINT_TOKEN)")


class AuthError(WaypointError):
    """The service cannot be set up with the auth it was given (no token configured, a bad scope)."""


class Auth:
    """Which tokens the service accepts and what each may do.

    `auth` is one of: None — the environment: `WAYPOINT_TOKEN` (every scope) and, optionally,
    `WAYPOINT_READ_TOKEN` (`read` only); a string — one token with every scope; a mapping token ->
    scopes; or a callable `decide(token)` (sync or async) returning the token's scopes, True (every
    scope), or None/False for a token it does not know. With no token at all, `AuthError`: the service
    never runs open.
    """

    def __init__(self, auth: str | Mapping[str, Iterable[str]] | Decide | None = None) -> None:
        self._decide: Decide | None = None
        self._tokens: dict[str, frozenset[str]] = {}
        if auth is None:
            full, read = os.environ.get(TOKEN_ENV, ""), os.environ.get(READ_TOKEN_ENV, "")
            if not full and not read:
                raise AuthError(f"no service token: set {TOKEN_ENV} (and optionally {READ_TOKEN_ENV} for "
                                "read-only viewers), or pass auth= (a token, a mapping token -> scopes, or a callable)")
            self._tokens = {t: s for t, s in ((read, frozenset({"read"})), (full, SCOPES)) if t}
        elif isinstance(auth, str):
            if not auth:
                raise AuthError("auth= is an empty token")
            self._tokens = {auth: SCOPES}
        elif isinstance(auth, Mapping):
            for token, scopes in auth.items():
                self._tokens[token] = _scopes(scopes)
            if not self._tokens or "" in self._tokens:
                raise AuthError("auth= maps no token (or an empty one)")
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
        for known, scopes in self._tokens.items():  # compare every one, in constant time
            if hmac.compare_digest(known.encode(), token.encode()):
                found = scopes
        return found

    def require(self, scope: str) -> Any:
        """A FastAPI dependency: the request's token must be valid (401) and hold `scope` (403)."""
        if scope not in SCOPES:
            raise AuthError(f"unknown scope {scope!r}; scopes are {sorted(SCOPES)}")

        async def check(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> frozenset[str]:
            token, by_cookie = _token_of(request, creds)
            scopes = await self.scopes(token) if token else None
            if scopes is None:
                raise HTTPException(401, "a valid bearer token is required (Authorization: Bearer <token>)",
                                    headers={"WWW-Authenticate": "Bearer"})
            if by_cookie and request.method not in ("GET", "HEAD", "OPTIONS") \
                    and request.headers.get(CSRF_HEADER) != CSRF_VALUE:
                raise HTTPException(403, f"a request authenticated by cookie must send {CSRF_HEADER}: {CSRF_VALUE}")
            if scope not in scopes:
                raise HTTPException(403, f"this token may not {scope} runs (it may: {', '.join(sorted(scopes))})")
            return scopes

        return check


def _token_of(request: Request, creds: HTTPAuthorizationCredentials | None) -> tuple[str, bool]:
    """(token, whether it came from the cookie); a header wins over the cookie."""
    if creds is not None and creds.scheme.lower() == "bearer":
        return creds.credentials, False
    if request.headers.get("authorization"):
        return "", False  # a header that is not a bearer token: not authenticated (never fall back)
    return request.cookies.get(COOKIE, ""), True


def _scopes(scopes: Iterable[str]) -> frozenset[str]:
    if isinstance(scopes, str):
        scopes = [scopes]
    out = frozenset(scopes)
    unknown = out - SCOPES
    if unknown:
        raise AuthError(f"unknown scope(s) {sorted(unknown)}; scopes are {sorted(SCOPES)}")
    return out
