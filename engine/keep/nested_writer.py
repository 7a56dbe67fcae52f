"""How `Checkpointer` writes nested runs' progress as parts of their own (the encoding: engine/keep/nested_parts.py)
and reads it back in this process. A mixin: the attributes it uses are `Checkpointer`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..run import RunPosition
from .content import join_state, position_from_plain, position_to_plain, split_state
from .nested_parts import ListBytes, NestedRun, nested_key
from .reading import PartCache, array_head
from .store import MAX_PART_NAME, MAX_PARTS, Blob

if TYPE_CHECKING:
    from ..codec import Serializer

__all__ = ["NestedWriter"]


class NestedWriter:
    """Nested runs' steps as parts of the root's versions (`Checkpointer` is one)."""

    serializer: Serializer
    _cache: dict[str, PartCache]
    _known: set[str]

    def nested(self, address: str, pos: RunPosition) -> NestedRun:
        """A nested run's finished step as parts of its own: only what changed since its last step is new. The
        root's next version writes them (`_place_nested`)."""
        key = nested_key(address)
        blobs: list[Blob] = []
        data: dict[str, Any] = {}
        kind, fields = split_state(pos.state, self.serializer, room=MAX_PART_NAME - len(key) - 3)
        small = {name: value for name, value in fields.items() if _small(value)}
        head = {"address": address, "run": position_to_plain(pos), "state": kind, "fields": small}
        parts = {key: self._whole(key, head, blobs, data)}
        lists = []
        for name, value in fields.items():
            part = f"{key}:s:{name}"
            if name in small:
                continue
            if type(value) is list:
                parts[part] = self._list(part, value, blobs)
                lists.append(part)
                cached = self._cache[part]
                data[part] = ListBytes(cached.count, cached.raw or b"", cached.tail, len(cached.tail or ()))
            else:
                parts[part] = self._whole(part, value, blobs, data)
        return NestedRun(address=address, key=key, parts=parts, lists=lists, data=data, blobs=blobs)

    def _place_nested(self, pos: RunPosition, parts: dict[str, str], lists: list[str], blobs: list[Blob],
                      rewrite: bool) -> tuple[dict[str, Any], list[NestedRun]]:
        """The root position's `nested` map as stored, each nested run's parts and new blobs added to the version's.
        One that would take the version past `MAX_PARTS`, or whose prefix is taken, is stored whole (bytes)."""
        placed: dict[str, Any] = {}
        runs: list[NestedRun] = []
        sent = {b.hash for b in blobs}
        for address, entry in pos.nested.items():
            if not isinstance(entry, NestedRun):  # read from a version written before format 3
                placed[address] = entry
                continue
            if entry.key in parts or len(parts) + len(entry.parts) > MAX_PARTS - 1:  # 1: the run part
                placed[address] = self.snapshot(self.nested_position(entry))
                continue
            waiting = {b.hash for b in entry.blobs}
            if rewrite or any(h not in self._known and h not in waiting for h in entry.parts.values()):
                self._rebuild(entry)  # the store lost blobs of it, or this is another run's ID (a fork)
            parts.update(entry.parts)
            lists.extend(entry.lists)
            for blob in entry.blobs:
                if blob.hash not in self._known and blob.hash not in sent:
                    sent.add(blob.hash)
                    blobs.append(blob)
            placed[address] = entry.key
            runs.append(entry)
        return placed, runs

    def _rebuild(self, entry: NestedRun) -> None:
        """`entry`'s parts written anew from the bytes they hold: a whole part as it is, a list as a chain of one
        segment. Nothing is encoded again."""
        blobs: list[Blob] = []
        for name, held in entry.data.items():
            if isinstance(held, ListBytes):
                raw = held.joined()
                digest = self._hash(None, data := self.serializer.encode_value([held.count, raw]))
                blobs.append(Blob(hash=digest, data=data))
                self._cache[name] = PartCache(head=digest, raw=raw, count=held.count)
                entry.data[name] = ListBytes(held.count, raw, None, 0)
            else:
                digest = self._hash(None, held)
                blobs.append(Blob(hash=digest, data=held))
                self._cache[name] = PartCache(head=digest)
            entry.parts[name] = digest
        entry.blobs = blobs

    def recall(self, entry: NestedRun | bytes) -> RunPosition:
        """A nested run's position as last recorded, to continue it from: a fresh object, the caller's to change."""
        if type(entry) is bytes:  # written before format 3
            return self.from_snapshot(entry)
        if entry.position is not None:
            pos, entry.position = entry.position, None
            return pos
        return self.nested_position(entry)

    def forget(self, entry: Any) -> None:
        """A nested run ended: its parts leave the root's versions, and what this writer kept of them goes."""
        for name in getattr(entry, "parts", ()):
            self._cache.pop(name, None)

    def nested_position(self, entry: NestedRun) -> RunPosition:
        """The position a nested run's parts hold, decoded from the bytes kept of them (a fresh object)."""
        head = self.serializer.decode_value(entry.data[entry.key])
        pos = position_from_plain(head["run"])
        prefix = entry.key + ":s:"
        fields = dict(head["fields"])
        for name, held in entry.data.items():
            if name.startswith(prefix):
                fields[name[len(prefix):]] = self.serializer.unpack(array_head(held.count) + held.joined()) \
                    if isinstance(held, ListBytes) else self.serializer.decode_value(held)
        pos.state = join_state(head["state"], fields, self.serializer)
        return pos


def _small(value: Any) -> bool:
    """A state field kept inside the nested run's own part, not a part of its own: a number, a flag, None, a short
    text — each part costs its name and head twice in every version, more than such a value."""
    return value is None or type(value) in (bool, int, float) or (type(value) is str and len(value) <= 64)
