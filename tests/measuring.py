"""A SQLite store that records what each version writes: the bytes of the new blobs each put carries (what a step
costs the store, for the tests that check a step writes what it appended, not the history)."""

from __future__ import annotations

from waypoint.stores import SQLiteStore


class Measuring(SQLiteStore):
    """Records the bytes of new blobs each put carries, in `written`."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.written: list[int] = []

    async def put(self, meta, header, parts, blobs, **kw):
        self.written.append(sum(len(b.data) for b in blobs))
        return await super().put(meta, header, parts, blobs, **kw)
