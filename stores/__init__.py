"""Checkpoint stores — `MemoryStore`, `SQLiteStore(path)`, `SQLStore(url)` (SQLAlchemy: Postgres, SQLite) —
and the run queue: `RunQueue` (submit / resume / status / wait) and the `Worker` that runs queued work.

`import waypoint.stores` imports no database driver; SQLAlchemy loads when an `SQLStore` is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .memory import MemoryStore
from .queue import QueueError, QueueTimeout, RunQueue, WorkStatus
from .sqlite import SQLiteStore
from .worker import Worker

if TYPE_CHECKING:
    from .sql import SQLStore

__all__ = ["MemoryStore", "SQLiteStore", "SQLStore", "RunQueue", "WorkStatus", "Worker", "QueueError",
           "QueueTimeout"]


def __getattr__(name: str) -> Any:
    if name == "SQLStore":
        from .sql import SQLStore

        return SQLStore
    raise AttributeError(f"module 'waypoint.stores' has no attribute {name!r}")
