"""Reading stored runs for `waypoint runs`: the database checked before it is opened, and a run decoded
without the graph that wrote it.

A checkpoint's `graph` part holds the graph's structure (its name among it), and the state's classes are
found by their registered names, so a run is readable by any process that registers the same types: the
engine's (`AgentState`, `Message`, ...) and the middleware's (`ApprovalInfo`) are imported here; a
command's own types are found by importing the command modules when a name is missing.
"""

from __future__ import annotations

import contextlib
import importlib
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from waypoint.engine import CheckpointMeta, InterruptInfo
from waypoint.middleware.pending import Pending, classify_interrupt

from ..fstools import stored_root

__all__ = ["RunsError", "StoredRun", "Pending", "opened_store", "check_database", "read_run", "read_version"]


class RunsError(Exception):
    """Something the user can fix (an unknown ID, a bad option): one line on stderr, exit code 1."""


@dataclass(frozen=True, kw_only=True)
class StoredRun:
    """One version of a run, decoded."""

    meta: CheckpointMeta
    graph: str
    """The name of the graph (or agent) that wrote it."""
    state: Any
    output: Any
    done: bool
    pending_nodes: tuple[str, ...]
    interrupts: InterruptInfo
    newest: int
    """The run's newest version (`meta.version` unless an older one was asked for)."""
    structure: dict[str, Any]
    """The shape of the graph that wrote it (what its fingerprint was computed from)."""
    now: float
    """The store's clock when it was read: what its lease is judged by (never this process's clock)."""
    trace: dict[str, str] = field(default_factory=dict)
    """What the run stored with this version besides its state (`RunSnapshot.trace`): its project root."""
    cancelled_by: Any = None
    """Who cancelled it at this version (`RunSnapshot.cancelled_by`), when a person's cancel stopped it."""

    @property
    def pending(self) -> list[Pending]:
        return [classify_interrupt(ctx) for ctx in self.interrupts.contexts]

    @property
    def is_agent(self) -> bool:
        from waypoint.engine.agents import AgentState

        return isinstance(self.state, AgentState)

    @property
    def project_root(self) -> Path | None:
        """The project root its tools are confined to, as stored with it (chapters 4–10); None if none is."""
        return stored_root(self.trace)

    @property
    def confined(self) -> bool:
        """Whether its tools are confined to a project root: it stored one, or a waypoint command defines its
        agent with tools confined to one (then a run stored without its root cannot say which)."""
        from ..agents import confines_tools

        return self.project_root is not None or (self.is_agent and confines_tools(self.graph))

    @property
    def awaits_answer(self) -> bool:
        """Whether a resume must say something (a static pause continues without an answer)."""
        return any(p.kind != "pause" for p in self.pending)


def check_database(path: Path) -> None:
    """Refuse, without creating or changing anything, a missing file or one that is not a Waypoint database."""
    if not path.exists():
        raise RunsError(f"no database at {str(path)!r} (nothing was created); pass --db PATH or set WAYPOINT_DB")
    if not path.is_file():
        raise RunsError(f"{str(path)!r} is not a file; pass --db PATH of a Waypoint SQLite database")
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as err:
        raise RunsError(f"{str(path)!r} cannot be read as a SQLite database ({err}); check --db") from None
    missing = sorted({"waypoint_schema", "waypoint_checkpoints"} - tables)
    if missing:
        raise RunsError(f"{str(path)!r} is not a Waypoint database (it has no table {', '.join(missing)}); "
                        "check --db")


@contextlib.asynccontextmanager
async def opened_store(db: str | Path) -> AsyncIterator[Any]:
    """The store `--db` names, closed afterwards: a database URL (`postgresql+asyncpg://...`, what
    `waypoint worker` and `waypoint serve` take), or a SQLite file checked first (never created)."""
    text = str(db)
    if "://" in text and not text.startswith("sqlite:///"):
        from waypoint.stores import open_store as open_url

        store = open_url(text)
        try:
            await store.history("waypoint-connection-check", limit=1)  # fails now if it cannot connect
        except Exception as err:
            await store.close()
            raise RunsError(f"cannot open the database at {_masked(text)}: {type(err).__name__}: "
                            f"{str(err)[:200]}; check --db") from None
    else:
        from ..console import open_store

        path = Path(text.removeprefix("sqlite:///"))
        check_database(path)
        store = open_store(path)
    try:
        yield store
    finally:
        await store.close()


def _masked(url: str) -> str:
    """The URL without its password."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@", 1)
    return url


def _register_types() -> None:
    """Import what registers the types an agent run stores (the state, messages, approvals)."""
    import waypoint.engine.agents  # noqa: F401
    import waypoint.middleware  # noqa: F401


def _register_command_types() -> None:
    """Import the command modules (the demo, the chapters), which may register types of their own."""
    from ..agents import AGENT_MODULES

    for name in AGENT_MODULES:
        with contextlib.suppress(Exception):  # a module that is missing or broken registers nothing
            importlib.import_module(f"{__package__}.{name}")


async def read_version(store: Any, checkpoint_id: str, version: int | None = None, *,
                       serializer: Any = None) -> StoredRun | None:
    """The newest (or given) version of a run, decoded; None if the run (or that version) does not exist.

    Raises `CheckpointCorrupted` (a `WaypointError`) when the record cannot be decoded.
    """
    from waypoint.engine import read_run as read_stored
    from waypoint.engine.codec.serde import UnknownType
    from waypoint.engine.keep.store import store_clock

    _register_types()
    try:
        snap = await read_stored(store, checkpoint_id, version=version, serializer=serializer)
    except UnknownType:
        _register_command_types()
        snap = await read_stored(store, checkpoint_id, version=version, serializer=serializer)
    if snap is None:
        return None
    return StoredRun(meta=snap.meta, graph=snap.graph or "?", state=snap.state, output=snap.output,
                     done=snap.meta.status == "completed" or snap.output is not None, pending_nodes=snap.pending,
                     interrupts=snap.interrupts, newest=snap.meta.version, structure=snap.structure,
                     now=await store_clock(store), trace=dict(snap.trace), cancelled_by=snap.cancelled_by)


async def read_run(store: Any, checkpoint_id: str, version: int | None = None, *, serializer: Any = None,
                   hint: str = "waypoint runs") -> StoredRun:
    """`read_version`, with an unknown run or version as a `RunsError` that says what exists (`hint`: the
    command with its `--db`, for the advice)."""
    history = await store.history(checkpoint_id)
    if not history:
        raise RunsError(f"no run {checkpoint_id!r} in this database; `{hint} list` shows the runs")
    newest = history[0].version
    if version is not None and version not in {m.version for m in history}:
        known = sorted(m.version for m in history)
        raise RunsError(f"run {checkpoint_id!r} has no version {version} (it has {_span(known)}); "
                        f"`{hint} history {checkpoint_id}` lists them")
    run = await read_version(store, checkpoint_id, version, serializer=serializer)
    if run is None:  # deleted between the two reads
        raise RunsError(f"run {checkpoint_id!r} was deleted while it was being read")
    return replace(run, newest=max(newest, run.meta.version))


def _span(versions: list[int]) -> str:
    if versions == list(range(versions[0], versions[-1] + 1)) and len(versions) > 2:
        return f"versions {versions[0]}-{versions[-1]}"
    return "version" + ("s " if len(versions) > 1 else " ") + ", ".join(map(str, versions))
