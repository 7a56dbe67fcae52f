"""A run's position as store content: parts, content-addressed blobs, and append segments.

`Checkpointer` is the engine side of the store contract (engine/keep/store.py) for one run. It turns a
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
import logging
import operator
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointCorrupted
from ..run import RunPosition, paused_records, takes_keyword
from ..shape import StateJournal
from .content import (
    position_from_plain,
    position_to_plain,
    register_engine_types,
    split_state,
)
from .lease import lease_clock
from .nested_writer import NestedWriter
from .reading import FORMAT, NESTED_FORMAT, RESTORE, Loaded, PartCache, VersionReader, binding
from .store import (
    MAX_CHAIN,
    Blob,
    CheckpointMeta,
    CheckPointStore,
    MissingBlobs,
    store_clock,
    version_label,
)

if TYPE_CHECKING:
    from ..codec import Serializer

__all__ = ["Checkpointer", "fingerprint", "new_owner"]



_WARNED: set[int] = set()


def _unkept_deadline(store: Any, checkpoint_id: str) -> None:
    """A store that dropped a pause's deadline will never say it is due: said at once, once per store."""
    if id(store) in _WARNED:
        return
    _WARNED.add(id(store))
    logging.getLogger("waypoint.recovery").error(
        "run '%s' paused with a deadline, but the store %r did not keep it (its put returned no deadline): its "
        "pauses will never expire by themselves. Use a store that keeps CheckpointMeta.deadline "
        "(engine/keep/store.py, guarantee 13)", checkpoint_id, store)



PRESUME_AT = 256
"""A list of items that can change in place is presumed to only grow (path 4 of `Checkpointer._list`) from this
length: a shorter one is compared in full at every write (that costs less than ~0.1 ms)."""


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


@dataclass(kw_only=True)
class Checkpointer(NestedWriter, VersionReader):
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
    _cache: dict[str, PartCache] = field(default_factory=dict)
    _known: set[str] = field(default_factory=set)
    _last: tuple[int, dict[str, Any]] | None = None
    """The step and header content (parts, lists, state kind) last written or read: what `mark` reuses."""
    _graph_part: str | None = None
    origin: str | None = None
    """Written into the next version's meta (then cleared): the `id@version` a fork or time travel left."""
    trace: dict[str, str] = field(default_factory=dict)
    """The running run's trace carrier, written into every header (nothing when empty)."""
    cancelled_by: dict[str, Any] | None = None
    """Written into the next version's header (then cleared): who cancelled the run there (engine/keep/cancel.py)."""
    sent: float = 0.0
    """The lease clock (engine/keep/lease.py) when the last write was sent: a lease it took lasts from then."""
    holding: bool = False
    """The last write was `running` under this writer's own lease: the next one continues under it, and the
    store refuses it once the lease is no longer this writer's (engine/keep/store.py, guarantee 11)."""
    takeover: bool = False
    """The next write takes the run from a lease owner the caller established is dead (then cleared)."""
    answer_by: float | None = None
    """The next write (a resume's claim) is refused by the store once its clock reaches this: the deadline of a
    pause the claim answers (engine/keep/admission.py). Cleared after it."""
    state_schema: dict[str, Any] | None = None
    """The state's fields and types (`GraphShape.state_schema`): written in the `graph` part beside the structure
    (not in the fingerprint), and compared with a stored run's when one is read (engine/keep/reading.py)."""
    fit_state: Any = None
    """For a migration (engine/keep/migrate.py): `fit(changes, fields) -> fields`, the stored state's fields made to
    fit the state's changed fields before they are joined; None: a changed state is reported, not joined."""

    def __post_init__(self) -> None:
        self.fingerprint = fingerprint(self.graph_structure)
        register_engine_types(self.serializer)

    # --- writing -------------------------------------------------------------------------------------

    async def save(self, pos: RunPosition, status: str, *, error: str | None = None,
                   journal: StateJournal | None = None, lease: tuple[Any, Any] | None = None,
                   exact: bool = False) -> CheckpointMeta:
        """Write the next version (compare-and-set on the one this run last read or wrote).

        Unchanged parts are not sent again; if the store lost some of them meanwhile (a `prune` that
        raced this run), the whole version is written again. `journal` says which state fields only grew
        through an append-owned reducer since the last write (engine/shape/reducers.py): their new items are
        written without looking at the old ones, except in a version that is not `running` (a pause or an
        end) or is `exact`, where every list is compared in full. (A failure or a cancel inside a step writes no new
        content: `mark`.) `lease`
        (owner, seconds from now; None seconds: no lease) is written instead of this writer's own for a `running`
        version (an edit of a run whose process died names its owner under a lease that has run out: 0 s)."""
        deadline = await self._deadlines(pos) if status == "interrupted" else None
        try:
            meta = await self._save(pos, status, error, journal, lease, deadline, exact=exact)
        except MissingBlobs:
            self._known.clear()
            self._cache.clear()
            self._graph_part = None
            meta = await self._save(pos, status, error, journal, lease, deadline, rewrite=True, exact=exact)
        if journal is not None and journal.replaced:
            journal.written()
        return meta

    async def _deadlines(self, pos: RunPosition) -> float | None:
        """Give each pause first stored now with a deadline counted from then (`expires_in`) its deadline on the
        store's clock, read once; the earliest deadline of the run's pauses (nested runs' too), or None."""
        records = [r for r in paused_records(pos) if r.deadline is not None or r.expires_in is not None]
        if not records:
            return None
        if any(r.deadline is None for r in records):
            now = await store_clock(self.store)
            for r in records:
                if r.deadline is None:
                    r.deadline, r.expires_in = now + r.expires_in, None
        return min(r.deadline for r in records)  # type: ignore[type-var]

    async def _save(self, pos: RunPosition, status: str, error: str | None,
                    journal: StateJournal | None, lease: tuple[Any, Any] | None = None,
                    deadline: float | None = None, *, rewrite: bool = False, exact: bool = False) -> CheckpointMeta:
        blobs: list[Blob] = []
        if self._graph_part is None:  # the same bytes at every step: encode once
            self._graph_part = self._whole("graph", self._graph_value(), blobs)
        elif self._graph_part not in self._known:
            self._whole("graph", self._graph_value(), blobs)
        parts = {"graph": self._graph_part}
        lists: list[str] = []
        state_kind, fields = split_state(pos.state, self.serializer)
        owned = journal.owned if journal is not None and state_kind != "value" else ()
        for name, value in fields.items():
            key = f"s:{name}"
            if type(value) is list:
                mine = name in owned and name not in journal.replaced  # type: ignore[union-attr]
                parts[key] = self._list(key, value, blobs, owned=mine, verify=exact or status != "running")
                lists.append(key)
            else:
                parts[key] = self._whole(key, value, blobs)
        placed, runs = self._place_nested(pos, parts, lists, blobs, rewrite)
        parts["run"] = self._whole("run", position_to_plain(pos, nested=placed), blobs)
        content = {"parts": parts, "lists": lists, "state": state_kind}
        if runs:
            content["format"] = NESTED_FORMAT
        meta = await self._put(pos.step, status, error, content, blobs, lease, deadline)
        for entry in runs:  # the store has them now
            entry.blobs = []
        return meta

    def _graph_value(self) -> dict[str, Any]:
        """The `graph` part: the structure, and the state's schema beside it (readers before it ignore the key)."""
        if self.state_schema is None:
            return self.graph_structure
        return {**self.graph_structure, "state": self.state_schema}

    async def mark(self, status: str, *, error: str | None = None) -> CheckpointMeta | None:
        """Write a new version with the last written content and a new status (when the current
        position cannot be encoded, a failure must still be recorded). None if nothing was written yet.
        The parts are reused as they are; only the header is new, bound to the new version."""
        if self._last is None:
            return None
        step, content = self._last
        return await self._put(step, status, error, content, [])

    async def release(self, pos: RunPosition | None = None) -> CheckpointMeta | None:
        """Write the last written content again, `running` under this writer's name with a lease that has already
        run out: a process that stops (a shutdown) leaves the run for the next one at once, and the version says a
        process let it go — no takeover of a dead owner. None if nothing was written yet. `pos`: the run's
        position, stopped where nothing is under way (a step boundary): it is written instead, its lists compared
        in full (a list presumed to only grow may have had an item changed in place since: `_list`, path 4)."""
        if self._last is None:
            return None
        if pos is not None:
            return await self.save(pos, "running", lease=(self.owner, 0.0), exact=True)
        step, content = self._last
        return await self._put(step, "running", None, content, [], (self.owner, 0.0))

    async def _put(self, step: int, status: str, error: str | None, content: dict[str, Any],
                   blobs: list[Blob], lease: tuple[Any, Any] | None = None,
                   deadline: float | None = None) -> CheckpointMeta:
        now = time.time()
        running = status == "running"
        owner, seconds = lease if lease is not None else (self.owner, self.lease_seconds)
        expires = now + seconds if seconds is not None else None
        meta = CheckpointMeta(
            checkpoint_id=self.checkpoint_id, version=(self.version or 0) + 1, status=status,
            step=step, fingerprint=self.fingerprint, created_at=self.created_at or self._created(now), updated_at=now,
            lease_owner=owner if running else None, lease_expires=expires if running else None, error=error,
            origin=self.origin, deadline=deadline,
        )
        record = {"format": FORMAT, **content, "meta": binding(meta)}
        if self.trace:
            record["trace"] = self.trace
        if self.cancelled_by is not None:
            record["cancel"] = self.cancelled_by
        header = self.serializer.dumps(record, root=f"checkpoint '{self.checkpoint_id}'")
        self.sent = lease_clock()  # the store stamps the lease no earlier (on its clock): see engine/keep/lease.py
        fence = {"due_by": self.answer_by} if self.answer_by is not None and takes_keyword(self.store.put, "due_by") else {}
        stored = await self.store.put(meta, header, content["parts"], blobs, expected_version=self.version,
                                      holder=self.owner if self.holding else None, takeover=self.takeover,
                                      fresh=self.created_at is None, **fence)
        self.answer_by = None
        if not isinstance(stored, CheckpointMeta) and self.created_at is None:  # a store (or a wrapper of one)
            found = await self.store.history(self.checkpoint_id, limit=1)      # that returns nothing: read it back
            stored = found[0] if found and found[0].version == meta.version else None
        meta = stored if isinstance(stored, CheckpointMeta) else meta  # as the store stamped it (its clock)
        if deadline is not None and getattr(meta, "deadline", None) is None:
            _unkept_deadline(self.store, self.checkpoint_id)
        self.holding = running and lease is None
        self.takeover = False
        self.origin = None
        self.cancelled_by = None
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

    def _whole(self, name: str, value: Any, blobs: list[Blob], keep: dict[str, Any] | None = None) -> str:
        data = self.serializer.encode_value(value, root=f"{self.checkpoint_id}.{name}")
        if keep is not None:
            keep[name] = data
        digest = self._hash(None, data)
        if digest not in self._known:
            blobs.append(Blob(hash=digest, data=data))
        self._cache[name] = PartCache(head=digest)
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
        4. Items that can change in place, in a list of at least `PRESUME_AT` of them that path 3 last found only
           grown: while the list still holds the items last written, in order (the same objects or equal ones, C
           speed), it is presumed to have only grown, and the new items are written. Path 3 compares it in full again once it
           grew by an eighth since (a constant cost per appended item), and whenever the run stops; a change in
           place it finds then is stored, and that list is compared in full for the rest of the run.

        Paths 1, 2 and 4 cost what was appended, whatever the list's length (B2 in docs/performance.md).
        """
        cached = self._cache.get(name)
        if cached is not None and cached.earlier is not None and items:  # written empty: the chain before it?
            earlier = cached.earlier
            if earlier.links < MAX_CHAIN and len(items) >= earlier.count:
                mine = self._same_in_front(earlier, items)
                if mine is not None:
                    return self._grow(name, earlier, items, blobs, mine)
                raw = _array_body(self.serializer.pack(items, root=f"{self.checkpoint_id}.{name}"))
                if raw.startswith(earlier.full_raw() or b""):
                    return self._grow(name, earlier, items, blobs, None)
        if cached is not None and cached.links < MAX_CHAIN and len(items) >= cached.count:
            if owned and not verify and cached.obj is items:
                return self._grow(name, cached, items, blobs, self._extended(cached, items), unchecked=True)
            mine = self._same_in_front(cached, items)
            if mine is not None:
                return self._grow(name, cached, items, blobs, mine)
            if not verify and self._presumed(cached, items):
                return self._grow(name, cached, items, blobs, None, unchecked=True)
        return self._list_by_bytes(name, items, cached, blobs, owned=owned)

    @staticmethod
    def _presumed(cached: PartCache, items: list[Any]) -> bool:
        """Path 4: the list still starts with the very items last written, and grew by less than an eighth since
        it was last compared in full. Our copy of the items is extended to the list's length."""
        refs, n = cached.refs, cached.count
        if refs is None or len(items) - cached.checked >= cached.checked // 8:
            return False
        refs.extend(items[n:])
        if refs == items:  # the same objects, at C speed (an item replaced by an equal one counts as the same)
            return True
        del refs[n:]
        return False

    @staticmethod
    def _same_in_front(cached: PartCache, items: list[Any]) -> list[Any] | None:
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
    def _extended(cached: PartCache, items: list[Any]) -> list[Any] | None:
        """Path 1: our copy of the items kept up to date when the new ones allow it (else dropped)."""
        mine, new = cached.items, items[cached.count:]
        if mine is None or len(mine) != cached.count or _settled_all(new) < (2 if cached.by_value else 1):
            return None
        mine.extend(new)
        return mine

    def _grow(self, name: str, cached: PartCache, items: list[Any], blobs: list[Blob],
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
        self._cache[name] = PartCache(head=digest, raw=cached.raw, tail=tail, count=len(items),
                                       links=cached.links + 1, items=mine, unchecked=unchecked,
                                       by_value=cached.by_value and mine is not None, obj=items,
                                       refs=cached.refs, checked=cached.checked, exact=cached.exact)
        return digest

    def _list_by_bytes(self, name: str, items: list[Any], cached: PartCache | None, blobs: list[Blob], *,
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
        # an item changed in place behind path 4's back: this list is compared in full from now on
        exact = cached is not None and (cached.exact or (not grew and cached.unchecked and cached.refs is not None))
        presume = not settled and not exact and grew and len(items) >= PRESUME_AT
        self._cache[name] = PartCache(head=digest, raw=raw, count=len(items), links=links,
                                       items=list(items) if settled else None, by_value=settled == 2, obj=items,
                                       refs=list(items) if presume else None, checked=len(items), exact=exact,
                                       earlier=cached if not items and cached is not None and cached.count else None)
        return digest

    def _segment(self, parent: str | None, count: int, raw: bytes, blobs: list[Blob]) -> str:
        data = self.serializer.encode_value([count, raw])
        digest = self._hash(parent, data)
        if digest not in self._known:
            blobs.append(Blob(hash=digest, data=data, parent=parent))
        return digest

    def snapshot(self, pos: RunPosition) -> bytes:
        """The position as one encoded value, kept in memory (a failure in a non-step mode stores it); nested runs'
        progress in it is encoded whole, as before format 3."""
        nested = {a: e if type(e) is bytes else self.snapshot(self.nested_position(e)) for a, e in pos.nested.items()}
        return self.serializer.encode_value({"run": position_to_plain(pos, nested=nested), "state": pos.state},
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
                                      f"version {record.meta.version} instead; {RESTORE}")
        self.version = record.meta.version if version is None else self.version
        self.created_at = record.meta.created_at
        self._known.update(b.hash for chain in record.chains.values() for b in chain)
        self._last = (record.meta.step, content)
        return loaded

def _array_body(packed: bytes) -> bytes:
    """A msgpack array's bytes without its header: the items' encodings, concatenated."""
    first = packed[0]
    if 0x90 <= first <= 0x9F:
        return packed[1:]
    return packed[3:] if first == 0xDC else packed[5:]


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
