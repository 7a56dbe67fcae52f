"""`SQLiteStore(path)`: checkpoints in one SQLite file, shared safely by threads and processes.

Every operation runs as one transaction (`BEGIN IMMEDIATE` for writes, so two processes never
interleave a compare-and-set). An operation that finds the database free runs at once on the calling
thread: on this hardware a thread round trip costs more (~100 µs) than a commit (~60 µs), and a
per-step checkpoint is paid at every step. That connection never waits for a lock (busy timeout 0).
Whatever would wait — another process holds the lock, the file or its schema must be created — goes
to a worker thread with its own connection and the real busy timeout, so the event loop never waits
on a lock. The WAL is kept short by SQLite's own auto-checkpoint on the committing connection (after
a commit that grows it past ~1000 pages: a few milliseconds, a few times per thousand steps); a
checkpoint run from another thread could not keep up with a tight loop of commits (measured).
Settings: WAL journal (readers never block the writer), `synchronous=NORMAL` (a commit is durable
against a crash of the process, and against power loss once the WAL is checkpointed — the last
commits before a power cut may be lost, never corrupted; pass `synchronous="FULL"` to fsync every
commit), and a busy timeout so several processes can share the file. docs/decisions.md says why this
store uses the standard library's driver rather than SQLAlchemy.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from waypoint.engine.errors import CheckpointError

from . import _sql
from ._cancel_sql import CancelMethods
from ._input_sql import InputMethods
from ._relay_sql import RelayMethods
from ._common import Expiry, unavailable

__all__ = ["SQLiteStore"]

T = TypeVar("T")


_WAL_LIMIT = 16 * 1024 * 1024  # a WAL larger than this is truncated when it starts over


def _is_busy(err: sqlite3.OperationalError) -> bool:
    text = str(err)
    return "locked" in text or "busy" in text


class _Conn:
    """The `_sql.DB` interface over one sqlite3 connection."""

    __slots__ = ("raw",)
    dialect = "sqlite"

    def __init__(self, raw: sqlite3.Connection) -> None:
        self.raw = raw

    def rows(self, sql: str, params: Mapping[str, Any] = {}) -> list[tuple]:
        return self.raw.execute(sql, params).fetchall()

    def run(self, sql: str, params: Mapping[str, Any] = {}) -> int:
        return self.raw.execute(sql, params).rowcount

    def many(self, sql: str, params: Sequence[Mapping[str, Any]]) -> None:
        self.raw.executemany(sql, params)


class SQLiteStore(_sql.SQLStoreMethods, CancelMethods, InputMethods, RelayMethods):
    """A `CheckPointStore` in the SQLite file at `path` (created, with its schema, on first use).

    `ttl` (seconds): interrupted runs not updated for that long are deleted (see `expire`).
    """

    def __init__(self, path: str | Path, *, busy_timeout: float = 30.0, synchronous: str = "NORMAL",
                 ttl: float | None = None) -> None:
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, got {synchronous!r}")
        self.path = Path(path)
        self.expiry = Expiry(ttl)
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous.upper()
        self._executor: ThreadPoolExecutor | None = None
        self._conn: _Conn | None = None
        self._lock = threading.Lock()
        self._inline: _Conn | None = None
        self._inline_lock = threading.Lock()
        self._needs_migration = False  # the worker opens (and migrates) first; then inline is tried again

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    # --- plumbing ------------------------------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T:
        done, result = self._try_inline(fn, args, write)
        if done:
            return result
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker(), self._transaction, fn, args, write)
        except sqlite3.OperationalError as err:
            if _is_busy(err):  # another process held the write lock past the busy timeout
                raise unavailable(repr(self), err) from err
            raise

    def _worker(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="waypoint-sqlite")
            return self._executor

    def _try_inline(self, fn: Callable[..., T], args: tuple, write: bool) -> tuple[bool, Any]:
        """Run `fn` here if the database is free right now; (False, None) sends it to the worker."""
        if not self._inline_lock.acquire(blocking=False):
            return False, None
        try:
            conn = self._inline or self._open_inline()
            if conn is None:
                return False, None
            raw = conn.raw
            try:
                raw.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                result = fn(conn, *args)
            except sqlite3.OperationalError as err:
                if raw.in_transaction:
                    raw.rollback()
                if _is_busy(err):  # another process holds the lock: wait for it on the worker
                    return False, None
                raise
            except BaseException:
                if raw.in_transaction:
                    raw.rollback()
                raise
            try:
                raw.commit()
            except BaseException:
                if raw.in_transaction:
                    raw.rollback()
                raise
            return True, result
        finally:
            self._inline_lock.release()

    def _open_inline(self) -> _Conn | None:
        """The calling thread's connection, or None while the file or its schema is not ready."""
        if self._needs_migration or not self.path.exists():
            return None
        raw = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
        try:
            raw.execute(f"PRAGMA synchronous={self.synchronous}")
            raw.execute(f"PRAGMA journal_size_limit={_WAL_LIMIT}")
            found = raw.execute("SELECT version FROM waypoint_schema").fetchall()
            wal = raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        except sqlite3.DatabaseError:  # no schema yet, locked, or not a database: the worker says which
            raw.close()
            self._needs_migration = True
            return None
        if not wal or found != [(_sql.SCHEMA_VERSION,)]:
            raw.close()
            self._needs_migration = True
            return None
        self._inline = _Conn(raw)
        return self._inline

    def _transaction(self, fn: Callable[..., T], args: tuple, write: bool) -> T:
        conn = self._conn or self._open()
        raw = conn.raw
        raw.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = fn(conn, *args)
        except BaseException:
            raw.rollback()
            raise
        raw.commit()
        self._needs_migration = False  # the schema is there now: the calling thread may try again
        return result

    def _open(self) -> _Conn:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            raw = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
            raw.execute("PRAGMA journal_mode=WAL")
            raw.execute(f"PRAGMA synchronous={self.synchronous}")
            raw.execute(f"PRAGMA journal_size_limit={_WAL_LIMIT}")
            conn = _Conn(raw)
            raw.execute("BEGIN IMMEDIATE")
            try:
                _sql.migrate(conn, "sqlite")
            except BaseException:
                raw.rollback()
                raise
            raw.commit()
            self._needs_migration = False
        except sqlite3.DatabaseError as err:
            raise CheckpointError(
                f"cannot open checkpoint database {str(self.path)!r}: {err}; check the path and that it "
                "is a Waypoint SQLite file"
            ) from err
        self._conn = conn
        return conn

    async def close(self) -> None:
        """Close the connections and stop the worker thread; the store reopens on next use."""
        with self._inline_lock:
            if self._inline is not None:
                self._inline.raw.close()
                self._inline = None
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_worker_conn)
            executor.shutdown(wait=True)

    def _close_worker_conn(self) -> None:
        if self._conn is not None:
            self._conn.raw.close()
            self._conn = None
