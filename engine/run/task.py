"""What code inside a running task may do beyond returning its output.

- `emit_chunk(data)`: publish a chunk the moment it exists. Callbacks and `aevents()` receive it as a
  `chunk` event of this node at once, whatever the node's output is (how an agent's model streams its
  tokens to the caller while the engine stores only the whole message).
- `enclosing_state()`: the run-local state of the graph that runs the calling task's graph as a subgraph
  node (how the agents of a workflow share its session values).
- `task_ledger()`: results the task records the moment each exists (`durability="step"` with a store),
  so that the task, run again after a crash or a pause, finds them and does not redo that work (how a
  tools node keeps a finished tool call from running twice). None when the run records nothing.
- `check_lease()`: raise `LeaseLost` if this process may no longer run the run — call it before starting
  work another process must not start too (how a tools node starts no tool call after losing the run).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ..events import Event
from .scope import current_task

__all__ = ["emit_chunk", "takes_keyword", "task_ledger", "TaskLedger", "current_checkpoint_id", "current_version", "idempotency_key",
           "ledger_epoch", "check_lease", "Attempts", "collecting_attempts", "start_over", "enclosing_state"]


async def emit_chunk(data: Any) -> None:
    """Publish `data` as a `chunk` event of the calling node (no-op when nobody listens)."""
    scope = current_task()
    if scope is None:
        raise RuntimeError("emit_chunk() must be called inside a running node")
    emitter = scope.run.emitter
    if emitter.wants("chunk"):
        await emitter.emit(Event("chunk", scope.path, data, scope.run.pos.step))


def takes_keyword(method: Any, name: str) -> bool:
    """Whether `method` (a store's, say) takes the keyword `name`: a store written before it was added is still
    used, without it. A wrapper's `**kwargs` hands it on. Known once per class and method."""
    key = (type(getattr(method, "__self__", None)), getattr(method, "__name__", ""), name)
    known = _TAKES.get(key)
    if known is None:
        try:
            params = inspect.signature(method).parameters
            known = name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        except (TypeError, ValueError):
            known = False
        _TAKES[key] = known
    return known


_TAKES: dict[tuple[type, str, str], bool] = {}


class TaskLedger:
    """The ledger entries of one task (its address) in the step it runs in.

    Entries live in the store's ledger (`record_call` / `recorded_calls`), keyed by the run's ledger
    epoch — the version at which the current step began, carried in the stored position — and by
    `<task address>|<key>`. A task run again in the same step (after a crash or a pause) sees what it
    recorded before; the next step starts an empty page.
    """

    def __init__(self, store: Any, serializer: Any, checkpoint_id: str, epoch: int, address: str,
                 check: Callable[[], None] | None = None, *, holder: str | None = None,
                 incarnation: float | None = None) -> None:
        self.store = store
        self.serializer = serializer
        self.checkpoint_id = checkpoint_id
        self.epoch = epoch
        self.prefix = f"{address}|"
        self.check = check
        """Raises `LeaseLost` once the run is no longer this process's (called before every write)."""
        self.holder = holder
        """The lease owner this process runs the run under: the store writes an entry only while it holds the
        run's lease (engine/keep/store.py, guarantee 11); None for a reader."""
        self.incarnation = incarnation
        """The run's `created_at`: entries are bound to it, and entries of another run on the ID are never read."""

    async def recorded(self) -> dict[str, Any]:
        """Every entry this task recorded in this step: key -> value.

        Each entry names the run, the page and the key it was written for, inside the (signed) record:
        an entry copied to another run, page or key is `CheckpointCorrupted`, never a result.
        """
        asked = {"prefix": self.prefix} if takes_keyword(self.store.recorded_calls, "prefix") else {}
        rows = await self.store.recorded_calls(self.checkpoint_id, self.epoch, incarnation=self.incarnation, **asked)
        n = len(self.prefix)
        return {k[n:]: self._open(k, v) for k, v in rows.items() if k.startswith(self.prefix)}

    async def record(self, key: str, value: Any) -> bool:
        """Record `value` under `key` unless an entry is there already; True if this call wrote it.

        Raises `LeaseLost` instead when the run is no longer this process's: a process stopped past its lease
        (and woken while another runs the call again), or whose run was deleted meanwhile, must not record its
        result as the call's. Checked here by the clock, then by the store in the write's own transaction."""
        if self.check is not None:
            self.check()
        full = self.prefix + key
        entry = {"ledger": [self.checkpoint_id, self.epoch, full], "value": value}
        data = self.serializer.dumps(entry, root=f"ledger entry '{key}' of run '{self.checkpoint_id}'")
        return await self.store.record_call(self.checkpoint_id, self.epoch, full, data, holder=self.holder,
                                            incarnation=self.incarnation)

    def _open(self, key: str, data: bytes) -> Any:
        entry = self.serializer.loads(data)
        if type(entry) is dict and entry.keys() == {"ledger", "value"}:
            if entry["ledger"] == [self.checkpoint_id, self.epoch, key]:
                return entry["value"]
        elif not self.serializer.signed:  # written before entries named their place; unsigned: no proof anyway
            return entry
        from ..errors import CheckpointCorrupted

        raise CheckpointCorrupted(
            f"run '{self.checkpoint_id}': tool-ledger entry {key[-80:]!r} (page {self.epoch}) was written for "
            "another run, page or call; the call's result is refused — restore the database from a backup "
            "or delete this run")


class Attempts:
    """The attempts of one model or tool call whose output is being collected: `number` counts them, and
    everything produced under an earlier number is void (a retry middleware started the call over).
    Collectors nest (the model box, a tracing middleware around the call): a retry voids them all."""

    def __init__(self, on_retry: Callable[[], Awaitable[None]] | None = None, parent: Attempts | None = None) -> None:
        self.number = 1
        self._on_retry = on_retry
        self._parent = parent

    async def retry(self) -> None:
        self.number += 1
        if self._on_retry is not None:
            await self._on_retry()
        if self._parent is not None:
            await self._parent.retry()


_ATTEMPTS: ContextVar[Attempts | None] = ContextVar("waypoint_attempts", default=None)


@contextmanager
def collecting_attempts(on_retry: Callable[[], Awaitable[None]] | None = None) -> Iterator[Attempts]:
    """Collect the output of one call: code that starts the call over (`start_over()`) bumps the number,
    and `on_retry` runs at once (to tell a live consumer that what it saw is void)."""
    attempts = Attempts(on_retry, _ATTEMPTS.get())
    token = _ATTEMPTS.set(attempts)
    try:
        yield attempts
    finally:
        try:
            _ATTEMPTS.reset(token)
        except ValueError:  # reset from another context (an async generator closed elsewhere)
            _ATTEMPTS.set(attempts._parent)


async def start_over() -> None:
    """Called by a retry before it tries the current model or tool call again: what the call produced so
    far is void — neither stored, nor executed, nor the result (a no-op outside a collected call)."""
    attempts = _ATTEMPTS.get()
    if attempts is not None:
        await attempts.retry()


def check_lease() -> None:
    """Raise `LeaseLost` if the run the calling task executes in is no longer this process's to run: its
    lease ran out unrenewed (judged by a local clock, so a process stopped past its lease and just woken
    knows at once, before its renewal thread runs again) or a renewal was refused (another process took
    the run over). Cheap: no store call. Does nothing for a run that holds no lease (no store, or not
    claimed by this call). The run loop lets the error through unwrapped: the run stops, writes nothing,
    and continues wherever it is taken over."""
    scope = current_task()
    if scope is None:
        raise RuntimeError("check_lease() must be called inside a running node")
    check = scope.run.lease_check
    if check is not None:
        check()


def current_checkpoint_id() -> str | None:
    """The checkpoint ID of the stored run the calling task executes in (None when not recorded)."""
    scope = current_task()
    if scope is None:
        raise RuntimeError("current_checkpoint_id() must be called inside a running node")
    return scope.run.checkpoint_id


def current_version() -> int | None:
    """The newest version of the stored run the calling task executes in — on a resume, its claim
    (None when the run is not recorded)."""
    scope = current_task()
    if scope is None:
        raise RuntimeError("current_version() must be called inside a running node")
    version = scope.run.version
    return version() if version is not None else None


def idempotency_key(epoch: int | None = None) -> str:
    """A key for the work at the calling address (a tool call, say): the same whenever this step of this
    stored run does that work again — a retry, a re-run after a crash, a resume — and different in any
    other step or run, and in a fork or a time-travel branch. Hand it to systems that must not apply the
    work twice. `epoch` (from `ledger_epoch()`) names the step that first did the work, for work that a
    resume continues in a later step."""
    scope = current_task()
    if scope is None:
        raise RuntimeError("idempotency_key() must be called inside a running node")
    run = scope.run
    base, now = run.step_key() if run.step_key is not None else (run.token, 0)
    text = f"{base}|{now if epoch is None else epoch}|{scope.place or scope.address}"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def ledger_epoch() -> int:
    """The calling task's ledger page (the version at which its step began; 0 when the run is not stored)."""
    scope = current_task()
    if scope is None:
        raise RuntimeError("ledger_epoch() must be called inside a running node")
    run = scope.run
    return run.step_key()[1] if run.step_key is not None else 0


def task_ledger() -> TaskLedger | None:
    """The calling task's ledger, or None (no store, or a durability mode that writes only at the end)."""
    scope = current_task()
    if scope is None:
        raise RuntimeError("task_ledger() must be called inside a running node")
    source = scope.run.ledger
    if source is None:
        return None
    store, serializer, checkpoint_id, epoch, holder, incarnation = source()
    return TaskLedger(store, serializer, checkpoint_id, epoch, scope.place or f"{scope.run.address};node:{scope.node}",
                      check=scope.run.lease_check, holder=holder, incarnation=incarnation)


def enclosing_state() -> Any:
    """The run-local state of the graph in which the calling task's graph runs as a subgraph node (None for a
    root run, and for a graph run by `run_nested`, which shares nothing with the task that runs it)."""
    scope = current_task()
    if scope is None:
        raise RuntimeError("enclosing_state() must be called inside a running node")
    return scope.run.parent_state
