"""How the service answers: JSON that is always valid UTF-8 whatever the stored text holds, 422s in
FastAPI's shape, and the headers every API answer carries.

Stored text is a model's output: it may hold lone surrogates (valid JSON text such as `"\\ud800"` decodes to
one), which UTF-8 cannot encode. Such a string is written with JSON's own escape (`\\ud800`), exactly and
losslessly, instead of failing the whole answer; a non-finite float (a graph's state may hold one) is
written as a string (`"NaN"`), since JSON has no such number.
"""

from __future__ import annotations

import json
import math
from typing import Any

from fastapi.responses import JSONResponse

__all__ = ["API_HEADERS", "SafeJSONResponse", "json_bytes", "invalid", "problem"]

API_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
"""On every answer of the API and the page: never sniff a type, never cache (answers carry run data)."""


def json_bytes(value: Any) -> bytes:
    """`value` as compact JSON in UTF-8: non-ASCII text as is, lone surrogates escaped, never an error
    for what a model wrote."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:  # a NaN or an infinity somewhere
        value = _finite(value)
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON's \\uXXXX escape says it exactly
        return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class SafeJSONResponse(JSONResponse):
    """A JSON answer that cannot fail on the text it carries (see the module docstring)."""

    def render(self, content: Any) -> bytes:
        return json_bytes(content)


def invalid(loc: list[Any], msg: str, kind: str = "value_error") -> SafeJSONResponse:
    """422 in FastAPI's own shape, naming the field (never echoing what was sent)."""
    return SafeJSONResponse({"detail": [{"loc": loc, "msg": msg, "type": kind}]}, status_code=422)


def problem(code: int, detail: str, /, **extra: Any) -> SafeJSONResponse:
    """An error answer (HTTP status `code`): what happened and what to do, plus facts such as
    `current_version` and the run's `status`."""
    return SafeJSONResponse({"detail": detail, **extra}, status_code=code)
