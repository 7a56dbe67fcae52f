"""Webhook deliveries in the checkpoint database: which events are owed to which receiver, and who is sending
each one now (`waypoint serve --webhook`, service/_notify.py; docs/service.md, "Notifications").

One row per (run incarnation, version, event, receiver) in `waypoint_deliveries` (migration 7, stores/_sql.py):

1. **Registered once.** Every service that sees an event inserts its row with `INSERT … ON CONFLICT DO NOTHING`
   on that key, so however many services share the database, an event has one row — one delivery.
2. **Claimed per attempt.** An attempt is made under a claim (a token, `claimed_until` on the database's clock):
   a due row is claimed by one `UPDATE` (Postgres: `FOR UPDATE SKIP LOCKED`; SQLite: its one write lock), and
   its outcome is written only `WHERE claim = :token`. A service that dies mid-attempt leaves the row to
   whichever service claims it once `claimed_until` has passed; no process's own clock is compared with it.
3. **Bounded.** An attempt that fails puts the row back with `next_try` later (the caller's backoff) or, at the
   caller's last attempt, `failed`; delivered and failed rows are pruned after a while.

The row carries the body as first built, so any service can retry it, even one that cannot read the run.
`receiver` is a digest of the URL, never the URL (webhook URLs often carry a secret). `MemoryDeliveries` is the
same for a `MemoryStore` (one process: the apps sharing that store share it).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from waypoint.engine.keep.store import CheckpointMeta

from ._sql import _META_COLUMNS, _meta, now_sql

__all__ = ["Delivery", "SQLDeliveries", "MemoryDeliveries", "deliveries_for", "delivery_id", "receiver_of"]

KEEP_DONE = 7 * 86400.0
"""Seconds a delivered or given-up row is kept (the dedupe horizon of a service restarting with a lookback)."""
_PAGE = 500
_IDS_PER_QUERY = 500
_STOPPED = ("interrupted", "completed", "failed")


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """One claimed attempt: the event's row as stored, `attempts` made before this one, the claim's token."""

    id: str
    checkpoint_id: str
    version: int
    event: str
    receiver: str
    body: bytes
    attempts: int
    claim: str


def receiver_of(url: str) -> str:
    """The receiver's name in the database: a digest of its URL (the URL itself may hold a secret)."""
    return hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def delivery_id(checkpoint_id: str, incarnation: float, version: int, event: str, receiver: str) -> str:
    """The delivery's ID, the same in every service (receivers dedupe on it): a digest of its key."""
    key = json.dumps([checkpoint_id, repr(float(incarnation)), int(version), event, receiver], ensure_ascii=True)
    return "wh_" + hashlib.sha256(key.encode("ascii")).hexdigest()[:32]


# --- SQL (each function runs in one store transaction: `store._call`) ----------------------------------------

def _names(prefix: str, values: Sequence[Any], params: dict[str, Any]) -> str:
    params.update({f"{prefix}{i}": v for i, v in enumerate(values)})
    return ", ".join(f":{prefix}{i}" for i in range(len(values)))


def stopped_since(db: Any, since: float, after: tuple[float, str, int] | None, limit: int) -> list[CheckpointMeta]:
    """Versions written at or after `since` (their writer's clock) that may carry an event — stopped ones, and
    those whose origin mentions an expiry — oldest first, after the cursor `after` (updated_at, id, version)."""
    params: dict[str, Any] = {"s": float(since), "n": limit}
    sql = (f"SELECT {_META_COLUMNS} FROM waypoint_checkpoints WHERE updated_at >= :s AND (status IN "
           f"({_names('st', _STOPPED, params)}) OR origin LIKE '%expired%')")
    if after is not None:
        params.update(au=float(after[0]), ac=after[1], av=int(after[2]))
        sql += (" AND (updated_at > :au OR (updated_at = :au AND (checkpoint_id > :ac OR "
                "(checkpoint_id = :ac AND version > :av))))")
    sql += " ORDER BY updated_at, checkpoint_id, version LIMIT :n"
    return [_meta(r) for r in db.rows(sql, params)]


def known(db: Any, ids: Sequence[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(ids), _IDS_PER_QUERY):
        params: dict[str, Any] = {}
        names = _names("i", ids[start:start + _IDS_PER_QUERY], params)
        found.update(r[0] for r in db.rows(f"SELECT id FROM waypoint_deliveries WHERE id IN ({names})", params))
    return found


def register(db: Any, rows: Sequence[dict[str, Any]]) -> list[str]:
    """Insert each event's row unless some service did first; returns the IDs inserted here."""
    now = now_sql(db)
    inserted = []
    for row in rows:
        if db.run("INSERT INTO waypoint_deliveries (checkpoint_id, incarnation, version, event, target, id, body, "
                  f"state, attempts, next_try, created_at) VALUES (:c, :inc, :v, :e, :r, :id, :b, 'pending', 0, {now}, "
                  f"{now}) ON CONFLICT DO NOTHING", row) == 1:
            inserted.append(row["id"])
    return inserted


def _due(receivers: Sequence[str], params: dict[str, Any], now: str, alias: str = "d") -> str:
    return (f"{alias}.target IN ({_names('r', receivers, params)}) AND {alias}.state = 'pending' AND "
            f"{alias}.next_try <= {now} AND ({alias}.claimed_until IS NULL OR {alias}.claimed_until <= {now})")


def any_due(db: Any, receivers: Sequence[str]) -> bool:
    """Whether a claim would find a row (read only: on SQLite a write transaction takes the database's lock)."""
    params: dict[str, Any] = {}
    return bool(db.rows(f"SELECT 1 FROM waypoint_deliveries d WHERE {_due(receivers, params, now_sql(db))} LIMIT 1",
                        params))


def claim(db: Any, receivers: Sequence[str], token: str, limit: int, hold: float) -> list[tuple]:
    """Claim up to `limit` due rows for `receivers` for `hold` seconds (the database's clock), soonest due first."""
    params: dict[str, Any] = {"t": token, "n": limit, "hold": float(hold)}
    skip = " FOR UPDATE SKIP LOCKED" if db.dialect == "postgresql" else ""
    now = now_sql(db)
    return db.rows(
        f"UPDATE waypoint_deliveries SET claim = :t, claimed_until = {now} + CAST(:hold AS DOUBLE PRECISION) "
        f"WHERE id IN (SELECT d.id FROM waypoint_deliveries d WHERE {_due(receivers, params, now)} "
        f"ORDER BY d.next_try LIMIT :n{skip}) "
        "RETURNING id, checkpoint_id, version, event, target, body, attempts", params)


def finish(db: Any, delivery_id: str, token: str, state: str, delay: float, error: str | None,
           counts: bool = True) -> bool:
    """The claimed attempt's outcome, if the claim `token` still holds the row: `state` "delivered", "failed"
    (given up) or "pending" (tried again `delay` seconds from now; `counts` False: not an attempt)."""
    now = now_sql(db)
    return db.run(
        f"UPDATE waypoint_deliveries SET state = :s, attempts = attempts + :k, claim = NULL, claimed_until = NULL, "
        f"next_try = {now} + CAST(:d AS DOUBLE PRECISION), last_error = COALESCE(:e, last_error), "
        f"finished_at = CASE WHEN :s = 'pending' THEN NULL ELSE {now} END WHERE id = :id AND claim = :t",
        {"s": state, "k": 1 if counts else 0, "d": float(delay), "e": error[:2000] if error else None,
         "id": delivery_id, "t": token}) == 1


def prune(db: Any, older_than: float) -> int:
    return db.run(f"DELETE FROM waypoint_deliveries WHERE state <> 'pending' AND finished_at < {now_sql(db)} - "
                  "CAST(:o AS DOUBLE PRECISION)", {"o": float(older_than)})


def row_of(checkpoint_id: str, incarnation: float, version: int, event: str, receiver: str, body: bytes) -> dict:
    """The parameters `register` inserts for one event and receiver."""
    return {"c": checkpoint_id, "inc": float(incarnation), "v": int(version), "e": event, "r": receiver,
            "id": delivery_id(checkpoint_id, incarnation, version, event, receiver), "b": body}


def _delivery(row: Sequence[Any], token: str) -> Delivery:
    return Delivery(id=row[0], checkpoint_id=row[1], version=int(row[2]), event=row[3], receiver=row[4],
                    body=bytes(row[5]), attempts=int(row[6]), claim=token)


# --- the two ledgers ------------------------------------------------------------------------------------------

class SQLDeliveries:
    """The deliveries of an SQL store (`SQLiteStore`, `SQLStore`), in its database."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def clock(self) -> float:
        return await self.store.clock()

    async def stopped_since(self, since: float) -> list[CheckpointMeta]:
        out: list[CheckpointMeta] = []
        after = None
        while True:
            page = await self.store._call(stopped_since, since, after, _PAGE)
            out += page
            if len(page) < _PAGE:
                return out
            after = (page[-1].updated_at, page[-1].checkpoint_id, page[-1].version)

    async def known(self, ids: Sequence[str]) -> set[str]:
        return await self.store._call(known, list(ids)) if ids else set()

    async def register(self, rows: Sequence[dict[str, Any]]) -> list[str]:
        return await self.store._call(register, list(rows), write=True) if rows else []

    async def claim(self, receivers: Sequence[str], limit: int, hold: float) -> list[Delivery]:
        if not await self.store._call(any_due, list(receivers)):  # the usual answer, without the write lock
            return []
        token = uuid.uuid4().hex
        rows = await self.store._call(claim, list(receivers), token, limit, hold, write=True)
        return [_delivery(r, token) for r in rows]

    async def finish(self, d: Delivery, state: str, *, delay: float = 0.0, error: str | None = None,
                     counts: bool = True) -> bool:
        return await self.store._call(finish, d.id, d.claim, state, delay, error, counts, write=True)

    async def prune(self, older_than: float = KEEP_DONE) -> int:
        return await self.store._call(prune, older_than, write=True)


class MemoryDeliveries:
    """The same for a store without a database (`MemoryStore`, or any store without SQL): rows in this process;
    the events are read through the store's public `list` and `history`."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.rows: dict[str, dict[str, Any]] = {}

    async def clock(self) -> float:
        clock = getattr(self.store, "clock", None)
        return await clock() if clock is not None else time.time()

    async def stopped_since(self, since: float) -> list[CheckpointMeta]:
        found: list[CheckpointMeta] = []
        before = None
        while True:
            heads = await self.store.list(limit=_PAGE, before=before)
            for head in heads:
                if head.updated_at < since:
                    return sorted(found, key=lambda m: (m.updated_at, m.checkpoint_id, m.version))
                found += [m for m in await self.store.history(head.checkpoint_id, limit=64)
                          if m.updated_at >= since and (m.status in _STOPPED or "expired" in (m.origin or ""))]
            if len(heads) < _PAGE:
                return sorted(found, key=lambda m: (m.updated_at, m.checkpoint_id, m.version))
            before = heads[-1]

    async def known(self, ids: Sequence[str]) -> set[str]:
        return {i for i in ids if i in self.rows}

    async def register(self, rows: Sequence[dict[str, Any]]) -> list[str]:
        now, inserted = time.monotonic(), []
        for row in rows:
            if row["id"] not in self.rows:
                self.rows[row["id"]] = {**row, "state": "pending", "attempts": 0, "next_try": now, "claim": None,
                                        "until": 0.0, "finished": None}
                inserted.append(row["id"])
        return inserted

    async def claim(self, receivers: Sequence[str], limit: int, hold: float) -> list[Delivery]:
        now, token, out = time.monotonic(), uuid.uuid4().hex, []
        due = sorted((r for r in self.rows.values() if r["r"] in receivers and r["state"] == "pending"
                      and r["next_try"] <= now and r["until"] <= now), key=lambda r: r["next_try"])
        for row in due[:limit]:
            row.update(claim=token, until=now + hold)
            out.append(_delivery((row["id"], row["c"], row["v"], row["e"], row["r"], row["b"], row["attempts"]),
                                 token))
        return out

    async def finish(self, d: Delivery, state: str, *, delay: float = 0.0, error: str | None = None,
                     counts: bool = True) -> bool:
        row = self.rows.get(d.id)
        if row is None or row["claim"] != d.claim:
            return False
        now = time.monotonic()
        row.update(state=state, attempts=row["attempts"] + (1 if counts else 0), claim=None, until=0.0,
                   next_try=now + delay, finished=None if state == "pending" else now)
        return True

    async def prune(self, older_than: float = KEEP_DONE) -> int:
        cutoff = time.monotonic() - older_than
        gone = [i for i, r in self.rows.items() if r["finished"] is not None and r["finished"] < cutoff]
        for i in gone:
            del self.rows[i]
        return len(gone)


_MEMORY: weakref.WeakKeyDictionary[Any, MemoryDeliveries] = weakref.WeakKeyDictionary()


def deliveries_for(store: Any) -> SQLDeliveries | MemoryDeliveries:
    """The delivery ledger of `store`: in its database for an SQL store, else one per store object in this
    process (every app on one `MemoryStore` shares it)."""
    if hasattr(store, "_call"):
        return SQLDeliveries(store)
    found = _MEMORY.get(store)
    if found is None:
        found = _MEMORY[store] = MemoryDeliveries(store)
    return found
