"""Checkpoint stores: `MemoryStore`, `SQLiteStore(path)`, `SQLStore(url)` (SQLAlchemy: Postgres, SQLite).

`import waypoint.stores` imports no database driver; SQLAlchemy loads when an `SQLStore` is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .memory import MemoryStore
from .sqlite import SQLiteStore

if TYPE_CHECKING:
    from .sql import SQLStore

__all__ = ["MemoryStore", "SQLiteStore", "SQLStore"]


def __getattr__(name: str) -> Any:
    if name == "SQLStore":
        from .sql import SQLStore

        return SQLStore
    raise AttributeError(f"module 'waypoint.stores' has no attribute {name!r}")
