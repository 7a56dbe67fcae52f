"""Cancel requests in SQL (engine/keep/store.py, guarantee 14): one row per run, the newest request."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from waypoint.engine.errors import CheckpointCorrupted
from waypoint.engine.keep.store import CancelRequest

from ._common import RESTORE, check_cancel, check_cancellable
from ._sql import DB, _lock_run, now_sql

__all__ = ["request_cancel", "cancel_requests", "CancelMethods"]

T = TypeVar("T")

_COLUMNS = "checkpoint_id, version, cancel_when, requested_by, requested_at"
_IDS_PER_QUERY = 500


def request_cancel(db: DB, checkpoint_id: str, when: str, by: str) -> CancelRequest:
    check_cancel(checkpoint_id, when, by)
    params = {"c": checkpoint_id}
    _lock_run(db, checkpoint_id)  # a claim or a put cannot slip between the look and the insert
    now = now_sql(db)
    head = db.rows(f"SELECT version, status, lease_expires - {now} FROM waypoint_checkpoints WHERE checkpoint_id = :c "
                   "ORDER BY version DESC LIMIT 1", params)
    version = check_cancellable(checkpoint_id, head[0] if head else None)
    db.run("DELETE FROM waypoint_cancels WHERE checkpoint_id = :c", params)
    db.run(f"INSERT INTO waypoint_cancels ({_COLUMNS}) VALUES (:c, :v, :w, :b, {now})",
           {**params, "v": version, "w": when, "b": by})
    return _requests(db, [checkpoint_id])[0]


def cancel_requests(db: DB, checkpoint_ids: Sequence[str]) -> list[CancelRequest]:
    return _requests(db, list(dict.fromkeys(checkpoint_ids)))


def _requests(db: DB, ids: list[str]) -> list[CancelRequest]:
    found = []
    for start in range(0, len(ids), _IDS_PER_QUERY):
        chunk = ids[start:start + _IDS_PER_QUERY]
        names = ", ".join(f":c{i}" for i in range(len(chunk)))
        rows = db.rows(f"SELECT {_COLUMNS} FROM waypoint_cancels WHERE checkpoint_id IN ({names})",
                       {f"c{i}": c for i, c in enumerate(chunk)})
        found += [_request(row) for row in rows]
    return found


def _request(row: Sequence) -> CancelRequest:
    cid, version, when, by, at = row
    if type(cid) is not str or type(version) is not int or type(when) is not str or type(by) is not str \
            or type(at) not in (int, float):
        raise CheckpointCorrupted(f"run {str(cid)[:120]!r}: its stored cancel request has the wrong types; {RESTORE}")
    return CancelRequest(checkpoint_id=cid, version=version, when=when, by=by, requested_at=float(at))


class CancelMethods:
    """Guarantee 14 for the SQL stores: each method is one `_call` of the function above."""

    async def _call(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T:
        raise NotImplementedError

    async def request_cancel(self, checkpoint_id: str, *, when: str = "now", by: str = "") -> CancelRequest:
        return await self._call(request_cancel, checkpoint_id, when, by, write=True)

    async def cancel_requests(self, checkpoint_ids: Sequence[str]) -> list[CancelRequest]:
        """Read from the loop that renews leases (engine/keep/lease.py), between its renewals."""
        return await self._renewals_read(cancel_requests, list(checkpoint_ids))

    async def _renewals_read(self, fn: Callable[..., T], *args: Any) -> T:
        """A read the lease thread makes: on the connection kept for renewals where the store keeps one."""
        return await self._call(fn, *args)
