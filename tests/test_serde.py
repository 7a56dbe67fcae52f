"""The checkpoint codec (waypoint.engine.codec.serde): round trips, registration, errors, envelope, hardening."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import enum
import hashlib
import hmac
import importlib
import math
import re
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, time, timedelta, timezone, tzinfo
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import msgpack
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from waypoint.engine.codec import serde
from waypoint.engine.errors import CheckpointCorrupted, SerializationError, WaypointError
from waypoint.engine.codec.serde import (
    ExtCode,
    Serializer,
    TypeRegistry,
    UnknownType,
    UnsupportedFormat,
    decode_value,
    dumps,
    encode_value,
    loads,
    register_type,
)

KEY = b"k" * 32


def same(a: Any, b: Any) -> bool:
    """Equal, and of exactly the same types all the way down (tzinfo, fold, -0.0 and NaN included)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (float, Decimal, datetime, time)):
        return repr(a) == repr(b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (set, frozenset)):
        twins = {y: y for y in b}
        return len(a) == len(b) and all(x in twins and same(x, twins[x]) for x in a)
    if isinstance(a, dict):
        twins = {k: k for k in b}
        return len(a) == len(b) and all(k in twins and same(k, twins[k]) and same(v, b[k]) for k, v in a.items())
    return a == b


def roundtrip(value: Any, serializer: Serializer | None = None) -> Any:
    s = serializer or serde.default_serializer
    return s.loads(s.dumps(value))


def record(header: dict[str, Any], body: bytes, *, key: bytes | None = None) -> bytes:
    """Build a record by hand from the layout documented in docs/codec.md."""
    head = msgpack.packb(header)
    signed = b"WPT" + len(head).to_bytes(2, "big") + head + body
    if key is not None:
        return signed + hmac.new(key, signed, hashlib.sha256).digest()
    return signed + zlib.crc32(signed).to_bytes(4, "big")


# --- built-in types ----------------------------------------------------------------------------

SCALARS = [None, True, False, 0.0, -0.0, 1.5, float("inf"), float("-inf"), float("nan"), "", "héllo ✓"]
STRINGS = ["lone \ud800 surrogate", b"", b"\x00\xff" * 10]
INTS = [0, 1, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 10**100, -(10**300)]
CONTAINERS = [[], (), {}, set(), frozenset(), [1, "a"], (1, "a"), (1,), {1, 2}, frozenset({"a", (1, 2)})]
MAPS = [{"a": 1, 2: "b", (1, "x"): [3], None: 0, 1.5: 2, frozenset({1}): b"", date(2020, 1, 1): ()}]
DATETIMES = [
    datetime(2024, 5, 1, 12, 30, 45, 123456),
    datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc),
    datetime(2024, 5, 1, 12, 30, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(2024, 5, 1, 12, 30, tzinfo=timezone(timedelta(hours=-3), "BRT")),
    datetime(2024, 5, 1, tzinfo=timezone(timedelta(seconds=1, microseconds=7))),
    datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=ZoneInfo("America/New_York")),
    datetime(2024, 11, 3, 1, 30, fold=0, tzinfo=ZoneInfo("America/New_York")),
    datetime.min,
    datetime.max,
]
OTHER_TIMES = [
    date(2024, 2, 29),
    date.min,
    date.max,
    time(23, 59, 59, 999999),
    time(1, 2, tzinfo=timezone(timedelta(hours=-1))),
    time(1, 2, tzinfo=ZoneInfo("Europe/Paris")),
    timedelta(0),
    timedelta(days=-3, seconds=5, microseconds=7),
    timedelta.max,
    timedelta.min,
]
NUMBERS = [UUID("12345678-1234-5678-1234-567812345678"), Decimal("0"), Decimal("-0"), Decimal("1.2300E+5")]
DECIMALS = [
    Decimal("3.14159265358979323846264338327950288"),
    Decimal("NaN"),
    Decimal("-Infinity"),
    Decimal("sNaN"),
]
BUILTINS = SCALARS + STRINGS + INTS + CONTAINERS + MAPS + DATETIMES + OTHER_TIMES + NUMBERS + DECIMALS


@pytest.mark.parametrize("value", BUILTINS, ids=lambda v: type(v).__name__)  # repr of a set varies by run
def test_builtin_values_round_trip_with_their_exact_types(value: Any) -> None:
    assert same(roundtrip(value), value)


def test_nested_containers_keep_tuples_tuples_and_lists_lists() -> None:
    value = {
        "state": ([{"k": (1, [2, (3, {4})])}], frozenset({(1, 2), ("a", (None,))})),
        (1, (2, 3)): {date(2020, 1, 1): [UUID(int=5), Decimal("1.5")]},
        7: [[], (), [()], ([],)],
    }
    out = roundtrip(value)
    assert same(out, value)
    assert type(out["state"]) is tuple and type(out["state"][0]) is list


def test_utc_comes_back_as_the_utc_singleton() -> None:
    assert roundtrip(datetime(2024, 1, 1, tzinfo=timezone.utc)).tzinfo is timezone.utc


def test_zoneinfo_comes_back_by_key() -> None:
    out = roundtrip(datetime(2024, 7, 1, 9, tzinfo=ZoneInfo("Asia/Tokyo")))
    assert out.tzinfo is ZoneInfo("Asia/Tokyo")


def test_bytes_like_values_are_written_as_bytes() -> None:
    assert roundtrip([bytearray(b"ab"), memoryview(b"cd")]) == [b"ab", b"cd"]


# --- registered types --------------------------------------------------------------------------


@register_type(name="tests.serde.Meta")
@dataclasses.dataclass
class Meta:
    source: str
    tags: tuple[str, ...] = ()


@register_type
class Role(enum.Enum):
    USER = "user"
    TOOL = ("tool", 1)


@register_type
class Message(pydantic.BaseModel):
    role: Role
    text: str
    meta: Meta | None = None
    sent: datetime | None = None
    call_id: str = pydantic.Field(default="", alias="callId")


def test_pydantic_model_with_nested_registered_types_round_trips() -> None:
    msg = Message(role=Role.TOOL, text="hi", meta=Meta("x", ("a",)), sent=datetime(2024, 1, 1), callId="c1")
    out = roundtrip({"messages": [msg, msg]})
    assert out == {"messages": [msg, msg]}
    assert type(out["messages"][0].meta) is Meta and out["messages"][0].meta.tags == ("a",)
    assert out["messages"][0].call_id == "c1"  # stored by field name, validated back despite the alias


def private() -> tuple[TypeRegistry, Serializer]:
    registry = TypeRegistry()
    return registry, Serializer(registry=registry)


def test_pydantic_extra_fields_root_models_and_frozen_models_round_trip() -> None:
    registry, s = private()

    @registry.register
    class Loose(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow", frozen=True)
        a: int

    @registry.register
    class Ids(pydantic.RootModel[list[UUID]]):
        pass

    loose = Loose(a=1, b=(2, 3))  # type: ignore[call-arg]
    ids = Ids([UUID(int=1)])
    assert roundtrip(loose, s) == loose and roundtrip(loose, s).b == (2, 3)
    assert roundtrip(ids, s) == ids


def test_dataclass_init_false_fields_are_restored_after_the_constructor() -> None:
    registry, s = private()

    @registry.register
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Counter:
        name: str
        hits: int = dataclasses.field(init=False, default=0)
        seen: list[str] = dataclasses.field(init=False, default_factory=list)

    counter = Counter(name="n")
    object.__setattr__(counter, "hits", 3)
    counter.seen.append("x")
    out = roundtrip(counter, s)
    assert (out.name, out.hits, out.seen) == ("n", 3, ["x"])


def test_enums_keep_their_class_even_when_they_subclass_int_or_str() -> None:
    registry, s = private()

    @registry.register
    class Level(enum.IntEnum):
        LOW = 1

    @registry.register
    class Mode(enum.StrEnum):
        FAST = "fast"

    registry.register(Role)
    out = roundtrip([Level.LOW, Mode.FAST, Role.TOOL], s)
    assert out == [Level.LOW, Mode.FAST, Role.TOOL]
    assert [type(x) for x in out] == [Level, Mode, Role]


def test_registered_objects_work_as_dict_keys_and_set_members() -> None:
    registry, s = private()
    registry.register(Role)

    @registry.register
    @dataclasses.dataclass(frozen=True)
    class Point:
        x: int
        y: int

    value = {Point(1, 2): {Point(3, 4)}, Role.USER: 1}
    assert same(roundtrip(value, s), value)


# --- registration ------------------------------------------------------------------------------


def test_register_type_works_as_function_and_both_decorator_forms() -> None:
    registry = TypeRegistry()

    @registry.register
    @dataclasses.dataclass
    class A:
        x: int

    @registry.register(name="custom.b")
    @dataclasses.dataclass
    class B:
        x: int

    @dataclasses.dataclass
    class C:
        x: int

    assert registry.register(C, "custom.c") is C
    assert registry.name_of(A) == f"{__name__}.{A.__qualname__}"
    assert registry.name_of(B) == "custom.b" and registry.type_named("custom.c") is C

    @register_type(name="tests.serde.decorated")
    @dataclasses.dataclass
    class D:
        x: int

    assert serde.default_registry.name_of(D) == "tests.serde.decorated"
    assert roundtrip(D(1)) == D(1)


def test_re_registering_the_same_class_is_a_no_op() -> None:
    registry = TypeRegistry()

    @dataclasses.dataclass
    class A:
        x: int

    registry.register(A, "a")
    assert registry.register(A, "a") is A
    assert registry.register(A) is A  # no name: keep the existing one
    assert registry.name_of(A) == "a"


def test_two_classes_under_one_name_is_an_error_naming_both() -> None:
    registry = TypeRegistry()

    @dataclasses.dataclass
    class First:
        x: int

    @dataclasses.dataclass
    class Second:
        x: int

    registry.register(First, "shared")
    with pytest.raises(SerializationError, match=r"'shared'.*First"):
        registry.register(Second, "shared")
    with pytest.raises(SerializationError, match="already registered as 'shared'"):
        registry.register(First, "other")

    def define() -> type:  # the same class statement run twice: a reloaded module, a notebook cell
        @dataclasses.dataclass
        class Again:
            x: int

        return Again

    registry.register(define())
    with pytest.raises(SerializationError, match="defined twice"):
        registry.register(define())


def test_only_models_dataclasses_and_enums_can_be_registered() -> None:
    class Plain:
        pass

    with pytest.raises(SerializationError, match="only pydantic models, dataclasses and Enum"):
        TypeRegistry().register(Plain)
    with pytest.raises(SerializationError, match="put @register_type above @dataclass"):

        @dataclasses.dataclass
        @TypeRegistry().register
        class Wrong:
            x: int

    with pytest.raises(SerializationError, match=r"@register_type\(name='x'\)"):
        TypeRegistry().register("x")  # type: ignore[call-overload]


# --- write-time errors -------------------------------------------------------------------------


@dataclasses.dataclass
class NotRegistered:
    note: str


def test_unregistered_type_fails_at_write_time_with_type_path_and_fix() -> None:
    state = {"messages": [1, 2, 3, Message(role=Role.USER, text="x", meta=None)]}
    state["messages"][3].__dict__["meta"] = NotRegistered("n")  # smuggle it past validation
    with pytest.raises(SerializationError) as caught:
        dumps(state, root="state")
    message = str(caught.value)
    assert f"{__name__}.NotRegistered" in message
    assert "state['messages'][3].meta" in message
    assert "register_type(NotRegistered)" in message and "@register_type" in message


def test_unwritable_objects_dict_keys_and_subclasses_are_located() -> None:
    with pytest.raises(SerializationError, match=r"value\[0\]\[1\]: builtins.object is not a type"):
        dumps([(1, object())])
    with pytest.raises(SerializationError, match=r"value<key .*>\[2\]<element 0>: builtins.object"):
        dumps({"fine": 1, frozenset({1}): {}, (1, Role.USER, frozenset({object()})): 2})

    class SubMeta(Meta):
        pass

    with pytest.raises(SerializationError, match=r"base class is registered as 'tests\.serde\.Meta'"):
        dumps(SubMeta("x"))


def test_unsupported_tzinfo_cycles_and_excess_depth_fail_at_write_time() -> None:
    class Custom(tzinfo):
        def utcoffset(self, dt: Any) -> timedelta:
            return timedelta(0)

    with pytest.raises(SerializationError, match=r"value\['t'\]: its tzinfo .*Custom"):
        dumps({"t": time(1, tzinfo=Custom())})
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(SerializationError, match="cycle"):
        dumps({"a": loop})
    deepest_ok: Any = None
    for _ in range(1023):
        deepest_ok = [deepest_ok]
    out, depth = roundtrip(deepest_ok), 0
    while out is not None:  # == on 1023 nested lists would hit Python's recursion limit
        out, depth = out[0], depth + 1
    assert depth == 1023
    with pytest.raises(SerializationError, match="1023"):
        dumps([deepest_ok])  # would be 1024 deep: msgpack could write it but not read it back


def test_subclasses_of_builtin_containers_are_refused_not_silently_converted() -> None:
    from collections import OrderedDict

    with pytest.raises(SerializationError, match=r"collections\.OrderedDict"):
        dumps(OrderedDict(a=1))


# --- the envelope ------------------------------------------------------------------------------


def test_record_layout_matches_the_documentation() -> None:
    data = dumps({"a": 1})
    assert data[:3] == b"WPT"
    size = int.from_bytes(data[3:5], "big")
    assert msgpack.unpackb(data[5 : 5 + size]) == {"format": 1, "check": "crc32", "enc": False}
    assert msgpack.unpackb(data[5 + size : -4]) == {"a": 1}
    assert data[-4:] == zlib.crc32(data[:-4]).to_bytes(4, "big")
    assert record({"format": 1, "check": "crc32", "enc": False}, msgpack.packb([1])) == dumps([1])
    signed = record({"format": 1, "check": "hmac-sha256", "enc": False}, msgpack.packb([1]), key=KEY)
    assert signed == Serializer(key=KEY).dumps([1])


def test_every_truncation_is_detected() -> None:
    data = dumps({"messages": ["hello", (1, 2)], "at": datetime(2024, 1, 1)})
    for end in range(len(data)):
        with pytest.raises(CheckpointCorrupted):
            loads(data[:end])


def test_every_single_bit_flip_is_detected() -> None:
    data = dumps({"messages": ["hello", (1, 2)], "n": 2**70})
    for i in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[i // 8] ^= 1 << (i % 8)
        with pytest.raises(CheckpointCorrupted):
            loads(bytes(flipped))


@pytest.mark.parametrize(
    "junk", [b"", b"W", b"WPT", b"WPT\x00", b"WPT\xff\xff", b"\x00" * 64, b"PK\x03\x04" + b"x" * 40]
)
def test_junk_bytes_are_corrupted_records(junk: bytes) -> None:
    with pytest.raises(CheckpointCorrupted):
        loads(junk)


def test_loads_refuses_non_bytes_as_a_usage_error() -> None:
    with pytest.raises(TypeError, match="expected bytes"):
        loads("WPT")  # type: ignore[arg-type]


def test_newer_format_raises_unsupported_format_with_upgrade_advice() -> None:
    data = record({"format": 7, "check": "crc32", "enc": False}, msgpack.packb(1))
    with pytest.raises(UnsupportedFormat) as caught:
        loads(data)
    assert str(caught.value) == (
        "checkpoint format 7 is newer than this Waypoint (knows up to 1); upgrade waypoint-graph to read it"
    )
    assert caught.value.format == 7 and isinstance(caught.value, CheckpointCorrupted)


@pytest.mark.parametrize(
    "header",
    [
        {"format": 0, "check": "crc32"},
        {"check": "crc32"},
        {"format": "1", "check": "crc32"},
        {"format": 1, "check": "md5"},
        {"format": 1, "check": "crc32", "enc": 1},
        [1],
    ],
)
def test_invalid_headers_are_corrupted(header: Any) -> None:
    with pytest.raises(CheckpointCorrupted):
        loads(record(header, msgpack.packb(1)))


# --- signing and encryption --------------------------------------------------------------------


def test_signed_records_round_trip_and_a_wrong_key_fails_the_signature() -> None:
    data = Serializer(key=KEY).dumps({"a": (1, 2)})
    assert Serializer(key=KEY).loads(data) == {"a": (1, 2)}
    with pytest.raises(CheckpointCorrupted, match="signature") as caught:
        Serializer(key=b"other key").loads(data)
    assert "key" in str(caught.value) and "differ" in str(caught.value)


def test_a_tampered_signed_record_fails_even_with_a_valid_looking_body() -> None:
    signed = Serializer(key=KEY)
    data = bytearray(signed.dumps({"role": "user"}))
    data[data.index(b"user")] = ord("r")
    with pytest.raises(CheckpointCorrupted, match="signature"):
        signed.loads(bytes(data))


def test_signing_cannot_be_stripped_or_skipped() -> None:
    unsigned = dumps({"admin": True})
    with pytest.raises(CheckpointCorrupted, match="not signed"):
        Serializer(key=KEY).loads(unsigned)
    with pytest.raises(CheckpointCorrupted, match="key="):
        loads(Serializer(key=KEY).dumps(1))


def _xor(data: bytes) -> bytes:
    return bytes(b ^ 0x5A for b in data)


def test_encryption_hooks_transform_the_body_and_leave_the_header_readable() -> None:
    crypt = Serializer(encrypt=_xor, decrypt=_xor)
    data = crypt.dumps({"secret": "s3cr3t"})
    assert b"s3cr3t" not in data
    size = int.from_bytes(data[3:5], "big")
    assert msgpack.unpackb(data[5 : 5 + size])["enc"] is True
    assert crypt.loads(data) == {"secret": "s3cr3t"}
    signed_crypt = Serializer(key=KEY, encrypt=_xor, decrypt=_xor)
    assert signed_crypt.loads(signed_crypt.dumps((1, 2))) == (1, 2)


def test_encrypted_record_without_decrypt_hook_fails_clearly() -> None:
    data = Serializer(encrypt=_xor, decrypt=_xor).dumps(1)
    with pytest.raises(CheckpointCorrupted, match=r"encrypted.*no decrypt hook"):
        loads(data)


def test_failing_decrypt_hook_is_a_corrupted_record() -> None:
    def refuse(_: bytes) -> bytes:
        raise ValueError("bad tag")

    data = Serializer(encrypt=_xor, decrypt=_xor).dumps(1)
    with pytest.raises(CheckpointCorrupted, match=r"decrypt hook failed.*bad tag"):
        Serializer(encrypt=_xor, decrypt=refuse).loads(data)


def test_serializer_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="together"):
        Serializer(encrypt=_xor)
    with pytest.raises(ValueError, match="non-empty bytes"):
        Serializer(key=b"")
    with pytest.raises(ValueError, match="non-empty bytes"):
        Serializer(key="text")  # type: ignore[arg-type]


# --- envelope-free values ----------------------------------------------------------------------


def test_encode_value_is_the_bare_body() -> None:
    blob = encode_value({"a": (1, 2)})
    assert not blob.startswith(b"WPT")
    assert decode_value(blob) == {"a": (1, 2)}
    with pytest.raises(CheckpointCorrupted):
        decode_value(blob[:-1])


def test_encode_value_still_signs_and_encrypts_when_configured() -> None:
    s = Serializer(key=KEY, encrypt=_xor, decrypt=_xor)
    blob = s.encode_value("s3cr3t")
    assert b"s3cr3t" not in blob and s.decode_value(blob) == "s3cr3t"
    with pytest.raises(CheckpointCorrupted, match="signature"):
        s.decode_value(bytes([blob[0] ^ 1]) + blob[1:])
    with pytest.raises(CheckpointCorrupted):
        s.loads(blob)  # a value blob never passes as a record


def test_pack_is_the_unprotected_body_for_parts_nested_in_a_protected_blob() -> None:
    s = Serializer(key=KEY, encrypt=_xor, decrypt=_xor)
    items = [s.pack({"turn": i, "text": "s3cr3t"}) for i in range(3)]
    assert items[0] == msgpack.packb({"turn": 0, "text": "s3cr3t"})  # plain msgpack: compare, concatenate
    segment = s.encode_value(items)
    assert b"s3cr3t" not in segment
    assert [s.unpack(item) for item in s.decode_value(segment)] == [
        {"turn": i, "text": "s3cr3t"} for i in range(3)
    ]
    with pytest.raises(CheckpointCorrupted):
        s.unpack(b"\xc1")
    with pytest.raises(SerializationError, match=r"run\.messages\[2\]: builtins\.object"):
        s.pack([1, 2, object()], root="run.messages")


# --- decoding never runs code named by the data ------------------------------------------------

CONSTRUCTED: list[str] = []


def test_unknown_type_name_on_read_says_to_register_before_resuming() -> None:
    elsewhere = TypeRegistry()

    @elsewhere.register(name="app.Ghost")
    @dataclasses.dataclass
    class Ghost:
        x: int

    with pytest.raises(UnknownType) as caught:
        loads(Serializer(registry=elsewhere).dumps([Ghost(1)]))
    assert caught.value.type_name == "app.Ghost"
    assert "app.Ghost" in str(caught.value) and "register" in str(caught.value) and "resum" in str(caught.value)


def test_decoding_imports_and_calls_nothing_named_by_the_data() -> None:
    other = TypeRegistry()

    @other.register(name="os.system")
    @dataclasses.dataclass
    class Trap:
        command: str

        def __post_init__(self) -> None:
            CONSTRUCTED.append(self.command)

    @other.register(name="builtins.eval")
    class Trap2(pydantic.BaseModel):
        source: str

        @pydantic.field_validator("source")
        @classmethod
        def record(cls, value: str) -> str:
            CONSTRUCTED.append(value)
            return value

    crafted = [Serializer(registry=other).dumps(v) for v in (Trap("touch /tmp/pwned"), [Trap2(source="1+1")])]
    CONSTRUCTED.clear()
    imports: list[str] = []

    def no_import(name: str, *args: Any, **kwargs: Any) -> Any:
        imports.append(name)
        raise AssertionError(f"loads tried to import {name}")

    errors = []
    real_import, real_import_module = builtins.__import__, importlib.import_module
    builtins.__import__, importlib.import_module = no_import, no_import  # type: ignore[assignment]
    try:
        for data in crafted:
            try:
                loads(data)
            except UnknownType as exc:
                errors.append(exc.type_name)
    finally:
        builtins.__import__, importlib.import_module = real_import, real_import_module
    assert errors == ["os.system", "builtins.eval"]
    assert imports == [] and CONSTRUCTED == []


def test_stored_data_the_class_no_longer_accepts_is_a_corrupted_record() -> None:
    old, new = TypeRegistry(), TypeRegistry()

    @old.register(name="app.Item")
    @dataclasses.dataclass
    class OldItem:
        x: int

    @new.register(name="app.Item")
    class NewItem(pydantic.BaseModel):
        y: int

    with pytest.raises(CheckpointCorrupted, match=r"'app\.Item' does not rebuild .*NewItem"):
        Serializer(registry=new).loads(Serializer(registry=old).dumps(OldItem(1)))


def test_concurrent_dumps_from_many_threads_do_not_mix_buffers() -> None:
    values = [{"i": i, "payload": "x" * (i * 997 % 5000), "t": (i,)} for i in range(200)]
    barrier = threading.Barrier(8)

    def work(v: dict[str, Any]) -> bool:
        if v["i"] < 8:
            barrier.wait()
        return roundtrip(v) == v

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(work, values))


def test_python_blocks_in_docs_codec_md_run() -> None:
    text = (Path(__file__).parents[1] / "docs" / "codec.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/codec.md", "exec", dont_inherit=True), {"__name__": "docs_codec"})


def test_public_names_exist() -> None:
    assert all(hasattr(serde, name) for name in serde.__all__)
    assert ExtCode.TUPLE == 16 and ExtCode.REGISTERED == 23


# --- properties --------------------------------------------------------------------------------

fixed_offsets = st.builds(
    timezone, st.timedeltas(min_value=timedelta(hours=-23, minutes=-59), max_value=timedelta(hours=23, minutes=59))
)
named_offsets = st.builds(
    timezone, st.timedeltas(timedelta(hours=-12), timedelta(hours=12)), st.text(min_size=1, max_size=5)
)
tzinfos = st.none() | st.just(timezone.utc) | fixed_offsets | named_offsets | st.timezones()
hashable_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**200), max_value=2**200)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=tzinfos)
    | st.dates()
    | st.times(timezones=tzinfos)
    | st.timedeltas()
    | st.uuids()
    | st.decimals(allow_nan=False)
)
hashables = st.recursive(
    hashable_leaves, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=6
)
leaves = hashable_leaves | st.floats() | st.decimals()  # NaNs are fine outside sets and keys
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(hashables, inner, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
    ),
    max_leaves=25,
)
MODEST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@MODEST
@given(values)
def test_property_any_nested_value_round_trips(value: Any) -> None:
    assert same(roundtrip(value), value)
    assert same(decode_value(encode_value(value)), value)


@MODEST
@given(st.binary(max_size=300))
def test_property_random_bytes_raise_only_waypoint_errors(junk: bytes) -> None:
    for attempt in (junk, b"WPT" + junk):  # never a record: no header, or a checksum that cannot match
        with pytest.raises(WaypointError):
            loads(attempt)


@MODEST
@given(st.binary(max_size=300))
def test_property_random_bodies_behind_a_valid_checksum_raise_only_waypoint_errors(body: bytes) -> None:
    # The checksum stops random damage long before the decoder; this feeds the decoder directly. A body is
    # either refused with a WaypointError or is one whole msgpack document — never anything msgpack rejects.
    for decode in (lambda: loads(record({"format": 1, "check": "crc32", "enc": False}, body)),
                   lambda: decode_value(body)):
        try:
            decode()
        except WaypointError:
            continue
        msgpack.unpackb(body, raw=False, strict_map_key=False)


@MODEST
@given(values, st.data())
def test_property_mutated_records_raise_only_waypoint_errors(value: Any, data: st.DataObject) -> None:
    keyed = Serializer(key=KEY)
    for serializer in (serde.default_serializer, keyed):
        original = serializer.dumps(value)
        mutated = bytearray(original)
        for _ in range(data.draw(st.integers(1, 4))):
            action = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
            at = data.draw(st.integers(0, max(len(mutated) - 1, 0)))
            if action == "flip" and mutated:
                mutated[at] ^= data.draw(st.integers(1, 255))
            elif action == "cut":
                del mutated[at:]
            elif action == "insert":
                mutated[at:at] = data.draw(st.binary(min_size=1, max_size=8))
            elif mutated:
                del mutated[at]
        try:
            serializer.loads(bytes(mutated))
        except WaypointError:
            continue
        assert bytes(mutated) == original or serializer is not keyed  # a keyed record never survives tampering


_markers = st.sampled_from([msgpack.ExtType(code, b"") for code in range(16, 24)])
hostile = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.builds(msgpack.ExtType, st.integers(0, 30), st.binary(max_size=20))
    | _markers,
    lambda inner: (
        st.lists(inner, max_size=6)
        | st.tuples(_markers, st.lists(inner, max_size=8)).map(lambda t: [t[0], *t[1]])
        | st.dictionaries(st.text(max_size=3) | st.integers(0, 5), inner, max_size=4)
    ),
    max_leaves=30,
)


@MODEST
@given(hostile)
def test_property_well_formed_but_hostile_msgpack_raises_only_waypoint_errors(value: Any) -> None:
    # Valid msgpack using our ext codes and markers in every wrong way: bad payloads, wrong arity.
    with contextlib.suppress(WaypointError):
        decode_value(msgpack.packb(value, use_bin_type=True))


def test_nan_and_signed_zero_survive() -> None:
    out = roundtrip([float("nan"), -0.0, Decimal("-0")])
    assert math.isnan(out[0]) and math.copysign(1, out[1]) == -1 and str(out[2]) == "-0"


def test_header_with_an_unhashable_check_field_is_corrupted_not_a_type_error():
    """Found by the mutation property test: a damaged header whose "check" decodes to a list."""
    import zlib

    import msgpack

    header = msgpack.packb({"format": 1, "check": [1], "enc": False})
    record = b"WPT" + len(header).to_bytes(2, "big") + header + b"\x01"
    record += zlib.crc32(record).to_bytes(4, "big")
    with pytest.raises(CheckpointCorrupted, match="header is invalid"):
        loads(record)
