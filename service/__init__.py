"""Waypoint over HTTP: start, inspect and resume runs, follow them live, and approve paused tool calls.

    from waypoint.service import create_app
    app = create_app({"ops": agent}, SQLiteStore("runs.db"))      # an ASGI app (FastAPI)
    router = create_router({"ops": agent}, store)                  # or a router for an existing app

Needs the `service` extra (`pip install '.[service]'`: FastAPI, uvicorn). docs/service.md
describes the endpoints, the events, auth and the page.
"""

from waypoint.stores import open_store

from ._auth import Auth, AuthError
from ._service import Service, create_app, create_router
from ._targets import ServiceError, load_targets
from ._webhooks import WebhookError, Webhooks, verify_signature

__all__ = ["create_app", "create_router", "Service", "Auth", "AuthError", "ServiceError", "load_targets",
           "open_store", "Webhooks", "WebhookError", "verify_signature"]
