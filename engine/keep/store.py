"""The checkpoint store contract (`CheckPointStore`) and the records it keeps.

A store keeps, per checkpoint ID, a chain of versions 1, 2, 3, … (the newest is where the run is)
plus the content those versions point at. It never interprets that content: the engine encodes a
run's position into *parts* (engine/keep/checkpoint.py), each a content-addressed blob or a chain of
blobs (append segments, for lists that only grow), and the store keeps bytes and parent links.
docs/stores.md explains the layout and how to write another store.

Guarantees every store gives (tests/test_store_contract.py checks them on every store):

1. `put` is compare-and-set: it writes version `expected_version + 1` (or 1 when `expected_version`
   is None) only if `expected_version` is the run's newest version (or the run has none), in one
   atomic step with its blobs. A newer version exists: `CheckpointConflict`. Version
   `expected_version` is gone (the run was deleted or expired meanwhile): `CheckpointNotFound` — a
   deleted run is never brought back by a late writer — and so is a newest version of another incarnation
   than the writer's (its `created_at`, which the store stamps from its own clock on a new run's first
   version, `fresh=True`: a writer of a deleted run is told from the new run on its ID whatever any clock
   says). Either way nothing is written.
2a. `put` checks that every part head and every new blob's parent is in the put or already stored;
   if not (pruned meanwhile), it raises `MissingBlobs` naming them and writes nothing; the engine
   then writes the whole version again.
2. A blob is identified by `(checkpoint_id, hash)`; writing one that exists is a no-op. `get` returns
   for every part the chain of blobs from the root to the referenced head, oldest first.
3. The tool ledger is idempotent: `record_call` keeps the first result written for
   `(checkpoint_id, version, call_id)` and reports whether this call wrote it. Every entry is bound to the
   run's incarnation (its `created_at`: a new run on a reused ID is another incarnation) and
   `recorded_calls(..., incarnation=)` never returns an entry of another one.
4. `history` is newest first; `list` returns the newest version of each run, newest update first
   (ties by checkpoint ID, descending), filtered by status, paged with `before`: the last
   `CheckpointMeta` of the previous page (or an `updated_at` time). A negative limit is a `ValueError`.
5. `prune` never deletes the newest version of a run (the one a pending interrupt or a resume
   needs), nor a blob that a remaining version still reaches, nor the ledger of a remaining version;
   while the newest version is `running` or `failed` it deletes no ledger entries at all (a step run
   again after a crash or a failure reads the page of the version it began at).
6. Stores are safe for concurrent runs in one process and for several processes on one database.
7. `renew_lease` may be called from another thread (with its own event loop) than the run's.
8. Reading never trusts what is stored: a row or blob of the wrong type or size, a part chain that
   loops back on itself or is longer than `MAX_CHAIN`, raises `CheckpointCorrupted` naming the run
   and version (never a driver, JSON or memory error), and reading such a chain always terminates.
   `meta_problem` and `parts_problem` below are the checks a store applies to what it read.
9. **Leases are on the store's clock.** `clock()` is the store's time (seconds since the epoch): the
   database server's for a store shared by machines (Postgres: `clock_timestamp()`), the host's for a
   store only one host can open (SQLite: read by SQLite itself, `julianday('now')`, so every process on
   the host reads the same clock whatever its own `time.time()` says; memory: its process's). Every lease expiry a store
   writes is stamped from that clock — `put` keeps the *duration* its meta asks for
   (`lease_expires - updated_at`, both on the writer's clock) and stores `clock() + duration`;
   `renew_lease` extends to `clock() + seconds` — and `renew_lease` refuses a lease that has already
   expired on it (`lease_expires <= clock()`). Whoever judges a lease compares `lease_expires` with
   `clock()`, so a writer or reader whose own clock is off by any amount never misjudges one.
   `updated_at` and `created_at` stay the writer's clock (they order lists and age runs for `ttl`).
10. An operation that failed for a reason that may pass (the database unreachable or restarting, no
   connection to spare, a lock not granted in time) raises `StoreUnavailable` with the driver's error as
   `__cause__`, having written nothing.
11. **Fenced writes.** A write for a run is checked, in the same transaction and on the store's clock,
   against who holds the run (its newest version's lease) — never against the writer's own clock:
   - `put(..., holder=owner)` continues the run under the lease `owner` (the writer's previous version was
     `running` under it): the newest version must still be `running` under that owner's unexpired lease,
     else `LeaseLost` (or `CheckpointNotFound` when the run is gone) and nothing is written;
   - `put(..., holder=None)` takes the run (a start, a claim, an edit): refused with `CheckpointConflict`
     while the newest version is `running` under another writer's unexpired lease, unless `takeover=True`
     (the caller established that the owner is dead);
   - `record_call(..., holder=owner, incarnation=created_at)` writes only while the newest version is
     `running` under `owner`'s unexpired lease and belongs to that incarnation, else `LeaseLost`;
   - `delete(checkpoint_id, force=False)` refuses (`CheckpointConflict`) a run `running` under an unexpired
     lease.
12. **Renewals never wait behind the process's own work.** `renew_leases` runs on a connection the store
   keeps for renewals alone (`reserve_renewals()`, called from the loop that renews, takes it up front and
   raises `StoreUnavailable` when the database refuses it), so a process whose work holds every pooled
   connection still renews its leases. A store whose renewals need nothing taken up front (SQLite, memory)
   has no `reserve_renewals`; the engine then reserves nothing and starts no thread for it.
13. **Deadlines.** A version stored paused carries `deadline`, the earliest deadline of its pauses (seconds since
   the epoch on the store's clock, stamped by the engine from `clock()`), kept as given and returned by `put`,
   `get`, `history` and `list`; only a run's newest version keeps it (a later version clears it on the earlier
   one). `list_due(limit=)` returns the newest versions whose deadline is at or before `clock()`, earliest first,
   in time proportional to what it returns (an index), however many runs wait, paged with `after` (the last
   meta of the previous page). A store without `list_due` is read with `list(status="interrupted")` instead, page
   by page. `put(..., due_by=t)` (optional) writes only while `clock()` is before `t`, judged in the write's own
   transaction, else `PauseExpired` and nothing is written: a resume's claim answering a pause whose deadline is
   `t` never lands after it.
14. **Cancel requests** (optional: `request_cancel` and `cancel_requests`). `request_cancel(checkpoint_id, when=,
   by=)` records a person's request to stop the run — replacing an earlier one — only while its newest version is
   `running` under an unexpired lease, judged in the same transaction on the store's clock; else `NotRunning`
   (`CheckpointNotFound` for an unknown run) and nothing is recorded. The request names that newest version and is
   stamped with `clock()`. `cancel_requests(checkpoint_ids)` returns the requests recorded for those runs; the
   process executing a run honours one only if it names a version at or after the one its claim wrote (a request
   made before a later continuation is never honoured by it). A delete of the run deletes its request.
15. **Queued inputs** (optional: `queue_input` and `queued_inputs`). `queue_input(checkpoint_id, payload, policy=,
   by=)` records new input for a run (its bytes as the engine encoded them) only while the run's newest version is
   `running` under an unexpired lease, judged in the same transaction on the store's clock; else `NotRunning`
   (`CheckpointNotFound` for an unknown run) and nothing is recorded. Inputs are numbered per run 1, 2, 3, … in the
   order the store recorded them, whichever process sent them, and stamped with `clock()`; a number is never given
   twice for one run while it exists. `queued_inputs(checkpoint_id, after=n)` returns the inputs numbered above `n`,
   oldest first. A delete of the run deletes its inputs. The engine decides which inputs a run has taken (the
   number is written in the run's own position when a turn claims it); after that claim it marks them
   (`mark_inputs(checkpoint_id, upto, state="taken")`: every waiting input numbered up to `upto`; `state="stuck"`:
   input `upto` alone, one that cannot be run). A mark is a hint, never the authority: a crash between the claim
   and the mark leaves an input `waiting` that the run's position says was taken, and the next look marks it.
   `waiting_inputs(limit=, after=)` (optional too) returns, by checkpoint ID after `after`, the runs whose newest
   version is not `running` and that have a `waiting` input and none `stuck` — leaving out the inputs with policy
   "enqueue" of a run paused for an answer (they wait for the answer): every run with an input no turn took, that
   may start now, is among them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ..errors import CheckpointError, clip

__all__ = ["store_clock", "CheckPointStore", "CheckpointMeta", "Checkpoint", "Blob", "RunStatus", "MissingBlobs", "MAX_PARTS",
           "MAX_PART_NAME", "MAX_HASH", "MAX_CHAIN", "meta_problem", "parts_problem", "version_label", "CancelRequest",
           "CANCEL_WHEN", "QueuedInput", "ON_BUSY", "MAX_INPUT_BYTES"]

RunStatus = Literal["running", "interrupted", "completed", "failed"]
STATUSES: tuple[str, ...] = ("running", "interrupted", "completed", "failed")

MAX_PARTS = 1024
"""Parts one version may have (the run, the graph and up to 1022 state fields). The engine stores a
state with more fields, or with a field name longer than `MAX_PART_NAME`, as one part."""
MAX_PART_NAME = 256
"""Characters in a part name."""
MAX_HASH = 128
"""Characters in a blob hash (the engine's are 32)."""
MAX_CHAIN = 10_000
"""Blobs in one part's chain. The engine starts a new chain before a list part's chain gets longer."""


class MissingBlobs(CheckpointError):
    """`put` named blobs the store does not hold (pruned since the writer last saw them)."""

    def __init__(self, checkpoint_id: str, hashes: Iterable[str]) -> None:
        self.hashes = sorted(hashes)
        super().__init__(
            f"run '{checkpoint_id}': the store no longer holds {len(self.hashes)} blob(s) this version points at "
            "(pruned while the run was writing); write the version again with its full content"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Blob:
    """Content a version points at. `parent` links an append segment to the segment before it."""

    hash: str
    data: bytes
    parent: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointMeta:
    """One version of a run, without its content: what `history` and `list` return."""

    checkpoint_id: str
    version: int
    status: RunStatus
    step: int
    fingerprint: str
    created_at: float
    updated_at: float
    lease_owner: str | None = None
    lease_expires: float | None = None
    error: str | None = None
    origin: str | None = None
    """Where a fork or a resume from an older version came from (`"<checkpoint_id>@<version>"`)."""
    deadline: float | None = None
    """The earliest deadline of the pauses a paused version waits on (the store's clock), or None (guarantee 13)."""

    @property
    def paused(self) -> bool:
        """Stored `interrupted` because it paused: it waits for an answer (or for a static pause to be resumed)."""
        return self.status == "interrupted" and self.error != "cancelled"

    @property
    def cancelled(self) -> bool:
        """Stored `interrupted` because its task was cancelled (Ctrl-C, a closed stream): it waits for nothing and
        continues from its last finished step when resumed."""
        return self.status == "interrupted" and self.error == "cancelled"


@dataclass(frozen=True, kw_only=True, slots=True)
class CancelRequest:
    """A person's request to stop a running run (guarantee 14)."""

    checkpoint_id: str
    version: int
    """The run's newest version when it was asked: a claim written after it is not stopped by it."""
    when: str
    """Where the run stops: "now", "after_step", or "after:<node>" (at the first step boundary after that node ran,
    in the run or any run nested in it)."""
    by: str
    """Who asked, as they said it (shown; never trusted)."""
    requested_at: float
    """The store's clock when it was recorded."""


CANCEL_WHEN = ("now", "after_step")
"""The `when` of a cancel that names no node; "after:<node>" names one."""


@dataclass(frozen=True, kw_only=True, slots=True)
class QueuedInput:
    """New input for a run that was executing when it came (guarantee 15): run after the turn in flight."""

    checkpoint_id: str
    n: int
    """Its place among the run's inputs (1, 2, 3, …): the order they run in."""
    policy: str
    """What the sender asked for the turn in flight (`ON_BUSY`): "enqueue", "interrupt" or "rollback"."""
    by: str
    """Who sent it, as they said it (shown; never trusted)."""
    queued_at: float
    """The store's clock when it was recorded."""
    payload: bytes = field(default=b"", repr=False)
    """The input as the engine encoded it (its serializer's record)."""


ON_BUSY = ("reject", "enqueue", "interrupt", "rollback")
"""What new input for a run that is executing does (`Runner.run(on_busy=)`): refused, queued after the turn in
flight, run after the turn is stopped at its next step boundary (what finished kept), or run after the turn is
stopped now and dropped."""

MAX_INPUT_BYTES = 4 * 1024 * 1024
"""Bytes one queued input may hold."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpoint:
    """One version with its content.

    `header` is the engine's encoded description of the version (opaque to the store); `parts`
    maps a part name to the hash of its head blob. On `get`, `chains[name]` holds the blobs of each
    part's chain, root first, so the engine can verify every hash before decoding.
    """

    meta: CheckpointMeta
    header: bytes
    parts: Mapping[str, str] = field(default_factory=dict)
    chains: Mapping[str, Sequence[Blob]] = field(default_factory=dict)


@runtime_checkable
class CheckPointStore(Protocol):
    """What the run loop needs from a store. All methods are coroutines. Optional, beside these:
    `reserve_renewals()` (guarantee 12) and `list_due(*, limit=100)` (guarantee 13)."""

    async def get(self, checkpoint_id: str, version: int | None = None) -> Checkpoint | None:
        """The newest (or the given) version with its part chains, or None."""

    async def put(
        self,
        meta: CheckpointMeta,
        header: bytes,
        parts: Mapping[str, str],
        blobs: Sequence[Blob],
        *,
        expected_version: int | None,
        holder: str | None = None,
        takeover: bool = False,
        fresh: bool = False,
    ) -> CheckpointMeta:
        """Write version `meta.version` (== expected_version + 1, or 1) atomically, with its blobs, and return
        its meta as stored.

        `parts` maps part names to head blob hashes (every head must be in `blobs` or already
        stored). Raises `CheckpointConflict` if that version exists (someone else wrote first). A lease
        in `meta` is stored as `clock() + (meta.lease_expires - meta.updated_at)` (guarantee 9).
        `holder` / `takeover`: who writes, checked against the run's lease (guarantee 11). `fresh`: the
        version starts a new run (an incarnation): the store stamps its `created_at` from its clock, after
        the newest version's; otherwise `meta.created_at` must be the newest version's (guarantee 1).
        """

    async def renew_lease(self, checkpoint_id: str, version: int, owner: str, seconds: float) -> bool:
        """Extend the lease to `seconds` from now on the store's clock, if `version` is the run's newest,
        `owner` holds its lease and that lease has not expired yet; False if not (nothing changes)."""

    async def clock(self) -> float:
        """The store's time, seconds since the epoch: the clock every lease in this store is judged by."""

    async def renew_leases(self, leases: Sequence[tuple[str, int, str, float]]) -> list[bool]:
        """`renew_lease` for each `(checkpoint_id, version, owner, seconds)`, in one transaction, on the
        connection this process keeps for renewals (guarantee 12); one answer per lease."""

    async def record_call(self, checkpoint_id: str, version: int, call_id: str, result: bytes, *,
                          holder: str | None = None, incarnation: float | None = None) -> bool:
        """Ledger: store a finished call's result once. True if this call wrote it. With `holder`, only
        while that owner holds the run's lease (guarantee 11), else `LeaseLost`."""

    async def recorded_calls(self, checkpoint_id: str, version: int, *,
                             incarnation: float | None = None, prefix: str | None = None) -> dict[str, bytes]:
        """Ledger: every result recorded for `(checkpoint_id, version)` of the run's incarnation
        `incarnation` (every incarnation's when None), by call id; with `prefix`, only the call ids that start
        with it (one task's: a page that a nested run's steps share holds many). A store without `prefix` is
        still used: the engine then picks the task's entries itself."""

    async def history(self, checkpoint_id: str, *, limit: int | None = None) -> list[CheckpointMeta]:
        """The run's versions, newest first."""

    async def list(
        self, *, status: RunStatus | None = None, limit: int = 100, before: float | CheckpointMeta | None = None
    ) -> list[CheckpointMeta]:
        """The newest version of each run, most recently updated first; `before` pages (see above)."""

    async def delete(self, checkpoint_id: str, *, force: bool = True) -> bool:
        """Remove a run entirely (versions, blobs, ledger). True if it existed. `force=False`: refuse
        (`CheckpointConflict`) while it is running under an unexpired lease, judged in the same transaction."""

    async def prune(self, checkpoint_id: str, *, keep_last: int = 1) -> int:
        """Delete all but the newest `keep_last` versions (at least 1) and what only they used."""

    async def expire(self, *, older_than: float | None = None, now: float | None = None) -> list[str]:
        """Delete interrupted runs last updated more than `older_than` seconds (default: the store's
        `ttl`) ago; returns their IDs. A store with a `ttl` also sweeps by itself after writes."""

    async def close(self) -> None:
        """Release connections."""


async def store_clock(store: Any) -> float:
    """`store.clock()`: the time leases in `store` are judged by. A store written before the contract had
    `clock()` lives on one host (it never said otherwise): its clock is this host's."""
    clock = getattr(store, "clock", None)
    return await clock() if clock is not None else time.time()


# --- checks on what a store read back ------------------------------------------------------------

def version_label(checkpoint_id: Any, version: Any) -> str:
    """`run 'X' version N`, as error messages name a stored version (stored values clipped)."""
    return f"run {clip(repr(checkpoint_id), 120)} version {clip(repr(version), 40)}"


def _is_time(value: Any) -> bool:
    return type(value) in (int, float)


def meta_problem(meta: CheckpointMeta) -> str | None:
    """What is wrong with the types of a stored version's fields, or None when nothing is."""
    checks = (
        ("checkpoint_id", type(meta.checkpoint_id) is str),
        ("version", type(meta.version) is int and meta.version >= 1),
        ("status", type(meta.status) is str and meta.status in STATUSES),
        ("step", type(meta.step) is int),
        ("fingerprint", type(meta.fingerprint) is str),
        ("created_at", _is_time(meta.created_at)),
        ("updated_at", _is_time(meta.updated_at)),
        ("lease_owner", meta.lease_owner is None or type(meta.lease_owner) is str),
        ("lease_expires", meta.lease_expires is None or _is_time(meta.lease_expires)),
        ("error", meta.error is None or type(meta.error) is str),
        ("origin", meta.origin is None or type(meta.origin) is str),
        ("deadline", meta.deadline is None or _is_time(meta.deadline)),
    )
    bad = [name for name, ok in checks if not ok]
    return f"its stored field(s) {', '.join(bad)} have the wrong type or value" if bad else None


def parts_problem(parts: Any) -> str | None:
    """What is wrong with a version's part map (name -> head hash), or None when nothing is."""
    if not isinstance(parts, Mapping):
        return f"its part list is a {type(parts).__name__}, not a map"
    if len(parts) > MAX_PARTS:
        return f"it lists {len(parts)} parts, more than the {MAX_PARTS} a version may have"
    for name, head in parts.items():
        if type(name) is not str or len(name) > MAX_PART_NAME or type(head) is not str or len(head) > MAX_HASH:
            return "its part list holds a name or hash that is not a short string"
    return None
