"""The codec against records built to hurt the reader: hostile headers, hash flooding, oversized values.

Every test crafts bytes an attacker with write access to the store could write, and checks that the
reader answers with `CheckpointCorrupted` (a short message) instead of crashing, hanging or allocating
without bound.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import zlib
from typing import Any
from uuid import UUID

import msgpack
import pytest
from waypoint.engine.codec import serde
from waypoint.engine.errors import CheckpointCorrupted, SerializationError
from waypoint.engine.codec.serde import ExtCode, Serializer, UnsupportedFormat, decode_value, encode_value, loads

KEY = b"k" * 32
P = 2**61 - 1  # CPython hashes ints modulo this prime: n and n + k*P collide


def record(header: Any, body: bytes, *, key: bytes | None = None) -> bytes:
    head = msgpack.packb(header)
    signed = b"WPT" + len(head).to_bytes(2, "big") + head + body
    if key is not None:
        return signed + hmac.new(key, signed, hashlib.sha256).digest()
    return signed + zlib.crc32(signed).to_bytes(4, "big")


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def bigint(n: int) -> msgpack.ExtType:
    return msgpack.ExtType(ExtCode.BIGINT, n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True))


def body_of(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


# --- the envelope header ----------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, KEY], ids=["unsigned", "signed"])
@pytest.mark.parametrize("where", ["check", "format", "enc", "extra"])
def test_a_deeply_nested_header_is_a_short_corrupted_error_not_a_recursion_error(key, where) -> None:
    header = {"format": 1, "check": "crc32", "enc": False}
    header[where] = nested(980)  # fits the 1024-byte header limit, and repr() of it overflows the stack
    assert len(msgpack.packb(header)) <= 1024
    data = record(header, msgpack.packb(1), key=key)
    for reader in (Serializer(key=key), Serializer(key=KEY if key is None else None)):
        try:
            reader.loads(data)  # an unknown extra field in an intact record is harmless
        except CheckpointCorrupted as caught:
            assert len(str(caught)) < 400
        else:
            assert where == "extra" and key is None


def test_with_a_key_a_bad_signature_is_reported_before_anything_in_the_header_is_believed() -> None:
    header = {"format": 1, "check": "hmac-sha256", "enc": nested(970)}
    assert len(msgpack.packb(header)) <= 1024
    forged = record(header, msgpack.packb(1), key=b"other")
    with pytest.raises(CheckpointCorrupted, match="signature"):
        Serializer(key=KEY).loads(forged)
    forged_enc = record({"format": 1, "check": "hmac-sha256", "enc": True}, msgpack.packb(1), key=b"other")
    with pytest.raises(CheckpointCorrupted, match="signature"):  # not "needs a decrypt hook"
        Serializer(key=KEY).loads(forged_enc)


def test_a_newer_format_is_still_named_when_its_trailer_is_not_ours() -> None:
    """A future format may change the trailer; the reader still says "upgrade", not "corrupted"."""
    head = msgpack.packb({"format": 9, "check": "sha3", "enc": False})
    data = b"WPT" + len(head).to_bytes(2, "big") + head + b"\x01" + b"\x00" * 64
    for reader in (Serializer(), Serializer(key=KEY)):
        with pytest.raises(UnsupportedFormat, match="format 9"):
            reader.loads(data)


def test_messages_never_carry_unbounded_stored_text() -> None:
    long_name = "x" * 1_000_000
    registered = [msgpack.ExtType(ExtCode.REGISTERED, b""), long_name, {}]
    zone = [msgpack.ExtType(ExtCode.DATETIME, b""), 2024, 1, 1, 0, 0, 0, 0, 0, "Z" * 100_000]
    bad_tz = [msgpack.ExtType(ExtCode.DATETIME, b""), 2024, 1, 1, 0, 0, 0, 0, 0, [["x" * 100_000]]]
    for value in (registered, zone, bad_tz, [msgpack.ExtType(ExtCode.REGISTERED, b""), nested(900), {}]):
        with pytest.raises(CheckpointCorrupted) as caught:
            decode_value(body_of(value))
        assert len(str(caught.value)) < 1000, str(caught.value)[:200]


# --- hash flooding: many keys with one hash ---------------------------------------------------


def colliding_ints(n: int) -> list[int]:
    return [(i + 1) * P + 7 for i in range(n)]  # all hash to 7; each needs the big-int ext


@pytest.mark.parametrize("kind", ["dict-bigint", "dict-uuid", "frozenset-tuple", "set-bigint", "frozenset-uuid"])
def test_a_map_or_set_of_keys_sharing_one_hash_is_refused_by_structure(kind) -> None:
    """Each such key costs a comparison with every earlier one: 80k of them in 1 MB took ~74 s of CPU."""
    n = 3000
    if kind == "dict-bigint":
        value: Any = {bigint(k): None for k in colliding_ints(n)}
    elif kind == "dict-uuid":
        value = {msgpack.ExtType(ExtCode.UUID, k.to_bytes(16, "big")): 0 for k in colliding_ints(n)}
    elif kind == "frozenset-tuple":
        tuples = [[msgpack.ExtType(ExtCode.TUPLE, b""), bigint(k)] for k in colliding_ints(n)]
        value = [msgpack.ExtType(ExtCode.FROZENSET, b""), *tuples]
    elif kind == "set-bigint":
        value = [msgpack.ExtType(ExtCode.SET, b""), *(bigint(k) for k in colliding_ints(n))]
    else:
        value = [msgpack.ExtType(ExtCode.FROZENSET, b""),
                 *(msgpack.ExtType(ExtCode.UUID, k.to_bytes(16, "big")) for k in colliding_ints(n))]
    body = body_of(value)
    started = time.process_time()  # this process's CPU: what flooding costs, whatever else the machine runs
    with pytest.raises(CheckpointCorrupted, match="hash"):
        decode_value(body)
    assert time.process_time() - started < 0.5


def test_a_map_with_tuple_keys_sharing_one_hash_is_refused() -> None:
    tuple_key = [msgpack.ExtType(ExtCode.TUPLE, b"")]
    packer = msgpack.Packer(use_bin_type=True, strict_types=False)
    keys = [packer.pack([*tuple_key, bigint(k)]) for k in colliding_ints(2000)]
    body = b"\xde" + len(keys).to_bytes(2, "big") + b"".join(k + b"\xc0" for k in keys)
    with pytest.raises(CheckpointCorrupted, match="hash"):
        decode_value(body)


def test_ordinary_maps_with_non_string_keys_still_decode() -> None:
    """What the collision check must never refuse: int keys (n and n + P included), tuples, UUIDs, sets."""
    value = {
        "ints": {i: i for i in range(-3000, 3000)},
        "near": {7: "a", 7 + P: "b", 7 + 2 * P: "c", -1: "d", -2: "e"},  # a few real collisions are fine
        "big": {10**30 + i: i for i in range(500)},
        "tuples": {(i, str(i)): i for i in range(500)},
        "uuids": {UUID(int=i): i for i in range(500)},
        "set": set(range(2000)) | {10**40},
    }
    assert serde.loads(serde.dumps(value)) == value
    assert decode_value(encode_value(value)) == value


def test_the_fast_path_for_string_keys_is_unchanged() -> None:
    value = [{"role": "assistant", "content": "m" * 40, "turn": i} for i in range(200)]
    assert decode_value(encode_value(value)) == value


# --- what one record may cost -----------------------------------------------------------------


def test_the_record_cap_is_small_enough_to_bound_decoding_memory() -> None:
    """A byte of msgpack can become a ~70-byte Python object (an empty map): the cap bounds the total."""
    assert serde.MAX_RECORD_BYTES <= 64 * 1024 * 1024


def test_every_writer_refuses_what_the_reader_would_refuse(monkeypatch) -> None:
    monkeypatch.setattr(serde, "MAX_RECORD_BYTES", 10_000)
    big = "x" * 20_000
    with pytest.raises(SerializationError, match="MAX_RECORD_BYTES"):
        serde.dumps(big)
    with pytest.raises(SerializationError, match="MAX_RECORD_BYTES"):
        encode_value(big)
    with pytest.raises(SerializationError, match="MAX_RECORD_BYTES"):
        serde.default_serializer.pack(big)
    for read in (loads, decode_value, serde.default_serializer.unpack):
        with pytest.raises(CheckpointCorrupted, match="MAX_RECORD_BYTES"):
            read(b"\x00" * 20_000)


def test_unsigned_records_are_refused_before_decoding_when_the_reader_has_a_key() -> None:
    empty_maps = b"\xdd" + (100_000).to_bytes(4, "big") + b"\x80" * 100_000
    data = record({"format": 1, "check": "crc32", "enc": False}, empty_maps)
    with pytest.raises(CheckpointCorrupted, match="not signed"):
        Serializer(key=KEY).loads(data)
    assert len(loads(data)) == 100_000  # the same bytes decode without a key: an unsigned store is trusted
