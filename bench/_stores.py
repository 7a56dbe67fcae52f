"""Store/checkpointer setup shared by the workloads (imports stay inside the functions)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench._harness import NotAvailable


# SQLite file cases: "sqlite" is each library as shipped (Waypoint synchronous=NORMAL, LangGraph sqlite's
# default FULL); "sqlite-normal" / "sqlite-full" put both on the same setting.
SQLITE_CASES = ("sqlite", "sqlite-normal", "sqlite-full")


def temp_db() -> tuple[Path, Any]:
    """A fresh SQLite file path on the real disk, and a cleanup callable."""
    d = Path(tempfile.mkdtemp(prefix="waypoint-bench-"))
    return d / "bench.db", lambda: shutil.rmtree(d, ignore_errors=True)


def waypoint_store(case: str) -> tuple[Any, Any]:
    """(store or None, close) for a Waypoint case; NotAvailable if the store class does not exist yet."""
    if case == "nostore":
        return None, None
    if case == "memory":
        try:
            from waypoint.stores import MemoryStore
        except ImportError as exc:
            raise NotAvailable(f"waypoint.stores.MemoryStore: {exc}") from exc
        return MemoryStore(), None
    if case in SQLITE_CASES:
        try:
            from waypoint.stores import SQLiteStore
        except ImportError as exc:
            raise NotAvailable(f"waypoint.stores.SQLiteStore: {exc}") from exc
        path, cleanup = temp_db()
        # "sqlite" / "sqlite-normal": the store's default (WAL, synchronous=NORMAL); "sqlite-full": fsync per commit
        store = SQLiteStore(str(path), synchronous="FULL") if case == "sqlite-full" else SQLiteStore(str(path))

        async def close() -> None:
            for name in ("aclose", "close", "dispose"):
                fn = getattr(store, name, None)
                if fn is not None:
                    res = fn()
                    if hasattr(res, "__await__"):
                        await res
                    break
            cleanup()

        return store, close
    raise ValueError(case)


def langgraph_saver(case: str, api: str) -> tuple[Any, Any]:
    """(checkpointer or None, close) for a LangGraph case."""
    if case == "nostore":
        return None, None
    if case == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        return InMemorySaver(), None
    if case in SQLITE_CASES:
        # "sqlite" / "sqlite-full": SqliteSaver as shipped (WAL, sqlite's default synchronous=FULL);
        # "sqlite-normal": `PRAGMA synchronous=NORMAL` run on the saver's connection (Waypoint's setting)
        path, cleanup = temp_db()
        if api == "async":
            if case == "sqlite-normal":
                raise NotAvailable("sqlite-normal is set up for LangGraph's sync SqliteSaver only")
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            conn = aiosqlite.connect(str(path))  # started lazily by the saver's setup()

            async def aclose() -> None:
                await conn.close()
                cleanup()

            return AsyncSqliteSaver(conn), aclose
        from langgraph.checkpoint.sqlite import SqliteSaver

        stack = contextlib.ExitStack()
        saver = stack.enter_context(SqliteSaver.from_conn_string(str(path)))
        if case == "sqlite-normal":
            saver.conn.execute("PRAGMA synchronous=NORMAL")  # per connection; setup() does not reset it

        def close() -> None:
            stack.close()
            cleanup()

        return saver, close
    raise ValueError(case)
