"""`ServiceState`: what the endpoints and the page share — the served targets, the store, who may call
(auth, the page's sessions, the token throttle), the event logs, the executions (here, or through the run
queue), the watcher that follows runs executed elsewhere — and reading runs."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from waypoint.engine import CheckpointMeta, read_run
from waypoint.engine.agents.turns import keeps_inputs
from waypoint.engine.keep import ON_BUSY
from waypoint.engine.keep.store import store_clock

from ._agui_events import CallIds
from ._auth import Auth, Decide, Gate
from ._events import Logs
from ._execution import Executor
from ._guard import MAX_BODY
from ._paging import HISTORY_PAGE, history_page
from ._queued import Dispatcher
from ._sessions import SESSION_TTL, Sessions
from ._targets import ServiceError, Target, prepare_targets
from ._views import pending_view, run_view
from ._watch import Watcher

__all__ = ["ServiceState"]

_PENDING_CACHE = 4096
DRAIN_SECONDS = 10.0
"""How long a stopping service lets the runs it executes finish their step (`waypoint serve --drain`)."""


class ServiceState:
    """Runs `runners_or_graphs` (a mapping name -> Runner / ChatModelAgent / Graph / CompiledGraph, a list,
    or one) on `store` behind bearer-token `auth` (see `Auth`); `max_body` limits request bodies (bytes),
    `session_ttl` the page's sessions (seconds). `queue`: None (runs execute in this process), True (a
    `RunQueue` on `store`: `waypoint worker` processes execute them) or a `RunQueue` on this store (say, with
    the workers' serializer). `drain_seconds`: how long `aclose()` lets the runs it executes finish their step
    (then stops the rest where they are; none is stored as cancelled). `on_busy`: the default for new input to an
    agent's chat whose turn is executing (`reject`, `enqueue`, `interrupt`, `rollback`: docs/agents.md)."""

    def __init__(self, runners_or_graphs: Any, store: Any, *,
                 auth: str | Mapping[str, Iterable[str]] | Decide | Auth | None = None,
                 max_body: int = MAX_BODY, session_ttl: float = SESSION_TTL, queue: Any = None,
                 drain_seconds: float = DRAIN_SECONDS, on_busy: str = "reject") -> None:
        self.store = store
        self.drain_seconds = drain_seconds
        self.on_busy = _on_busy(on_busy, store)
        """What new input for an agent's executing chat does when `POST /runs` does not say (`Runner.run(on_busy=)`)."""
        self.targets: dict[str, Target] = prepare_targets(runners_or_graphs, store)
        self.by_fingerprint = {t.fingerprint: t for t in self.targets.values()}
        self.auth = auth if isinstance(auth, Auth) else Auth(auth)
        self.sessions = Sessions(ttl=session_ttl)
        self.gate = Gate(self.auth, self.sessions)
        self.max_body = max_body
        self.logs = Logs()
        self.watcher = Watcher(store, self.logs, self._read, self._name_of)
        self.executor = Executor(store, self.logs, self.watcher)
        self.queue = _queue(queue, store)
        self.dispatcher = Dispatcher(self.queue, self.logs, self.watcher) if self.queue is not None else None
        self.agui_calls = CallIds()
        """The IDs the AG-UI streams showed paused calls under (service/_agui_events.py)."""
        self.notifier: Any = None
        """The `Notifier` posting the served runs' events to webhooks (`create_app(webhooks=...)`), or None."""
        self._pending: OrderedDict[tuple[str, int, float, float], list[dict[str, Any]]] = OrderedDict()
        self._earlier: dict[str, Target] = {}  # fingerprint of an earlier version of a served graph -> its target
        self._foreign: set[str] = set()  # fingerprints of graphs this service does not serve

    async def aclose(self) -> None:
        """Stop the runs this process executes for its shutdown (each at its next step boundary within
        `drain_seconds`, the rest where they are; left `running` with their leases ended, for the next process)
        and end every event stream."""
        await self.executor.aclose(self.drain_seconds)
        self.logs.close()
        await self.watcher.aclose()

    async def _read(self, checkpoint_id: str, version: int, head: CheckpointMeta | None) -> Any:
        return await self.snapshot(checkpoint_id, version, head=head)

    def _name_of(self, meta: CheckpointMeta) -> str | None:
        target = self.target_of(meta)
        return target.name if target is not None else None

    def agent_fingerprints(self) -> list[str]:
        """The fingerprints of the served agents' graphs, and of the earlier versions of them met so far."""
        return [fp for fp, t in (*self.by_fingerprint.items(), *self._earlier.items()) if t.runner is not None]

    def target_of(self, meta: CheckpointMeta) -> Target | None:
        """The served agent or graph that wrote this version (by its fingerprint), or that a version it serves is a
        later version of (once `resolve` has read one such run)."""
        found = self.by_fingerprint.get(meta.fingerprint)
        return found if found is not None else self._earlier.get(meta.fingerprint)

    async def resolve(self, meta: CheckpointMeta) -> Target | None:
        """`target_of`, reading the run's stored graph once per unknown fingerprint: a run written by an earlier
        version of a served graph (a deploy) belongs to the served one of its name — the engine then judges, at a
        resume, whether this version may continue it (docs/resume.md, "Deploys")."""
        found = self.target_of(meta)
        if found is not None or meta.fingerprint in self._foreign:
            return found
        try:
            snap = await read_run(self.store, meta.checkpoint_id, version=meta.version)
        except Exception:  # noqa: BLE001 - unreadable here: not ours to serve
            snap = None
        target = self.targets.get(snap.graph) if snap is not None and snap.graph else None
        if target is None:
            if len(self._foreign) >= _PENDING_CACHE:
                self._foreign.clear()
            self._foreign.add(meta.fingerprint)
            return None
        self._earlier[meta.fingerprint] = target
        return target

    async def snapshot(self, checkpoint_id: str, version: int | None = None, head: CheckpointMeta | None = None,
                       ) -> Any:
        """The decoded version (newest by default), or None."""
        if head is None:
            found = await self.store.history(checkpoint_id, limit=1)
            if not found:
                return None
            head = found[0]
        target = await self.resolve(head)
        if target is not None:
            return await target.app.get_run(checkpoint_id, version=version)
        return await read_run(self.store, checkpoint_id, version=version)

    async def pending(self, meta: CheckpointMeta) -> list[dict[str, Any]]:
        """The interrupts a version waits on (cached: a version never changes)."""
        key = (meta.checkpoint_id, meta.version, meta.created_at, meta.updated_at)  # a new run on the ID differs
        found = self._pending.get(key)
        if found is None:
            snap = await self.snapshot(meta.checkpoint_id, meta.version, head=meta)
            found = [] if snap is None else [pending_view(c, meta.version, meta.updated_at)
                                             for c in snap.interrupts.contexts]
            self._pending[key] = found
            if len(self._pending) > _PENDING_CACHE:
                self._pending.popitem(last=False)
        return found

    async def answerable(self, meta: CheckpointMeta) -> list[str]:
        """The IDs of the interrupts a version waits on for an answer (static pauses need none)."""
        if meta.status == "completed":
            return []
        return [p["id"] for p in await self.pending(meta) if p["kind"] != "pause"]

    async def view(self, checkpoint_id: str, version: int | None = None, *,
                   history_limit: int = HISTORY_PAGE) -> dict[str, Any] | None:
        """The run as `GET /runs/{id}` shows it, or None. Reads a page of its history, never all of it."""
        history, more = await history_page(self.store, checkpoint_id, before=None, limit=history_limit)
        if not history:
            return None
        snap = await self.snapshot(checkpoint_id, version, head=history[0])
        if snap is None:
            return None
        return run_view(snap, history, newest=history[0].version, history_next=more,
                        active=checkpoint_id in self.executor.running, now=await store_clock(self.store))


def _queue(queue: Any, store: Any) -> Any:
    """The run queue the service submits to (None: it executes runs itself)."""
    if queue is None or queue is False:
        return None
    from waypoint.stores import RunQueue

    if queue is True:
        if not hasattr(store, "_call"):
            raise ServiceError(f"a run queue needs an SQL store shared with the workers (SQLStore on Postgres, or a "
                               f"SQLite file), not {type(store).__name__}: a MemoryStore lives in one process")
        return RunQueue(store)
    if not isinstance(queue, RunQueue) or repr(queue.store) != repr(store):
        raise ServiceError(f"queue= must be True or a RunQueue on the service's store ({store!r}), not {queue!r}")
    return queue


def _on_busy(on_busy: Any, store: Any) -> str:
    if on_busy not in ON_BUSY:
        raise ServiceError(f"service: on_busy={str(on_busy)[:80]!r} must be one of {', '.join(ON_BUSY)}")
    if on_busy != "reject" and not keeps_inputs(store):
        raise ServiceError(f"service: on_busy={on_busy!r} queues new input in the store, and "
                           f"{type(store).__name__} keeps none: use MemoryStore, SQLiteStore or SQLStore")
    return on_busy
