"""`Service` (the state behind the HTTP API with its router) and `create_app` / `create_router`, the two
ways to put it on the web. The top of the folder: it imports the API's and the page's routes, which
import the state below them (docs/service.md, "Where things are")."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from ._api import build_api_router
from ._guard import MAX_BODY, guarded_route
from ._notify import Notifier
from ._recovery import MAX_ATTEMPTS, start_recovery, stop_recovery
from ._responses import SafeJSONResponse
from ._sessions import SESSION_TTL
from ._state import DRAIN_SECONDS, ServiceState
from ._ui import build_ui_router
from ._webhooks import Webhooks

__all__ = ["Service", "create_app", "create_router"]


class Service(ServiceState):
    """Runs `runners_or_graphs` (a mapping name -> Runner / ChatModelAgent / Graph / CompiledGraph, a list,
    or one) on `store` behind bearer-token `auth` (see `Auth`). `service.router` is the FastAPI router;
    `await service.aclose()` stops the runs it executes for its shutdown (each at its next step boundary within
    `drain_seconds`, the rest where they are — none stored as cancelled: each is left `running` with its lease
    ended, for the next process to continue at once).
    `max_body` limits request bodies (bytes, 413 over it); `session_ttl` the page's sessions (seconds);
    `queue` (True, or a `RunQueue` on `store`) hands starts and resumes to `waypoint worker` processes instead
    of executing them here (docs/service.md, "Where runs execute")."""

    def __init__(self, runners_or_graphs: Any, store: Any, *, auth: Any = None, max_body: int = MAX_BODY,
                 session_ttl: float = SESSION_TTL, queue: Any = None, drain_seconds: float = DRAIN_SECONDS,
                 on_busy: str = "reject") -> None:
        super().__init__(runners_or_graphs, store, auth=auth, max_body=max_body, session_ttl=session_ttl,
                         queue=queue, drain_seconds=drain_seconds, on_busy=on_busy)
        self.router = APIRouter(default_response_class=SafeJSONResponse)
        self.router.include_router(build_api_router(self))
        self.router.include_router(build_ui_router(self))


def create_router(runners_or_graphs: Any, store: Any, *, auth: Any = None, max_body: int = MAX_BODY,
                  session_ttl: float = SESSION_TTL, queue: Any = None, recover: bool = True,
                  max_attempts: int = MAX_ATTEMPTS, drain_seconds: float = DRAIN_SECONDS,
                  webhooks: Any = None, on_busy: str = "reject") -> APIRouter:
    """The service as a router for an existing FastAPI app: `app.include_router(router, prefix="/waypoint")`.

    The router's lifespan (merged into the app's by `include_router`) recovers the served runs whose process
    died, now and while the app runs (`recover=False` turns it off; a run is given up after `max_attempts`
    takeovers in a row without progress: docs/service.md, "Recovery"), and when the app shuts down it drains
    the runs it executes (each finishes its step within `drain_seconds`; none is stored as cancelled, each is
    left for the next process to continue at once); `router.service` is the `Service`. With a `queue` the workers recover the runs (each
    worker continues its graphs' runs whose process died), so the service does not.
    `webhooks` (a URL, a list of URLs, or a `Webhooks`): the served runs' pauses, expiries, completions and
    failures are posted there, signed, while the app runs (docs/service.md, "Notifications"); without a signing
    key (`$WAYPOINT_WEBHOOK_SECRET`) it is a `WebhookError` here. `on_busy`: what new input for an agent's chat
    whose turn is executing does when `POST /runs` does not say (docs/service.md, "New input while a run is active").
    """
    hooks = Webhooks.of(webhooks)
    service = Service(runners_or_graphs, store, auth=auth, max_body=max_body, session_ttl=session_ttl, queue=queue,
                      drain_seconds=drain_seconds, on_busy=on_busy)
    service.notifier = Notifier(service, hooks) if hooks is not None else None

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        own = recover and service.queue is None  # with a queue, the workers recover runs
        recovery = start_recovery(service, max_attempts=max_attempts) if own else None
        notifier = service.notifier
        if notifier is not None:
            notifier.start()
        try:
            yield
        finally:
            await stop_recovery(recovery)
            await service.aclose()
            if notifier is not None:  # last: what the drain wrote is registered for the next service
                await notifier.aclose()

    router = APIRouter(lifespan=lifespan, default_response_class=SafeJSONResponse)
    router.include_router(service.router)
    router.service = service  # type: ignore[attr-defined]
    return router


def create_app(runners_or_graphs: Any, store: Any, *, auth: Any = None, title: str = "Waypoint",
               max_body: int = MAX_BODY, session_ttl: float = SESSION_TTL, queue: Any = None,
               recover: bool = True, max_attempts: int = MAX_ATTEMPTS, drain_seconds: float = DRAIN_SECONDS,
               webhooks: Any = None, on_busy: str = "reject") -> FastAPI:
    """An ASGI app (FastAPI) serving `runners_or_graphs` on `store`: the API, its OpenAPI document at
    `/openapi.json`, and the approval page at `/ui`. `auth`: see `Auth` (default: `WAYPOINT_TOKEN`); `queue`:
    see `Service`; `recover`, `max_attempts`: automatic recovery, `drain_seconds`: the drain at shutdown,
    `webhooks`: notifications and `on_busy`: new input to a busy chat, as `create_router` says."""
    router = create_router(runners_or_graphs, store, auth=auth, max_body=max_body, session_ttl=session_ttl,
                           queue=queue, recover=recover, max_attempts=max_attempts, drain_seconds=drain_seconds,
                           webhooks=webhooks, on_busy=on_busy)
    service: Service = router.service  # type: ignore[attr-defined]
    app = FastAPI(title=title, version="1", docs_url=None, redoc_url=None, openapi_url=None,
                  description="Start, inspect and resume checkpointed Waypoint runs; follow them live (SSE).")
    app.include_router(router)
    app.state.waypoint = service

    async def openapi(_: Any = Depends(service.gate.require("read"))) -> SafeJSONResponse:
        if app.openapi_schema is None:
            app.openapi_schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                             routes=app.routes)
        return SafeJSONResponse(app.openapi_schema)

    app.router.add_api_route("/openapi.json", openapi, methods=["GET"], include_in_schema=False,
                             response_class=SafeJSONResponse,
                      route_class_override=guarded_route(service.gate, "read", max_body))
    return app
