"""Pages: the run list's `before` cursor, and a run's history a page at a time (a read of a run costs the
same at its 5th version as at its 5,000th).

A run-list cursor is ours (`encode_cursor`) but travels through clients: decoding it checks everything —
a finite time in range, an ID a run could have — so a forged one is a 422, never a 500 or a silent
empty page.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from waypoint.engine import CheckpointMeta

__all__ = ["encode_cursor", "decode_cursor", "history_page", "HISTORY_PAGE", "MAX_VERSION"]

HISTORY_PAGE = 20
"""Versions of a run's history `GET /runs/{id}` shows (`history_limit=` asks for up to 500)."""
MAX_VERSION = 2**53
"""The largest version a request may name (what JSON numbers hold exactly; SQL's BIGINT holds more)."""
_MAX_TIME = 1e11  # seconds: the year 5138


def encode_cursor(meta: CheckpointMeta) -> str:
    raw = json.dumps([meta.updated_at, meta.checkpoint_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> CheckpointMeta:
    """The `before=` row a cursor stands for; ValueError if it is not one of ours."""
    wrong = ValueError("not a cursor returned by GET /runs (pass its `next` as it was given)")
    try:
        updated, cid = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)),
                                  parse_constant=_no_constant)
    except Exception:  # noqa: BLE001 - any garbage is the same mistake
        raise wrong from None
    if isinstance(updated, bool) or not isinstance(updated, (int, float)) or not isinstance(cid, str):
        raise wrong
    if not 0 <= updated <= _MAX_TIME or not 0 < len(cid) <= 512 or not _is_text(cid):  # NaN fails the range too
        raise wrong
    return CheckpointMeta(checkpoint_id=cid, version=1, status="completed", step=0, fingerprint="",
                          created_at=float(updated), updated_at=float(updated))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a time")


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def history_page(store: Any, checkpoint_id: str, *, before: int | None, limit: int,
                       newest: int | None = None) -> tuple[list[CheckpointMeta], int | None]:
    """Up to `limit` versions older than `before` (the newest ones when None), newest first, and the
    `before` of the next page (None on the last). Reads only as far back as the page asked for."""
    if before is None:
        found = await store.history(checkpoint_id, limit=limit + 1)
    else:
        if newest is None:
            head = await store.history(checkpoint_id, limit=1)
            newest = head[0].version if head else 0
        skip = max(0, newest - before + 1)  # versions >= before (fewer if some were pruned)
        found = [m for m in await store.history(checkpoint_id, limit=skip + limit + 1) if m.version < before]
    page = found[:limit]
    return page, (page[-1].version if len(found) > limit else None)
