"""Webhooks: what `create_app(webhooks=...)` / `waypoint serve --webhook URL` is told (`Webhooks`), how a body is
signed and checked (`sign`, `verify_signature`), which events a stored version carries (`events_of`), and the
JSON each event is posted as (`payload`). The loop that finds and posts them is service/_notify.py.

Events, each from one stored version of a run of a served agent or graph:

- `waiting`: the version is paused (stored `interrupted`, not cancelled) — it waits for an answer; `pending`
  lists what it waits on as the approval page shows it (`pending_view`). An edit of a paused run's state
  (`update_state`) is not a new wait.
- `expired`: the version continues a pause whose deadline passed (its origin ends with `" expired"`, as
  the deadline's resume writes it: `"<id>@<version> expired"`); `pending` lists what the expired pause waited on.
- `completed`, `failed`: the version is stored so; `error` says why it failed, and `pending` what a failed run
  still waits on, if anything (as `GET /approvals` lists it).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from waypoint.engine import CheckpointMeta

from ._targets import ServiceError

__all__ = ["Webhooks", "WebhookError", "SECRET_ENV", "SIGNATURE_HEADER", "EVENTS", "sign", "verify_signature",
           "events_of", "expired_pause", "payload", "safe_url"]

log = logging.getLogger("waypoint.webhooks")

SECRET_ENV = "WAYPOINT_WEBHOOK_SECRET"
"""The environment variable holding the key webhooks are signed with."""
MIN_SECRET_LENGTH = 16
SIGNATURE_HEADER = "Waypoint-Signature"
"""`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, as Stripe and Standard Webhooks sign."""
EVENTS = ("waiting", "expired", "completed", "failed")
TOLERANCE = 300.0
"""Seconds a receiver accepts a signature's timestamp away from its own clock (`verify_signature`): a replay of
an old delivery is refused."""


class WebhookError(ServiceError):
    """Webhooks cannot be set up as asked (no signing key, a URL that is not http(s), a bad setting)."""


@dataclass(frozen=True, kw_only=True)
class Webhooks:
    """Where and how `waypoint serve` posts its runs' events (docs/service.md, "Notifications").

    `urls`: each receives every event. `secret`: the signing key (default: `$WAYPOINT_WEBHOOK_SECRET`; at
    least 16 characters). An attempt that gets no 2xx within `timeout` seconds is tried again after `backoff`
    seconds, doubling up to `max_backoff` (with up to a quarter more, at random, so receivers coming back are
    not hit all at once), `attempts` attempts in all. The store is looked at every `poll` seconds; versions
    written up to `lookback` seconds before the service started are delivered too (a restart's gap), and each
    look reads back `overlap` seconds (a version's time is its writer's clock). At most `concurrency` posts at
    once."""

    urls: tuple[str, ...]
    secret: str = field(default="", repr=False)
    timeout: float = 10.0
    attempts: int = 8
    backoff: float = 2.0
    max_backoff: float = 300.0
    poll: float = 1.0
    lookback: float = 30.0
    overlap: float = 30.0
    concurrency: int = 8

    def __post_init__(self) -> None:
        urls = (self.urls,) if isinstance(self.urls, str) else tuple(self.urls)
        object.__setattr__(self, "urls", tuple(dict.fromkeys(urls)))
        if not self.urls:
            raise WebhookError("webhooks need at least one URL (http:// or https://)")
        for url in self.urls:
            _check_url(url)
        secret = self.secret or os.environ.get(SECRET_ENV, "")
        if not secret:
            raise WebhookError(f"webhooks are signed, and there is no key: set {SECRET_ENV} (at least "
                               f"{MIN_SECRET_LENGTH} characters; make one with: python -c 'import secrets; "
                               f"print(secrets.token_urlsafe(32))') and give the same key to the receivers, which "
                               f"check the {SIGNATURE_HEADER} header with it")
        if len(secret) < MIN_SECRET_LENGTH:
            raise WebhookError(f"the webhook signing key ({SECRET_ENV}) has {len(secret)} characters; use at least "
                               f"{MIN_SECRET_LENGTH} (python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        object.__setattr__(self, "secret", secret)
        numbers = (self.timeout, self.backoff, self.max_backoff, self.poll)
        if not all(0 < n < float("inf") for n in numbers) or self.attempts < 1 or self.concurrency < 1 or \
                not all(0 <= n < float("inf") for n in (self.lookback, self.overlap)):
            raise WebhookError("webhook timeout, backoff, max_backoff and poll must be positive and finite, attempts "
                               "and concurrency at least 1, lookback and overlap at least 0")

    @classmethod
    def of(cls, value: Any) -> Webhooks | None:
        """`create_app(webhooks=...)`: None, a URL, a list of URLs, or a `Webhooks`."""
        if value is None or isinstance(value, Webhooks):
            return value
        if isinstance(value, str):
            return cls(urls=(value,))
        if isinstance(value, Sequence):
            return cls(urls=tuple(value))
        raise WebhookError(f"webhooks= must be a URL, a list of URLs or a Webhooks, not {type(value).__name__}")

    def delay(self, attempts: int, jitter: float) -> float:
        """Seconds before the next attempt after `attempts` failed ones; `jitter` in [0, 1)."""
        return min(self.backoff * 2 ** (attempts - 1), self.max_backoff) * (1 + jitter / 4)


def _check_url(url: Any) -> None:
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        shown = repr(safe_url(url)) if isinstance(url, str) and "://" in url else f"of type {type(url).__name__}" \
            if not isinstance(url, str) else "(not shown: it may hold a secret)"
        raise WebhookError(f"webhook URL {shown} is not an http:// or https:// URL with a host")


def safe_url(url: str) -> str:
    """The URL as logs name it: scheme, host and port only (a webhook's path or query often holds a secret)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/…"


# --- signing --------------------------------------------------------------------------------------------------

def _digest(secret: str | bytes, timestamp: int, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: str | bytes, body: bytes, timestamp: int | None = None) -> str:
    """The `Waypoint-Signature` header for `body` sent at `timestamp` (Unix seconds; default now)."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    return f"t={t},v1={_digest(secret, t, body)}"


def verify_signature(secret: str | bytes, body: bytes, header: str, *, tolerance: float = TOLERANCE,
                     now: float | None = None) -> bool:
    """Whether `header` (a `Waypoint-Signature`) signs `body` with `secret`, and its timestamp is within
    `tolerance` seconds of `now` (default: this clock). For receivers written in Python."""
    if not isinstance(header, str) or not isinstance(body, (bytes, bytearray)):
        return False
    fields: dict[str, list[str]] = {}
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        fields.setdefault(name, []).append(value)
    stamp = (fields.get("t") or [""])[0]
    clock = time.time() if now is None else now
    if not _DIGITS.fullmatch(stamp) or not abs(clock - int(stamp)) <= tolerance:  # NaN compares False: refused
        return False
    want = _digest(secret, int(stamp), bytes(body)).encode("ascii")
    # bytes, not str: compare_digest refuses non-ASCII text, and a header is the sender's to fill
    return any(hmac.compare_digest(want, got.encode("utf-8", "surrogatepass")) for got in fields.get("v1", ()))


# --- events ---------------------------------------------------------------------------------------------------

_EXPIRED = re.compile(r"@(\d+) expired$")
_DIGITS = re.compile(r"[0-9]{1,12}")


def expired_pause(meta: CheckpointMeta) -> int | None:
    """The version of the pause this version expired (its origin `"<id>@<version> expired"`), or None if it
    is no expiry. (The one place that reads how a deadline's resume is recorded.)"""
    origin = meta.origin or ""
    if not origin.endswith(" expired"):
        return None
    found = _EXPIRED.search(origin)
    return int(found.group(1)) if found else max(meta.version - 1, 0)


_EDIT = re.compile(r"@\d+ (update_state|migrate)\b")


def events_of(meta: CheckpointMeta) -> list[str]:
    """The events version `meta` carries, in order (see the module)."""
    out = ["expired"] if expired_pause(meta) is not None else []
    if meta.paused and not _EDIT.search(meta.origin or ""):  # an edit or a migration of a paused run is no new wait
        out.append("waiting")
    elif meta.status in ("completed", "failed"):
        out.append(meta.status)
    return out


async def payload(state: Any, meta: CheckpointMeta, event: str, graph: str | None) -> dict[str, Any]:
    """The event as JSON data (its `id` is added per receiver). `pending` is None when the paused version
    cannot be read (it is still announced: a run waits)."""
    pending: list[dict[str, Any]] | None = []
    if event in ("waiting", "expired", "failed"):  # a failed run may still wait on a pause (GET /approvals)
        try:
            pending = await _pending(state, meta, event)
        except Exception as err:  # noqa: BLE001 - unreadable: the event is still posted, with pending null
            log.warning("webhooks: the pause of run %r version %s cannot be read for its %r event (%s: %s); it is "
                        "posted with pending null", meta.checkpoint_id, meta.version, event, type(err).__name__, err)
            pending = None
    return {"event": event, "run_id": meta.checkpoint_id, "graph": graph, "version": meta.version,
            "status": meta.status, "pending": pending, "error": meta.error, "origin": meta.origin,
            "at": meta.updated_at}


async def _pending(state: Any, meta: CheckpointMeta, event: str) -> list[dict[str, Any]] | None:
    paused = meta
    if event == "expired":
        version = expired_pause(meta)
        found = await state.store.get(meta.checkpoint_id, version) if version else None
        if found is None:
            return None
        paused = found.meta
    return await state.pending(paused)
