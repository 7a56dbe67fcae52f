"""The names every layer of the engine shares: `START`, `END`, the trigger and durability kinds, and
the builder's records of nodes and branches (what `compile()` turns into a `GraphShape`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .retry import RetryPolicy

__all__ = ["START", "END", "Trigger", "Durability", "NodeSpec", "Branch", "KEY_RE"]

START = "__start__"
END = "__end__"

Trigger = Literal["any", "all"]
Durability = Literal["step", "interrupt", "exit"]

# Node keys appear inside interrupt addresses ("runnable:g;node:a"), so they may not contain ';' or ':'.
KEY_RE = re.compile(r"^[^;:\s]([^;:]*[^;:\s])?$")


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """A node as the user declared it."""

    key: str
    runnable: Any
    pre: Callable[..., Any] | None = None
    post: Callable[..., Any] | None = None
    input_key: str | None = None
    output_key: str | None = None
    retry: RetryPolicy | None = None
    timeout: float | None = None


@dataclass(frozen=True, kw_only=True)
class Branch:
    """A routing decision after `source`: `condition(output)` returns one key or a collection of keys.

    `ends` maps what the condition may return to node keys (a list means each key maps to itself).
    """

    source: str
    condition: Callable[..., Any]
    ends: Mapping[Any, str]
