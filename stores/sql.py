"""`SQLStore(url)`: the store contract on SQLAlchemy 2's async engine (Postgres via asyncpg, or SQLite via aiosqlite).

It runs the same SQL as `SQLiteStore` (stores/_sql.py) inside `engine.begin()`; adding a database is
adding its dialect's column types there plus a conformance-test run. For SQLite URLs every
transaction starts with `BEGIN IMMEDIATE` (SQLAlchemy's documented recipe for pysqlite/aiosqlite), WAL
and a busy timeout are set on connect. SQLAlchemy and the URL's driver are imported when the first store is
created, never by `import waypoint.stores`; a driver that is not installed is `MissingDriver` there, naming
the extra to install (at a connection it would pass for a database that is down).

**One engine per event loop.** An asyncpg connection belongs to the event loop that opened it, and a
store is used from several: `invoke()` runs `asyncio.run` per call, and the lease thread renews leases
from its own loop (engine/keep/lease.py). So the store keeps one SQLAlchemy engine — one connection pool —
per loop that uses it, created on that loop's first call. A loop that shuts down with
`asyncio.run` / `asyncio.Runner` disposes its engine itself (a small async generator parked on the
loop is closed by `shutdown_asyncgens()`, and closing it disposes the pool while the loop still runs);
`close()` disposes the calling loop's engine and lets go of the others.

**Renewals have a connection of their own** (engine/keep/store.py, guarantee 12): `renew_leases` runs on an engine
of one connection, kept open (`reserve_renewals()` takes it up front; checked before each use, so a
connection the server dropped is opened again), never on the work's pool — a process whose runs hold every
pooled connection still renews their leases, and a process that cannot get that connection claims no run.
A connection the database refuses because it has none to spare ("too many clients", or starting up) is waited
for, up to `connect_wait` seconds (a renewal: 2 s), before the operation fails with `StoreUnavailable`: nothing
was sent yet, and the work's own pool gives one back soon. On Postgres every session ends a transaction left
idle for `idle_in_transaction` seconds (5: a process frozen inside a write must not hold the run's lock, and so
every other writer of the run, for good) and stops waiting for a lock after `lock_wait` (10).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

from waypoint.engine.errors import WaypointError

from . import _sql
from ._cancel_sql import CancelMethods
from ._input_sql import InputMethods
from ._relay_sql import RelayMethods
from ._common import Expiry, no_spare_connection, passing, unavailable

__all__ = ["SQLStore", "MissingDriver"]

T = TypeVar("T")

_EXTRAS = {"asyncpg": "postgres"}
"""The extra of waypoint-graph that installs a driver (pyproject.toml)."""


class MissingDriver(WaypointError):
    """The URL names a database driver this Python cannot import: nothing can connect; the message says what to
    install."""


def _check_driver(url: Any, label: str) -> None:
    """Refuse a URL whose driver is not installed now, once, naming what to install — not at every connection,
    where it would read as a database that is down (a worker would wait for it for good)."""
    try:
        url.get_dialect().import_dbapi()
    except ImportError as err:
        driver = url.get_driver_name()
        extra = _EXTRAS.get(driver)
        how = f"install the {extra} extra: pip install '.[{extra}]'" if extra else f"install the {driver} package"
        raise MissingDriver(f"{label} needs the {driver} driver, which is not installed ({err}); {how}") from None


class _Conn:
    """The `_sql.DB` interface over a SQLAlchemy (sync-facade) connection inside `run_sync`."""

    __slots__ = ("conn", "text", "dialect")

    def __init__(self, conn: Any, text: Callable[[str], Any], dialect: str) -> None:
        self.conn = conn
        self.text = text
        self.dialect = dialect

    def rows(self, sql: str, params: Mapping[str, Any] = {}) -> list[tuple]:
        return [tuple(r) for r in self.conn.execute(self.text(sql), dict(params)).fetchall()]

    def run(self, sql: str, params: Mapping[str, Any] = {}) -> int:
        return self.conn.execute(self.text(sql), dict(params)).rowcount

    def many(self, sql: str, params: Sequence[Mapping[str, Any]]) -> None:
        self.conn.execute(self.text(sql), [dict(p) for p in params])


def _text_cache(text: Callable[[str], Any]) -> Callable[[str], Any]:
    """`text(sql)`, remembered: the same few statements run at every step, and parsing their `:name`
    parameters each time costs more than running them (measured with B8's profile)."""
    cache: dict[str, Any] = {}

    def cached(sql: str) -> Any:
        clause = cache.get(sql)
        if clause is None:
            if len(cache) > 512:  # statements built per number of parts stay few; bound it anyway
                cache.clear()
            clause = cache[sql] = text(sql)
        return clause

    return cached


class _Listening:
    """A LISTEN held on one connection: `alive()` until the connection is lost; `close()` gives it back."""

    def __init__(self, conn: Any, raw: Any, channel: str, callback: Callable[..., None],
                 payload: bool = False) -> None:
        self.conn = conn
        self.raw = raw
        self.channel = channel
        self.callback = callback
        self.payload = payload
        self.closing = False

    def notified(self, _conn: Any = None, _pid: Any = None, _channel: Any = None, payload: Any = None) -> None:
        if self.payload:
            self.callback(payload)
        else:
            self.callback()

    def lost(self, *_: Any) -> None:
        # the listener wakes and finds it dead: it listens again (unless it is closing it itself)
        if self.closing:
            return
        if self.payload:
            self.callback(None)
        else:
            self.callback()

    def alive(self) -> bool:
        return not self.raw.is_closed()

    async def close(self) -> None:
        self.closing = True
        try:
            if not self.raw.is_closed():
                await self.raw.remove_listener(self.channel, self.notified)
        except Exception:  # noqa: BLE001, S110 - the connection is going away either way
            pass
        try:  # never back into the pool: a connection that listened (or was cut) may be in any state
            await self.conn.invalidate()
        except Exception:  # noqa: BLE001, S110 - a connection the server dropped cannot be closed cleanly
            pass


async def _dispose_at_shutdown(store: SQLStore, key: Any, engine: Any) -> AsyncIterator[None]:
    """Parked on the loop `key[0]` once started: `shutdown_asyncgens()` closes it, which disposes `engine`."""
    try:
        yield
    finally:
        store._forget(key, engine)
        await engine.dispose()


_RENEWALS = {"pool_size": 1, "max_overflow": 0, "pool_pre_ping": True, "pool_timeout": 5.0}
"""The engine lease renewals run on: one connection, kept open, checked before each use."""
_RENEWALS_CONNECT_WAIT = 2.0
"""How long a renewal asks again for a connection the database refused for want of one (after a restart, say)."""


@contextlib.asynccontextmanager
async def _begin(engine: Any, wait: float) -> AsyncIterator[Any]:
    """`engine.begin()`, its connection asked for by `_connect`."""
    conn = await _connect(engine, wait)
    try:
        async with conn.begin():
            yield conn
    finally:
        await conn.__aexit__(None, None, None)  # closes it even when this task is being cancelled


async def _connect(engine: Any, wait: float) -> Any:
    """A connection of `engine`'s pool; one the database refuses for want of a spare connection is asked for
    again, with a backoff, for up to `wait` seconds (nothing was sent: trying again is safe)."""
    waited, delay = 0.0, 0.02
    while True:
        try:
            return await engine.connect()
        except Exception as err:
            if waited >= wait or not no_spare_connection(err):
                raise
        await asyncio.sleep(delay)
        waited += delay
        delay = min(delay * 2, 0.5)


class SQLStore(_sql.SQLStoreMethods, CancelMethods, InputMethods, RelayMethods):
    """A `CheckPointStore` on any SQLAlchemy async URL: `postgresql+asyncpg://…`, `sqlite+aiosqlite:///…`.

    `engine_options` go to `create_async_engine` for every loop's engine (say `pool_size=`,
    `max_overflow=`; SQLAlchemy's defaults are 5 and 10 connections per loop).
    """

    def __init__(self, url: str, *, busy_timeout: float = 30.0, ttl: float | None = None, connect_wait: float = 10.0,
                 idle_in_transaction: float = 5.0, lock_wait: float = 10.0, **engine_options: Any) -> None:
        from sqlalchemy import text
        from sqlalchemy.engine import make_url

        self.url = url
        self.expiry = Expiry(ttl)
        self.busy_timeout = busy_timeout
        self.connect_wait = connect_wait
        self.idle_in_transaction, self.lock_wait = idle_in_transaction, lock_wait
        self._text = _text_cache(text)
        self._options = engine_options
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
        self._label = f"SQLStore({parsed.render_as_string(hide_password=True)!r})"
        if self.dialect not in _sql._BINARY:
            raise ValueError(f"SQLStore supports sqlite and postgresql URLs, not {self.dialect!r} ({url})")
        _check_driver(parsed, self._label)
        self._lock = threading.Lock()
        self._engines: dict[tuple[Any, str], tuple[Any, Any]] = {}  # (loop, "work" | "renewals") -> (engine, closer)
        self._migrated = False

    def __repr__(self) -> str:
        return f"SQLStore({self.url!r})"

    # --- one engine per event loop ----------------------------------------------------------------------

    def _create_engine(self, kind: str = "work") -> Any:
        from sqlalchemy import event
        from sqlalchemy.ext.asyncio import create_async_engine

        options = self._options if kind == "work" else {**self._options, **_RENEWALS}
        if self.dialect == "postgresql":  # a frozen holder of a run's lock must not hold every other writer for good
            connect_args = dict(options.get("connect_args") or {})
            settings = {"idle_in_transaction_session_timeout": str(int(self.idle_in_transaction * 1000)),
                        "lock_timeout": str(int(self.lock_wait * 1000)), **(connect_args.get("server_settings") or {})}
            options = {**options, "connect_args": {**connect_args, "server_settings": settings}}
        engine = create_async_engine(self.url, **options)
        if self.dialect == "sqlite":
            sync_engine = engine.sync_engine
            busy_ms = int(self.busy_timeout * 1000)

            @event.listens_for(sync_engine, "connect")
            def _on_connect(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
                cursor = dbapi_conn.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
                cursor.close()

            @event.listens_for(sync_engine, "begin")
            def _on_begin(conn: Any) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine

    async def _engine(self, kind: str = "work") -> Any:
        """This loop's engine of `kind`, created (and its disposal at loop shutdown arranged) on first use."""
        loop = asyncio.get_running_loop()
        found = self._engines.get((loop, kind))
        if found is not None:
            return found[0]
        engine = self._create_engine(kind)
        closer = _dispose_at_shutdown(self, (loop, kind), engine)
        with self._lock:
            for old in [key for key in self._engines if key[0].is_closed()]:  # closed without shutdown_asyncgens
                self._engines.pop(old)[0].sync_engine.dispose(close=False)
            self._engines[(loop, kind)] = (engine, closer)
        await closer.__anext__()  # parks it on this loop (the loop keeps only a weak reference: we keep it)
        return engine

    def _forget(self, key: Any, engine: Any) -> None:
        with self._lock:
            if self._engines.get(key, (None,))[0] is engine:
                del self._engines[key]

    async def _call(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T:
        """`fn(db, *args)` in one transaction; a database error that may pass is `StoreUnavailable`."""
        try:
            return await self._transaction(fn, args)
        except WaypointError:
            raise
        except Exception as err:
            if passing(err):
                raise unavailable(self._label, err) from err
            raise

    async def _renewals_call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(db, *args)` on the connection kept for lease renewals (module docstring), never waited for."""
        try:
            return await self._transaction(fn, args, "renewals")
        except WaypointError:
            raise
        except Exception as err:
            if passing(err):
                raise unavailable(self._label, err) from err
            raise

    async def _renewals_read(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._renewals_call(fn, *args)

    async def reserve_renewals(self) -> None:
        """Open the calling loop's connection for lease renewals now, if it is not open (module docstring)."""
        try:
            engine = await self._engine("renewals")
            async with engine.connect():
                pass  # back into its pool of one, where it stays open
        except WaypointError:
            raise
        except Exception as err:
            if passing(err):
                raise unavailable(self._label, err) from err
            raise

    async def _transaction(self, fn: Callable[..., T], args: tuple, kind: str = "work") -> T:
        text, dialect = self._text, self.dialect
        engine = await self._engine(kind)
        wait = self.connect_wait if kind == "work" else _RENEWALS_CONNECT_WAIT
        if not self._migrated:  # its own transaction: an operation that fails must not roll the schema back
            async with _begin(engine, wait) as conn:
                await conn.run_sync(lambda sync: _sql.migrate(_Conn(sync, text, dialect), dialect))
            self._migrated = True
        async with _begin(engine, wait) as conn:
            return await conn.run_sync(lambda sync: fn(_Conn(sync, text, dialect), *args))

    async def listen_runs(self, callback: Callable[[str | None, int, str], None]) -> _Listening | None:
        """Postgres: call `callback(checkpoint_id, version, status)` (on this loop) for every transition any
        process writes to this database — a version that starts or claims a run (after one that was not
        running), one at which it stops — once its transaction commits; `(checkpoint_id, 0, "deleted")` for a
        deleted run, a `checkpoint_id` of None for an ID too long to announce, and `(None, 0, "lost")` if the
        connection is lost (listen again, and read what may have been missed meanwhile). A run's steps in
        between are not announced (read them). None on SQLite: poll instead. The handle has `alive()` and
        `close()`; it holds one connection of this loop's pool."""
        def announced(payload: str | None) -> None:
            if payload is None:
                callback(None, 0, "lost")
                return
            version, status, checkpoint_id = (payload.split(" ", 2) + ["", "", ""])[:3]
            callback(checkpoint_id or None, int(version) if version.isdigit() else 0, status)

        return await self._listen(_sql.RUNS_CHANNEL, announced, payload=True)

    async def _listen(self, channel: str, callback: Callable[..., None], *, payload: bool = False
                      ) -> _Listening | None:
        """Postgres: call `callback` (on this loop) on every NOTIFY to `channel` (with the payload when
        `payload`), and once more if the connection is lost (a restart, a network cut: listen again then;
        with `payload`, it is given None). None on SQLite.

        Holds one connection of this loop's pool until closed."""
        if self.dialect != "postgresql":
            return None
        engine = await self._engine()
        try:
            conn = await engine.connect()
            raw = (await conn.get_raw_connection()).driver_connection
        except WaypointError:
            raise
        except Exception as err:
            if passing(err):
                raise unavailable(self._label, err) from err
            raise
        listening = _Listening(conn, raw, channel, callback, payload)
        try:
            await raw.add_listener(channel, listening.notified)
        except BaseException as err:
            await conn.invalidate()  # a pooled connection the server had closed (a restart): drop it
            if isinstance(err, Exception) and passing(err):
                raise unavailable(self._label, err) from err
            raise
        raw.add_termination_listener(listening.lost)
        return listening

    async def close(self) -> None:
        """Dispose this loop's connection pool and let go of every other loop's (the store reopens on use)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            engines, self._engines = self._engines, {}
        for (owner, _kind), (engine, _closer) in engines.items():
            if owner is loop:
                await engine.dispose()
                continue
            try:  # another loop's connections are closed by that loop, the next time it runs
                asyncio.run_coroutine_threadsafe(engine.dispose(), owner)
            except RuntimeError:  # that loop is closed: drop them
                engine.sync_engine.dispose(close=False)
