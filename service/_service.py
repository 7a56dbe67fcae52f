"""`Service`: the state behind the HTTP API — served targets, the store, auth, event logs, executions —
and `create_app` / `create_router`, the two ways to put it on the web."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from waypoint.engine import (
    CheckpointConflict,
    CheckpointError,
    CheckpointExists,
    CheckpointMeta,
    CheckpointNotFound,
    GraphMismatch,
    UnknownInterrupt,
    read_run,
)

from ._auth import Auth, Decide
from ._events import Logs
from ._execution import Executor
from ._targets import Target, prepare_targets
from ._views import pending_view

__all__ = ["Service", "create_app", "create_router"]

_PENDING_CACHE = 4096


class Service:
    """Runs `runners_or_graphs` (a mapping name -> Runner / ChatModelAgent / Graph / CompiledGraph, a list,
    or one) on `store` behind bearer-token `auth` (see `Auth`). `service.router` is the FastAPI router;
    `await service.aclose()` cancels the runs it executes (each is saved as cancelled, resumable)."""

    def __init__(self, runners_or_graphs: Any, store: Any, *,
                 auth: str | Mapping[str, Iterable[str]] | Decide | Auth | None = None) -> None:
        self.store = store
        self.targets: dict[str, Target] = prepare_targets(runners_or_graphs, store)
        self.by_fingerprint = {t.fingerprint: t for t in self.targets.values()}
        self.auth = auth if isinstance(auth, Auth) else Auth(auth)
        self.logs = Logs()
        self.executor = Executor(store, self.logs)
        self._pending: OrderedDict[tuple[str, int, float, float], list[dict[str, Any]]] = OrderedDict()
        from ._api import build_router

        self.router: APIRouter = build_router(self)

    async def aclose(self) -> None:
        """Cancel the runs this process executes and end every event stream."""
        self.logs.close()
        await self.executor.aclose()

    # --- reading ----------------------------------------------------------------------------------------

    def target_of(self, meta: CheckpointMeta) -> Target | None:
        """The served agent or graph that wrote this version (by its fingerprint)."""
        return self.by_fingerprint.get(meta.fingerprint)

    async def snapshot(self, checkpoint_id: str, version: int | None = None, history: list[CheckpointMeta] | None = None,
                       ) -> Any:
        """The decoded version (newest by default), or None."""
        if history is None:
            history = await self.store.history(checkpoint_id, limit=1)
        if not history:
            return None
        target = self.target_of(history[0])
        if target is not None:
            return await target.app.get_run(checkpoint_id, version=version)
        return await read_run(self.store, checkpoint_id, version=version)

    async def pending(self, meta: CheckpointMeta) -> list[dict[str, Any]]:
        """The interrupts a version waits on (cached: a version never changes)."""
        key = (meta.checkpoint_id, meta.version, meta.created_at, meta.updated_at)  # a new run on the ID differs
        found = self._pending.get(key)
        if found is None:
            snap = await self.snapshot(meta.checkpoint_id, meta.version, history=[meta])
            found = [] if snap is None else [pending_view(c, meta.version, meta.updated_at)
                                             for c in snap.interrupts.contexts]
            self._pending[key] = found
            if len(self._pending) > _PENDING_CACHE:
                self._pending.popitem(last=False)
        return found

    # --- errors -------------------------------------------------------------------------------------------

    async def refused(self, checkpoint_id: str, err: BaseException | None) -> JSONResponse:
        """The response for a start or resume the engine refused before it wrote anything."""
        if isinstance(err, CheckpointNotFound):
            return JSONResponse({"detail": str(err)}, status_code=404)
        if isinstance(err, (CheckpointConflict, CheckpointExists, UnknownInterrupt, GraphMismatch, CheckpointError)):
            return await self.conflict(checkpoint_id, str(err), with_pending=isinstance(err, UnknownInterrupt))
        if isinstance(err, asyncio.CancelledError):
            return JSONResponse({"detail": "the service is shutting down; the run was not started"}, status_code=503)
        if isinstance(err, (TypeError, ValueError)):
            return invalid(["body", "input"], f"{type(err).__name__}: {err}")
        what = f"{type(err).__name__}: {err}" if err is not None else "the run ended without writing anything"
        return JSONResponse({"detail": what}, status_code=500)

    async def conflict(self, checkpoint_id: str, detail: str, *, with_pending: bool = False) -> JSONResponse:
        """409 with where the run is now."""
        found = await self.store.history(checkpoint_id, limit=1)
        body: dict[str, Any] = {"detail": detail, "current_version": found[0].version if found else None,
                                "status": found[0].status if found else None}
        if with_pending and found:
            with contextlib.suppress(Exception):
                body["pending"] = [p["id"] for p in await self.pending(found[0])]
        return JSONResponse(body, status_code=409)


def invalid(loc: list[Any], msg: str, kind: str = "value_error") -> JSONResponse:
    """422 in FastAPI's own shape, naming the field."""
    return JSONResponse({"detail": [{"loc": loc, "msg": msg, "type": kind}]}, status_code=422)


def encode_cursor(meta: CheckpointMeta) -> str:
    raw = json.dumps([meta.updated_at, meta.checkpoint_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> CheckpointMeta:
    """The `before=` row a cursor stands for; ValueError if it is not one of ours."""
    try:
        updated, cid = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except Exception:  # noqa: BLE001 - any garbage is the same mistake
        raise ValueError("not a cursor returned by GET /runs") from None
    if not isinstance(updated, (int, float)) or not isinstance(cid, str):
        raise ValueError("not a cursor returned by GET /runs")
    return CheckpointMeta(checkpoint_id=cid, version=1, status="completed", step=0, fingerprint="",
                          created_at=float(updated), updated_at=float(updated))


def create_router(runners_or_graphs: Any, store: Any, *, auth: Any = None) -> APIRouter:
    """The service as a router for an existing FastAPI app: `app.include_router(router, prefix="/waypoint")`.

    The router's lifespan (merged into the app's by `include_router`) cancels the runs it executes when the
    app shuts down; `router.service` is the `Service`.
    """
    service = Service(runners_or_graphs, store, auth=auth)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await service.aclose()

    router = APIRouter(lifespan=lifespan)
    router.include_router(service.router)
    router.service = service  # type: ignore[attr-defined]
    return router


def create_app(runners_or_graphs: Any, store: Any, *, auth: Any = None, title: str = "Waypoint") -> FastAPI:
    """An ASGI app (FastAPI) serving `runners_or_graphs` on `store`: the API, its OpenAPI document at
    `/openapi.json`, and the approval page at `/ui`. `auth`: see `Auth` (default: `WAYPOINT_TOKEN`)."""
    router = create_router(runners_or_graphs, store, auth=auth)
    service: Service = router.service  # type: ignore[attr-defined]
    app = FastAPI(title=title, version="1", docs_url=None, redoc_url=None, openapi_url=None,
                  description="Start, inspect and resume checkpointed Waypoint runs; follow them live (SSE).")
    app.include_router(router)
    app.state.waypoint = service

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(_: Any = Depends(service.auth.require("read"))) -> JSONResponse:
        if app.openapi_schema is None:
            app.openapi_schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                             routes=app.routes)
        return JSONResponse(app.openapi_schema)

    return app
