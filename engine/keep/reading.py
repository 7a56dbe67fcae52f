"""Reading a run's version back (engine/keep/checkpoint.py writes it): the header checked against the row it came
in, each part's chain of blobs verified, and the position decoded. Anything inconsistent is
`CheckpointCorrupted` naming the run and version, whatever the store handed back; decoding never runs code."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from ..errors import CheckpointCorrupted, WaypointError, describe
from ..events import clean_trace
from ..run import RunPosition
from ..shape import state_changes
from .content import join_state, position_from_plain
from .nested_parts import NESTED, ListBytes, NestedRun, nested_key
from .store import MAX_CHAIN, Checkpoint, CheckpointMeta, meta_problem, parts_problem, version_label

if TYPE_CHECKING:
    from ..codec import Serializer

FORMAT = 2
"""Header format: 2 binds the header to its version (the "meta" map); 1 (no binding) is still read
by an unsigned Serializer and refused by a signed one."""
NESTED_FORMAT = 3
"""Format 2, with nested runs' progress in parts of their own (engine/keep/nested_parts.py): written only by a
version that holds some, so every other version stays readable by a Waypoint that reads format 2."""
RESTORE = "restore the database from a backup or delete this run"


@dataclass(slots=True)
class PartCache:
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
    refs: list[Any] | None = None
    """Our own list of the items last written when they can change in place and the list is long (`PRESUME_AT`):
    while the list object still starts with these very items, the list is presumed to have only grown (path 4 in engine/keep/checkpoint.py)."""
    checked: int = 0
    """How many items the last full comparison saw: a presumed list is compared in full again once it grew by an
    eighth since (so the full comparisons cost a constant per appended item)."""
    exact: bool = False
    """An item was seen changed in place after the list was presumed to only grow: compared in full from then on."""
    earlier: PartCache | None = None
    """The chain this part had before it was written empty (a new run on the ID starts its state empty, then takes
    the conversation the last run ended with): the next write that starts with those items goes on from it."""

    def full_raw(self) -> bytes | None:
        if self.tail:
            self.raw = b"".join([self.raw or b"", *self.tail])
            self.tail = None
        return self.raw


@dataclass(frozen=True, kw_only=True, slots=True)
class CancelledBy:
    """A person's cancel as the version it stopped records it: who asked, where it stopped, when it was asked (the
    store's clock)."""

    by: str
    when: str
    at: float

    def plain(self) -> dict[str, Any]:
        return {"by": self.by, "when": self.when, "at": self.at}

    @classmethod
    def read(cls, value: Any) -> CancelledBy | None:
        """From a header's `cancel` entry; None when absent or malformed (it is a record for people, not a rule)."""
        if type(value) is not dict:
            return None
        by, when, at = value.get("by"), value.get("when"), value.get("at")
        if type(by) is not str or type(when) is not str or type(at) not in (int, float):
            return None
        return cls(by=by[:200], when=when[:300], at=float(at))


@dataclass(kw_only=True)
class Loaded:
    """A version read back: its meta and the decoded position and graph structure."""

    meta: CheckpointMeta
    position: RunPosition
    structure: dict[str, Any]
    trace: dict[str, str] = field(default_factory=dict)
    """The trace carrier of the run that wrote this version (empty when it stored none)."""
    cancelled_by: CancelledBy | None = None
    """Who stopped the run at this version, and where, when a person's cancel did (engine/keep/cancel.py)."""
    state_changes: list[Any] = field(default_factory=list)
    """What in the reader's state schema this version's state cannot be continued across (`StateChange`s); when
    any, `position.state` is None: the stored fields were not joined into a class that no longer fits them."""


class VersionReader:
    """The reading half of `Checkpointer` (the attributes it reads are declared below)."""

    serializer: Serializer
    checkpoint_id: str
    fingerprint: str
    state_schema: dict[str, Any] | None
    fit_state: Any
    _cache: dict[str, PartCache]

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
                                      f"{RESTORE}") from err

    def _decode_checked(self, record: Checkpoint, where: str) -> tuple[Loaded, dict[str, Any]]:
        problem = _record_problem(record, self.checkpoint_id)
        if problem is not None:
            raise CheckpointCorrupted(f"{where}: {problem}; {RESTORE}")
        content, trace, cancelled_by = self._read_header(record, where)
        lists = set(content["lists"])
        values: dict[str, Any] = {}

        def decode(name: str, head: str) -> None:
            chain = record.chains.get(name) or ()
            self._verify_chain(name, head, chain, where)
            values[name] = self._decode_list(name, head, chain, where) if name in lists \
                else self._decode_whole(name, head, chain, where)

        for name in ("run", "graph"):
            if name in record.parts:
                decode(name, record.parts[name])
        try:
            structure = values.pop("graph")
            if type(structure) is not dict:
                raise ValueError("the graph part is not a map")
            held = {k[2:] for k in record.parts if k.startswith("s:")}
            changes = self._state_changes(structure, content["state"], held)
            changed = {c.field for c in changes}
        except WaypointError:
            raise
        except Exception as err:
            raise CheckpointCorrupted(
                f"{where}: its content does not have the expected shape ({describe(err)}); {RESTORE}") from err
        for name, head in record.parts.items():  # a field whose type changed is not decoded: it may not any more
            if name not in ("run", "graph") and (name.startswith(NESTED) or name[2:] not in changed):
                decode(name, head)
        try:
            nested = {k: values.pop(k) for k in [k for k in values if k.startswith(NESTED)]}
            position = position_from_plain(values.pop("run"))
            if nested or any(type(v) is str for v in position.nested.values()):
                position.nested = self._nested_runs(position.nested, nested, record, lists, where)
            fields = {k[2:]: v for k, v in values.items()}
            if changes and self.fit_state is not None:
                fields, changes = self.fit_state(changes, fields), []
            position.state = None if changes else join_state(content["state"], fields, self.serializer)
        except WaypointError:
            raise
        except Exception as err:
            raise CheckpointCorrupted(
                f"{where}: its content does not have the expected shape ({describe(err)}); {RESTORE}") from err
        return Loaded(meta=record.meta, position=position, structure=structure, trace=trace,
                      state_changes=changes, cancelled_by=cancelled_by), content

    def _nested_runs(self, stored: dict[str, Any], values: dict[str, Any], record: Checkpoint, lists: set[str],
                     where: str) -> dict[str, Any]:
        """The root position's nested runs, each one's parts checked against the address it is stored for
        (engine/keep/nested_parts.py); parts no nested run of the position names are corrupted content."""
        runs: dict[str, Any] = {}
        for address, held in stored.items():
            if type(held) is bytes:  # written before format 3
                runs[address] = held
                continue
            head = values.pop(held, None)
            if held != nested_key(address) or type(head) is not dict or head.get("address") != address \
                    or type(head.get("fields")) is not dict:
                raise CheckpointCorrupted(f"{where}: the nested run at {address[:200]!r} names parts that are not its "
                                          f"own; {RESTORE}")
            prefix = held + ":s:"
            names = [n for n in values if n.startswith(prefix)]
            fields = {**head["fields"], **{n[len(prefix):]: values.pop(n) for n in names}}
            pos = position_from_plain(head["run"])
            pos.state = join_state(head["state"], fields, self.serializer)
            data: dict[str, Any] = {held: record.chains[held][0].data}
            for n in names:
                cached = self._cache[n]
                data[n] = ListBytes(cached.count, cached.raw or b"", None, 0) if n in lists \
                    else record.chains[n][0].data
            runs[address] = NestedRun(address=address, key=held, parts={n: record.parts[n] for n in (held, *names)},
                                      lists=[n for n in names if n in lists], data=data, position=pos)
        if values:
            raise CheckpointCorrupted(f"{where}: it holds parts of a nested run its position does not name; {RESTORE}")
        return runs

    def _state_changes(self, structure: dict[str, Any], kind: Any, held: set[str]) -> list[Any]:
        """The state changes a stored state of `kind` holding the fields `held` meets in this reader's schema (none
        when the reader has none, or the state is not a registered class's fields)."""
        if self.state_schema is None or type(kind) is not list:
            return []
        return state_changes(structure.get("state"), self.state_schema, held)

    def _read_header(self, record: Checkpoint, where: str) -> tuple[dict[str, Any], dict[str, str], Any]:
        """The header's content (parts, lists, state kind), after checking it describes this very row,
        the trace carrier it holds (malformed entries dropped: it is diagnostic data) and who cancelled it."""
        header = self.serializer.loads(record.header)
        fmt = header.get("format") if type(header) is dict else None
        if fmt == 1 and "meta" not in header:
            if self.serializer.signed:
                raise CheckpointCorrupted(
                    f"{where}: its header has format 1, written before headers were bound to their run and "
                    "version; a signed store refuses it (its content could be replayed as another run or "
                    "version). Resume or finish it with the Waypoint release that wrote it, or delete it"
                )
        elif type(fmt) is int and fmt > NESTED_FORMAT:
            raise CheckpointCorrupted(f"{where}: its header has format {fmt}, newer than this Waypoint reads "
                                      f"({NESTED_FORMAT}); upgrade waypoint-graph to read it")
        elif fmt not in (FORMAT, NESTED_FORMAT):
            raise CheckpointCorrupted(f"{where}: its header has no valid format number; {RESTORE}")
        else:
            self._checkbinding(header.get("meta"), record.meta, where)
        lists, state = header.get("lists", []), header.get("state")
        if header.get("parts") != dict(record.parts) or type(lists) is not list \
                or not all(type(n) is str for n in lists) or not _is_state_kind(state):
            raise CheckpointCorrupted(f"{where}: its header does not match its part list; {RESTORE}")
        content = {"parts": dict(record.parts), "lists": lists, "state": state}
        if fmt == NESTED_FORMAT:  # what `mark` writes again
            content["format"] = fmt
        return content, clean_trace(header.get("trace")), CancelledBy.read(header.get("cancel"))

    def _checkbinding(self, bound: Any, meta: CheckpointMeta, where: str) -> None:
        expected = binding(meta)
        expected[0] = self.checkpoint_id
        if type(bound) is list and bound == expected:
            return
        differ = [name for i, name in enumerate(_BOUND) if type(bound) is not list or len(bound) != len(expected)
                  or bound[i] != expected[i]]
        raise CheckpointCorrupted(
            f"{where}: its header was written for a different run or version (fields that differ from the "
            f"stored row: {', '.join(differ)}); the rows were moved, replayed or altered; {RESTORE}"
        )

    def _verify_chain(self, name: str, head: str, chain: Any, where: str) -> None:
        if len(chain) > MAX_CHAIN:
            raise CheckpointCorrupted(f"{where}: part '{name}' has more than {MAX_CHAIN} segments; {RESTORE}")
        parent = None
        for blob in chain:
            if not isinstance(blob.data, (bytes, bytearray, memoryview)) or blob.parent != parent \
                    or self._hash(parent, blob.data) != blob.hash:
                raise CheckpointCorrupted(
                    f"{where}: part '{name}' fails its hash check (bytes changed on disk or a link is "
                    f"missing); {RESTORE}"
                )
            parent = blob.hash
        if not chain or parent != head:
            raise CheckpointCorrupted(f"{where}: part '{name}' is missing blobs; {RESTORE}")

    def _decode_whole(self, name: str, head: str, chain: Any, where: str) -> Any:
        if len(chain) != 1:
            raise CheckpointCorrupted(f"{where}: part '{name}' has segments but is not a list")
        self._cache[name] = PartCache(head=head)
        return self.serializer.decode_value(chain[0].data)

    def _decode_list(self, name: str, head: str, chain: Any, where: str) -> list[Any]:
        from ..codec import MAX_RECORD_BYTES

        ser = self.serializer
        bodies, count, size = [], 0, 0
        for blob in chain:
            segment = ser.decode_value(blob.data)
            # Every item takes at least one byte: a count above the segment's length is a lie.
            if not (type(segment) is list and len(segment) == 2 and type(segment[0]) is int
                    and type(segment[1]) is bytes and 0 <= segment[0] <= len(segment[1])):
                raise CheckpointCorrupted(f"{where}: part '{name}' has a malformed segment; {RESTORE}")
            count += segment[0]
            size += len(segment[1])
            if size > MAX_RECORD_BYTES - 5:  # refused before joining them, not after
                raise CheckpointCorrupted(f"{where}: part '{name}' adds up to more than MAX_RECORD_BYTES")
            bodies.append(segment[1])
        raw = b"".join(bodies)
        items = ser.unpack(array_head(count) + raw)
        if type(items) is not list or len(items) != count:
            raise CheckpointCorrupted(f"{where}: part '{name}' segments do not add up to its items")
        self._cache[name] = PartCache(head=head, raw=raw, count=count, links=len(chain))
        return items


_BOUND = ("checkpoint ID", "version", "step", "status", "fingerprint", "error", "origin")


def binding(meta: CheckpointMeta) -> list[Any]:
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


def array_head(count: int) -> bytes:
    if count < 16:
        return bytes([0x90 | count])
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


