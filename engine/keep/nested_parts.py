"""A nested run's progress as parts of the root run's version (issue 34 §1).

A run nested in a task (a subgraph node's, an agent used as a tool: engine/compose/nested.py) records each finished
step in the root's checkpoint (`RunPosition.nested`, by the nested run's address). It was one value, the nested
position encoded whole, rewritten into the root's `run` part at every step: an inner conversation of N messages
cost O(N) bytes a step. Now each nested run has parts of its own, named after a hash of its address:

- `n:<hash>` — its position without the state, its state's kind, the address itself (checked on reading, so a
  part cannot be moved to another nested run), and its small state fields (numbers, flags, None, short text);
- `n:<hash>:s:<field>` — one part per other state field; a list is a chain, as a top-level field's is, so a step
  writes only the messages it appended (engine/keep/checkpoint.py, `_list`).

The root's position then names each nested run's parts by their prefix (`nested: {address: "n:<hash>"}`); a version
holding any is header format 3, which a Waypoint that reads only format 2 refuses by name. A nested run that would
take the version past `MAX_PARTS`, or whose hash another address already took, is stored whole as before (bytes),
which every reader still reads.

Each nested step is encoded when the nested run finishes it (`Checkpointer.nested`), not when the root's version is
written: a sibling still running does not leak its half-done step into the version. `NestedRun.data` keeps the
encoded bytes the parts hold, so the run can be read back in this process (`recall`) and its chains written anew
from nothing when the store lost some blobs (a prune that raced the run) or the version goes to another run's ID (a
fork) — without encoding anything again.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field

from ..run import RunPosition
from .store import Blob

__all__ = ["NESTED", "NestedRun", "nested_key", "ListBytes"]

NESTED = "n:"


def nested_key(address: str) -> str:
    """The part-name prefix of the nested run at `address`: 128 bits of its hash (a model's call IDs are in the
    address: a collision must not be computable), in URL-safe base64 (part names are written twice a version)."""
    digest = hashlib.blake2b(address.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return NESTED + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


@dataclass(frozen=True, slots=True)
class ListBytes:
    """A list part's items as encoded, at one write: `raw` and the first `pieces` of `tail` (appended to only, so a
    later write's segments are not part of it), `count` items in all."""

    count: int
    raw: bytes
    tail: list[bytes] | None
    pieces: int

    def joined(self) -> bytes:
        return b"".join([self.raw, *(self.tail or ())[:self.pieces]])


@dataclass(eq=False, kw_only=True)
class NestedRun:
    """A nested run as recorded at its last finished step: the parts it adds to the root's versions."""

    address: str
    key: str
    parts: dict[str, str]
    """Part name -> head hash."""
    lists: list[str]
    data: dict[str, bytes | ListBytes]
    """Part name -> what it holds: a whole part's encoded value, or a list part's items."""
    blobs: list[Blob] = field(default_factory=list)
    """Written since the last version: sent with the next one (those the store already has are not)."""
    position: RunPosition | None = None
    """Read from a store: handed to the first `recall` (later ones decode `data`)."""
