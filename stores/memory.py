"""`MemoryStore`: the store contract in process memory (tests, demos, single-process services).

Every method body runs without an `await` between its reads and writes, so each call is atomic
with respect to other coroutines on the loop: compare-and-set needs no lock.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from waypoint.engine.errors import LeaseLost
from waypoint.engine.keep.store import (Blob, CancelRequest, Checkpoint, CheckpointMeta, MissingBlobs, QueuedInput,
                                       RunStatus, version_label)

from ._relay_memory import RelayMemory
from ._common import (
    LEDGER_NEEDED,
    Expiry,
    chain_from,
    check_cancel,
    check_cancellable,
    check_input,
    check_due_by,
    check_holder,
    check_idle,
    check_limit,
    check_newest,
    check_put,
    check_status,
    cursor,
    lost_message,
    needed_blobs,
    reachable,
    stamped,
)

__all__ = ["MemoryStore"]


class MemoryStore(RelayMemory):
    """Checkpoints kept in dictionaries; gone when the process exits. `ttl` as for `SQLiteStore`."""

    def __init__(self, *, ttl: float | None = None) -> None:
        self.expiry = Expiry(ttl)
        self._versions: dict[str, dict[int, tuple[CheckpointMeta, bytes, dict[str, str]]]] = {}
        self._blobs: dict[str, dict[str, Blob]] = {}
        self._ledger: dict[tuple[str, int], dict[str, tuple[float | None, bytes]]] = {}  # -> (incarnation, result)
        self._due: dict[str, float] = {}  # run -> its newest version's deadline
        self._cancels: dict[str, CancelRequest] = {}  # run -> its newest cancel request (guarantee 14)
        self._inputs: dict[str, list[QueuedInput]] = {}  # run -> its queued inputs, numbered from 1 (guarantee 15)
        self._marks: dict[tuple[str, int], str] = {}  # (run, n) -> "taken" | "stuck" (unmarked: waiting)

    async def get(self, checkpoint_id: str, version: int | None = None) -> Checkpoint | None:
        versions = self._versions.get(checkpoint_id)
        if not versions:
            return None
        if version is None:
            version = _newest(versions)
        row = versions.get(version)
        if row is None:
            return None
        meta, header, parts = row
        blobs = self._blobs.get(checkpoint_id, {})
        where = version_label(checkpoint_id, version)
        return Checkpoint(meta=meta, header=header, parts=dict(parts),
                          chains={name: chain_from(blobs, head, where, name) for name, head in parts.items()})

    async def put(
        self,
        meta: CheckpointMeta,
        header: bytes,
        parts: Mapping[str, str],
        blobs: Sequence[Blob],
        *,
        expected_version: int | None,
        holder: str | None = None,
        takeover: bool = False,
        fresh: bool = False,
        due_by: float | None = None,
    ) -> CheckpointMeta:
        check_put(meta, expected_version)
        cid = meta.checkpoint_id
        versions = self._versions.get(cid) or {}
        newest = _newest(versions) if versions else None
        head = versions[newest][0] if newest is not None else None
        check_newest(cid, newest, expected_version, head.created_at if head is not None else None, meta.created_at,
                     fresh)
        check_holder(cid, head and head.status, head and head.lease_owner, head is not None and _live(head), holder,
                     takeover)
        check_due_by(cid, due_by, _now())
        stored = self._blobs.get(cid, {})
        missing = {h for h in needed_blobs(parts, blobs) if h not in stored}
        if missing:
            raise MissingBlobs(cid, missing)
        meta = stamped(meta, _now(), head.created_at if head is not None else None, fresh)  # this store's clock
        versions = self._versions.setdefault(cid, versions)
        stored = self._blobs.setdefault(cid, stored)
        for blob in blobs:
            stored.setdefault(blob.hash, blob)
        if head is not None and head.deadline is not None:  # only the newest version keeps one (guarantee 13)
            versions[newest] = (_replace(head, deadline=None), *versions[newest][1:])  # type: ignore[index]
        versions[meta.version] = (meta, bytes(header), dict(parts))
        if meta.deadline is not None:
            self._due[cid] = meta.deadline
        else:
            self._due.pop(cid, None)
        if self.expiry.due():
            await self.expire()
        return meta

    async def renew_lease(self, checkpoint_id: str, version: int, owner: str, seconds: float) -> bool:
        versions = self._versions.get(checkpoint_id) or {}
        if not versions or _newest(versions) != version:
            return False
        meta, header, parts = versions[version]
        now = _now()
        if meta.lease_owner != owner or meta.lease_expires is None or meta.lease_expires <= now:
            return False
        versions[version] = (_replace(meta, lease_expires=now + seconds), header, parts)
        return True

    async def renew_leases(self, leases: Sequence[tuple[str, int, str, float]]) -> list[bool]:
        return [await self.renew_lease(*lease) for lease in leases]

    async def clock(self) -> float:
        """This host's clock: a memory store lives in one process."""
        return _now()

    async def record_call(self, checkpoint_id: str, version: int, call_id: str, result: bytes, *,
                          holder: str | None = None, incarnation: float | None = None) -> bool:
        if holder is not None:
            versions = self._versions.get(checkpoint_id) or {}
            head = versions[_newest(versions)][0] if versions else None
            if head is None or head.status != "running" or head.lease_owner != holder or not _live(head) or (
                    head.created_at != incarnation):
                raise LeaseLost(lost_message(checkpoint_id, False) + f" (ledger entry {call_id[-80:]!r} was not "
                                "recorded)", checkpoint_id=checkpoint_id)
        calls = self._ledger.setdefault((checkpoint_id, version), {})
        if call_id in calls:
            return False
        calls[call_id] = (incarnation, bytes(result))
        return True

    async def recorded_calls(self, checkpoint_id: str, version: int, *,
                             incarnation: float | None = None, prefix: str | None = None) -> dict[str, bytes]:
        return {k: data for k, (written, data) in self._ledger.get((checkpoint_id, version), {}).items()
                if (incarnation is None or written is None or written == incarnation)
                and (prefix is None or k.startswith(prefix))}

    async def history(self, checkpoint_id: str, *, limit: int | None = None) -> list[CheckpointMeta]:
        check_limit(limit, f"history('{checkpoint_id}')")
        versions = self._versions.get(checkpoint_id, {})
        metas = [versions[v][0] for v in sorted(versions, reverse=True)]
        return metas if limit is None else metas[:limit]

    async def list_due(self, *, limit: int = 100, after: CheckpointMeta | None = None) -> list[CheckpointMeta]:
        check_limit(limit, "list_due()")
        now, start = _now(), (after.deadline, after.checkpoint_id) if after is not None else None
        due = sorted((d, cid) for cid, d in self._due.items() if d <= now and (start is None or (d, cid) > start))
        due = due[:limit]
        return [self._versions[cid][_newest(self._versions[cid])][0] for _, cid in due]

    async def list(
        self, *, status: RunStatus | None = None, limit: int = 100, before: float | CheckpointMeta | None = None
    ) -> list[CheckpointMeta]:
        check_status(status)
        check_limit(limit, "list()")
        after = cursor(before)
        newest = [v[_newest(v)][0] for v in self._versions.values() if v]
        rows = [m for m in newest if (status is None or m.status == status)
                and (after is None or (m.updated_at, m.checkpoint_id) < (after[0], after[1] or ""))]
        rows.sort(key=lambda m: (m.updated_at, m.checkpoint_id), reverse=True)
        return rows[:limit]

    async def delete(self, checkpoint_id: str, *, force: bool = True) -> bool:
        versions = self._versions.get(checkpoint_id)
        if not force and versions:
            head = versions[_newest(versions)][0]
            if head.status == "running" and head.lease_expires is not None:
                check_idle(checkpoint_id, [(head.lease_owner, head.lease_expires - _now())])
        existed = self._versions.pop(checkpoint_id, None) is not None
        self._due.pop(checkpoint_id, None)
        self._cancels.pop(checkpoint_id, None)
        self._inputs.pop(checkpoint_id, None)
        self._marks = {k: v for k, v in self._marks.items() if k[0] != checkpoint_id}
        self._blobs.pop(checkpoint_id, None)
        for key in [k for k in self._ledger if k[0] == checkpoint_id]:
            del self._ledger[key]
        return existed

    async def prune(self, checkpoint_id: str, *, keep_last: int = 1) -> int:
        versions = self._versions.get(checkpoint_id)
        if not versions:
            return 0
        keep = sorted(versions, reverse=True)[: max(1, keep_last)]
        dropped = [v for v in versions if v not in keep]
        drop_ledger = versions[_newest(versions)][0].status not in LEDGER_NEEDED
        for v in dropped:
            del versions[v]
        if drop_ledger:
            for key in [k for k in self._ledger if k[0] == checkpoint_id and k[1] < min(keep)]:
                del self._ledger[key]
        blobs = self._blobs.get(checkpoint_id, {})
        heads = [head for _, _, parts in versions.values() for head in parts.values()]
        live = reachable({h: b.parent for h, b in blobs.items()}, heads)
        for h in [h for h in blobs if h not in live]:
            del blobs[h]
        return len(dropped)

    async def expire(self, *, older_than: float | None = None, now: float | None = None) -> list[str]:
        cutoff = (_now() if now is None else now) - self.expiry.older_than(older_than)
        gone = [cid for cid, v in self._versions.items()
                if v and v[_newest(v)][0].status == "interrupted" and v[_newest(v)][0].updated_at < cutoff]
        for cid in gone:
            await self.delete(cid)
        return gone

    async def request_cancel(self, checkpoint_id: str, *, when: str = "now", by: str = "") -> CancelRequest:
        check_cancel(checkpoint_id, when, by)
        versions = self._versions.get(checkpoint_id)
        head = versions[_newest(versions)][0] if versions else None
        left = head.lease_expires - _now() if head is not None and head.lease_expires is not None else None
        version = check_cancellable(checkpoint_id, (head.version, head.status, left) if head is not None else None)
        request = CancelRequest(checkpoint_id=checkpoint_id, version=version, when=when, by=by, requested_at=_now())
        self._cancels[checkpoint_id] = request
        return request

    async def cancel_requests(self, checkpoint_ids: Sequence[str]) -> list[CancelRequest]:
        return [r for c in dict.fromkeys(checkpoint_ids) if (r := self._cancels.get(c)) is not None]

    async def queue_input(self, checkpoint_id: str, payload: bytes, *, policy: str = "enqueue",
                          by: str = "") -> QueuedInput:
        check_input(checkpoint_id, payload, policy, by)
        versions = self._versions.get(checkpoint_id)
        head = versions[_newest(versions)][0] if versions else None
        left = head.lease_expires - _now() if head is not None and head.lease_expires is not None else None
        check_cancellable(checkpoint_id, (head.version, head.status, left) if head is not None else None,
                          doing="new input cannot be queued for it (start it with the input instead)")
        inputs = self._inputs.setdefault(checkpoint_id, [])
        queued = QueuedInput(checkpoint_id=checkpoint_id, n=len(inputs) + 1, policy=policy, by=by, queued_at=_now(),
                             payload=bytes(payload))
        inputs.append(queued)
        return queued

    async def queued_inputs(self, checkpoint_id: str, *, after: int = 0) -> list[QueuedInput]:
        return self._inputs.get(checkpoint_id, [])[max(0, int(after)):][:100]

    async def waiting_inputs(self, *, limit: int = 100, after: str | None = None,
                             fingerprints: Sequence[str] | None = None) -> list[str]:
        found = []
        for cid, inputs in self._inputs.items():
            versions = self._versions.get(cid)
            head = versions[_newest(versions)][0] if versions else None
            if head is None or head.status == "running" or cid <= (after or "") or \
                    (fingerprints is not None and head.fingerprint not in fingerprints) or \
                    any(self._marks.get((cid, q.n)) == "stuck" for q in inputs):
                continue
            paused = head.status == "interrupted" and head.error != "cancelled"
            if any(self._marks.get((cid, q.n), "waiting") == "waiting" and not (paused and q.policy == "enqueue")
                   for q in inputs):
                found.append(cid)
        return sorted(found)[:limit]

    async def mark_inputs(self, checkpoint_id: str, upto: int, *, state: str = "taken") -> int:
        if state not in ("taken", "stuck"):
            raise ValueError(f"run '{checkpoint_id}': an input is marked 'taken' or 'stuck', not {str(state)[:40]!r}")
        marked = 0
        for q in self._inputs.get(checkpoint_id, []):
            now = self._marks.get((checkpoint_id, q.n), "waiting")
            if (q.n <= upto and now != "taken") if state == "taken" else (q.n == upto and now == "waiting"):
                self._marks[(checkpoint_id, q.n)] = state
                marked += 1
        return marked

    async def close(self) -> None:
        return None


def _newest(versions: dict[int, object]) -> int:
    """The highest version: versions are only ever added in increasing order, so it is the last key."""
    return next(reversed(versions))


def _now() -> float:
    """This store's clock — the host's: a memory store lives in one process, so its clock is that process's. Every
    lease it stamps or judges reads this one function."""
    return time.time()


def _live(meta: CheckpointMeta) -> bool:
    return meta.lease_expires is not None and meta.lease_expires > _now()


def _replace(meta: CheckpointMeta, **changes) -> CheckpointMeta:
    from dataclasses import replace

    return replace(meta, **changes)
