"""The codec's type registry: which classes may travel in a checkpoint, each under one stable name.

Decoding rebuilds a registered value only through the class found here by name, with the class's own
constructor (dataclasses, enums) or validator (pydantic models); nothing else is looked up, imported
or called. `waypoint.engine.serde` is the public face of this module.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import pydantic

from .errors import SerializationError

__all__ = ["RegisteredType", "TypeRegistry", "qualified_name"]

C = TypeVar("C", bound=type)
Kind = Literal["model", "root_model", "dataclass", "enum"]

# pydantic validates by alias unless told otherwise; we store fields by *name* (as written in the
# class), so ask for by-name validation where pydantic supports it (2.11+).
_PYDANTIC_VERSION = tuple(int(part) for part in pydantic.VERSION.split(".")[:2])
_BY_NAME: dict[str, bool] = {"by_alias": False, "by_name": True} if _PYDANTIC_VERSION >= (2, 11) else {}
_MISSING = object()


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
        """Register `cls` under `name` (default `module.QualName`); usable as `@register` or `@register(name=...)`.

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
            raise SerializationError(f"the registered name for {qualified_name(cls)} must be a non-empty str, got {name!r}")
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
            redefined = qualified_name(holder.cls) == qualified_name(cls)
            raise SerializationError(
                f"cannot register {qualified_name(cls)} as {final!r}: that name already belongs to a "
                f"different class, {qualified_name(holder.cls)}"
                + (" (the class was defined twice: a module reload or a notebook cell run again?)" if redefined else "")
                + "; pass a distinct name=... to one of them"
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
    return issubclass(cls, (enum.Enum, pydantic.BaseModel)) or dataclasses.is_dataclass(cls)


def _entry_for(cls: type, name: str) -> RegisteredType:
    if issubclass(cls, enum.Enum):
        return RegisteredType(cls=cls, name=name, kind="enum", dump=_enum_value, load=cls)
    if issubclass(cls, pydantic.RootModel):
        return RegisteredType(cls=cls, name=name, kind="root_model", dump=_root_value, load=cls.model_validate)
    if issubclass(cls, pydantic.BaseModel):
        return RegisteredType(cls=cls, name=name, kind="model", dump=_model_fields, load=_model_loader(cls))
    if dataclasses.is_dataclass(cls):
        dump, load = _dataclass_codec(cls)
        return RegisteredType(cls=cls, name=name, kind="dataclass", dump=dump, load=load)
    raise SerializationError(
        f"cannot register {qualified_name(cls)}: only pydantic models, dataclasses and Enum subclasses "
        "can be registered; store its data in one of those (or in built-in types) instead"
    )


def _enum_value(member: enum.Enum) -> Any:
    return member.value


def _root_value(model: pydantic.RootModel[Any]) -> Any:
    return model.root


def _model_fields(model: pydantic.BaseModel) -> dict[str, Any]:
    """The declared fields (by name) plus any extra fields; private attributes are not stored."""
    values = model.__dict__
    data = {name: values[name] for name in type(model).model_fields if name in values}
    extra = model.__pydantic_extra__
    if extra:
        data.update(extra)
    return data


def _model_loader(cls: type[pydantic.BaseModel]) -> Callable[[Any], Any]:
    def load(data: Any) -> Any:
        return cls.model_validate(data, **_BY_NAME)

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
            raise TypeError(f"stored fields {unknown!r} are not fields of the class")
        obj = cls(**{name: data[name] for name in init_names if name in data})
        for name in late_names:  # restore state the constructor does not take (frozen-safe)
            if name in data:
                object.__setattr__(obj, name, data[name])
        return obj

    return dump, load
