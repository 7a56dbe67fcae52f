"""The codec's type tables: built-in types by ext code, and the registry of classes by stable name.

Decoding rebuilds a registered value only through the class found here by name, with the class's own
constructor (dataclasses, enums) or validator (pydantic models); nothing else is looked up, imported
or called. `waypoint.engine.codec.serde` is the public face of this module (docs/codec.md has the tables).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
import re
import sys
import threading
from collections.abc import Callable
from datetime import date, datetime, time, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

import msgpack

from ..errors import CheckpointCorrupted, SerializationError, clip

__all__ = [
    "BUILTIN_BUILDERS",
    "BUILTIN_ENCODERS",
    "builtin_encoder",
    "check_hashes",
    "ExtCode",
    "Marker",
    "M_REGISTERED",
    "RegisteredType",
    "TypeRegistry",
    "Unencodable",
    "ext_hook",
    "is_registrable",
    "locate",
    "qualified_name",
    "unregistered_reason",
]

C = TypeVar("C", bound=type)
Kind = Literal["model", "root_model", "dataclass", "enum"]

_MISSING = object()


def _pydantic() -> Any:
    """pydantic if it is loaded, else None: a class can only be a pydantic model once pydantic is
    imported, so the codec never pays pydantic's import for runs that do not use it."""
    return sys.modules.get("pydantic")


def _is_model(cls: type, root: bool = False) -> bool:
    pd = _pydantic()
    return pd is not None and issubclass(cls, pd.RootModel if root else pd.BaseModel)


MAX_SAME_HASH = 16
"""A decoded map or set may hold at most this many keys with one hash value. Each key that shares
a hash is compared with every earlier one, so a record of colliding keys (big ints `n + k * (2**61 - 1)`,
UUIDs, tuples of them) would cost time quadratic in its size; ordinary keys almost never share one."""


def check_hashes(keys: list[Any], what: str) -> None:
    """Refuse `keys` (of one map or set) when more than MAX_SAME_HASH of them share a hash value."""
    if len(keys) <= MAX_SAME_HASH:
        return
    seen: dict[int, int] = {}
    for key in keys:
        digest = hash(key)
        count = seen.get(digest, 0) + 1
        if count > MAX_SAME_HASH:
            raise CheckpointCorrupted(
                f"checkpoint body holds a {what} with more than {MAX_SAME_HASH} keys sharing one hash value, "
                "a record built to make decoding slow (hash flooding); it was not written by Waypoint"
            )
        seen[digest] = count


def qualified_name(cls: type) -> str:
    """`module.QualName`, the default registered name and the name used in error messages."""
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RegisteredType:
    """One registered class and how its instances are taken apart and rebuilt."""

    cls: type
    """The class itself."""
    name: str
    """The stable name written into checkpoints."""
    kind: Kind
    """Which encoding applies: field map (model, dataclass), root value (root_model) or value (enum)."""
    dump: Callable[[Any], Any]
    """Instance -> plain data (a field map, a root value or an enum value); the codec encodes the rest."""
    load: Callable[[Any], Any]
    """Decoded plain data -> instance, through the class's own constructor or validator."""


class TypeRegistry:
    """Classes the codec may write and rebuild, each under exactly one stable name.

    Pydantic models, dataclasses and `enum.Enum` subclasses can be registered. Registration is
    thread-safe; lookups are plain dict reads.
    """

    def __init__(self) -> None:
        self._by_name: dict[str, RegisteredType] = {}
        self._by_type: dict[type, RegisteredType] = {}
        self._lock = threading.Lock()

    @overload
    def register(self, cls: C, name: str | None = None) -> C: ...
    @overload
    def register(self, cls: None = None, name: str | None = None) -> Callable[[C], C]: ...

    def register(self, cls: type | None = None, name: str | None = None) -> Any:
        """Register `cls` under `name` (default `module.QualName`); also `@register`, `@register(name=...)`.

        Returns the class unchanged. Registering the same class again under the same name (or with no
        name) does nothing. Raises `SerializationError` when the class is not a pydantic model,
        dataclass or Enum, when the name already belongs to another class, or when the class is
        already registered under a different name.
        """
        if cls is None:
            return lambda actual: self.register(actual, name)
        if not isinstance(cls, type):
            raise SerializationError(
                f"register_type expects a class, got {cls!r}; to choose the name write "
                f"@register_type(name={cls!r}) or register_type(MyClass, name=...)"
                if isinstance(cls, str)
                else f"register_type expects a class, got {type(cls).__name__} {cls!r}"
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise SerializationError(
                f"the registered name for {qualified_name(cls)} must be a non-empty str, got {name!r}"
            )
        with self._lock:
            return self._register_locked(cls, name)

    def _register_locked(self, cls: type, name: str | None) -> type:
        existing = self._by_type.get(cls)
        if existing is not None:
            if name is None or name == existing.name:
                return cls
            raise SerializationError(
                f"{qualified_name(cls)} is already registered as {existing.name!r}; a class has one "
                f"name, so it cannot also be registered as {name!r}"
            )
        final = name or qualified_name(cls)
        holder = self._by_name.get(final)
        if holder is not None:
            twice = qualified_name(holder.cls) == qualified_name(cls)
            note = " (the class was defined twice: a reloaded module or a re-run notebook cell?)" if twice else ""
            raise SerializationError(
                f"cannot register {qualified_name(cls)} as {final!r}: that name already belongs to a "
                f"different class, {qualified_name(holder.cls)}{note}; pass a distinct name=... to one of them"
            )
        entry = _entry_for(cls, final)
        self._by_name[final] = entry
        self._by_type[cls] = entry
        return cls

    def name_of(self, cls: type) -> str | None:
        """The name `cls` is registered under, or None."""
        entry = self._by_type.get(cls)
        return entry.name if entry is not None else None

    def type_named(self, name: str) -> type | None:
        """The class registered under `name`, or None. Never imports anything."""
        entry = self._by_name.get(name)
        return entry.cls if entry is not None else None

    def entry_for_type(self, cls: type) -> RegisteredType | None:
        """The registration of exactly `cls` (not of a base class), or None."""
        return self._by_type.get(cls)

    def entry_named(self, name: str) -> RegisteredType | None:
        """The registration under `name`, or None."""
        return self._by_name.get(name)

    def registered_base(self, cls: type) -> RegisteredType | None:
        """The registration of the nearest registered base class of `cls` (for error hints)."""
        for base in cls.__mro__[1:]:
            entry = self._by_type.get(base)
            if entry is not None:
                return entry
        return None


def is_registrable(cls: type) -> bool:
    """True for the kinds of class `TypeRegistry.register` accepts."""
    return issubclass(cls, enum.Enum) or _is_model(cls) or dataclasses.is_dataclass(cls)


def _entry_for(cls: type, name: str) -> RegisteredType:
    if issubclass(cls, enum.Enum):
        return RegisteredType(cls=cls, name=name, kind="enum", dump=_enum_value, load=cls)
    if _is_model(cls, root=True):
        return RegisteredType(cls=cls, name=name, kind="root_model", dump=_root_value, load=cls.model_validate)
    if _is_model(cls):
        return RegisteredType(cls=cls, name=name, kind="model", dump=_model_fields, load=_model_loader(cls))
    if dataclasses.is_dataclass(cls):
        dump, load = _dataclass_codec(cls)
        return RegisteredType(cls=cls, name=name, kind="dataclass", dump=dump, load=load)
    order = " (for a dataclass, put @register_type above @dataclass)" if "__annotations__" in vars(cls) else ""
    raise SerializationError(
        f"cannot register {qualified_name(cls)}: only pydantic models, dataclasses and Enum subclasses "
        f"can be registered{order}; store its data in one of those (or in built-in types) instead"
    )


def _enum_value(member: enum.Enum) -> Any:
    return member.value


def _root_value(model: Any) -> Any:
    return model.root


def _model_fields(model: Any) -> dict[str, Any]:
    """The declared fields (by name) plus any extra fields; private attributes are not stored."""
    values = model.__dict__
    data = {name: values[name] for name in type(model).model_fields if name in values}
    extra = model.__pydantic_extra__
    if extra:
        data.update(extra)
    return data


def _model_loader(cls: Any) -> Callable[[Any], Any]:
    # pydantic validates by alias unless told otherwise; we store fields by *name* (as written in the
    # class), so ask for by-name validation where pydantic supports it (2.11+).
    version = tuple(int(part) for part in _pydantic().VERSION.split(".")[:2])
    by_name = version >= (2, 11)

    def load(data: Any) -> Any:
        if by_name:
            return cls.model_validate(data, by_alias=False, by_name=True)
        return cls.model_validate(data)  # older pydantic: aliased fields need populate_by_name=True

    return load


def _dataclass_codec(cls: type) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """Fields by name. `init=False` fields are stored too and set back after the constructor runs."""
    fields = dataclasses.fields(cls)
    init_names = tuple(f.name for f in fields if f.init)
    late_names = tuple(f.name for f in fields if not f.init)
    known = frozenset(init_names + late_names)

    def dump(obj: Any) -> dict[str, Any]:
        data = {name: getattr(obj, name) for name in init_names}
        for name in late_names:  # an init=False field may legitimately be unset
            value = getattr(obj, name, _MISSING)
            if value is not _MISSING:
                data[name] = value
        return data

    def load(data: Any) -> Any:
        if type(data) is not dict:
            raise TypeError(f"expected a map of fields, got {type(data).__name__}")
        unknown = [key for key in data if key not in known]
        if unknown:
            raise TypeError(f"stored fields {clip(repr(unknown))} are not fields of the class")
        obj = cls(**{name: data[name] for name in init_names if name in data})
        for name in late_names:  # restore state the constructor does not take (frozen-safe)
            if name in data:
                object.__setattr__(obj, name, data[name])
        return obj

    return dump, load


# --- ext codes and markers ---------------------------------------------------------------------


class ExtCode(enum.IntEnum):
    """msgpack ext type codes in checkpoint bodies. They are on disk: never renumber or reuse one.

    Codes 1-15 carry their value in the ext payload. Codes 16-31 are *markers* (empty payload)
    heading an array: `[marker, *parts]`, so containers nest natively with no recursive packing.
    """

    BIGINT = 1  # int outside msgpack's 64-bit range: signed big-endian two's complement
    UUID = 2  # the 16 bytes of UUID.bytes
    DECIMAL = 3  # ASCII str(Decimal), exact (NaN, Infinity and exponents included)
    TUPLE = 16  # [m, *items]
    SET = 17  # [m, *items]
    FROZENSET = 18  # [m, *items]
    DATETIME = 19  # [m, year, month, day, hour, minute, second, microsecond, fold, tz]
    DATE = 20  # [m, proleptic ordinal]
    TIME = 21  # [m, hour, minute, second, microsecond, fold, tz]
    TIMEDELTA = 22  # [m, days, seconds, microseconds]
    REGISTERED = 23  # [m, registered name, data]: field map, RootModel root, or Enum value


# tz is nil (naive), an int (fixed offset in microseconds; 0 is UTC), [offset, name] (a named fixed
# offset) or a str (a zoneinfo key).


class Marker:
    """What a marker ext decodes to; the list hook replaces the array it heads."""

    __slots__ = ("code",)

    def __init__(self, code: int) -> None:
        self.code = code

    def __repr__(self) -> str:
        return f"<waypoint codec marker {ExtCode(self.code).name}>"


_BIGINT, _UUID, _DECIMAL = int(ExtCode.BIGINT), int(ExtCode.UUID), int(ExtCode.DECIMAL)
_MARKERS = {int(code): Marker(int(code)) for code in ExtCode if code >= 16}
_M = {code: msgpack.ExtType(code, b"") for code in _MARKERS}
_M_TUPLE, _M_SET, _M_FROZENSET = _M[ExtCode.TUPLE], _M[ExtCode.SET], _M[ExtCode.FROZENSET]
_M_DATETIME, _M_DATE, _M_TIME = _M[ExtCode.DATETIME], _M[ExtCode.DATE], _M[ExtCode.TIME]
_M_TIMEDELTA, M_REGISTERED = _M[ExtCode.TIMEDELTA], _M[ExtCode.REGISTERED]
_NATIVE = frozenset({type(None), bool, int, float, str, bytes, bytearray, memoryview, msgpack.ExtType})


class Unencodable(Exception):
    """Internal: raised by the default hook; dumps turns it into a SerializationError with a path."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


# --- built-in types: encode --------------------------------------------------------------------


def _encode_tz(tz: Any) -> Any:
    if tz is None:
        return None
    if type(tz) is timezone:
        offset = tz.utcoffset(None)
        micros = offset // timedelta(microseconds=1)
        name = tz.tzname(None)
        return micros if name == timezone(offset).tzname(None) else [micros, name]
    zoneinfo = sys.modules.get("zoneinfo")  # a ZoneInfo can only exist once zoneinfo is imported
    if zoneinfo is not None and type(tz) is zoneinfo.ZoneInfo and tz.key is not None:
        return tz.key
    raise Unencodable(
        f"its tzinfo {type(tz).__module__}.{type(tz).__qualname__} ({tz!r}) is not supported; "
        "use datetime.timezone (UTC or a fixed offset) or zoneinfo.ZoneInfo(key)"
    )


def _encode_datetime(d: datetime) -> list[Any]:
    tz = _encode_tz(d.tzinfo)
    return [_M_DATETIME, d.year, d.month, d.day, d.hour, d.minute, d.second, d.microsecond, d.fold, tz]


BUILTIN_ENCODERS: dict[type, Callable[[Any], Any]] = {
    int: lambda n: msgpack.ExtType(_BIGINT, n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True)),
    tuple: lambda t: [_M_TUPLE, *t],
    set: lambda s: [_M_SET, *s],
    frozenset: lambda s: [_M_FROZENSET, *s],
    datetime: _encode_datetime,
    date: lambda d: [_M_DATE, d.toordinal()],
    time: lambda t: [_M_TIME, t.hour, t.minute, t.second, t.microsecond, t.fold, _encode_tz(t.tzinfo)],
    timedelta: lambda td: [_M_TIMEDELTA, td.days, td.seconds, td.microseconds],
}
# uuid and decimal are not imported by the codec (a resume pays for every import): their encoders join
# the table the first time a value of their type is written, which needs the module to be loaded anyway.
_LAZY_ENCODERS: dict[tuple[str, str], Callable[[Any], Any]] = {
    ("uuid", "UUID"): lambda u: msgpack.ExtType(_UUID, u.bytes),
    ("decimal", "Decimal"): lambda d: msgpack.ExtType(_DECIMAL, str(d).encode("ascii")),
}


def builtin_encoder(kind: type) -> Callable[[Any], Any] | None:
    """The encoder of a built-in type, or None."""
    encode = BUILTIN_ENCODERS.get(kind)
    if encode is None:
        encode = _LAZY_ENCODERS.get((kind.__module__, kind.__qualname__))
        if encode is not None and getattr(sys.modules.get(kind.__module__), kind.__qualname__, None) is kind:
            BUILTIN_ENCODERS[kind] = encode
        else:
            encode = None
    return encode


# --- built-in types: decode --------------------------------------------------------------------

_ZONE_KEY = re.compile(r"[A-Za-z0-9_+-]{1,40}(?:/[A-Za-z0-9_+-]{1,40}){0,3}")


@functools.lru_cache(maxsize=256)
def _zone(key: str) -> ZoneInfo:
    """A stored zone key -> ZoneInfo, after checking it names a zone this machine has.

    ZoneInfo falls back to importing `tzdata.zoneinfo.<Area>` packages; the check keeps the data
    from choosing what gets imported: the key must be a file on TZPATH or in tzdata's own list.
    """
    from zoneinfo import TZPATH, ZoneInfo

    if not _ZONE_KEY.fullmatch(key):
        raise CheckpointCorrupted(f"stored time zone key {clip(repr(key))} is not a valid IANA zone key")
    on_disk = any(os.path.isfile(os.path.join(root, key)) for root in TZPATH)
    if not on_disk and key not in _all_zones():
        raise CheckpointCorrupted(
            f"checkpoint uses time zone {key!r}, which this machine does not know; install the tzdata package"
        )
    return ZoneInfo(key)


@functools.cache
def _all_zones() -> frozenset[str]:
    from zoneinfo import available_timezones

    return frozenset(available_timezones())


def _decode_tz(raw: Any) -> Any:
    if raw is None:
        return None
    if type(raw) is int:
        return timezone(timedelta(microseconds=raw))
    if type(raw) is str:
        return _zone(raw)
    if type(raw) is list and len(raw) == 2 and type(raw[0]) is int and type(raw[1]) is str:
        return timezone(timedelta(microseconds=raw[0]), raw[1])
    raise ValueError(f"bad time zone: a {type(raw).__name__}")


def _build_datetime(a: list[Any]) -> datetime:
    _, year, month, day, hour, minute, second, micro, fold, tz = a
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=_decode_tz(tz), fold=fold)


def _build_time(a: list[Any]) -> time:
    _, hour, minute, second, micro, fold, tz = a
    return time(hour, minute, second, micro, tzinfo=_decode_tz(tz), fold=fold)


def _build_timedelta(a: list[Any]) -> timedelta:
    _, days, seconds, micros = a
    return timedelta(days=days, seconds=seconds, microseconds=micros)


def _build_date(a: list[Any]) -> date:
    _, ordinal = a
    return date.fromordinal(ordinal)


def _build_set(a: list[Any]) -> set[Any]:
    items = a[1:]
    check_hashes(items, "set")
    return set(items)


def _build_frozenset(a: list[Any]) -> frozenset[Any]:
    items = a[1:]
    check_hashes(items, "frozenset")
    return frozenset(items)


BUILTIN_BUILDERS: dict[int, Callable[[list[Any]], Any]] = {
    ExtCode.TUPLE: lambda a: tuple(a[1:]),
    ExtCode.SET: _build_set,
    ExtCode.FROZENSET: _build_frozenset,
    ExtCode.DATETIME: _build_datetime,
    ExtCode.DATE: _build_date,
    ExtCode.TIME: _build_time,
    ExtCode.TIMEDELTA: _build_timedelta,
}


def ext_hook(code: int, payload: bytes) -> Any:
    """msgpack's ext hook: payload-carrying codes become values, marker codes become `Marker`s."""
    marker = _MARKERS.get(code)
    if marker is not None and not payload:
        return marker
    if code == _BIGINT and payload:
        return int.from_bytes(payload, "big", signed=True)
    if code == _UUID:
        from uuid import UUID

        return UUID(bytes=payload)
    if code == _DECIMAL:
        from decimal import Decimal

        return Decimal(payload.decode("ascii"))
    raise CheckpointCorrupted(
        f"checkpoint body holds msgpack ext type {code} ({len(payload)} bytes), which Waypoint never writes"
    )


# --- the write error path: where in a value the unwritable part sits ---------------------------

_MAX_WALK = 1023  # msgpack's nesting limit (see _Codec.pack in serde.py)


def locate(value: Any, root: str, default: Callable[[Any], Any], registry: TypeRegistry) -> tuple[str, str] | None:
    """(path, reason) of the first part of `value` that cannot be written, or None if none is found.

    A slow Python walk mirroring the encoder, run only after the fast native encode failed. Paths
    read like Python: `root['messages'][3].meta`; set elements and dict keys are `<element i>` and
    `<key k>`.
    """
    active: set[int] = set()  # ids of the containers on the current path, to spot cycles

    def walk(obj: Any, path: str, depth: int) -> tuple[str, str] | None:
        kind = type(obj)
        if kind in _NATIVE:
            return None
        if id(obj) in active:
            return path, "the value contains itself (a reference cycle); checkpoints hold trees, not graphs"
        if depth > _MAX_WALK:
            return path, "the value is nested more than 1023 containers deep"
        if kind is list:
            children = [(f"{path}[{i}]", item) for i, item in enumerate(obj)]
        elif kind is dict:
            children = [pair for key, item in obj.items() for pair in _dict_children(path, key, item)]
        else:
            try:
                replacement = default(obj)
            except Unencodable as exc:
                return path, exc.reason
            children = _children_of(kind, replacement, path, registry)
        active.add(id(obj))
        try:
            for child_path, child in children:
                found = walk(child, child_path, depth + 1)
                if found is not None:
                    return found
        finally:
            active.discard(id(obj))
        return None

    try:
        return walk(value, root, 0)
    except RecursionError:
        return None


def _dict_children(path: str, key: Any, item: Any) -> list[tuple[str, Any]]:
    shown = repr(key)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return [(f"{path}<key {shown}>", key), (f"{path}[{shown}]", item)]


def _children_of(kind: type, replacement: Any, path: str, registry: TypeRegistry) -> list[tuple[str, Any]]:
    if kind is tuple:
        return [(f"{path}[{i}]", item) for i, item in enumerate(replacement[1:])]
    if kind is set or kind is frozenset:
        return [(f"{path}<element {i}>", item) for i, item in enumerate(replacement[1:])]
    entry = registry.entry_for_type(kind)
    if entry is None:  # datetime, UUID, big int, ...: no parts that could fail
        return []
    data = replacement[2]
    if entry.kind in ("model", "dataclass"):
        return [(f"{path}.{name}", item) for name, item in data.items()]
    return [(f"{path}.{'root' if entry.kind == 'root_model' else 'value'}", data)]


def unregistered_reason(kind: type, registry: TypeRegistry, how: str) -> str:
    """Why `kind` cannot be written and the fix; `how` is the registering call to suggest."""
    what = qualified_name(kind)
    if is_registrable(kind):
        base = registry.registered_base(kind)
        hint = ""
        if base is not None:
            hint = f" (its base class is registered as {base.name!r}; each subclass needs its own name)"
        return (
            f"{what} is not registered with the Waypoint codec{hint}. Register it before writing: "
            f"{how}({kind.__name__}) or decorate the class with @register_type"
        )
    return (
        f"{what} is not a type the Waypoint codec can write. Convert it to a supported built-in type, "
        f"or keep its data in a dataclass or pydantic model registered with {how}(...) / @register_type"
    )
