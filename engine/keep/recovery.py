"""Automatic recovery: continuing runs whose process died, with nobody calling resume.

    from waypoint.engine import recover

    await recover([app])                                   # one pass: continue what can be continued now
    task = asyncio.create_task(recover([app], watch=True))  # keep recovering while this process runs

`waypoint serve` and `waypoint worker` run the second form (service/_recovery.py, stores/worker.py). The
rules (docs/resume.md, "Recovery"):

1. **Only runs whose process died.** A run is a candidate when its newest version is `running` — its
   process stopped without saving where the run came to rest — and nobody holds it: its lease expired on
   the store's clock, or its owner is provably dead (a process on this host whose PID is gone:
   engine/keep/owners.py). A paused, failed, completed or cancelled run is left as it is (a paused one waits for
   a person; a cancelled one was stopped on purpose).
2. **Never a live owner's run.** Not a run this process executes, not one whose owner is a live PID on this
   host, not one under a live lease held from another host (that one is a candidate once its lease expires).
3. **A dead owner's lease is ended first** (`renew_lease(..., 0)`, refused unless that owner still holds
   the newest version), so every process — another recovering process, a queue worker — sees the run free.
4. **Exactly one process continues it:** the continuation is the engine's claim, by compare-and-set on the
   version the decision was made from (`expected_version`); a process that loses gets `CheckpointConflict`
   and leaves the run to the winner.
5. **Only runs of the graphs given**, matched by the fingerprint of their newest version (the graph's name
   and shape) — or, for a run written by another version of a graph given (a deploy), by its name, when the
   change cannot change what the run already did (`deploy_conflicts`, docs/resume.md "Deploys"). A run of
   another graph, or of an incompatible version, is left for a process that serves it (said once in the log).
6. **Bounded:** at most `concurrency` runs are continued at once by one call.
7. **Given up after `max_attempts`:** a run whose last `max_attempts` takeovers each ended before it wrote
   anything after its claim (`RunPosition.takeovers`, counted by the engine at every takeover) is stored
   `failed` with why, by compare-and-set, instead of being continued again. Resuming it by hand gives it a
   fresh count.
8. **One log line per run** (logger `waypoint.recovery`, level WARNING): which run, why it is continued,
   and how the continuation ended (or why it was given up).
9. **Deadlines.** A paused run whose pause's deadline has passed on the store's clock (`store.list_due()`,
   engine/keep/store.py guarantee 13) is resumed with the answer its deadline gives each due pause (`Expired`,
   or the pause's `on_deadline`), by compare-and-set on the version judged: an answer that lands first wins and
   the expiry is "taken"; an expiry that lands first wins and the late answer is refused. A pause answered before
   its deadline is never expired (its run moved on). `execute(graph, meta, resume=answers)` continues it when
   the hook takes `resume`.

Nothing here imports a store: a process hands in its compiled graphs, and `execute` (optional) says how a
run is continued when not by `graph.ainvoke(None, ...)` (the service continues it as one of its own
executions, so its page follows it live; a worker queues it for the fleet).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import (CheckpointConflict, CheckpointNotFound, GraphInterrupted, GraphMismatch, PauseExpired,
                      StoreUnavailable, WaypointError)
from ..run import due_answers
from .checkpoint import Checkpointer, fingerprint
from .content import deploy_conflicts
from .owners import OwnerState, owner_state
from .store import store_clock

__all__ = ["recover", "Recovered", "MAX_ATTEMPTS", "give_up"]

log = logging.getLogger("waypoint.recovery")

MAX_ATTEMPTS = 10
"""Takeovers in a row without progress after which a run is given up (the worker's `max_attempts` too)."""

_PAGE = 500
_SAY_AGAIN = 60.0
_MEMORY = 10_000
_REST = 10.0
"""Seconds a due run is left alone after its expiry lost to an answer (or to work queued for it)."""


@dataclass(frozen=True, kw_only=True)
class Recovered:
    """What one pass of `recover` did with one run."""

    checkpoint_id: str
    graph: str
    version: int
    """The run's version the decision was made from."""
    outcome: str
    """"completed", "interrupted" (paused for a person), "failed", "gave up" (stored failed after
    `max_attempts`), "expired" (a due pause was answered by its deadline, rule 9), "refused" (this version
    cannot continue it: `GraphMismatch`), "handed over" (an `execute` hook took it), "taken" (another process continued it
    first, or it moved on), or "error" (the store failed: tried again at the next pass)."""
    detail: str = ""


Execute = Callable[..., Awaitable[Any]]
"""`execute(graph, meta, *, resume=None)`: continue the run `meta` (its `CheckpointMeta`) of `graph`, claiming it
by compare-and-set on `meta.version` — with `resume` as `ainvoke`'s answers when given (a due pause's, rule 9; a
hook without the parameter leaves those to the default continuation); may return a few words saying what it did."""


async def recover(graphs: Iterable[Any], *, watch: bool = False, every: float = 1.0, concurrency: int = 4,
                  max_attempts: int = MAX_ATTEMPTS, execute: Execute | None = None) -> list[Recovered]:
    """Continue every run of `graphs` whose process died (module docstring, rules 1-8).

    `graphs`: compiled graphs with a store (or objects with a compiled graph as `.app`, such as a `Runner`).
    Without `watch`, one pass: find the runs to continue now, continue them (at most `concurrency` at once),
    wait for them, and return what was done with each. With `watch=True`, look again every `every` seconds
    until cancelled (it never returns); a store that fails is tried again at the next look.
    `execute(graph, meta)` replaces the default continuation, `graph.ainvoke(None, checkpoint_id=...,
    expected_version=meta.version)`.

    Raises `WaypointError` for a graph without a store, and (one pass only) `StoreUnavailable` when the
    store cannot be read.
    """
    if concurrency < 1 or max_attempts < 1 or not every > 0:
        raise ValueError(f"recover(): concurrency and max_attempts must be >= 1 and every > 0, got {concurrency}, "
                         f"{max_attempts} and {every}")
    recovery = _Recovery(graphs, concurrency=concurrency, max_attempts=max_attempts, execute=execute)
    if not watch:
        return await recovery.once()
    await recovery.watch(every)
    return []  # not reached: watching ends by cancellation


@dataclass(frozen=True)
class _Candidate:
    graph: Any | None
    meta: Any
    why: str
    release: bool
    """The owner is dead on this host: end its lease first (rule 3)."""
    due: bool = False
    """A paused run whose deadline passed (rule 9)."""


class _Recovery:
    def __init__(self, graphs: Iterable[Any], *, concurrency: int, max_attempts: int, execute: Execute | None) -> None:
        self.stores: dict[int, tuple[Any, dict[str, Any]]] = {}  # id(store) -> (store, {fingerprint: graph})
        for item in graphs:
            app = getattr(item, "app", item)
            store = getattr(app, "store", None)
            if store is None:
                raise WaypointError(f"recover(): graph '{getattr(app, 'name', app)}' was compiled without a store, so "
                                    "none of its runs can be recovered; compile it with store=...")
            self.stores.setdefault(id(store), (store, {}))[1][fingerprint(app.structure)] = app
        if not self.stores:
            raise WaypointError("recover(): give it the compiled graphs whose runs this process may continue")
        self.slots = asyncio.Semaphore(concurrency)
        self.max_attempts = max_attempts
        self.execute = execute
        self.execute_answers = execute is not None and _takes_resume(execute)
        self.active: dict[str, asyncio.Task] = {}  # runs this call is continuing, by checkpoint ID
        self.unserved: set[tuple[str, int]] = set()
        self.resting: dict[tuple[str, int], float] = {}  # due runs left a while: another answer was on its way
        self.named: dict[tuple[str, int], Any] = {}  # (run, version) of another fingerprint -> the graph that may
        self.handed: set[tuple[str, int]] = set()  # (run, version) an `execute` hook took over

    async def once(self) -> list[Recovered]:
        found = [c for store, served in self.stores.values() for c in await self._scan(store, served)]
        return list(await asyncio.gather(*(self._handle(c) for c in found)))

    async def watch(self, every: float) -> None:
        failing: dict[int, float] = {}  # id(store) -> when its failure was last said (said again once a minute)
        try:
            while True:
                for key, (store, served) in self.stores.items():
                    try:
                        found = await self._scan(store, served)
                    except Exception as err:  # noqa: BLE001 - the store may come back: look again later
                        if time.monotonic() - failing.get(key, -_SAY_AGAIN) >= _SAY_AGAIN:
                            failing[key] = time.monotonic()
                            log.warning("recovery: cannot read the runs of %r (%s: %s); looking again every %.1f s",
                                        store, type(err).__name__, err, every)
                        continue
                    if failing.pop(key, None) is not None:
                        log.warning("recovery: the runs of %r can be read again", store)
                    for candidate in found:
                        self._start(candidate)
                await asyncio.sleep(every)
        finally:
            tasks = list(self.active.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, candidate: _Candidate) -> None:
        cid = candidate.meta.checkpoint_id
        task = asyncio.create_task(self._handle(candidate), name=f"waypoint-recovery:{cid}")
        self.active[cid] = task
        task.add_done_callback(lambda _: self.active.pop(cid, None))

    # --- finding them -----------------------------------------------------------------------------------

    async def _scan(self, store: Any, served: dict[str, Any]) -> list[_Candidate]:
        """The runs of `store` to continue now (rules 1, 2, 5, 9)."""
        now = await store_clock(store)  # read before the leases: a renewal after it shows in what is read next
        found: list[_Candidate] = []
        before = None
        while True:
            page = await store.list(status="running", limit=_PAGE, before=before)
            for meta in page:
                candidate = self._judge(meta, now, served)
                if candidate is not None and candidate.graph is None:
                    candidate = await self._deployed(store, candidate, served)
                if candidate is not None:
                    found.append(candidate)
            if len(page) < _PAGE:
                break
            before = page[-1]
        for meta in await _due(store, now):
            key = (meta.checkpoint_id, meta.version)
            if meta.checkpoint_id in self.active or key in self.handed or self.resting.get(key, 0) > time.monotonic():
                continue
            candidate = _Candidate(served.get(meta.fingerprint), meta,
                                   f"its pause's deadline passed {now - meta.deadline:.1f} s ago", False, due=True)
            if candidate.graph is None:
                candidate = await self._deployed(store, candidate, served)
            if candidate is not None:
                found.append(candidate)
        return found

    def _judge(self, meta: Any, now: float, served: dict[str, Any]) -> _Candidate | None:
        if meta.checkpoint_id in self.active or (meta.checkpoint_id, meta.version) in self.handed:
            return None
        expires = meta.lease_expires
        if expires is None or expires <= now:
            why, release = f"its lease expired {now - expires:.1f} s ago" if expires else "it holds no lease", False
        elif owner_state(meta.lease_owner) is OwnerState.DEAD:
            why, release = f"its process ({meta.lease_owner}) is gone from this host", True
        else:
            return None  # a live owner: this process, a live PID here, or a live lease from elsewhere
        return _Candidate(served.get(meta.fingerprint), meta, why, release)

    async def _deployed(self, store: Any, c: _Candidate, served: dict[str, Any]) -> _Candidate | None:
        """A run written by another version of a graph this process serves: continued by this version when the
        change cannot change what the run already did (docs/resume.md, "Deploys"); else left, said once (rule 5)."""
        key = (c.meta.checkpoint_id, c.meta.version)
        if key not in self.named:
            if len(self.named) >= _MEMORY:
                self.named.clear()
            self.named[key] = await _compatible(store, c.meta, served)
        graph = self.named[key]
        if graph is None:
            self._unserved(c.meta, c.why)
            return None
        return _Candidate(graph, c.meta, c.why + " (written by an earlier version of the graph)", c.release, c.due)

    def _unserved(self, meta: Any, why: str) -> None:
        key = (meta.checkpoint_id, meta.version)
        if key in self.unserved:
            return
        if len(self.unserved) >= _MEMORY:
            self.unserved.clear()
        self.unserved.add(key)
        log.warning("recovery: run '%s' (version %d) needs continuing — %s — but it was written by a graph this "
                    "process does not serve; a process serving that graph continues it", meta.checkpoint_id,
                    meta.version, why)

    # --- continuing one ---------------------------------------------------------------------------------

    async def _handle(self, c: _Candidate) -> Recovered:
        cid, graph = c.meta.checkpoint_id, c.graph
        async with self.slots:
            try:
                return await self._continue(c)
            except asyncio.CancelledError:
                raise
            except (StoreUnavailable, CheckpointNotFound) as err:
                log.warning("recovery: run '%s' was not continued: %s", cid, err)
                return self._done(c, "error", str(err))
            except Exception as err:  # noqa: BLE001 - one run's trouble never stops the others' recovery
                log.exception("recovery: run '%s' of graph '%s' could not be continued", cid, graph.name)
                return self._done(c, "error", f"{type(err).__name__}: {err}")

    async def _expire(self, c: _Candidate) -> Recovered:
        """Resume a paused run with the answers its due pauses' deadlines give (rule 9)."""
        store, cid, meta = c.graph.store, c.meta.checkpoint_id, c.meta
        reader = Checkpointer(store=store, serializer=c.graph.get_serializer(), checkpoint_id=cid,
                              graph_structure=c.graph.structure)
        loaded = await reader.load()
        if loaded is None or loaded.meta.version != meta.version or not loaded.meta.paused:
            return self._done(c, "taken", "it moved on before its pause could be expired")
        now = await store_clock(store)
        answers = due_answers(loaded.position, now)
        if not answers:
            return self._done(c, "taken", "none of its pauses is due any more")
        late = ", ".join(f"{iid} (due {a.when}, {now - a.deadline:.1f} s ago)" for iid, a in answers.items())
        log.warning("recovery: run '%s' of graph '%s' (version %d): no answer came by the deadline of interrupt %s; "
                    "answering as each deadline says", cid, c.graph.name, meta.version, late)
        execute = self.execute if self.execute_answers else None
        try:
            said = await (execute or _resume)(c.graph, loaded.meta, resume=answers)
        except GraphInterrupted:
            return self._done(c, "expired", "it paused again and waits for an answer")
        except (CheckpointConflict, PauseExpired) as err:  # answered first, or work for it waits in a queue
            self.resting[(cid, meta.version)] = time.monotonic() + _REST
            return self._done(c, "taken", str(err))
        except GraphMismatch as err:
            self._handed(cid, meta.version)
            return self._done(c, "refused", str(err))
        except StoreUnavailable:
            raise
        except Exception as err:  # noqa: BLE001 - the run's own failure (stored with it), or a refusal to resume it
            self._handed(cid, meta.version)  # said once, not again at every look while it stays at this version
            return self._done(c, "failed", f"{type(err).__name__}: {err}")
        if execute is None:
            return self._done(c, "expired", "it went on and completed")
        self._handed(cid, meta.version)
        return self._done(c, "handed over", said if isinstance(said, str) else "")

    def _handed(self, cid: str, version: int) -> None:
        if len(self.resting) >= _MEMORY:
            self.resting.clear()
        if len(self.handed) >= _MEMORY:
            self.handed.clear()
        self.handed.add((cid, version))  # not handed over again while it stays at this version

    async def _continue(self, c: _Candidate) -> Recovered:
        if c.due:
            return await self._expire(c)
        store, cid, meta = c.graph.store, c.meta.checkpoint_id, c.meta
        if c.release and not await store.renew_lease(cid, meta.version, meta.lease_owner, 0.0):
            return self._done(c, "taken", "its lease changed hands before it could be ended")
        reader = Checkpointer(store=store, serializer=c.graph.get_serializer(), checkpoint_id=cid,
                              graph_structure=c.graph.structure)
        loaded = await reader.load()
        if loaded is None or loaded.meta.version != meta.version or loaded.meta.status != "running":
            return self._done(c, "taken", "it moved on before it was continued")
        takeovers = loaded.position.takeovers if loaded.position.taken_at == meta.version else 0
        if takeovers >= self.max_attempts:
            return await self._give_up(c, reader, takeovers, loaded.meta.step)
        log.warning("recovery: continuing run '%s' of graph '%s' from version %d (step %d): %s (takeover %d of "
                    "at most %d)", cid, c.graph.name, meta.version, loaded.meta.step, c.why, takeovers + 1,
                    self.max_attempts)
        try:
            said = await (self.execute or _resume)(c.graph, loaded.meta)
        except GraphInterrupted:
            return self._done(c, "interrupted", "it paused and waits for an answer")
        except CheckpointConflict as err:
            return self._done(c, "taken", str(err))
        except GraphMismatch as err:  # refused before its claim (a pending call's tool this version lacks)
            self._handed(cid, meta.version)  # said once, not at every look while it stays at this version
            return self._done(c, "refused", str(err))
        except StoreUnavailable:
            raise
        except Exception as err:  # noqa: BLE001 - the run's own failure, stored with the run
            return self._done(c, "failed", f"{type(err).__name__}: {err}")
        if self.execute is None:
            return self._done(c, "completed")
        self._handed(cid, meta.version)
        return self._done(c, "handed over", said if isinstance(said, str) else "")

    async def _give_up(self, c: _Candidate, reader: Checkpointer, takeovers: int, step: int) -> Recovered:
        cid = c.meta.checkpoint_id
        why = (f"gave up after {takeovers} attempts: each process that continued run '{cid}' stopped (killed, "
               f"crashed or cut off) before the run wrote anything, at step {step}. Look at what the run does at "
               "that step (its history, the node's code, the process's memory), fix the cause, and resume it by "
               f"hand (ainvoke(None, checkpoint_id={cid!r}), POST /runs/{{id}}/resume, or waypoint runs resume): "
               "that gives it a fresh count")
        try:
            await reader.mark("failed", error=why)
        except CheckpointConflict:
            return self._done(c, "taken", "it moved on before it could be given up")
        log.error("recovery: run '%s' of graph '%s' %s", cid, c.graph.name, why.split(": ", 1)[0] + " and is "
                  "now stored as failed with why")
        return Recovered(checkpoint_id=cid, graph=c.graph.name, version=c.meta.version, outcome="gave up", detail=why)

    def _done(self, c: _Candidate, outcome: str, detail: str = "") -> Recovered:
        if outcome != "error":
            log.warning("recovery: run '%s' of graph '%s': %s%s", c.meta.checkpoint_id, c.graph.name, outcome,
                        f" ({detail})" if detail else "")
        return Recovered(checkpoint_id=c.meta.checkpoint_id, graph=c.graph.name, version=c.meta.version,
                         outcome=outcome, detail=detail)


async def give_up(graph: Any, checkpoint_id: str, why: str) -> bool:
    """Store the run `checkpoint_id` of `graph` as failed with `why`, if its newest version is `running` and
    nobody holds it (its lease expired, or its owner is gone from this host) — by compare-and-set, so a run
    someone continued meanwhile is left alone. Returns whether it was stored failed."""
    reader = Checkpointer(store=graph.store, serializer=graph.get_serializer(), checkpoint_id=checkpoint_id,
                          graph_structure=graph.structure)
    loaded = await reader.load()
    if loaded is None or loaded.meta.status != "running":
        return False
    meta = loaded.meta
    live = meta.lease_expires is not None and meta.lease_expires > await store_clock(graph.store)
    if live and owner_state(meta.lease_owner) is not OwnerState.DEAD:
        return False
    reader.takeover = live  # its owner is gone from this host, though the store still sees the lease live
    try:
        await reader.mark("failed", error=why)
    except CheckpointConflict:
        return False
    return True


async def _resume(graph: Any, meta: Any, *, resume: Any = None) -> str:
    """The default continuation: the engine's resume, claimed by compare-and-set on the version judged."""
    await graph.ainvoke(None, checkpoint_id=meta.checkpoint_id, expected_version=meta.version, resume=resume)
    return "completed"


async def _compatible(store: Any, meta: Any, served: dict[str, Any]) -> Any | None:
    """The served graph of the run's name that may continue it (its changes cannot change what the run did), or
    None (another graph's run, an incompatible version, or one this process cannot read)."""
    graphs = list(served.values())
    try:
        reader = Checkpointer(store=store, serializer=graphs[0].get_serializer(), checkpoint_id=meta.checkpoint_id,
                              graph_structure=graphs[0].structure)
        loaded = await reader.load()
    except Exception:  # noqa: BLE001 - unreadable here (another codec or key): a process serving it continues it
        return None
    if loaded is None or loaded.meta.version != meta.version:
        return None
    named = [g for g in graphs if g.name == loaded.structure.get("name")]
    if len(named) != 1 or deploy_conflicts(loaded.structure, named[0].structure, loaded.position):
        return None
    return named[0]


async def _due(store: Any, now: float) -> list[Any]:
    """The paused runs of `store` whose deadline is at or before `now` (its clock): `list_due` where the store has
    it, else every paused run's newest version, page by page (guarantee 13)."""
    list_due = getattr(store, "list_due", None)
    if list_due is not None:
        due, after = [], None
        while True:  # every page: due runs this process leaves (another graph's) must not hide its own
            page = await list_due(limit=_PAGE, after=after)
            due += [m for m in page if m.paused]
            if len(page) < _PAGE:
                return due
            after = page[-1]
    found, before = [], None
    while True:
        page = await store.list(status="interrupted", limit=_PAGE, before=before)
        found += [m for m in page if m.paused and getattr(m, "deadline", None) is not None and m.deadline <= now]
        if len(page) < _PAGE:
            return found
        before = page[-1]


def _takes_resume(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "resume" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
