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
- One token holds at most `PER_TOKEN` sessions: its own oldest ends first, so logging in again and again
  with one token (a read-only one, say) never ends the sessions of another. Past `LIMIT` in all (many
  tokens), the oldest session of the token holding the most ends first. Repeated logins with one token are
  slowed down besides (service/_auth.py).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["Session", "Sessions", "SESSION_TTL", "CSRF_KEY_HEADER", "LIMIT", "PER_TOKEN", "token_key"]

SESSION_TTL = 8 * 3600.0
CSRF_KEY_HEADER = "x-waypoint-csrf"
LIMIT = 10_000
"""Open sessions of one process, in all."""
PER_TOKEN = 1000
"""Open sessions of one token."""


@dataclass(frozen=True, kw_only=True)
class Session:
    token: str = field(repr=False)  # never in a repr, a log line or an assertion message
    csrf: str = field(repr=False)
    expires: float

    def allows_write(self, key: str | None) -> bool:
        return key is not None and hmac.compare_digest(self.csrf.encode(), key.encode("utf-8", "replace"))


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "replace")).hexdigest()


def token_key(token: str) -> str:
    """What a token is known by in memory (its sessions, its logins): a hash, never the token."""
    return hashlib.sha256(b"waypoint-token:" + token.encode("utf-8", "replace")).hexdigest()


class Sessions:
    """Open sessions of this process: at most `per_token` of one token (its oldest is ended first) and
    `limit` in all (then the oldest of the token holding the most)."""

    def __init__(self, ttl: float = SESSION_TTL, limit: int = LIMIT, per_token: int = PER_TOKEN) -> None:
        self.ttl, self.limit, self.per_token = ttl, limit, per_token
        self._open: OrderedDict[str, Session] = OrderedDict()
        self._of_token: dict[str, OrderedDict[str, None]] = {}  # token_key -> its sessions' keys, oldest first

    def open(self, token: str) -> tuple[str, Session]:
        """A new session for `token`: (its ID for the cookie, the session with its write key)."""
        session_id = secrets.token_urlsafe(32)
        session = Session(token=token, csrf=secrets.token_urlsafe(32), expires=time.time() + self.ttl)
        key, mine = _key(session_id), self._of_token.setdefault(token_key(token), OrderedDict())
        self._open[key] = session
        mine[key] = None
        while len(mine) > self.per_token:  # this token's oldest: never another token's
            self._end(next(iter(mine)))
        while len(self._open) > self.limit:
            most = max(self._of_token.values(), key=len)
            self._end(next(iter(most)))
        return session_id, session

    def _end(self, key: str) -> None:
        session = self._open.pop(key, None)
        if session is None:
            return
        group = token_key(session.token)
        mine = self._of_token.get(group)
        if mine is not None:
            mine.pop(key, None)
            if not mine:
                del self._of_token[group]

    def count(self, token: str) -> int:
        """Open sessions of `token` (expired ones included until they are next looked at)."""
        return len(self._of_token.get(token_key(token), ()))

    def find(self, session_id: str) -> Session | None:
        """The live session of that ID, or None (unknown, ended or expired)."""
        key = _key(session_id)
        session = self._open.get(key)
        if session is not None and session.expires <= time.time():
            self._end(key)
            return None
        return session

    def close(self, session_id: str) -> None:
        self._end(_key(session_id))

    def __len__(self) -> int:
        return len(self._open)
