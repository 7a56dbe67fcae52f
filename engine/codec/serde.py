"""The checkpoint codec: msgpack values in a versioned, checksummed (optionally signed and encrypted) record.

A record (docs/codec.md draws it)::

    b"WPT" | header length: u16 big-endian | header: msgpack map | body | trailer

The header is `{"format": 1, "check": "crc32" | "hmac-sha256", "enc": bool}`; the trailer is the
CRC-32 (4 bytes) or HMAC-SHA256 (32 bytes) of every byte before it; the body is the msgpack value,
passed through the `encrypt` hook when one is configured.

Guarantees:

1. `dumps(v)` returns bytes that `loads` (same registry, key and hooks) turns into a value equal to
   `v` with the same types all the way down, or raises `SerializationError` naming the offending
   type, where it sits inside `v`, and the fix. Nothing unwritable is discovered at resume time.
2. `loads` never imports, looks up or calls anything named by the data, except classes registered in
   its `TypeRegistry` (through their own constructor or validator). There is no pickle anywhere.
3. Whatever bytes `loads` is given, it returns a value or raises a `CheckpointCorrupted` subclass
   (`UnsupportedFormat`, `UnknownType`); never a raw msgpack, `ValueError`, `RecursionError`, ....
   The trailer (CRC-32, or the HMAC when the Serializer has a key) is checked before the header is
   believed; error messages quote stored data only clipped to a few hundred characters.
4. Decoding is bounded: records above `MAX_RECORD_BYTES` are refused (and never written), msgpack's
   length limits are the record's own length, nesting is capped by msgpack's fixed stack (1023
   containers; the writer refuses deeper values), and a map or set whose keys pile up on one hash
   value is refused (hash flooding would cost time quadratic in its size).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import zlib
from collections.abc import Callable
from typing import Any, TypeVar, overload

import msgpack

from ..errors import CheckpointCorrupted, SerializationError, WaypointError, clip, describe
from ._types import (
    BUILTIN_BUILDERS,
    BUILTIN_ENCODERS,
    M_REGISTERED,
    ExtCode,
    Marker,
    TypeRegistry,
    Unencodable,
    builtin_encoder,
    check_hashes,
    ext_hook,
    locate,
    qualified_name,
    unregistered_reason,
)

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "MAX_RECORD_BYTES",
    "ExtCode",
    "Serializer",
    "TypeRegistry",
    "UnknownType",
    "UnsupportedFormat",
    "decode_value",
    "default_registry",
    "default_serializer",
    "dumps",
    "encode_value",
    "loads",
    "register_type",
]

C = TypeVar("C", bound=type)

FORMAT_VERSION = 1
"""The record format this codec writes, and the newest it reads."""
MAGIC = b"WPT"
MAX_RECORD_BYTES = 64 * 1024 * 1024
"""Larger records, blobs and packed values are refused on write (SerializationError) and on read
(CheckpointCorrupted). Decoding may take up to ~70 times a record's size in memory (a byte can
become an empty map), so this cap is also what bounds the memory one hostile unsigned record costs."""

_MAX_HEADER = 1024
_VALUE_DOMAIN = b"WPT-value\x00"  # HMAC prefix for encode_value blobs: they can never pass as records


class UnsupportedFormat(CheckpointCorrupted):
    """The record was written by a newer Waypoint, in a format this one cannot read."""

    def __init__(self, format: int, known: int = FORMAT_VERSION) -> None:
        self.format = format
        self.known = known
        super().__init__(
            f"checkpoint format {format} is newer than this Waypoint (knows up to {known}); "
            "upgrade waypoint-graph to read it"
        )


class UnknownType(CheckpointCorrupted):
    """The record holds a registered type whose name is not registered in this process."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name
        shown = clip(repr(type_name))  # the name comes from stored data: quote it, but not unbounded
        super().__init__(
            f"checkpoint holds a value of type {shown}, but no class is registered under that "
            "name in this process; import the module that defines it and register the class "
            f"(@register_type or register_type(cls, name={shown})) before resuming"
        )


# --- the value codec ---------------------------------------------------------------------------


class _Codec:
    """msgpack <-> values for one registry: the `default`, list and ext hooks plus the error-path walk."""

    def __init__(self, registry: TypeRegistry) -> None:
        self.registry = registry
        self._local = threading.local()
        self._options = {
            "ext_hook": ext_hook,
            "list_hook": self._list_hook,
            "raw": False,
            "unicode_errors": "surrogatepass",
            "timestamp": 1,  # a stray msgpack timestamp decodes to a plain float, never a foreign type
        }

    def default(self, obj: Any) -> Any:
        """msgpack's hook for everything it does not pack natively (strict_types: subclasses too)."""
        kind = type(obj)
        encode = BUILTIN_ENCODERS.get(kind) or builtin_encoder(kind)
        if encode is not None:
            return encode(obj)
        entry = self.registry.entry_for_type(kind)
        if entry is not None:
            return [M_REGISTERED, entry.name, entry.dump(obj)]
        how = "register_type" if self.registry is default_registry else "registry.register"
        raise Unencodable(unregistered_reason(kind, self.registry, how))

    def pack(self, value: Any) -> bytes:
        # A reused Packer is ~5x faster than packb on large values (no fresh 1 MiB buffer per call).
        # One per thread; taken while in use so a re-entrant call gets its own.
        packer = getattr(self._local, "packer", None)
        if packer is None:
            packer = msgpack.Packer(
                default=self.default, use_bin_type=True, strict_types=True, unicode_errors="surrogatepass"
            )
        self._local.packer = None
        try:
            # msgpack writes 1024 nested containers but reads only 1023: packing inside a one-element
            # array (header byte 0x91, cut off below) makes the writer refuse what the reader would.
            data: bytes = packer.pack([value])  # Packer.pack empties its buffer itself when it raises
        except BaseException:
            self._local.packer = packer
            raise
        if len(data) <= 8 * 1024 * 1024:  # do not pin a huge buffer to the thread
            self._local.packer = packer
        return data[1:]

    def unpack(self, body: Any) -> Any:
        """Raises only CheckpointCorrupted (or a subclass) on bad input.

        Maps with only str/bytes keys (the usual case) are built by msgpack itself: their hashes are
        keyed per process, so no stored data can make them collide. A body with other keys (ints,
        tuples, ...) is decoded again with a map hook that refuses keys piling up on one hash value.
        """
        try:
            try:
                return msgpack.unpackb(body, strict_map_key=True, **self._options)
            except ValueError as exc:
                if "map key" not in str(exc):
                    raise
            return msgpack.unpackb(body, strict_map_key=False, object_pairs_hook=_checked_map, **self._options)
        except WaypointError:
            raise
        except Exception as exc:  # any decoder or constructor failure means the bytes are bad
            raise CheckpointCorrupted(f"checkpoint body does not decode: {describe(exc)}") from exc

    def _list_hook(self, items: list[Any]) -> Any:
        if not items or type(items[0]) is not Marker:
            return items
        code = items[0].code
        if code == ExtCode.REGISTERED:
            return self._build_registered(items)
        return BUILTIN_BUILDERS[code](items)

    def _build_registered(self, items: list[Any]) -> Any:
        _, name, data = items
        if type(name) is not str:
            raise CheckpointCorrupted(
                f"checkpoint body names a registered type with a {type(name).__name__}, not a str"
            )
        entry = self.registry.entry_named(name)
        if entry is None:
            raise UnknownType(name)
        try:
            return entry.load(data)
        except Exception as exc:  # the class's own constructor/validator rejected the stored data
            raise CheckpointCorrupted(
                f"stored value of type {name!r} does not rebuild {qualified_name(entry.cls)}: "
                f"{describe(exc)} (did the class change since the checkpoint was written?)"
            ) from exc

    def explain(self, value: Any, root: str, cause: BaseException) -> SerializationError:
        """The write-time error for `value`: the failing part's path and the fix, found by a slow walk."""
        found = locate(value, root, self.default, self.registry)
        if found is None and "recursion limit" in str(cause):  # msgpack's nesting limit; too deep to walk
            return SerializationError(
                f"cannot write {root}: it is nested more than 1023 containers deep, or contains itself"
            )
        if found is None:
            return SerializationError(f"cannot write {root}: {type(cause).__name__}: {cause}")
        path, reason = found
        return SerializationError(f"cannot write {path}: {reason}")


def _checked_map(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """msgpack's map hook on the slow path (maps with keys other than str/bytes)."""
    check_hashes([key for key, _ in pairs], "map")
    return dict(pairs)


# --- the record envelope -----------------------------------------------------------------------


class Serializer:
    """Encodes values to checkpoint records and back; thread-safe, cheap to call on every step.

    `key` signs records with HMAC-SHA256 (and then refuses unsigned ones). `encrypt`/`decrypt`
    (given together) transform the body on write/read; the header stays readable so a reader can
    tell it needs them. `registry` defaults to the module's `default_registry`.
    """

    def __init__(
        self,
        *,
        key: bytes | None = None,
        encrypt: Callable[[bytes], bytes] | None = None,
        decrypt: Callable[[bytes], bytes] | None = None,
        registry: TypeRegistry | None = None,
    ) -> None:
        if key is not None and (not isinstance(key, (bytes, bytearray)) or not key):
            raise ValueError("Serializer key must be non-empty bytes (32 random bytes is a good choice)")
        if (encrypt is None) != (decrypt is None):
            raise ValueError("pass encrypt and decrypt together: one without the other writes what it cannot read")
        self._key = bytes(key) if key is not None else None
        self._encrypt = encrypt
        self._decrypt = decrypt
        self._registry = registry if registry is not None else default_registry
        self._codec = _Codec(self._registry)
        check = "hmac-sha256" if self._key else "crc32"
        header = msgpack.packb({"format": FORMAT_VERSION, "check": check, "enc": encrypt is not None})
        self._head = MAGIC + len(header).to_bytes(2, "big") + header

    @property
    def signed(self) -> bool:
        """True when records are signed with an HMAC key (and unsigned ones are refused)."""
        return self._key is not None

    @property
    def registry(self) -> TypeRegistry:
        """The registry this serializer writes and rebuilds registered types with."""
        return self._registry

    def dumps(self, value: Any, *, root: str = "value") -> bytes:
        """Encode `value` as a complete record (magic, header, body, checksum or signature).

        `root` names the value in error messages (paths read `root['messages'][3].meta`).
        Raises `SerializationError` when any part of `value` cannot be written, or when the record
        would be larger than `MAX_RECORD_BYTES`.
        """
        body = self._seal(self._encode(value, root))
        size = len(self._head) + len(body) + (4 if self._key is None else 32)
        if size > MAX_RECORD_BYTES:
            raise _too_large(size, "record", root)
        return b"".join((self._head, body, self._trailer(self._head, body)))

    def loads(self, data: bytes | bytearray | memoryview) -> Any:
        """Decode a record written by `dumps`.

        Raises `CheckpointCorrupted` when the bytes are not an intact record (bad magic, checksum,
        signature, truncation, undecodable body), `UnsupportedFormat` for a newer format, and
        `UnknownType` for a registered type name this process does not know. The trailer is checked
        first, with this Serializer's own setting (HMAC with a key, CRC-32 without): nothing in the
        header is acted upon before it passes.
        """
        view = _as_view(data)
        if len(view) > MAX_RECORD_BYTES:
            raise CheckpointCorrupted(f"checkpoint record is {len(view)} bytes, over MAX_RECORD_BYTES")
        if len(view) < 5 or view[:3] != MAGIC:
            raise CheckpointCorrupted("not a Waypoint checkpoint record (the magic prefix b'WPT' is missing)")
        header_end = 5 + int.from_bytes(view[3:5], "big")
        end = len(view) - self._trailer_len
        if header_end - 5 > _MAX_HEADER or header_end > end:
            raise self._rejection(view, header_end, "checkpoint record is truncated (shorter than its header "
                                  "and trailer) or its header has an impossible length")
        if not hmac.compare_digest(self._trailer(view[:end]), view[end:]):
            raise self._rejection(view, header_end, None)
        encrypted = _read_header(view[5:header_end], "hmac-sha256" if self._key else "crc32")
        body = view[header_end:end]
        if encrypted:
            if self._decrypt is None:
                raise CheckpointCorrupted(
                    "checkpoint record is encrypted but this Serializer has no decrypt hook; "
                    "pass encrypt=/decrypt= to Serializer"
                )
            body = self._open(body)
        return self._codec.unpack(body)

    def encode_value(self, value: Any, *, root: str = "value") -> bytes:
        """Encode one value as a bare blob: no magic, header or checksum (envelope-free).

        For small per-field blobs inside a store record that carries its own checksum. Encryption
        and signing still apply when configured (blob = body, encrypted, then a 32-byte HMAC tag),
        and there is no header to say so: read it back with `decode_value` of a Serializer
        configured the same way. Raises `SerializationError` like `dumps`.
        """
        body = self._seal(self._encode(value, root))
        size = len(body) if self._key is None else len(body) + 32
        if size > MAX_RECORD_BYTES:
            raise _too_large(size, "value blob", root)
        return body if self._key is None else body + self._trailer(_VALUE_DOMAIN, body)

    def decode_value(self, data: bytes | bytearray | memoryview) -> Any:
        """Decode a blob written by `encode_value`; bad input raises `CheckpointCorrupted` (or a subclass)."""
        view = _as_view(data)
        if len(view) > MAX_RECORD_BYTES:
            raise CheckpointCorrupted(f"value blob is {len(view)} bytes, over MAX_RECORD_BYTES")
        if self._key is not None:
            if len(view) < 32:
                raise CheckpointCorrupted("value blob is too short to carry its HMAC signature")
            body, tag = view[:-32], view[-32:]
            if not hmac.compare_digest(self._trailer(_VALUE_DOMAIN, body), tag):
                raise CheckpointCorrupted(_SIGNATURE_FAILED.format(what="value blob"))
            view = body
        if self._decrypt is not None:
            view = self._open(view)
        return self._codec.unpack(view)

    def pack(self, value: Any, *, root: str = "value") -> bytes:
        """The bare msgpack encoding of `value`: no envelope, no signature, no encryption.

        For parts nested inside something that `encode_value` or `dumps` then protects (the items of
        an append segment, say); on its own it is neither checked nor confidential. Deterministic for
        equal values of the same shape (sets excepted), so encodings can be compared.
        Raises `SerializationError` like `dumps`.
        """
        return self._encode(value, root)

    def unpack(self, data: bytes | bytearray | memoryview) -> Any:
        """Decode bytes written by `pack`; bad input raises `CheckpointCorrupted` (or a subclass)."""
        view = _as_view(data)
        if len(view) > MAX_RECORD_BYTES:
            raise CheckpointCorrupted(f"packed value is {len(view)} bytes, over MAX_RECORD_BYTES")
        return self._codec.unpack(view)

    def _encode(self, value: Any, root: str) -> bytes:
        try:
            data = self._codec.pack(value)
        except Exception as exc:  # unregistered type, cycle, too deep, ...: explain with a path
            raise self._codec.explain(value, root, exc) from (None if isinstance(exc, Unencodable) else exc)
        if len(data) > MAX_RECORD_BYTES:  # every writer refuses what every reader would refuse
            raise _too_large(len(data), "value", root)
        return data

    def _seal(self, body: bytes) -> bytes:
        if self._encrypt is None:
            return body
        try:
            sealed = self._encrypt(body)
        except Exception as exc:
            raise SerializationError(f"the encrypt hook failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(sealed, (bytes, bytearray, memoryview)):
            raise SerializationError(f"the encrypt hook must return bytes, got {type(sealed).__name__}")
        return bytes(sealed)

    def _open(self, body: Any) -> Any:
        try:
            opened = self._decrypt(bytes(body))  # type: ignore[misc]  # callers check it is set
        except Exception as exc:
            raise CheckpointCorrupted(
                f"the decrypt hook failed ({describe(exc)}); the record is damaged or was "
                "encrypted with a different key"
            ) from exc
        if not isinstance(opened, (bytes, bytearray, memoryview)):
            raise CheckpointCorrupted(f"the decrypt hook must return bytes, got {type(opened).__name__}")
        return opened

    def _trailer(self, *parts: Any) -> bytes:
        if self._key is not None:
            mac = hmac.new(self._key, digestmod=hashlib.sha256)
            for part in parts:
                mac.update(part)
            return mac.digest()
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        return crc.to_bytes(4, "big")

    def _rejection(self, view: memoryview, header_end: int, reason: str | None) -> CheckpointCorrupted:
        """Why a record failed its trailer check, as precisely as its *unverified* header allows.

        The header is only looked at to choose the message (a newer format, a key mismatch); nothing
        it says is acted upon, and nothing from it is quoted.
        """
        header = _peek_header(view, header_end)
        fmt, check = header.get("format"), header.get("check")
        if type(fmt) is int and fmt > FORMAT_VERSION:
            return UnsupportedFormat(fmt)  # a newer format may lay out its trailer differently
        if self._key is not None and check == "crc32" and _crc_matches(view):
            return CheckpointCorrupted(
                "checkpoint record is not signed, but this Serializer has a key and accepts only records "
                "signed with it (an unsigned record could have been written by anyone)"
            )
        if self._key is None and check == "hmac-sha256":
            return CheckpointCorrupted(
                "checkpoint record is signed (HMAC-SHA256); pass the signing key= to Serializer to read it"
            )
        if reason is not None:
            return CheckpointCorrupted(reason)
        if self._key is not None:
            return CheckpointCorrupted(_SIGNATURE_FAILED.format(what="checkpoint record"))
        return CheckpointCorrupted("checkpoint record fails its CRC-32 checksum: it is corrupted or truncated")

    @property
    def _trailer_len(self) -> int:
        return 4 if self._key is None else 32


_SIGNATURE_FAILED = (
    "{what} failed its HMAC-SHA256 signature check: it was altered, or it was signed with a different "
    "key than this Serializer's (the key may differ between writer and reader)"
)


def _as_view(data: Any) -> memoryview:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    return memoryview(data).cast("B")


def _too_large(size: int, what: str, root: str) -> SerializationError:
    return SerializationError(
        f"cannot write {root}: the {what} would be {size} bytes, over MAX_RECORD_BYTES "
        f"({MAX_RECORD_BYTES} bytes); keep large data outside the run state and store a reference to it"
    )


def _crc_matches(view: memoryview) -> bool:
    return len(view) >= 4 and zlib.crc32(view[:-4]).to_bytes(4, "big") == view[-4:]


def _peek_header(view: memoryview, header_end: int) -> dict[Any, Any]:
    """The header as msgpack reads it, or {} when it does not read as a map; never raises."""
    if header_end - 5 > _MAX_HEADER or header_end > len(view):
        return {}
    try:
        header = msgpack.unpackb(view[5:header_end], raw=False)  # strict map keys: str or bytes only
    except Exception:  # any failure: there is no usable header
        return {}
    return header if type(header) is dict else {}


def _read_header(raw: memoryview, check: str) -> bool:
    """Check a verified header against the trailer kind `check`; returns whether the body is encrypted.

    Refuses newer formats first. Every failure is a `CheckpointCorrupted` that quotes nothing.
    """
    try:
        header = msgpack.unpackb(raw, raw=False)
    except Exception as exc:  # any msgpack failure here means a damaged header
        raise CheckpointCorrupted(f"record header does not decode ({type(exc).__name__})") from None
    fmt = header.get("format") if type(header) is dict else None
    if type(fmt) is not int:
        raise CheckpointCorrupted("checkpoint record header has no format number")
    if fmt > FORMAT_VERSION:
        raise UnsupportedFormat(fmt)
    encrypted = header.get("enc", False)
    if fmt < 1 or type(header.get("check")) is not str or header["check"] != check or type(encrypted) is not bool:
        raise CheckpointCorrupted(
            f"checkpoint record header is invalid: it needs format 1, check {check!r} and a true/false enc"
        )
    return encrypted


# --- module-level defaults ---------------------------------------------------------------------

default_registry = TypeRegistry()
"""The registry `register_type` fills and every Serializer uses unless given another."""
default_serializer = Serializer()
"""An unsigned, unencrypted Serializer over `default_registry`; used by the module-level functions."""


@overload
def register_type(cls: C, name: str | None = None) -> C: ...
@overload
def register_type(cls: None = None, name: str | None = None) -> Callable[[C], C]: ...


def register_type(cls: type | None = None, name: str | None = None) -> Any:
    """Register a pydantic model, dataclass or Enum in `default_registry` under a stable name.

    Use as `register_type(MyClass)`, `register_type(MyClass, name="x")`, `@register_type` or
    `@register_type(name="x")`; returns the class. The name defaults to `module.QualName`; pass one
    explicitly so that moving or renaming the class does not orphan stored checkpoints.
    Raises `SerializationError` on a name clash or an unsupported kind of class.
    """
    return default_registry.register(cls, name)


def dumps(value: Any, *, root: str = "value") -> bytes:
    """`default_serializer.dumps`."""
    return default_serializer.dumps(value, root=root)


def loads(data: bytes | bytearray | memoryview) -> Any:
    """`default_serializer.loads`."""
    return default_serializer.loads(data)


def encode_value(value: Any, *, root: str = "value") -> bytes:
    """`default_serializer.encode_value`: a bare blob with no envelope."""
    return default_serializer.encode_value(value, root=root)


def decode_value(data: bytes | bytearray | memoryview) -> Any:
    """`default_serializer.decode_value`."""
    return default_serializer.decode_value(data)
