"""What every route of the service does before and after its endpoint (`guarded_route`, a FastAPI route
class, so it holds in `create_app` and in a router mounted in someone else's app alike):

1. authenticate from the headers alone (401, 403, 429) — before a byte of the body is read, so an
   unauthenticated client cannot make the service read, buffer or parse anything;
2. read the body up to `max_body` bytes (413: a `Content-Length` over it is refused unread; a chunked
   body is cut off when it passes it);
3. refuse a body that is not UTF-8, or whose JSON holds a lone surrogate anywhere (`"\\ud800"` is valid
   JSON text but no valid string): 422 naming the field, so such text is never stored; and a body nested
   more than `MAX_DEPTH` levels deep, or holding a number of more digits than Python converts (4300): 422,
   never a `RecursionError` or `ValueError` out of the JSON parser (a 500);
4. answer errors as JSON — a 422 lists `loc`, `msg` and `type` but never echoes what was sent (a token,
   a megabyte) — and give every answer the API headers (`nosniff`, `no-store`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import ClientDisconnect

from ._auth import Gate
from ._responses import API_HEADERS, SafeJSONResponse, invalid, problem

__all__ = ["guarded_route", "MAX_BODY", "MAX_DEPTH", "lone_surrogate_at"]

MAX_BODY = 1024 * 1024
"""Default limit of a request body, in bytes (`create_app(max_body=...)`, `waypoint serve --max-body`)."""
MAX_DEPTH = 100
"""How deeply a request body's JSON may nest (arrays and objects); deeper is a 422. Python's parser gives up
near 1,000 levels with a RecursionError, pydantic's near 200."""

_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")
_log = logging.getLogger("waypoint.service")


class _Refused(Exception):
    def __init__(self, response: Response) -> None:
        self.response = response


def guarded_route(gate: Gate | None, scope: str | None, max_body: int) -> type[APIRoute]:
    """A route class whose requests are checked as the module docstring says (`scope` None: no token)."""

    class GuardedRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
            inner = super().get_route_handler()

            async def handler(request: Request) -> Response:
                try:
                    if scope is not None and gate is not None:
                        identity = await gate.identify(request)
                        gate.allow(identity, scope, request)
                        request.state.waypoint_identity = identity
                    if request.method in _WRITES:
                        request = await _buffered(request, max_body)
                    response = await inner(request)
                except _Refused as refused:
                    response = refused.response
                except ClientDisconnect:  # gone before its body was read (or cut off by the server's timeout)
                    response = problem(400, "the client went away before its request body arrived")
                except HTTPException as err:
                    response = SafeJSONResponse({"detail": err.detail}, status_code=err.status_code,
                                                headers=err.headers)
                except RequestValidationError as err:
                    response = SafeJSONResponse({"detail": [_error(e) for e in err.errors()]}, status_code=422)
                except Exception:  # noqa: BLE001 - answered as JSON; the log has the traceback
                    _log.exception("%s %s failed", request.method, request.url.path)
                    response = problem(500, "the service failed on this request; its log says why")
                response.headers.update(API_HEADERS)
                return response

            return handler

    return GuardedRoute


def _error(e: dict[str, Any]) -> dict[str, Any]:
    return {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "value_error")}


async def _buffered(request: Request, limit: int) -> Request:
    """The request with its body read (at most `limit` bytes) and checked; raises _Refused."""
    too_large = _Refused(problem(413, f"the request body is over the limit of {limit} bytes"))
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise _Refused(problem(400, "Content-Length is not a number"))
        if int(length) > limit:
            raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    body = b"".join(chunks)
    _check_text(body)
    return Request(request.scope, receive=_replay(body, request.receive))


def _check_text(body: bytes) -> None:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _Refused(invalid(["body"], f"the body is not UTF-8 text (a bad byte at offset {err.start})")) from None
    if _too_deep(text):
        raise _Refused(invalid(["body"], f"the body's JSON is nested more than {MAX_DEPTH} levels deep; send a "
                                         "flatter value"))
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return  # not JSON: the endpoint says so, in FastAPI's words
    except (ValueError, RecursionError) as err:  # a number of more than 4300 digits (int's limit), say
        raise _Refused(invalid(["body"], f"the body's JSON cannot be read: {_why(err)}")) from None
    if not _SURROGATE_ESCAPE.search(text):
        return
    where = lone_surrogate_at(value, ["body"])
    if where is not None:
        raise _Refused(invalid(where, "text with a lone surrogate (\\ud800-\\udfff not part of a pair) is not "
                                      "valid Unicode; send valid text"))


def _too_deep(text: str) -> bool:
    """Whether JSON `text` nests arrays and objects more than `MAX_DEPTH` deep (brackets inside strings do
    not count). Counted without recursion; free for a body with few brackets."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    depth = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_DEPTH:
            return True
    return False


def _why(err: BaseException) -> str:
    if isinstance(err, RecursionError):
        return "it is nested too deeply"
    if "digits" in str(err):
        return "it holds a number of more than 4300 digits; send a shorter number (a version is at most 2^53)"
    return f"{type(err).__name__}"


def lone_surrogate_at(value: Any, loc: list[Any]) -> list[Any] | None:
    """Where in a decoded JSON value a string (or a key) holds a lone surrogate, or None."""
    stack = [(value, loc)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return where
        elif isinstance(item, dict):
            for k, v in item.items():
                if _SURROGATE.search(k):
                    return where + [k.encode("utf-8", "backslashreplace").decode()]
                stack.append((v, where + [k]))
        elif isinstance(item, list):
            stack.extend((v, where + [i]) for i, v in enumerate(item))
    return None


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: the client's disconnect, when it comes

    return replay
