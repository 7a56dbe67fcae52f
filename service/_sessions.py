"""The approval page's sessions: what its cookie holds instead of the token.

Logging in on the page (`POST /ui/login` with a token) opens a session: a random 256-bit ID, kept in this
process's memory with the token it was opened with, a write key, and an expiry (`SESSION_TTL`, 8 hours).
The browser gets the ID in an HttpOnly, SameSite=Strict cookie — `__Host-waypoint_session` with Secure
over HTTPS — and the write key in the login's answer, which the page keeps in its origin's localStorage.

- The cookie never holds the token: a cookie the browser also sends to another server on this host
  (browsers do not tell ports apart for cookies) can only read, for what is left of its session.
- A request that changes something must also carry the write key (`X-Waypoint-CSRF`), which only a page
  of this origin (scheme, host *and port*) can read: not another site, not another port.
- Every use re-checks the token the session was opened with: a token taken away ends its sessions at
  their next request. "Log out" ends the session at once; so does a restart of the service.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["Session", "Sessions", "SESSION_TTL", "CSRF_KEY_HEADER"]

SESSION_TTL = 8 * 3600.0
CSRF_KEY_HEADER = "x-waypoint-csrf"
_LIMIT = 10_000


@dataclass(frozen=True, kw_only=True)
class Session:
    token: str
    csrf: str
    expires: float

    def allows_write(self, key: str | None) -> bool:
        return key is not None and hmac.compare_digest(self.csrf.encode(), key.encode("utf-8", "replace"))


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


class Sessions:
    """Open sessions of this process (at most `limit`; the oldest is ended first)."""

    def __init__(self, ttl: float = SESSION_TTL, limit: int = _LIMIT) -> None:
        self.ttl, self.limit = ttl, limit
        self._open: OrderedDict[str, Session] = OrderedDict()

    def open(self, token: str) -> tuple[str, Session]:
        """A new session for `token`: (its ID for the cookie, the session with its write key)."""
        session_id = secrets.token_urlsafe(32)
        session = Session(token=token, csrf=secrets.token_urlsafe(32), expires=time.time() + self.ttl)
        self._open[_key(session_id)] = session
        while len(self._open) > self.limit:
            self._open.popitem(last=False)
        return session_id, session

    def find(self, session_id: str) -> Session | None:
        """The live session of that ID, or None (unknown, ended or expired)."""
        key = _key(session_id)
        session = self._open.get(key)
        if session is not None and session.expires <= time.time():
            del self._open[key]
            return None
        return session

    def close(self, session_id: str) -> None:
        self._open.pop(_key(session_id), None)

    def __len__(self) -> int:
        return len(self._open)
