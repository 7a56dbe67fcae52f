"""`load_object(spec)`: the object a `module:attr` option names (`waypoint runs resume --graph`,
`waypoint worker --graphs`, `waypoint serve --agents`), like `python -m` does for modules: those of the
current directory are importable.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from ..errors import describe

__all__ = ["load_object"]


def load_object(spec: str, *, option: str, kinds: tuple[type, ...], error: type[Exception],
                args: tuple[Any, ...] = ()) -> Any:
    """The object `module:attr` (attr may be dotted) names; one that is not of `kinds` but callable is called
    with `args` and must return one. Anything wrong raises `error` with a message naming `option`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise error(f"{option} takes module:attr (e.g. myapp.agents:build_agent), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise error(f"{option} {spec}: cannot import {module_name!r} ({err}); is it on PYTHONPATH?") from None
    except Exception as err:
        raise error(f"{option} {spec}: importing {module_name!r} failed: {describe(err)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise error(f"{option} {spec}: {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, kinds) and callable(obj):
        try:
            obj = obj(*args)
        except Exception as err:
            raise error(f"{option} {spec}: calling {attr}() failed: {describe(err)}") from None
    if not isinstance(obj, kinds):
        names = ", ".join(k.__name__ for k in kinds[:-1]) + f" or {kinds[-1].__name__}"
        raise error(f"{option} {spec} is a {type(obj).__name__}, not a {names} (or a function returning one)")
    return obj
