"""The approval page: `/ui` (pending approvals across runs, live) and `/ui/runs/{id}` (one run's history
and events). Plain HTML and a little JavaScript from `service/ui/`, no build step.

The page authenticates with a cookie: its login form posts the token to `/ui/login`, which checks it and
sets `waypoint_token` (HttpOnly, so scripts cannot read it; SameSite=Strict; Secure over HTTPS). The
browser's `EventSource` sends it with the event streams, which cannot carry an `Authorization` header.
The page shells hold no data and need no token; everything they show comes from the API, which does.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from ._auth import COOKIE, CSRF_HEADER, CSRF_VALUE

if TYPE_CHECKING:
    from ._service import Service

__all__ = ["add_ui_routes"]

_TYPES = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
_SECURITY = {"Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'; "
                                        "connect-src 'self'; frame-ancestors 'none'",
             "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


class Login(BaseModel):
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


def add_ui_routes(router: APIRouter, service: Service) -> None:
    """The page's routes on the service's router (not in the OpenAPI document)."""
    read = Depends(service.auth.require("read"))

    def page(request: Request, name: str) -> HTMLResponse:
        html = _asset(name).replace("__BASE__", _base(request).rstrip("/") + "/")
        return HTMLResponse(html, headers=_SECURITY)

    @router.get("/ui", include_in_schema=False)
    async def approvals_page(request: Request) -> HTMLResponse:
        return page(request, "index.html")

    @router.get("/ui/runs/{checkpoint_id}", include_in_schema=False)
    async def run_page(request: Request, checkpoint_id: str) -> HTMLResponse:
        return page(request, "run.html")

    @router.get("/ui/static/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in _TYPES:
            return JSONResponse({"detail": "no such file"}, status_code=404)
        return Response(_asset(name), media_type=_TYPES[name], headers=_SECURITY)

    @router.get("/ui/session", include_in_schema=False)
    async def session(scopes: Any = read) -> dict[str, Any]:
        return {"scopes": sorted(scopes)}

    @router.post("/ui/login", include_in_schema=False)
    async def login(request: Request, body: Login) -> Response:
        if request.headers.get(CSRF_HEADER) != CSRF_VALUE:
            return JSONResponse({"detail": f"send {CSRF_HEADER}: {CSRF_VALUE}"}, status_code=403)
        scopes = await service.auth.scopes(body.token)
        if scopes is None:
            return JSONResponse({"detail": "that token is not valid here"}, status_code=401)
        response = JSONResponse({"scopes": sorted(scopes)})
        response.set_cookie(COOKIE, body.token, httponly=True, samesite="strict", path=_base(request) + "/",
                            secure=request.url.scheme == "https")
        return response

    @router.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        response = Response(status_code=204)
        response.delete_cookie(COOKIE, path=_base(request) + "/", httponly=True, samesite="strict")
        return response
