"""`SQLStore(url)`: the store contract on SQLAlchemy 2's async engine (Postgres, or SQLite via aiosqlite).

It runs the same SQL as `SQLiteStore` (stores/_sql.py) inside `engine.begin()`; adding a database is
adding its dialect's column types there plus a conformance-test run. For SQLite URLs every
transaction starts with `BEGIN IMMEDIATE` (SQLAlchemy's documented recipe for pysqlite/aiosqlite), WAL
and a busy timeout are set on connect. SQLAlchemy is imported when the first store is created, never
by `import waypoint.stores`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from . import _sql
from ._common import Expiry

__all__ = ["SQLStore"]

T = TypeVar("T")


class _Conn:
    """The `_sql.DB` interface over a SQLAlchemy (sync-facade) connection inside `run_sync`."""

    __slots__ = ("conn", "text")

    def __init__(self, conn: Any, text: Callable[[str], Any]) -> None:
        self.conn = conn
        self.text = text

    def rows(self, sql: str, params: Mapping[str, Any] = {}) -> list[tuple]:
        return [tuple(r) for r in self.conn.execute(self.text(sql), dict(params)).fetchall()]

    def run(self, sql: str, params: Mapping[str, Any] = {}) -> int:
        return self.conn.execute(self.text(sql), dict(params)).rowcount

    def many(self, sql: str, params: Sequence[Mapping[str, Any]]) -> None:
        self.conn.execute(self.text(sql), [dict(p) for p in params])


class SQLStore(_sql.SQLStoreMethods):
    """A `CheckPointStore` on any SQLAlchemy async URL: `postgresql+asyncpg://…`, `sqlite+aiosqlite:///…`."""

    def __init__(self, url: str, *, busy_timeout: float = 30.0, ttl: float | None = None,
                 **engine_options: Any) -> None:
        from sqlalchemy import event, text
        from sqlalchemy.ext.asyncio import create_async_engine

        self.url = url
        self.expiry = Expiry(ttl)
        self._text = text
        self._engine = create_async_engine(url, **engine_options)
        self.dialect = self._engine.dialect.name
        if self.dialect not in _sql._BINARY:
            raise ValueError(f"SQLStore supports sqlite and postgresql URLs, not {self.dialect!r} ({url})")
        if self.dialect == "sqlite":
            sync_engine = self._engine.sync_engine

            @event.listens_for(sync_engine, "connect")
            def _on_connect(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
                cursor = dbapi_conn.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
                cursor.close()

            @event.listens_for(sync_engine, "begin")
            def _on_begin(conn: Any) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        self._migrated = False

    def __repr__(self) -> str:
        return f"SQLStore({self.url!r})"

    async def _call(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T:
        text = self._text
        async with self._engine.begin() as conn:
            if not self._migrated:
                await conn.run_sync(lambda sync: _sql.migrate(_Conn(sync, text), self.dialect))
                self._migrated = True
            return await conn.run_sync(lambda sync: fn(_Conn(sync, text), *args))

    async def close(self) -> None:
        await self._engine.dispose()
