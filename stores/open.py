"""`open_store(db)`: the store a `--db` value names (what `waypoint worker` and `waypoint serve` take)."""

from __future__ import annotations

import os
from typing import Any

from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = ["open_store"]


def open_store(db: str | os.PathLike[str], **options: Any) -> Any:
    """`memory` → `MemoryStore` (gone at exit); `sqlite:///path` or a file path → `SQLiteStore` (the file is
    created if missing); any other URL, such as `postgresql+asyncpg://...` → `SQLStore(url, **options)`."""
    db = os.fspath(db)
    if db == "memory":
        return MemoryStore()
    if db.startswith("sqlite:///"):
        db = db.removeprefix("sqlite:///")
    elif "://" in db:
        from .sql import SQLStore

        return SQLStore(db, **options)
    if os.path.isdir(db):
        raise IsADirectoryError(f"--db {db!r} is a directory; give the database file (it is created if missing)")
    return SQLiteStore(db)
