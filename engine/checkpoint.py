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
written. That keeps the bytes written per step flat as history grows (docs/stores.md).
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import CheckpointCorrupted, WaypointError
from .position import InterruptRecord, RunPosition
from .store import Blob, Checkpoint, CheckpointMeta, CheckPointStore, MissingBlobs
from .streams import Chunks

if TYPE_CHECKING:
    from .compiled import CompiledGraph
    from .serde import Serializer

__all__ = ["Checkpointer", "fingerprint", "graph_structure", "new_owner"]

_FORMAT = 1


def new_owner() -> str:
    """A lease owner name unique to this process and call: host, pid and a random suffix."""
    return f"{os.uname().nodename}:{os.getpid()}:{os.urandom(4).hex()}"


def graph_structure(graph: CompiledGraph) -> dict[str, Any]:
    """What makes two graphs the same for resuming: names, nodes, routes, trigger, subgraphs."""
    nodes: dict[str, Any] = {}
    for key, node in graph.nodes.items():
        nodes[key] = graph_structure(node.subgraph) if node.subgraph is not None else "node"
    return {
        "name": graph.name,
        "trigger": graph.trigger,
        "nodes": nodes,
        "edges": sorted([a, b] for a, b in graph._edges),
        "branches": sorted([b.source, sorted(map(str, b.ends.values()))] for b in graph._branches),
    }


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


@dataclass(kw_only=True)
class Loaded:
    """A version read back: its meta and the decoded position and graph structure."""

    meta: CheckpointMeta
    position: RunPosition
    structure: dict[str, Any]


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
    _cache: dict[str, _PartCache] = field(default_factory=dict)
    _known: set[str] = field(default_factory=set)
    _last: tuple[int, bytes, dict[str, str]] | None = None
    _graph_part: str | None = None
    origin: str | None = None
    """Written into the next version's meta (then cleared): the `id@version` a fork or time travel left."""

    def __post_init__(self) -> None:
        self.fingerprint = fingerprint(self.graph_structure)
        _register_engine_types(self.serializer)

    # --- writing -------------------------------------------------------------------------------------

    async def save(self, pos: RunPosition, status: str, *, error: str | None = None) -> CheckpointMeta:
        """Write the next version (compare-and-set on the one this run last read or wrote).

        Unchanged parts are not sent again; if the store lost some of them meanwhile (a `prune` that
        raced this run), the whole version is written again.
        """
        try:
            return await self._save(pos, status, error)
        except MissingBlobs:
            self._known.clear()
            self._cache.clear()
            self._graph_part = None
            return await self._save(pos, status, error)

    async def _save(self, pos: RunPosition, status: str, error: str | None) -> CheckpointMeta:
        blobs: list[Blob] = []
        if self._graph_part is None:  # the same bytes at every step: encode once
            self._graph_part = self._whole("graph", self.graph_structure, blobs)
        elif self._graph_part not in self._known:
            self._whole("graph", self.graph_structure, blobs)
        parts = {"run": self._whole("run", _position_to_plain(pos), blobs), "graph": self._graph_part}
        state_kind, fields = _split_state(pos.state, self.serializer)
        lists = []
        for name, value in fields.items():
            key = f"s:{name}"
            if type(value) is list:
                parts[key] = self._list(key, value, blobs)
                lists.append(key)
            else:
                parts[key] = self._whole(key, value, blobs)
        header = self.serializer.dumps({"format": _FORMAT, "parts": parts, "lists": lists, "state": state_kind},
                                       root=f"checkpoint '{self.checkpoint_id}'")
        return await self._put(pos.step, status, error, header, parts, blobs)

    async def mark(self, status: str, *, error: str | None = None) -> CheckpointMeta | None:
        """Write a new version with the last written content and a new status (when the current
        position cannot be encoded, a failure must still be recorded). None if nothing was written yet."""
        if self._last is None:
            return None
        step, header, parts = self._last
        return await self._put(step, status, error, header, parts, [])

    async def _put(self, step: int, status: str, error: str | None, header: bytes, parts: dict[str, str],
                   blobs: list[Blob]) -> CheckpointMeta:
        now = time.time()
        running = status == "running"
        meta = CheckpointMeta(
            checkpoint_id=self.checkpoint_id, version=(self.version or 0) + 1, status=status,
            step=step, fingerprint=self.fingerprint, created_at=self.created_at or now, updated_at=now,
            lease_owner=self.owner if running else None,
            lease_expires=now + self.lease_seconds if running else None, error=error, origin=self.origin,
        )
        await self.store.put(meta, header, parts, blobs, expected_version=self.version)
        self.origin = None
        self.version = meta.version
        self.created_at = meta.created_at
        self._known.update(b.hash for b in blobs)
        self._last = (step, header, parts)
        return meta

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

    def _list(self, name: str, items: list[Any], blobs: list[Blob]) -> str:
        """A list part: when the list only grew, write just the new items as a segment on its chain.

        One encoding of the whole list (C speed), then a byte-prefix test against the last write:
        msgpack values are self-delimiting, so "the old items' bytes are a prefix of the new ones"
        means exactly "the old items are unchanged and items were appended" — an item edited in place
        changes the bytes and starts a new chain.
        """
        ser = self.serializer
        raw = _array_body(ser.pack(items, root=f"{self.checkpoint_id}.{name}"))
        cached = self._cache.get(name)
        if cached is not None and cached.raw is not None and raw.startswith(cached.raw):
            if len(items) == cached.count:
                return cached.head
            parent, new_raw, new_count = cached.head, raw[len(cached.raw):], len(items) - cached.count
        else:
            parent, new_raw, new_count = None, raw, len(items)
        data = ser.encode_value([new_count, new_raw])
        digest = self._hash(parent, data)
        if digest not in self._known:
            blobs.append(Blob(hash=digest, data=data, parent=parent))
        self._cache[name] = _PartCache(head=digest, raw=raw, count=len(items))
        return digest

    def snapshot(self, pos: RunPosition) -> bytes:
        """The position as one encoded value, kept in memory (a failure in a non-step mode stores it)."""
        return self.serializer.encode_value({"run": _position_to_plain(pos), "state": pos.state},
                                            root=f"checkpoint '{self.checkpoint_id}'")

    def from_snapshot(self, data: bytes) -> RunPosition:
        plain = self.serializer.decode_value(data)
        pos = _position_from_plain(plain["run"])
        pos.state = plain["state"]
        return pos

    # --- reading -------------------------------------------------------------------------------------

    async def load(self, version: int | None = None) -> Loaded | None:
        """Read the newest (or a given) version; None if the run does not exist."""
        record = await self.store.get(self.checkpoint_id, version)
        if record is None:
            return None
        loaded = self.decode(record)
        self.version = record.meta.version if version is None else self.version
        self.created_at = record.meta.created_at
        self._known.update(b.hash for chain in record.chains.values() for b in chain)
        self._last = (record.meta.step, record.header, dict(record.parts))
        return loaded

    def decode(self, record: Checkpoint) -> Loaded:
        """Verify and decode a stored version; any inconsistency is `CheckpointCorrupted`."""
        where = f"checkpoint '{self.checkpoint_id}' version {record.meta.version}"
        header = self.serializer.loads(record.header)
        if not isinstance(header, dict) or header.get("format") != _FORMAT or header.get("parts") != dict(record.parts):
            raise CheckpointCorrupted(f"{where}: its header does not match its part list; the record is damaged")
        values: dict[str, Any] = {}
        lists = set(header.get("lists", ()))
        for name, head in record.parts.items():
            chain = record.chains.get(name) or ()
            self._verify_chain(name, head, chain, where)
            values[name] = self._decode_list(name, head, chain, where) if name in lists \
                else self._decode_whole(name, head, chain, where)
        try:
            position = _position_from_plain(values.pop("run"))
            structure = values.pop("graph")
            position.state = _join_state(header["state"], {k[2:]: v for k, v in values.items()}, self.serializer)
        except WaypointError:
            raise
        except Exception as err:
            raise CheckpointCorrupted(f"{where}: its content does not have the expected shape ({err})") from err
        return Loaded(meta=record.meta, position=position, structure=structure)

    def _verify_chain(self, name: str, head: str, chain: Any, where: str) -> None:
        parent = None
        for blob in chain:
            if blob.parent != parent or self._hash(parent, blob.data) != blob.hash:
                raise CheckpointCorrupted(
                    f"{where}: part '{name}' fails its hash check (bytes changed on disk or a link is "
                    "missing); restore the database from a backup or delete this run"
                )
            parent = blob.hash
        if not chain or parent != head:
            raise CheckpointCorrupted(f"{where}: part '{name}' is missing blobs; delete this run or restore a backup")

    def _decode_whole(self, name: str, head: str, chain: Any, where: str) -> Any:
        if len(chain) != 1:
            raise CheckpointCorrupted(f"{where}: part '{name}' has segments but is not a list")
        self._cache[name] = _PartCache(head=head)
        return self.serializer.decode_value(chain[0].data)

    def _decode_list(self, name: str, head: str, chain: Any, where: str) -> list[Any]:
        ser = self.serializer
        bodies, count = [], 0
        for blob in chain:
            segment = ser.decode_value(blob.data)
            if not (type(segment) is list and len(segment) == 2 and type(segment[0]) is int
                    and type(segment[1]) is bytes and segment[0] >= 0):
                raise CheckpointCorrupted(f"{where}: part '{name}' has a malformed segment")
            count += segment[0]
            bodies.append(segment[1])
        raw = b"".join(bodies)
        items = ser.unpack(_array_head(count) + raw)
        if type(items) is not list or len(items) != count:
            raise CheckpointCorrupted(f"{where}: part '{name}' segments do not add up to its items")
        self._cache[name] = _PartCache(head=head, raw=raw, count=count)
        return items


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


# --- position <-> plain values ------------------------------------------------------------------------

def _position_to_plain(pos: RunPosition) -> dict[str, Any]:
    return {
        "step": pos.step, "pending": pos.pending, "inbox": pos.inbox, "skipped": pos.skipped,
        "interrupts": {k: _record_to_plain(r) for k, r in pos.interrupts.items()},
        "before": pos.paused_before, "after": pos.paused_after, "released": pos.released, "ledger": pos.ledger,
        "done": pos.done,
        "output": pos.output,
    }


def _record_to_plain(r: InterruptRecord) -> dict[str, Any]:
    return {
        "address": r.address, "info": r.info, "state": r.state, "has_state": r.has_state,
        "child": None if r.child is None else {**_position_to_plain(r.child), "state": r.child.state},
        "subs": [_record_to_plain(s) for s in r.subs],
    }


def _position_from_plain(d: dict[str, Any]) -> RunPosition:
    return RunPosition(
        step=d["step"], pending=d["pending"], inbox=d["inbox"], skipped=d["skipped"],
        interrupts={k: _record_from_plain(v) for k, v in d["interrupts"].items()},
        paused_before=d["before"], paused_after=d["after"], released=d.get("released", []),
        ledger=d.get("ledger", 0), done=d["done"],
        output=d["output"], state=d.get("state"),
    )


def _record_from_plain(d: dict[str, Any]) -> InterruptRecord:
    return InterruptRecord(
        address=d["address"], info=d["info"], state=d["state"], has_state=d["has_state"],
        child=None if d["child"] is None else _position_from_plain(d["child"]),
        subs=[_record_from_plain(s) for s in d["subs"]],
    )


# --- state <-> parts -----------------------------------------------------------------------------------

def _split_state(state: Any, serializer: Serializer) -> tuple[Any, dict[str, Any]]:
    """The state's kind and its fields: a dict's str keys, a registered class's fields, or itself."""
    if state is None:
        return None, {}
    if type(state) is dict and all(type(k) is str for k in state):
        return "dict", state
    entry = serializer.registry.entry_for_type(type(state))
    if entry is not None and entry.kind in ("model", "dataclass"):
        return ["obj", entry.name], entry.dump(state)
    return "value", {"": state}


def _join_state(kind: Any, fields: dict[str, Any], serializer: Serializer) -> Any:
    if kind is None:
        return None
    if kind == "dict":
        return fields
    if kind == "value":
        return fields[""]
    entry = serializer.registry.entry_named(kind[1])
    if entry is None:
        from .serde import UnknownType

        raise UnknownType(kind[1])
    return entry.load(fields)


def _register_engine_types(serializer: Serializer) -> None:
    registry = serializer.registry
    if registry.entry_for_type(Chunks) is None:
        registry.register(Chunks, name="waypoint.Chunks")


def describe_difference(old: dict[str, Any], new: dict[str, Any], where: str = "") -> str:
    """What changed between two graph structures, in words (for GraphMismatch)."""
    prefix = f"in subgraph '{where}': " if where else ""
    changes: list[str] = []
    for key in ("name", "trigger"):
        if old.get(key) != new.get(key):
            changes.append(f"{key} was {old.get(key)!r}, now {new.get(key)!r}")
    old_nodes, new_nodes = old.get("nodes", {}), new.get("nodes", {})
    if removed := sorted(set(old_nodes) - set(new_nodes)):
        changes.append(f"node(s) {removed} removed")
    if added := sorted(set(new_nodes) - set(old_nodes)):
        changes.append(f"node(s) {added} added")
    for key in sorted(set(old_nodes) & set(new_nodes)):
        a, b = old_nodes[key], new_nodes[key]
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                changes.append(describe_difference(a, b, f"{where}/{key}".strip("/")))
            else:
                changes.append(f"node '{key}' changed kind")
    old_edges = {tuple(e) for e in old.get("edges", [])}
    new_edges = {tuple(e) for e in new.get("edges", [])}
    if gone := sorted(old_edges - new_edges):
        changes.append("edge(s) " + ", ".join(f"{a} -> {b}" for a, b in gone) + " removed")
    if came := sorted(new_edges - old_edges):
        changes.append("edge(s) " + ", ".join(f"{a} -> {b}" for a, b in came) + " added")
    if old.get("branches") != new.get("branches"):
        changes.append("branches changed")
    return prefix + ("; ".join(changes) or "the structure differs")
