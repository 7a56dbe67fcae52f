"""The approval page: `/ui` (pending approvals across runs, live) and `/ui/runs/{id}` (one run's history
and events). Plain HTML and a little JavaScript from `service/ui/`, no build step.

The page logs in with a token once (`POST /ui/login`) and gets a session (service/_sessions.py): an
opaque, expiring, revocable ID in an HttpOnly, SameSite=Strict cookie (`__Host-` and Secure over HTTPS)
and a write key it keeps in its origin's storage and sends with every write. The browser's
`EventSource` sends the cookie with the event streams, which cannot carry an `Authorization` header.
The page shells hold no data and need no token; everything they show comes from the API, which does.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from ._auth import LOGIN_HEADER, LOGIN_VALUE, session_cookie
from ._guard import guarded_route
from ._responses import SafeJSONResponse, problem
from ._sessions import CSRF_KEY_HEADER
from ._state import ServiceState

__all__ = ["build_ui_router"]

_TYPES = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
_SECURITY = {"Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'; "
                                        "connect-src 'self'; frame-ancestors 'none'",
             "Referrer-Policy": "no-referrer"}
_LOGIN_BODY = 8192


class Login(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str = Field(min_length=1, max_length=4096)


@lru_cache(maxsize=8)
def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("ui", name).read_text(encoding="utf-8")


def _base(request: Request) -> str:
    """The path the service is mounted at ("" at the root): the request's path without the segments of
    the route from `/ui` on (whether or not the route's own path carries the router's prefix)."""
    template = getattr(request.scope.get("route"), "path_format", "") or ""
    depth = template[template.find("/ui"):].count("/") if "/ui" in template else 0
    parts = request.url.path.rstrip("/").split("/")
    return "/".join(parts[:len(parts) - depth])


def build_ui_router(state: ServiceState) -> APIRouter:
    """The page's routes (not in the OpenAPI document)."""
    router = APIRouter(include_in_schema=False)
    open_route = guarded_route(None, None, _LOGIN_BODY)
    reader = guarded_route(state.gate, "read", _LOGIN_BODY)

    def page(request: Request, name: str) -> HTMLResponse:
        html = _asset(name).replace("__BASE__", _base(request).rstrip("/") + "/")
        return HTMLResponse(html, headers=_SECURITY)

    async def approvals_page(request: Request) -> HTMLResponse:
        return page(request, "index.html")

    async def run_page(request: Request, checkpoint_id: str) -> HTMLResponse:
        return page(request, "run.html")

    async def asset(name: str) -> Response:
        if name not in _TYPES:
            return problem(404, "no such file")
        return Response(_asset(name), media_type=_TYPES[name], headers=_SECURITY)

    async def session(scopes: Any = Depends(state.gate.require("read"))) -> dict[str, Any]:
        return {"scopes": sorted(scopes)}

    async def login(request: Request, body: Login) -> Response:
        if request.headers.get(LOGIN_HEADER) != LOGIN_VALUE:
            return problem(403, f"send {LOGIN_HEADER}: {LOGIN_VALUE} (the page's login form does)")
        opened_for = await state.gate.login(request, body.token)
        if opened_for is None:
            return problem(401, "that token is not valid here")
        scopes, session_id, opened = opened_for
        name, path = session_cookie(_base(request), request.url.scheme == "https")
        response = SafeJSONResponse({"scopes": sorted(scopes), "csrf": opened.csrf, "expires": opened.expires})
        response.set_cookie(name, session_id, max_age=int(state.sessions.ttl), path=path, httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")
        return response

    async def logout(request: Request) -> Response:
        name, path = session_cookie(_base(request), request.url.scheme == "https")
        session_id = request.cookies.get(name)
        found = state.sessions.find(session_id) if session_id else None
        if found is not None:
            if not found.allows_write(request.headers.get(CSRF_KEY_HEADER)):
                raise HTTPException(403, f"send {CSRF_KEY_HEADER} (the page's write key) to log out")
            state.sessions.close(session_id)
        response = Response(status_code=204)
        response.delete_cookie(name, path=path, httponly=True, samesite="strict",
                               secure=request.url.scheme == "https")
        return response

    for method, path, endpoint, route in [
        ("GET", "/ui", approvals_page, open_route), ("GET", "/ui/runs/{checkpoint_id}", run_page, open_route),
        ("GET", "/ui/static/{name}", asset, open_route), ("GET", "/ui/session", session, reader),
        ("POST", "/ui/login", login, open_route), ("POST", "/ui/logout", logout, open_route),
    ]:
        router.add_api_route(path, endpoint, methods=[method], route_class_override=route,
                             response_class=SafeJSONResponse)
    return router
