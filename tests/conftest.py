"""Shared test helpers, and the fix that lets `python -m pytest` run from the repository root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _import_the_standard_librarys_cmd() -> None:
    """`python -m pytest` puts the current directory first on sys.path, where the repository's `cmd/`
    folder (installed as `waypoint.cmd`) shadows the standard library's `cmd`, which pdb imports when
    pytest configures itself. Import the real one first, from a path without the repository root;
    every later `import cmd` gets it from sys.modules. (Conftest files load before pytest imports pdb.)
    """
    root = str(Path(__file__).resolve().parents[1])
    if getattr(sys.modules.get("cmd"), "Cmd", None) is not None:
        return
    sys.modules.pop("cmd", None)
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if os.path.abspath(p or os.curdir) != root]
    try:
        import cmd  # noqa: F401
    finally:
        sys.path[:] = saved


_import_the_standard_librarys_cmd()

try:  # imported here, on the main thread: pytest rewrites anyio's modules (a plugin's) with ast.parse, which is not
    import mcp  # noqa: F401 - thread-safe on CPython 3.11.7 (gh-106905); the SDK imports them lazily, from any thread
except ImportError:
    pass

from waypoint.engine import END, START, Graph  # noqa: E402


def linear(name: str, *fns, **compile_opts):
    """A compiled START -> f0 -> f1 -> ... -> END graph."""
    g = Graph(name=name)
    keys = [f"n{i}" for i in range(len(fns))]
    for key, fn in zip(keys, fns):
        g.add_node(key, fn)
    for a, b in zip([START, *keys], [*keys, END]):
        g.add_edge(a, b)
    return g.compile(**compile_opts)


@pytest.fixture
def chat_server():
    """A chat-completions server on 127.0.0.1 (tests/chat_server.py); fails the test if replies are left."""
    from chat_server import ChatServer

    server = ChatServer()
    try:
        yield server
    finally:
        server.close()
    assert not server.replies, f"{len(server.replies)} scripted replies were never requested"


@pytest.fixture(scope="session")
def pg():
    """One PostgreSQL server for the session (tests/pg.py). Skips the test when no server can start,
    unless WAYPOINT_REQUIRE_POSTGRES=1 (CI), where that is a failure."""
    from pg import REQUIRED, PgServer

    try:
        server = PgServer()
    except Exception as err:  # noqa: BLE001 - reported as the reason of the skip (or failure)
        message = f"PostgreSQL could not start: {type(err).__name__}: {err}"
        if REQUIRED:
            pytest.fail(message + " (WAYPOINT_REQUIRE_POSTGRES=1)", pytrace=False)
        pytest.skip(message)
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg):
    """A fresh, empty Postgres database for this test: its SQLAlchemy URL."""
    return pg.new_database()


STORES = ["memory", "sqlite", "sqlalchemy-sqlite", "postgres"]


@pytest.fixture(params=STORES)
async def store(request, tmp_path):
    """Each store the contract covers, on a fresh database (memory, SQLite file, SQLAlchemy + aiosqlite,
    SQLAlchemy + asyncpg on a real PostgreSQL server)."""
    from waypoint.stores import MemoryStore, SQLiteStore, SQLStore

    if request.param == "memory":
        s = MemoryStore()
    elif request.param == "sqlite":
        s = SQLiteStore(tmp_path / "runs.db")
    elif request.param == "postgres":
        s = SQLStore(request.getfixturevalue("pg_url"))
    else:
        s = SQLStore(f"sqlite+aiosqlite:///{tmp_path / 'runs.db'}")
    yield s
    await s.close()


@pytest.fixture
def procs():
    """Processes a test starts (append them); whatever still runs at the end is killed."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.communicate(timeout=10)
