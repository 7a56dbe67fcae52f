"""The HTTP API's routes (docs/service.md lists them with their answers)."""

from __future__ import annotations

import asyncio

import json
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import Response, StreamingResponse
from pydantic import TypeAdapter, ValidationError
from waypoint.engine import CheckpointConflict, Message
from waypoint.engine.keep.store import store_clock

from ._agui import AguiApi, follow_as_agui
from ._events import LogEvent, stream
from ._execution import Execution
from ._cancel import cancel_run
from ._guard import guarded_route
from ._paging import HISTORY_PAGE, MAX_VERSION, decode_cursor, encode_cursor, history_page
from ._launch import claim_of, launch_resume, launch_start
from ._queued import Submission
from ._refusals import Attempt, conflict, missing, refused
from ._responses import SafeJSONResponse, invalid, problem
from ._resume import Prepared, prepare_resume
from ._schemas import (
    CancelAccepted,
    CancelRun,
    Accepted,
    Approvals,
    HistoryPage,
    InputMessage,
    Problem,
    ResumeRun,
    RunList,
    RunView,
    Served,
    StartRun,
)
from ._state import ServiceState
from ._views import meta_view, time_left

__all__ = ["build_api_router", "EventStream"]

_AGENT_INPUT: TypeAdapter[Any] = TypeAdapter(str | list[InputMessage])
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "no valid bearer token (or page session)"},
    403: {"model": Problem, "description": "the token may not do this (or a page write without its write key)"},
    413: {"model": Problem, "description": "the body is over the service's limit"},
    429: {"model": Problem, "description": "too many wrong tokens from this address: wait (Retry-After)"},
    500: {"model": Problem, "description": "the run cannot be read, or the service failed: `detail` says which"},
}
_NOT_FOUND = {404: {"model": Problem, "description": "no such run"}}
_CONFLICT = {409: {"model": Problem, "description": "the run moved on, or another resumer won, or it is running: "
                                                    "`current_version`, `status` and `pending` say where it is"}}
_QUEUED = {202: {"model": Accepted, "description": "new input for a chat whose turn executes (`on_busy`), queued to "
                                                 "run after it: `queued` says its place"}}
_INVALID = {422: {"description": "bad input: `detail[].loc` names the field"}}
_UNAVAILABLE = {503: {"model": Problem, "description": "the service is shutting down: try again"}}
_PROBLEM_JSON = {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


def _as_json(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """`responses` for a route whose own answers are not JSON (events): its errors still are."""
    return {code: {"description": r["description"], "content": _PROBLEM_JSON} for code, r in responses.items()}


class EventStream(StreamingResponse):
    """Server-Sent Events (docs/service.md lists them)."""

    media_type = "text/event-stream"


def build_api_router(state: ServiceState) -> APIRouter:
    """The API's routes on `state` (every one through service/_guard.py)."""
    api = _Api(state)
    router = APIRouter()
    run = {"tags": ["runs"]}
    events = {"tags": ["events"], "response_class": EventStream,
              "responses": {200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"},
                            **_as_json(_ERRORS)}}
    routes: list[tuple[str, str, Any, str, dict[str, Any]]] = [
        ("GET", "/agents", api.agents, "read", {**run, "response_model": list[Served]}),
        ("POST", "/runs", api.start_run, "start",
         {**run, "status_code": 201, "response_model": Accepted | RunView,
          "responses": {**_QUEUED, **_CONFLICT, **_INVALID, **_UNAVAILABLE}}),
        ("GET", "/runs", api.list_runs, "read", {**run, "response_model": RunList, "responses": _INVALID}),
        ("GET", "/runs/{checkpoint_id}", api.get_run, "read",
         {**run, "response_model": RunView, "responses": {**_NOT_FOUND, **_INVALID}}),
        ("GET", "/runs/{checkpoint_id}/history", api.get_history, "read",
         {**run, "response_model": HistoryPage, "responses": {**_NOT_FOUND, **_INVALID}}),
        ("POST", "/runs/{checkpoint_id}/resume", api.resume_run, "resume",
         {**run, "response_model": Accepted | RunView,
          "responses": {**_NOT_FOUND, **_CONFLICT, **_INVALID, **_UNAVAILABLE}}),
        ("POST", "/runs/{checkpoint_id}/cancel", api.cancel_run, "cancel",
         {**run, "status_code": 202, "response_model": CancelAccepted,
          "responses": {**_NOT_FOUND, **_CONFLICT, **_INVALID}}),
        ("DELETE", "/runs/{checkpoint_id}", api.delete_run, "delete",
         {**run, "status_code": 204, "response_class": Response, "response_model": None,
          "responses": {**_NOT_FOUND, **_CONFLICT}}),
        ("GET", "/runs/{checkpoint_id}/events", api.run_events, "read",
         {**events, "responses": {**events["responses"], **_as_json(_NOT_FOUND)}}),
        ("GET", "/approvals", api.approvals, "read", {"tags": ["events"], "response_model": Approvals}),
        ("GET", "/events", api.service_events, "read", events),
        ("POST", "/agui/{agent}", AguiApi(state).run_agent, "read",
         {**events, "tags": ["ag-ui"],
          "responses": {**events["responses"], **_as_json({**_NOT_FOUND, **_CONFLICT, **_INVALID})}}),
    ]
    for method, path, endpoint, scope, extra in routes:
        if extra.get("response_class") is not EventStream:
            extra = {"response_class": SafeJSONResponse, **extra, "responses": {**_ERRORS, **extra.get("responses", {})}}
        router.add_api_route(path, endpoint, methods=[method], dependencies=[Depends(state.gate.require(scope))],
                             route_class_override=guarded_route(state.gate, scope, state.max_body), **extra)
    return router


class _Api:
    """The endpoints (their docstrings are the OpenAPI descriptions)."""

    def __init__(self, state: ServiceState) -> None:
        self.state, self.store, self.executor = state, state.store, state.executor

    async def _answer(self, ex: Execution | Submission, attempt: Attempt, wait: bool, code: int) -> Any:
        outcome = await claim_of(self.state, ex, attempt)
        if isinstance(outcome, SafeJSONResponse):
            return outcome
        if outcome.queued is not None:  # new input for a chat whose turn executes: it runs after that turn
            q = outcome.queued
            return SafeJSONResponse({"checkpoint_id": ex.checkpoint_id, "graph": ex.target.name, "status": "queued",
                                     "version": None,
                                     "queued": {"n": q.n, "policy": q.policy, "by": q.by, "queued_at": q.queued_at}},
                                    status_code=202)
        if not wait:
            return SafeJSONResponse({"checkpoint_id": ex.checkpoint_id, "graph": ex.target.name,
                                     "status": outcome.status, "version": outcome.version,
                                     "last_event_id": ex.first_event}, status_code=code)
        failed = await asyncio.shield(ex.finished)  # work handed to a worker may still be refused there (its compare-and-set)
        if failed is not None:
            return await refused(self.state, attempt, failed)
        view = await self._view(ex.checkpoint_id)
        if isinstance(view, SafeJSONResponse):
            return view
        return SafeJSONResponse(view, status_code=code)

    async def _view(self, checkpoint_id: str, version: int | None = None,
                    history_limit: int = HISTORY_PAGE) -> dict[str, Any] | SafeJSONResponse:
        try:
            view = await self.state.view(checkpoint_id, version, history_limit=history_limit)
        except Exception as err:  # noqa: BLE001 - stored bytes that do not decode, a type no module here registers
            return problem(500, f"run '{checkpoint_id}' cannot be read: {type(err).__name__}: {err}")
        return missing(checkpoint_id, version) if view is None else view

    async def agents(self) -> list[dict[str, Any]]:
        """The agents and graphs this service runs."""
        return [{"name": t.name, "kind": t.kind, "description": t.description}
                for t in self.state.targets.values()]

    async def start_run(self, body: StartRun) -> Any:
        """Start a run (in this process, or — with a run queue — in a worker). Answers once its first version
        (the claim) is written — or, with `wait`, once it pauses, completes or fails (then with the run, as
        GET /runs/{id} gives it). With a queue and no worker's claim yet, `status` is "queued"."""
        targets = self.state.targets
        if body.agent is None and len(targets) != 1:
            return invalid(["body", "agent"], f"name the agent or graph to run: one of {sorted(targets)}")
        target = targets.get(body.agent) if body.agent is not None else next(iter(targets.values()))
        if target is None:
            return invalid(["body", "agent"], f"no agent or graph {body.agent!r} here; served: {sorted(targets)}")
        data = body.input
        if target.kind == "agent":
            try:
                data = _messages(_AGENT_INPUT.validate_python(body.input))
            except ValidationError:
                return invalid(["body", "input"], "an agent's input is text or a list of {role, content} messages")
            if isinstance(data, list) and not data:
                return invalid(["body", "input"], "an agent's input is text or a list of at least one message")
        cid = body.checkpoint_id or uuid.uuid4().hex
        on_busy = body.on_busy or self.state.on_busy
        if on_busy != "reject" and target.kind != "agent":
            return invalid(["body", "on_busy"], f"on_busy={on_busy!r} queues a chat's new input: {target.name!r} is a "
                           "graph, whose runs take input only when started")
        ex, attempt = await launch_start(self.state, target, cid, data, force_new_run=body.force_new_run,
                                         on_busy=on_busy, by=body.by)
        return await self._answer(ex, attempt, body.wait, 201)

    async def list_runs(self, status: Literal["running", "interrupted", "completed", "failed"] | None = None,
                        limit: int = Query(50, ge=1, le=500),
                        before: str | None = Query(None, max_length=2048,
                                                   description="the `next` cursor of the previous page")) -> Any:
        """The newest version of each run, most recently updated first, a page at a time."""
        try:
            cursor = decode_cursor(before) if before is not None else None
        except ValueError as err:
            return invalid(["query", "before"], str(err))
        metas = await self.store.list(status=status, limit=limit, before=cursor)
        now = await store_clock(self.store)
        runs = []
        for meta in metas:
            target = self.state.target_of(meta)
            runs.append({**meta_view(meta, now), "graph": target.name if target else None,
                         "active": meta.checkpoint_id in self.executor.running})
        return {"runs": runs, "next": encode_cursor(metas[-1]) if len(metas) == limit else None}

    async def get_run(self, checkpoint_id: str, version: int | None = Query(None, ge=1, le=MAX_VERSION),
                      history_limit: int = Query(HISTORY_PAGE, ge=1, le=500,
                                                 description="versions of its history to include")) -> Any:
        """A run: status, step, pending interrupts with what they show, the conversation (an agent) or
        the state (a graph), its output, decisions, and a page of its history (newest first; the rest from
        GET /runs/{id}/history). The cost of a read does not grow with the number of versions."""
        return await self._view(checkpoint_id, version, history_limit)

    async def get_history(self, checkpoint_id: str,
                          before: int | None = Query(None, ge=1, le=MAX_VERSION,
                                                     description="the `history_next` (or `next`) of the last page"),
                          limit: int = Query(HISTORY_PAGE, ge=1, le=500)) -> Any:
        """A run's versions older than `before`, newest first, a page at a time."""
        page, more = await history_page(self.store, checkpoint_id, before=before, limit=limit)
        if not page and not await self.store.history(checkpoint_id, limit=1):
            return missing(checkpoint_id)
        now = await store_clock(self.store)
        return {"history": [meta_view(m, now) for m in page], "next": more}

    async def resume_run(self, checkpoint_id: str, body: ResumeRun) -> Any:
        """Resume a run (in this process, or — with a run queue — in a worker) with answers by interrupt ID.
        An `approve` (or `restart`) must carry
        the approval's `digest` or `expected_version`. Answers once the claim is written by compare-and-set
        on the version the answers were checked against (or, with `wait`, once the run pauses again,
        completes or fails). 409 when the run moved on, the digest no longer matches, an interrupt is no
        longer pending, another resumer won, or it is running."""
        prepared = await prepare_resume(self.state, checkpoint_id, body)
        if not isinstance(prepared, Prepared):
            return prepared
        ex, attempt = await launch_resume(self.state, checkpoint_id, prepared, takeover=body.takeover)
        return await self._answer(ex, attempt, body.wait, 200)

    async def cancel_run(self, checkpoint_id: str, body: CancelRun) -> Any:
        """Stop a running run wherever it executes — this service, another one, a worker — `now` or at a safe point
        (`after_step`; an agent's `after_tool_calls` or `after_model_call`; `after:<node>`). It is stored cancelled
        at its last finished step with who asked, and continues when resumed or given new input. 202 once the request
        is recorded (the run stops within about half a second); 409 when nothing executes the run (paused, finished,
        or its process is gone); 422 for a point its graph does not have."""
        return await cancel_run(self.state, checkpoint_id, body)

    async def delete_run(self, checkpoint_id: str,
                         force: bool = Query(False, description="also a run that is running")) -> Any:
        """Delete a run: every version, its blobs, its tool ledger and its events in this service."""
        head = await self.store.history(checkpoint_id, limit=1)
        if not head:
            return missing(checkpoint_id)
        try:  # without force, the store refuses a live run in the delete's own transaction, on its own clock
            existed = await self.store.delete(checkpoint_id, force=force)
        except CheckpointConflict as err:
            return await conflict(self.state, head[0], f"{err} (DELETE with force=true)")
        if not existed:
            return missing(checkpoint_id)
        running = self.executor.running.get(checkpoint_id)
        if running is not None and running.task is not None:
            running.task.cancel()  # stop spending model calls on a run that is gone
        gone = {"checkpoint_id": checkpoint_id}
        self.state.watcher.forget(checkpoint_id)
        log = self.state.logs.drop(checkpoint_id)  # its events go with it: a new run on the ID starts afresh
        if log is not None:
            log.append("deleted", gone)
        self.state.logs.hub.append("deleted", gone)
        return Response(status_code=204)

    async def run_events(self, checkpoint_id: str, last_event_id: str | None = Header(None, alias="Last-Event-ID"),
                         after: str | None = Query(None, max_length=64,
                                                   description="like Last-Event-ID, for clients that cannot set "
                                                               "headers (anything but one of our IDs: a snapshot)"),
                         protocol: Literal["waypoint", "ag-ui"] = Query("waypoint", alias="format", description="`ag-ui`: the run as "
                                                                      "AG-UI events (docs/service.md, \"AG-UI\")"),
                         ) -> Any:
        """The run's events as Server-Sent Events: a `snapshot` first (unless `Last-Event-ID` names an event
        still in the log: then what followed it), then live events as they happen."""
        self.state.watcher.ensure()
        executing = self.executor.running.get(checkpoint_id)
        relayed = None
        if executing is not None:  # its log is the run's since its claim
            log = executing.log
        else:
            if checkpoint_id in self.state.watcher.expected:  # a start submitted here: its log, if claimed
                await self.state.watcher.look(checkpoint_id)
            head = await self.store.history(checkpoint_id, limit=1)
            queued = self.state.watcher.expected.get(checkpoint_id)
            if not head and queued is not None and protocol == "ag-ui":
                return problem(409, f"run '{checkpoint_id}' waits in the run queue for a worker: follow it as AG-UI "
                               f"once a worker has claimed it (GET /runs/{checkpoint_id} says so), or follow its native events now")
            if not head and queued is not None:  # a start submitted here that no worker has claimed yet
                async def waiting() -> dict[str, Any]:
                    return {"checkpoint_id": checkpoint_id, "status": "queued",
                            "detail": "submitted to the run queue; its events come once a worker claims it"}

                return _sse_response(stream(queued.log, _event_id(last_event_id, after)[0], waiting))
            if not head:
                return missing(checkpoint_id)
            kept = self.state.logs.runs.get(checkpoint_id)
            log = self.state.logs.current(checkpoint_id, head[0].created_at)  # never another run's log
            if checkpoint_id not in self.executor.launched:  # executed elsewhere (or at rest): from the store
                self.state.watcher.follow(checkpoint_id, head[0], fresh=log is not kept)
                relayed = self.state.watcher.relayed(checkpoint_id, head[0].created_at)
                await self.state.watcher.begin_relay(log, head[0])

        async def snapshot() -> dict[str, Any]:
            view = await self._view(checkpoint_id)
            if isinstance(view, dict):
                return view
            status = "deleted" if view.status_code == 404 else "unreadable"
            return {"checkpoint_id": checkpoint_id, "status": status, "detail": json.loads(view.body)["detail"]}

        if protocol == "ag-ui":
            return _sse_response(follow_as_agui(self.state, checkpoint_id, log))
        return _sse_response(stream(log, _event_id(last_event_id, after), snapshot, relayed=relayed))

    async def approvals(self, limit: int = Query(100, ge=1, le=500)) -> Any:
        """What runs wait on, newest first: approvals (tool, arguments, digest) and other interrupts — of
        paused runs, and of failed runs that still wait on one (`run_status` "failed", `run_error` why)."""
        out, unreadable = [], []
        metas = [*await self.store.list(status="interrupted", limit=limit),
                 *await self.store.list(status="failed", limit=limit)]
        now = await store_clock(self.store)  # a deadline is judged on the store's clock, as recovery judges it
        for meta in metas:
            target = self.state.target_of(meta)
            try:
                pending = await self.state.pending(meta)
            except Exception:  # noqa: BLE001 - one damaged (or foreign) run does not hide the others
                unreadable.append(meta.checkpoint_id)
                continue
            for item in pending:
                if item["kind"] != "pause":
                    out.append({"checkpoint_id": meta.checkpoint_id, "graph": target.name if target else None,
                                "run_status": meta.status, "run_error": meta.error, **time_left(item, now)})
        out.sort(key=lambda p: p["paused_at"] or 0, reverse=True)
        return {"approvals": out[:limit], "unreadable": unreadable}

    async def service_events(self, last_event_id: str | None = Header(None, alias="Last-Event-ID"),
                             after: str | None = Query(None, max_length=64)) -> Any:
        """Every run's `started`, `interrupt`, `end` and `deleted` events (what the approval page follows). A
        reader that reconnects is replayed only the events of runs that are still stored."""
        self.state.watcher.ensure()
        await self.state.watcher.follow_hub()
        async def snapshot() -> dict[str, Any]:
            return {"active": sorted(self.executor.running), "at": time.time()}

        stored: dict[str, float | None] = {}  # checkpoint ID -> the created_at of its run now

        async def replayable(event: LogEvent) -> bool:
            if event.run is None:
                return True
            cid, created_at = event.run
            if cid not in stored:
                try:
                    head = await self.store.history(cid, limit=1)
                except Exception:  # noqa: BLE001 - what cannot be checked is not replayed
                    head = []
                stored[cid] = head[0].created_at if head else None
            return created_at is not None and stored[cid] == created_at

        return _sse_response(stream(self.state.logs.hub, _event_id(last_event_id, after)[0], snapshot, replayable))


def _messages(value: Any) -> Any:
    if isinstance(value, str):
        return value
    return [Message(role=m.role, content=m.content) for m in value]


def _event_id(header: str | None, after: str | None) -> tuple[int | None, int | None]:
    """The event a reader saw last: `Last-Event-ID` (or `?after=`, the same for clients that cannot set
    headers) — `<local ID>` or `<local ID>.<relayed number>` (service/_events.py); anything else is none of ours:
    a snapshot first."""
    text = header if header is not None else after
    if text is None:
        return None, None
    local, dot, cursor = text.strip().partition(".")
    if not (local.isascii() and local.isdigit() and len(local) <= 20):
        return None, None
    if not dot:
        return int(local), None
    return int(local), int(cursor) if cursor.isascii() and cursor.isdigit() and len(cursor) <= 20 else None


def _sse_response(body: Any) -> EventStream:
    return EventStream(body, headers={"X-Accel-Buffering": "no"})
