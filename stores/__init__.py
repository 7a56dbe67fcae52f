"""Checkpoint stores — `MemoryStore`, `SQLiteStore(path)`, `SQLStore(url)` (SQLAlchemy: Postgres, SQLite),
`open_store(db)` for any of them by a path or URL — and the run queue: `RunQueue` (submit / resume / status / wait) and the `Worker` that runs queued work.

`import waypoint.stores` imports no database driver (SQLAlchemy loads when an `SQLStore` is created),
and the queue's modules load when one of their names is first used: a process that only resumes a run
pays for neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .memory import MemoryStore
from .open import open_store
from .sqlite import SQLiteStore

if TYPE_CHECKING:
    from .queue import QueueError, QueueTimeout, RunQueue, WorkStatus
    from .sql import MissingDriver, SQLStore
    from .worker import Worker

__all__ = ["MemoryStore", "SQLiteStore", "SQLStore", "open_store", "RunQueue", "WorkStatus", "Worker", "QueueError",
           "QueueTimeout", "MissingDriver"]

_LAZY = {"SQLStore": "sql", "MissingDriver": "sql", "RunQueue": "queue", "WorkStatus": "queue", "QueueError": "queue",
         "QueueTimeout": "queue", "Worker": "worker"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:
        from importlib import import_module

        return getattr(import_module(f".{module}", __name__), name)
    raise AttributeError(f"module 'waypoint.stores' has no attribute {name!r}")
