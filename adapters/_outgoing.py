"""What both SDK models (OpenAI, Anthropic) do to a request before it goes out (pure functions, no SDK import).

A conversation is stored exactly as the model wrote it, and a model may write text that is not valid
Unicode: a JSON `"\\ud800"` decodes to a Python `str` holding an unpaired surrogate, which no SDK can
encode as UTF-8 — so, sent back as it is, it would fail every later request of that conversation. The
*request* is made sendable instead, never the stored messages:

- `sendable(body)`: a copy of the JSON part of a request in which every unpaired surrogate is U+FFFD (a
  pair split over two code points is joined), copied only where something changed; a value that is not
  JSON (a set, NaN, an object), or that nests deeper than `MAX_DEPTH`, raises `Unsendable`, which the model
  reports as a `ModelError` naming itself;
- `sdk_arguments(body, accepted)`: the request as keyword arguments of the SDK's `create`, with the fields
  this SDK version does not take as arguments moved into `extra_body`, so they are sent as they are;
- `build_request(...)`: both, around a model's own request builder; whatever fails is a `ModelError` naming
  the model (not retryable: the same conversation fails the same way), never an SDK's `UnicodeEncodeError`.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Collection
from typing import Any
from urllib.parse import urlsplit

from waypoint.engine.errors import ModelError, describe

__all__ = ["offered_tools", "MAX_DEPTH", "Unsendable", "valid_utf8", "sendable", "depth", "sdk_arguments", "SDK_OPTIONS",
           "build_request", "server_of", "accepted_arguments"]

MAX_DEPTH = 256
"""A request value nested deeper than this is not sent (JSON encoders recurse; Python's limit is ~1000)."""
SDK_OPTIONS = frozenset({"extra_headers", "extra_query", "timeout"})
"""Arguments of an SDK's `create` that are options of the call, not part of the JSON body."""


class Unsendable(ValueError):
    """A request value cannot be sent as JSON; the message says where and why."""


def offered_tools(tools: Any, tool_choice: Any, *, model: str, server: str) -> list[Any]:
    """`tools` as the `ToolInfo`s a request offers (a `Tool` by its `info`); a `tool_choice` naming none of them
    is a `ModelError` before anything is sent."""
    from waypoint.engine.errors import ModelError
    from waypoint.engine.models.schema import tool_infos

    offered = tool_infos(tools)
    names = [t.name for t in offered]
    if tool_choice not in ("auto", "required", "none") and tool_choice not in names:
        raise ModelError(f"model '{model}' at {server}: tool_choice names tool '{tool_choice}', but the tools "
                         f"offered are {names}; offer it or choose 'auto'", model=model)
    return offered


def valid_utf8(text: str) -> str:
    """`text` with each unpaired surrogate replaced by U+FFFD (the same object when there is none)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def sendable(value: Any, where: str = "the request") -> Any:
    """`value` as JSON a provider can read (see the module docstring); raises `Unsendable`."""
    return _sendable(value, (where,), 0)


def _sendable(value: Any, path: tuple[Any, ...], level: int) -> Any:
    """`path` is (parent path, key): formatted only when something is wrong."""
    if isinstance(value, str):
        return valid_utf8(value)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Unsendable(f"{_where(path)} is {value}, which JSON does not allow")
        return value
    if level >= MAX_DEPTH:
        raise Unsendable(f"{_where(path)} nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        out, changed = {}, False
        for key, item in value.items():
            if not isinstance(key, str):
                raise Unsendable(f"{_where(path)} has a key that is not a string ({type(key).__name__})")
            new_key, new_item = valid_utf8(key), _sendable(item, (path, key), level + 1)
            changed = changed or new_key is not key or new_item is not item
            out[new_key] = new_item
        return out if changed else value
    if isinstance(value, (list, tuple)):
        items = [_sendable(item, (path, i), level + 1) for i, item in enumerate(value)]
        return items if any(a is not b for a, b in zip(items, value)) else value
    raise Unsendable(f"{_where(path)} is a {type(value).__name__}, which is not JSON")


def _where(path: tuple[Any, ...]) -> str:
    keys = []
    while len(path) == 2:
        path, key = path
        keys.append(f"[{key}]" if isinstance(key, int) else f".{valid_utf8(key)[:40]}")
    where = path[0] + "".join(reversed(keys))
    return where if len(where) <= 120 else f"{where[:70]}…{where[-40:]}"


def depth(value: Any, limit: int) -> int:
    """How deeply `value` nests (dicts and lists; counting stops past `limit`), without recursion."""
    stack, deepest = [(value, 1)], 0
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        if level > limit:
            return level
        if isinstance(node, dict):
            stack.extend((v, level + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, level + 1) for v in node)
    return deepest


def sdk_arguments(body: dict[str, Any], accepted: Collection[str]) -> dict[str, Any]:
    """`body` as keyword arguments of an SDK's `create` that takes `accepted`: the rest go in `extra_body`."""
    unknown = {k: v for k, v in body.items() if k not in accepted}
    if not unknown:
        return body
    known = {k: v for k, v in body.items() if k in accepted}
    known["extra_body"] = {**unknown, **(known.get("extra_body") or {})}
    return known


@functools.cache
def accepted_arguments(create: Callable[..., Any]) -> frozenset[str]:
    """The keyword arguments an SDK's `create` method takes (read from its signature once)."""
    return frozenset(inspect.signature(create).parameters) - {"self"}


def build_request(build: Callable[[], dict[str, Any]], accepted: Collection[str], *, model: str,
                  server: str) -> dict[str, Any]:
    """The SDK arguments of one request: `build()`'s body, sendable. Raises `ModelError` naming the model."""
    try:
        body = build()
        options = {k: body.pop(k) for k in SDK_OPTIONS if k in body}  # the call's options are no JSON
        body = sendable(body)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever it is, this request cannot go out
        raise ModelError(f"model '{model}' at {server}: the request could not be built: {describe(exc)} — "
                         "check the tools' schemas and the extra arguments given to the model", model=model) from exc
    return sdk_arguments({**body, **options}, accepted)


def server_of(base_url: str) -> str:
    """`host:port` of `base_url`, never its `user:password` (what messages and `repr` show)."""
    return urlsplit(base_url).netloc.rpartition("@")[2] or base_url.rpartition("@")[2]
