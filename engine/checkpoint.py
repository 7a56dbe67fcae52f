"""A run's position as store content: parts, content-addressed blobs, and append segments.

`Checkpointer` is the engine side of the store contract (engine/store.py) for one run. It turns a
`RunPosition` into *parts*:

- `run`   — step, pending tasks and their inputs, inbox, skips, interrupts, output (small; changes
            every step, so written every step);
- `graph` — the graph's structure, for `GraphMismatch` messages (same bytes every step: written once);
- `s:<field>` — one part per field of the run-local state (a dict's keys, a registered dataclass's or
            pydantic model's fields; any other state is one part `s:`).

Each part is a blob whose hash is its address, so an unchanged part is never written twice. A part
whose value is a list is a *chain*: a root segment plus append segments, each naming its parent. When
a list only grew since the last write (the common case: a conversation), only the new items are
written. That keeps the bytes written per step flat as history grows (docs/stores.md); a chain is
restarted (the whole list written as a new root) before it grows past `MAX_CHAIN` segments.

A version's *header* is a codec record listing the parts and binding them to the version: it holds
the checkpoint ID, version, step, status, graph fingerprint and error the row claims. Reading checks
that claim against the row, so with a signing key content cannot be moved to another run or version.
Only the small header is written per version; parts are encoded once (`mark` reuses them). The header
also carries the writing run's trace carrier when it has one (`RunInfo.trace`, engine/events.py): how a
resumed run, in another process, links its trace to the run that paused it.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import operator
import os
import time
import warnings
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from .checkpoint_content import (
    join_state,
    position_from_plain,
    position_to_plain,
    register_engine_types,
    split_state,
)
from .errors import CheckpointCorrupted, WaypointError, describe
from .events import clean_trace
from .lease import lease_clock
from .position import RunPosition
from .reducers import StateJournal
from .store import (
    MAX_CHAIN,
    Blob,
    Checkpoint,
    CheckpointMeta,
    CheckPointStore,
    MissingBlobs,
    meta_problem,
    parts_problem,
    version_label,
)

if TYPE_CHECKING:
    from .serde import Serializer

__all__ = ["Checkpointer", "fingerprint", "new_owner"]

_FORMAT = 2
"""Header format: 2 binds the header to its version (the "meta" map); 1 (no binding) is still read
by an unsigned Serializer and refused by a signed one."""
_RESTORE = "restore the database from a backup or delete this run"


def new_owner() -> str:
    """A lease owner name unique to this process and call: host, pid and a random suffix."""
    return f"{os.uname().nodename}:{os.getpid()}:{os.urandom(4).hex()}"


@functools.lru_cache(maxsize=64)
def _fingerprint(packed: bytes) -> str:
    return hashlib.blake2b(packed, digest_size=12).hexdigest()


def fingerprint(structure: dict[str, Any]) -> str:
    """A short hash of a graph structure: equal structures, equal fingerprints."""
    import msgpack

    return _fingerprint(msgpack.packb(structure, use_bin_type=True))


@dataclass(slots=True)
class _PartCache:
    """What was last written for one part: its head hash and, for a list, its items' bytes."""

    head: str
    raw: bytes | None = None
    """A list part's items, each msgpack-encoded, concatenated (the array body without its header)."""
    count: int = 0
    links: int = 1
    """Segments in a list part's chain."""
    items: list[Any] | None = None
    """Our own list of the items last written, kept only when every one is immutable: then the list
    unchanged in front means those items are unchanged (checked by value or by identity, `by_value`)."""
    by_value: bool = False
    """`items` may be compared with `==` (C speed): every item's equality is the codec's (`_settled`)."""
    obj: list[Any] | None = None
    """The list object last written (an append-owned field grows the same object)."""
    unchecked: bool = False
    """Segments were appended on path 1 without comparing the items in front (checked when the run stops)."""
    tail: list[bytes] | None = None
    """Segments appended on a fast path since `raw` was last joined (joined when needed)."""

    def full_raw(self) -> bytes | None:
        if self.tail:
            self.raw = b"".join([self.raw or b"", *self.tail])
            self.tail = None
        return self.raw


@dataclass(kw_only=True)
class Loaded:
    """A version read back: its meta and the decoded position and graph structure."""

    meta: CheckpointMeta
    position: RunPosition
    structure: dict[str, Any]
    trace: dict[str, str] = field(default_factory=dict)
    """The trace carrier of the run that wrote this version (empty when it stored none)."""


@dataclass(kw_only=True)
class Checkpointer:
    """Reads and writes one run's versions in a store (one per `ainvoke`)."""

    store: CheckPointStore
    serializer: Serializer
    checkpoint_id: str
    graph_structure: dict[str, Any]
    owner: str = field(default_factory=new_owner)
    lease_seconds: float = 30.0
    version: int | None = None
    created_at: float | None = None
    replaces: float | None = None
    """The `created_at` of the run a new run is written over (None: none): the new one is created after it."""
    _cache: dict[str, _PartCache] = field(default_factory=dict)
    _known: set[str] = field(default_factory=set)
    _last: tuple[int, dict[str, Any]] | None = None
    """The step and header content (parts, lists, state kind) last written or read: what `mark` reuses."""
    _graph_part: str | None = None
    origin: str | None = None
    """Written into the next version's meta (then cleared): the `id@version` a fork or time travel left."""
    trace: dict[str, str] = field(default_factory=dict)
    """The running run's trace carrier, written into every header (nothing when empty)."""
    sent: float = 0.0
    """The lease clock (engine/lease.py) when the last write was sent: a lease it took lasts from then."""
    holding: bool = False
    """The last write was `running` under this writer's own lease: the next one continues under it, and the
    store refuses it once the lease is no longer this writer's (engine/store.py, guarantee 11)."""
    takeover: bool = False
    """The next write takes the run from a lease owner the caller established is dead (then cleared)."""

    def __post_init__(self) -> None:
        self.fingerprint = fingerprint(self.graph_structure)
        register_engine_types(self.serializer)

    # --- writing -------------------------------------------------------------------------------------

    async def save(self, pos: RunPosition, status: str, *, error: str | None = None,
                   journal: StateJournal | None = None, lease: tuple[Any, Any] | None = None) -> CheckpointMeta:
        """Write the next version (compare-and-set on the one this run last read or wrote).

        Unchanged parts are not sent again; if the store lost some of them meanwhile (a `prune` that
        raced this run), the whole version is written again. `journal` says which state fields only grew
        through an append-owned reducer since the last write (engine/reducers.py): their new items are
        written without looking at the old ones, except in a version that is not `running` (a pause or an
        end), where every list is compared in full. (A failure or cancel writes no new content: `mark`.) `lease`
        (owner, seconds from now; None seconds: no lease) is written instead of this writer's own for a `running`
        version (an edit of a run whose process died names its owner under a lease that has run out: 0 s)."""
        try:
            meta = await self._save(pos, status, error, journal, lease)
        except MissingBlobs:
            self._known.clear()
            self._cache.clear()
            self._graph_part = None
            meta = await self._save(pos, status, error, journal, lease)
        if journal is not None and journal.replaced:
            journal.written()
        return meta

    async def _save(self, pos: RunPosition, status: str, error: str | None,
                    journal: StateJournal | None, lease: tuple[Any, Any] | None = None) -> CheckpointMeta:
        blobs: list[Blob] = []
        if self._graph_part is None:  # the same bytes at every step: encode once
            self._graph_part = self._whole("graph", self.graph_structure, blobs)
        elif self._graph_part not in self._known:
            self._whole("graph", self.graph_structure, blobs)
        parts = {"run": self._whole("run", position_to_plain(pos), blobs), "graph": self._graph_part}
        state_kind, fields = split_state(pos.state, self.serializer)
        owned = journal.owned if journal is not None and state_kind != "value" else ()
        lists = []
        for name, value in fields.items():
            key = f"s:{name}"
            if type(value) is list:
                mine = name in owned and name not in journal.replaced  # type: ignore[union-attr]
                parts[key] = self._list(key, value, blobs, owned=mine, verify=status != "running")
                lists.append(key)
            else:
                parts[key] = self._whole(key, value, blobs)
        return await self._put(pos.step, status, error, {"parts": parts, "lists": lists, "state": state_kind}, blobs,
                               lease)

    async def mark(self, status: str, *, error: str | None = None) -> CheckpointMeta | None:
        """Write a new version with the last written content and a new status (when the current
        position cannot be encoded, a failure must still be recorded). None if nothing was written yet.
        The parts are reused as they are; only the header is new, bound to the new version."""
        if self._last is None:
            return None
        step, content = self._last
        return await self._put(step, status, error, content, [])

    async def release(self) -> CheckpointMeta | None:
        """Write the last written content again, `running` under this writer's name with a lease that has already
        run out: a process that stops (a shutdown) leaves the run for the next one at once, and the version says a
        process let it go — no takeover of a dead owner. None if nothing was written yet."""
        if self._last is None:
            return None
        step, content = self._last
        return await self._put(step, "running", None, content, [], (self.owner, 0.0))

    async def _put(self, step: int, status: str, error: str | None, content: dict[str, Any],
                   blobs: list[Blob], lease: tuple[Any, Any] | None = None) -> CheckpointMeta:
        now = time.time()
        running = status == "running"
        owner, seconds = lease if lease is not None else (self.owner, self.lease_seconds)
        expires = now + seconds if seconds is not None else None
        meta = CheckpointMeta(
            checkpoint_id=self.checkpoint_id, version=(self.version or 0) + 1, status=status,
            step=step, fingerprint=self.fingerprint, created_at=self.created_at or self._created(now), updated_at=now,
            lease_owner=owner if running else None, lease_expires=expires if running else None, error=error,
            origin=self.origin,
        )
        record = {"format": _FORMAT, **content, "meta": _binding(meta)}
        if self.trace:
            record["trace"] = self.trace
        header = self.serializer.dumps(record, root=f"checkpoint '{self.checkpoint_id}'")
        self.sent = lease_clock()  # the store stamps the lease no earlier (on its clock): see engine/lease.py
        stored = await self.store.put(meta, header, content["parts"], blobs, expected_version=self.version,
                                      holder=self.owner if self.holding else None, takeover=self.takeover,
                                      fresh=self.created_at is None)
        if not isinstance(stored, CheckpointMeta) and self.created_at is None:  # a store (or a wrapper of one)
            found = await self.store.history(self.checkpoint_id, limit=1)      # that returns nothing: read it back
            stored = found[0] if found and found[0].version == meta.version else None
        meta = stored if isinstance(stored, CheckpointMeta) else meta  # as the store stamped it (its clock)
        self.holding = running and lease is None
        self.takeover = False
        self.origin = None
        self.version = meta.version
        self.created_at = meta.created_at
        self._known.update(b.hash for b in blobs)
        self._last = (step, content)
        return meta

    def _created(self, now: float) -> float:
        """A new run's `created_at`: after the run it is written over, whatever this host's clock says — the
        stores refuse a write of a run created before the newest version's (the writer's run was deleted and
        its ID used again), so a run that replaces another must never look older than it."""
        if self.replaces is None:
            return now
        return max(now, self.replaces + 0.001)

    def _hash(self, parent: str | None, data: bytes) -> str:
        h = hashlib.blake2b(digest_size=16)
        if parent:
            h.update(parent.encode())
        h.update(data)
        return h.hexdigest()

    def _whole(self, name: str, value: Any, blobs: list[Blob]) -> str:
        data = self.serializer.encode_value(value, root=f"{self.checkpoint_id}.{name}")
        digest = self._hash(None, data)
        if digest not in self._known:
            blobs.append(Blob(hash=digest, data=data))
        self._cache[name] = _PartCache(head=digest)
        return digest

    def _list(self, name: str, items: list[Any], blobs: list[Blob], *, owned: bool = False,
              verify: bool = False) -> str:
        """A list part: when the list only grew, write just the new items as a segment on its chain.

        How "only grew" is known, cheapest first (docs/stores.md):

        1. An append-owned field (`append`, `add_messages`) that is still the list object last written
           and no shorter: the engine appended to it, so the new items are the tail. Not while the run
           stops (`verify`): then the whole list is compared, so a pause or an end always stores exactly
           what the state holds.
        2. Every item written last time immutable, and our own copy of them still equal to the list in
           front: by `==` at C speed when every item's equality is the codec's (str, bytes, numbers,
           tuples, frozen pydantic models such as `Message`), by identity otherwise.
        3. Otherwise one encoding of the whole list (C speed) and a byte-prefix test against the last
           write: msgpack values are self-delimiting, so "the old items' bytes are a prefix of the new
           ones" means exactly "the old items are unchanged and items were appended" — an item edited in
           place changes the bytes and starts a new chain.

        Paths 1 and 2 cost what was appended, whatever the list's length (B2 in docs/performance.md).
        """
        cached = self._cache.get(name)
        if cached is not None and cached.links < MAX_CHAIN and len(items) >= cached.count:
            if owned and not verify and cached.obj is items:
                return self._grow(name, cached, items, blobs, self._extended(cached, items), unchecked=True)
            mine = self._same_in_front(cached, items)
            if mine is not None:
                return self._grow(name, cached, items, blobs, mine)
        return self._list_by_bytes(name, items, cached, blobs, owned=owned)

    @staticmethod
    def _same_in_front(cached: _PartCache, items: list[Any]) -> list[Any] | None:
        """Our copy of `items` if the items written last time are still its front (path 2), else None."""
        mine, n = cached.items, cached.count
        if mine is None:
            return None
        new = items[n:]
        if _settled_all(new) < (2 if cached.by_value else 1):
            return None
        mine.extend(new)
        if mine == items if cached.by_value else all(map(operator.is_, items, mine)):
            return mine
        del mine[n:]
        return None

    @staticmethod
    def _extended(cached: _PartCache, items: list[Any]) -> list[Any] | None:
        """Path 1: our copy of the items kept up to date when the new ones allow it (else dropped)."""
        mine, new = cached.items, items[cached.count:]
        if mine is None or len(mine) != cached.count or _settled_all(new) < (2 if cached.by_value else 1):
            return None
        mine.extend(new)
        return mine

    def _grow(self, name: str, cached: _PartCache, items: list[Any], blobs: list[Blob],
              mine: list[Any] | None, *, unchecked: bool = False) -> str:
        """Append the items after `cached.count` as a segment of the part's chain (none: the same head).
        `unchecked`: the items in front were not compared (path 1)."""
        n = cached.count
        if len(items) == n:
            cached.obj, cached.items, cached.unchecked = items, mine, unchecked
            cached.by_value = cached.by_value and mine is not None
            return cached.head
        new = items[n:]
        new_raw = _array_body(self.serializer.pack(new, root=f"{self.checkpoint_id}.{name}"))
        digest = self._segment(cached.head, len(new), new_raw, blobs)
        tail = cached.tail or []
        tail.append(new_raw)
        self._cache[name] = _PartCache(head=digest, raw=cached.raw, tail=tail, count=len(items),
                                       links=cached.links + 1, items=mine, unchecked=unchecked,
                                       by_value=cached.by_value and mine is not None, obj=items)
        return digest

    def _list_by_bytes(self, name: str, items: list[Any], cached: _PartCache | None, blobs: list[Blob], *,
                       owned: bool = False) -> str:
        raw = _array_body(self.serializer.pack(items, root=f"{self.checkpoint_id}.{name}"))
        old = cached.full_raw() if cached is not None else None
        grew = old is not None and raw.startswith(old)
        if grew and len(items) == cached.count:  # unchanged
            digest, links = cached.head, cached.links
        elif grew and cached.links < MAX_CHAIN:  # only grew: a segment (else restart: a chain stays bounded)
            digest = self._segment(cached.head, len(items) - cached.count, raw[len(old):], blobs)
            links = cached.links + 1
        else:  # a new chain
            if owned and not grew and cached is not None and cached.unchecked:
                _warn_changed_in_place(self.checkpoint_id, name[2:])
            digest, links = self._segment(None, len(items), raw, blobs), 1
        settled = _settled_all(items)
        self._cache[name] = _PartCache(head=digest, raw=raw, count=len(items), links=links,
                                       items=list(items) if settled else None, by_value=settled == 2, obj=items)
        return digest

    def _segment(self, parent: str | None, count: int, raw: bytes, blobs: list[Blob]) -> str:
        data = self.serializer.encode_value([count, raw])
        digest = self._hash(parent, data)
        if digest not in self._known:
            blobs.append(Blob(hash=digest, data=data, parent=parent))
        return digest

    def snapshot(self, pos: RunPosition) -> bytes:
        """The position as one encoded value, kept in memory (a failure in a non-step mode stores it)."""
        return self.serializer.encode_value({"run": position_to_plain(pos), "state": pos.state},
                                            root=f"checkpoint '{self.checkpoint_id}'")

    def from_snapshot(self, data: bytes) -> RunPosition:
        plain = self.serializer.decode_value(data)
        pos = position_from_plain(plain["run"])
        pos.state = plain["state"]
        return pos

    # --- reading -------------------------------------------------------------------------------------

    async def load(self, version: int | None = None) -> Loaded | None:
        """Read the newest (or a given) version; None if the run does not exist."""
        record = await self.store.get(self.checkpoint_id, version)
        if record is None:
            return None
        loaded, content = self._decode(record)
        if version is not None and record.meta.version != version:
            raise CheckpointCorrupted(f"{version_label(self.checkpoint_id, version)}: the store returned "
                                      f"version {record.meta.version} instead; {_RESTORE}")
        self.version = record.meta.version if version is None else self.version
        self.created_at = record.meta.created_at
        self._known.update(b.hash for chain in record.chains.values() for b in chain)
        self._last = (record.meta.step, content)
        return loaded

    def decode(self, record: Checkpoint) -> Loaded:
        """Verify and decode a stored version; any inconsistency is `CheckpointCorrupted` naming the
        run and version, whatever the store handed back."""
        return self._decode(record)[0]

    def _decode(self, record: Checkpoint) -> tuple[Loaded, dict[str, Any]]:
        where = version_label(self.checkpoint_id, getattr(getattr(record, "meta", None), "version", None))
        try:
            with _naming(where):
                return self._decode_checked(record, where)
        except WaypointError:
            raise
        except Exception as err:  # a store handed back something of a shape no check above expected
            raise CheckpointCorrupted(f"{where}: the stored record has an unexpected shape ({describe(err)}); "
                                      f"{_RESTORE}") from err

    def _decode_checked(self, record: Checkpoint, where: str) -> tuple[Loaded, dict[str, Any]]:
        problem = _record_problem(record, self.checkpoint_id)
        if problem is not None:
            raise CheckpointCorrupted(f"{where}: {problem}; {_RESTORE}")
        content, trace = self._read_header(record, where)
        lists = set(content["lists"])
        values: dict[str, Any] = {}
        for name, head in record.parts.items():
            chain = record.chains.get(name) or ()
            self._verify_chain(name, head, chain, where)
            values[name] = self._decode_list(name, head, chain, where) if name in lists \
                else self._decode_whole(name, head, chain, where)
        try:
            position = position_from_plain(values.pop("run"))
            structure = values.pop("graph")
            if type(structure) is not dict:
                raise ValueError("the graph part is not a map")
            position.state = join_state(content["state"], {k[2:]: v for k, v in values.items()}, self.serializer)
        except WaypointError:
            raise
        except Exception as err:
            raise CheckpointCorrupted(
                f"{where}: its content does not have the expected shape ({describe(err)}); {_RESTORE}") from err
        return Loaded(meta=record.meta, position=position, structure=structure, trace=trace), content

    def _read_header(self, record: Checkpoint, where: str) -> tuple[dict[str, Any], dict[str, str]]:
        """The header's content (parts, lists, state kind), after checking it describes this very row,
        and the trace carrier it holds (malformed entries dropped: it is diagnostic data)."""
        header = self.serializer.loads(record.header)
        fmt = header.get("format") if type(header) is dict else None
        if fmt == 1 and "meta" not in header:
            if self.serializer.signed:
                raise CheckpointCorrupted(
                    f"{where}: its header has format 1, written before headers were bound to their run and "
                    "version; a signed store refuses it (its content could be replayed as another run or "
                    "version). Resume or finish it with the Waypoint release that wrote it, or delete it"
                )
        elif type(fmt) is int and fmt > _FORMAT:
            raise CheckpointCorrupted(f"{where}: its header has format {fmt}, newer than this Waypoint reads "
                                      f"({_FORMAT}); upgrade waypoint-graph to read it")
        elif fmt != _FORMAT:
            raise CheckpointCorrupted(f"{where}: its header has no valid format number; {_RESTORE}")
        else:
            self._check_binding(header.get("meta"), record.meta, where)
        lists, state = header.get("lists", []), header.get("state")
        if header.get("parts") != dict(record.parts) or type(lists) is not list \
                or not all(type(n) is str for n in lists) or not _is_state_kind(state):
            raise CheckpointCorrupted(f"{where}: its header does not match its part list; {_RESTORE}")
        return {"parts": dict(record.parts), "lists": lists, "state": state}, clean_trace(header.get("trace"))

    def _check_binding(self, bound: Any, meta: CheckpointMeta, where: str) -> None:
        expected = _binding(meta)
        expected[0] = self.checkpoint_id
        if type(bound) is list and bound == expected:
            return
        differ = [name for i, name in enumerate(_BOUND) if type(bound) is not list or len(bound) != len(expected)
                  or bound[i] != expected[i]]
        raise CheckpointCorrupted(
            f"{where}: its header was written for a different run or version (fields that differ from the "
            f"stored row: {', '.join(differ)}); the rows were moved, replayed or altered; {_RESTORE}"
        )

    def _verify_chain(self, name: str, head: str, chain: Any, where: str) -> None:
        if len(chain) > MAX_CHAIN:
            raise CheckpointCorrupted(f"{where}: part '{name}' has more than {MAX_CHAIN} segments; {_RESTORE}")
        parent = None
        for blob in chain:
            if not isinstance(blob.data, (bytes, bytearray, memoryview)) or blob.parent != parent \
                    or self._hash(parent, blob.data) != blob.hash:
                raise CheckpointCorrupted(
                    f"{where}: part '{name}' fails its hash check (bytes changed on disk or a link is "
                    f"missing); {_RESTORE}"
                )
            parent = blob.hash
        if not chain or parent != head:
            raise CheckpointCorrupted(f"{where}: part '{name}' is missing blobs; {_RESTORE}")

    def _decode_whole(self, name: str, head: str, chain: Any, where: str) -> Any:
        if len(chain) != 1:
            raise CheckpointCorrupted(f"{where}: part '{name}' has segments but is not a list")
        self._cache[name] = _PartCache(head=head)
        return self.serializer.decode_value(chain[0].data)

    def _decode_list(self, name: str, head: str, chain: Any, where: str) -> list[Any]:
        from .serde import MAX_RECORD_BYTES

        ser = self.serializer
        bodies, count, size = [], 0, 0
        for blob in chain:
            segment = ser.decode_value(blob.data)
            # Every item takes at least one byte: a count above the segment's length is a lie.
            if not (type(segment) is list and len(segment) == 2 and type(segment[0]) is int
                    and type(segment[1]) is bytes and 0 <= segment[0] <= len(segment[1])):
                raise CheckpointCorrupted(f"{where}: part '{name}' has a malformed segment; {_RESTORE}")
            count += segment[0]
            size += len(segment[1])
            if size > MAX_RECORD_BYTES - 5:  # refused before joining them, not after
                raise CheckpointCorrupted(f"{where}: part '{name}' adds up to more than MAX_RECORD_BYTES")
            bodies.append(segment[1])
        raw = b"".join(bodies)
        items = ser.unpack(_array_head(count) + raw)
        if type(items) is not list or len(items) != count:
            raise CheckpointCorrupted(f"{where}: part '{name}' segments do not add up to its items")
        self._cache[name] = _PartCache(head=head, raw=raw, count=count, links=len(chain))
        return items


_BOUND = ("checkpoint ID", "version", "step", "status", "fingerprint", "error", "origin")


def _binding(meta: CheckpointMeta) -> list[Any]:
    """What a header binds its content to (`_BOUND`, in order; a list packs faster than a map): the row
    fields nobody may change after the write. The lease and the timestamps are left out: a store
    renews leases in place."""
    return [meta.checkpoint_id, meta.version, meta.step, meta.status, meta.fingerprint, meta.error, meta.origin]


@contextmanager
def _naming(where: str) -> Iterator[None]:
    """Prefix the run and version to a codec error raised while reading them (its class is kept)."""
    try:
        yield
    except CheckpointCorrupted as err:
        if err.args and isinstance(err.args[0], str) and not err.args[0].startswith(where):
            err.args = (f"{where}: {err.args[0]}", *err.args[1:])
        raise


def _record_problem(record: Checkpoint, checkpoint_id: str) -> str | None:
    """What is wrong with the types of what a store returned for `checkpoint_id`, or None."""
    problem = meta_problem(record.meta)
    if problem is not None:
        return problem
    if record.meta.checkpoint_id != checkpoint_id:
        return "the store returned a row of another run"
    if not isinstance(record.header, (bytes, bytearray, memoryview)):
        return f"its header is a {type(record.header).__name__}, not bytes"
    problem = parts_problem(record.parts)
    if problem is not None:
        return problem
    if not isinstance(record.chains, Mapping):
        return "its part chains are not a map"
    return None


def _is_state_kind(kind: Any) -> bool:
    return kind in (None, "dict", "value") if type(kind) is not list else (
        len(kind) == 2 and kind[0] == "obj" and type(kind[1]) is str)


def _array_body(packed: bytes) -> bytes:
    """A msgpack array's bytes without its header: the items' encodings, concatenated."""
    first = packed[0]
    if 0x90 <= first <= 0x9F:
        return packed[1:]
    return packed[3:] if first == 0xDC else packed[5:]


def _array_head(count: int) -> bytes:
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


_ATOMS = frozenset({str, bytes, int, float, bool, type(None), complex})
_EQ_BY_CODEC: dict[type, bool] = {}


def _settled(value: Any, depth: int = 0) -> int:
    """How a list item can be proved unchanged: 2 by `==` (it is immutable and its equality is the
    codec's: built-in atoms, tuples of such, frozen pydantic models with pydantic's own `__eq__`, enums
    compared by identity), 1 by identity (immutable: frozen dataclasses, frozensets, enums with a value
    equality), 0 not at all (it can change in place: dicts, lists, mutable objects)."""
    kind = type(value)
    if kind in _ATOMS:
        return 2
    if depth > 8:
        return 0
    if kind is tuple:
        return min((_settled(v, depth + 1) for v in value), default=2)
    if kind is frozenset:
        return min(1, min((_settled(v, depth + 1) for v in value), default=1))
    config = getattr(kind, "model_config", None)  # a pydantic model declared frozen
    if isinstance(config, dict) and config.get("frozen") and not getattr(value, "__pydantic_extra__", None):
        inner = min((_settled(v, depth + 1) for v in value.__dict__.values()), default=2)
        return min(inner, 2 if _pydantic_eq(kind) else 1)
    params = getattr(kind, "__dataclass_params__", None)
    if params is not None and params.frozen and hasattr(value, "__dict__"):
        return min(1, min((_settled(v, depth + 1) for v in vars(value).values()), default=1))
    if isinstance(value, enum.Enum):
        return 2 if kind.__eq__ is object.__eq__ else 1
    return 0


def _settled_all(items: list[Any]) -> int:
    """`_settled` of a list: the least of its items' (2 for no items), stopping at the first 0."""
    least = 2
    for item in items:
        level = _settled(item)
        if level < least:
            if not level:
                return 0
            least = level
    return least


def _pydantic_eq(kind: type) -> bool:
    """Whether `kind` compares with pydantic's own `__eq__` (same class, equal fields), not its own."""
    known = _EQ_BY_CODEC.get(kind)
    if known is None:
        owner = next((c for c in kind.__mro__ if "__eq__" in c.__dict__), object)
        known = _EQ_BY_CODEC[kind] = owner.__name__ == "BaseModel" and owner.__module__.startswith("pydantic")
    return known


def _warn_changed_in_place(checkpoint_id: str, field_name: str) -> None:
    warnings.warn(
        f"run '{checkpoint_id}': state field '{field_name}' has an append reducer, so its versions record only the "
        "items appended to it, but an item already recorded was changed in place (or the list was reordered): the "
        "versions written since then hold the old items; this one holds the list as it is now. Change such "
        "items through the reducer (add_messages replaces an item by ID) or use a reducer of your own",
        RuntimeWarning, stacklevel=2,
    )
