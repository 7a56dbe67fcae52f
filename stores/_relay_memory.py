"""Relayed events for `MemoryStore` (stores/_relay_sql.py says what they are): the same numbering, fencing and
trimming, in a dictionary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from waypoint.engine.errors import LeaseLost

from ._relay_sql import ENDED_GRACE, KEEP, check_batch

__all__ = ["RelayMemory"]


class RelayMemory:
    """Mixed into `MemoryStore` (which has `_versions`)."""

    _versions: dict[str, dict[int, tuple[Any, bytes, dict[str, str]]]]

    def _relayed(self) -> dict[str, list[tuple[int, float, int, str, str]]]:
        found = self.__dict__.get("_relay_log")
        if found is None:
            found = self.__dict__["_relay_log"] = {}
        return found

    async def append_events(self, checkpoint_id: str, events: Sequence[tuple[str, str]], *, incarnation: float,
                            base: int, holder: str) -> list[int]:
        import time

        check_batch(checkpoint_id, events)
        if not self._holds(checkpoint_id, incarnation, holder, time.time()):
            raise LeaseLost(f"run '{checkpoint_id[:120]}': this process does not hold the run any more; its live "
                            "events were not relayed", checkpoint_id=checkpoint_id)
        rows = self._relayed().setdefault(checkpoint_id, [])
        first = (rows[-1][0] if rows else 0) + 1
        rows.extend((first + j, incarnation, int(base), kind, data) for j, (kind, data) in enumerate(events))
        del rows[:max(0, len(rows) - KEEP)]
        return list(range(first, first + len(events)))

    def _holds(self, checkpoint_id: str, incarnation: float, holder: str, now: float) -> bool:
        versions = self._versions.get(checkpoint_id) or {}
        if not versions:
            return False
        metas = [versions[v][0] for v in sorted(versions, reverse=True)]
        head = metas[0]
        if head.created_at != incarnation:
            return False
        if head.status == "running":
            return head.lease_owner == holder and head.lease_expires is not None and head.lease_expires > now
        last = next((m.lease_owner for m in metas if m.lease_owner is not None), None)
        return last == holder and head.updated_at > now - ENDED_GRACE

    async def read_events(self, checkpoint_id: str, *, incarnation: float, after: int = 0, limit: int = 500
                          ) -> tuple[int | None, int | None, list[tuple[int, int, str, str]]]:
        rows = self._relayed().get(checkpoint_id, [])
        found = [(n, b, k, d) for n, i, b, k, d in rows if n > after and i == incarnation]
        return (rows[0][0] if rows else None), (rows[-1][0] if rows else None), found[:limit]
