"""The checkpoint store contract (`CheckPointStore`) and the records it keeps.

A store keeps, per checkpoint ID, a chain of versions 1, 2, 3, … (the newest is where the run is)
plus the content those versions point at. It never interprets that content: the engine encodes a
run's position into *parts* (engine/checkpoint.py), each a content-addressed blob or a chain of
blobs (append segments, for lists that only grow), and the store keeps bytes and parent links.
docs/stores.md explains the layout and how to write another store.

Guarantees every store gives (tests/store_contract.py checks them on every store):

1. `put` is compare-and-set: it writes version `expected_version + 1` (or 1 when `expected_version`
   is None) only if `expected_version` is the run's newest version (or the run has none), in one
   atomic step with its blobs. A newer version exists: `CheckpointConflict`. Version
   `expected_version` is gone (the run was deleted or expired meanwhile): `CheckpointNotFound` — a
   deleted run is never brought back by a late writer. Either way nothing is written.
2a. `put` checks that every part head and every new blob's parent is in the put or already stored;
   if not (pruned meanwhile), it raises `MissingBlobs` naming them and writes nothing; the engine
   then writes the whole version again.
2. A blob is identified by `(checkpoint_id, hash)`; writing one that exists is a no-op. `get` returns
   for every part the chain of blobs from the root to the referenced head, oldest first.
3. The tool ledger is idempotent: `record_call` keeps the first result written for
   `(checkpoint_id, version, call_id)` and reports whether this call wrote it.
4. `history` is newest first; `list` returns the newest version of each run, newest update first
   (ties by checkpoint ID, descending), filtered by status, paged with `before`: the last
   `CheckpointMeta` of the previous page (or an `updated_at` time). A negative limit is a `ValueError`.
5. `prune` never deletes the newest version of a run (the one a pending interrupt or a resume
   needs), nor a blob that a remaining version still reaches, nor the ledger of a remaining version;
   while the newest version is `running` or `failed` it deletes no ledger entries at all (a step run
   again after a crash or a failure reads the page of the version it began at).
6. Stores are safe for concurrent runs in one process and for several processes on one database.
7. `renew_lease` may be called from another thread (with its own event loop) than the run's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from .errors import CheckpointError

__all__ = ["CheckPointStore", "CheckpointMeta", "Checkpoint", "Blob", "RunStatus", "MissingBlobs"]

RunStatus = Literal["running", "interrupted", "completed", "failed"]
STATUSES: tuple[str, ...] = ("running", "interrupted", "completed", "failed")


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
    """What the run loop needs from a store. All methods are coroutines."""

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
    ) -> None:
        """Write version `meta.version` (== expected_version + 1, or 1) atomically, with its blobs.

        `parts` maps part names to head blob hashes (every head must be in `blobs` or already
        stored). Raises `CheckpointConflict` if that version exists (someone else wrote first).
        """

    async def renew_lease(self, checkpoint_id: str, version: int, owner: str, expires: float) -> bool:
        """Extend the lease on the newest version if `owner` still holds it; False if not."""

    async def record_call(self, checkpoint_id: str, version: int, call_id: str, result: bytes) -> bool:
        """Ledger: store a finished call's result once. True if this call wrote it."""

    async def recorded_calls(self, checkpoint_id: str, version: int) -> dict[str, bytes]:
        """Ledger: every result recorded for `(checkpoint_id, version)`, by call id."""

    async def history(self, checkpoint_id: str, *, limit: int | None = None) -> list[CheckpointMeta]:
        """The run's versions, newest first."""

    async def list(
        self, *, status: RunStatus | None = None, limit: int = 100, before: float | CheckpointMeta | None = None
    ) -> list[CheckpointMeta]:
        """The newest version of each run, most recently updated first; `before` pages (see above)."""

    async def delete(self, checkpoint_id: str) -> bool:
        """Remove a run entirely (versions, blobs, ledger). True if it existed."""

    async def prune(self, checkpoint_id: str, *, keep_last: int = 1) -> int:
        """Delete all but the newest `keep_last` versions (at least 1) and what only they used."""

    async def expire(self, *, older_than: float | None = None, now: float | None = None) -> list[str]:
        """Delete interrupted runs last updated more than `older_than` seconds (default: the store's
        `ttl`) ago; returns their IDs. A store with a `ttl` also sweeps by itself after writes."""

    async def close(self) -> None:
        """Release connections."""
