"""The HTTP API's routes (docs/service.md lists them with their answers)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Depends, Header, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import TypeAdapter, ValidationError
from waypoint.engine import WaypointError

from ._events import stream
from ._execution import Execution
from ._schemas import Accepted, InputMessage, Problem, ResumeRun, RunList, Served, StartRun
from ._service import decode_cursor, encode_cursor, invalid
from ._views import lease_alive, meta_view, run_view

if TYPE_CHECKING:
    from ._service import Service

__all__ = ["build_router"]

_AGENT_INPUT: TypeAdapter[Any] = TypeAdapter(str | list[InputMessage])
_ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": Problem, "description": "no valid bearer token"},
                                            403: {"model": Problem, "description": "the token may not do this"}}
_NOT_FOUND = {404: {"model": Problem, "description": "no such run"}}
_CONFLICT = {409: {"model": Problem, "description": "the run moved on, or another resumer won, or it is running "
                                                    "elsewhere: `current_version` says where it is"}}
_INVALID = {422: {"description": "bad input: `detail[].loc` names the field"}}
_SSE = {"content": {"text/event-stream": {}}, "description": "Server-Sent Events (docs/service.md lists them)"}


def build_router(service: Service) -> APIRouter:
    """The API's routes on `service`, plus the approval page's."""
    api = _Api(service)
    router = APIRouter(responses=_ERRORS)
    need = {scope: [Depends(service.auth.require(scope))] for scope in ("read", "start", "resume", "delete")}
    routes: list[tuple[str, str, Any, str, dict[str, Any]]] = [
        ("GET", "/agents", api.agents, "read", {"response_model": list[Served], "tags": ["runs"]}),
        ("POST", "/runs", api.start_run, "start", {"status_code": 201, "response_model": Accepted, "tags": ["runs"],
                                                   "responses": {**_CONFLICT, **_INVALID}}),
        ("GET", "/runs", api.list_runs, "read", {"response_model": RunList, "tags": ["runs"]}),
        ("GET", "/runs/{checkpoint_id}", api.get_run, "read", {"tags": ["runs"], "responses": _NOT_FOUND}),
        ("POST", "/runs/{checkpoint_id}/resume", api.resume_run, "resume",
         {"response_model": Accepted, "tags": ["runs"], "responses": {**_NOT_FOUND, **_CONFLICT, **_INVALID}}),
        ("DELETE", "/runs/{checkpoint_id}", api.delete_run, "delete",
         {"status_code": 204, "response_class": Response, "response_model": None,
          "tags": ["runs"], "responses": {**_NOT_FOUND, **_CONFLICT}}),
        ("GET", "/runs/{checkpoint_id}/events", api.run_events, "read",
         {"tags": ["events"], "responses": {200: _SSE, **_NOT_FOUND}}),
        ("GET", "/approvals", api.approvals, "read", {"tags": ["events"]}),
        ("GET", "/events", api.service_events, "read", {"tags": ["events"], "responses": {200: _SSE}}),
    ]
    for method, path, endpoint, scope, extra in routes:
        router.add_api_route(path, endpoint, methods=[method], dependencies=need[scope], **extra)
    from ._ui import add_ui_routes

    add_ui_routes(router, service)
    return router


class _Api:
    """The endpoints (their docstrings are the OpenAPI descriptions)."""

    def __init__(self, service: Service) -> None:
        self.service, self.store, self.executor = service, service.store, service.executor

    async def _answer(self, ex: Execution, first_event: int, wait: bool, code: int) -> Any:
        outcome = await ex.claimed
        if outcome.version is None:
            return await self.service.refused(ex.checkpoint_id, outcome.error)
        if not wait:
            return JSONResponse({"checkpoint_id": ex.checkpoint_id, "graph": ex.target.name, "status": "running",
                                 "version": outcome.version, "last_event_id": first_event}, status_code=code)
        await ex.finished
        view = await self._view(ex.checkpoint_id)
        if view is None:
            return _missing(ex.checkpoint_id)
        return JSONResponse(view, status_code=code)

    async def _view(self, checkpoint_id: str, version: int | None = None) -> dict[str, Any] | None:
        history = await self.store.history(checkpoint_id)
        snap = await self.service.snapshot(checkpoint_id, version, history=history[:1]) if history else None
        if snap is None:
            return None
        return run_view(snap, history, active=checkpoint_id in self.executor.running)

    async def agents(self) -> list[dict[str, Any]]:
        """The agents and graphs this service runs."""
        return [{"name": t.name, "kind": t.kind, "description": t.description}
                for t in self.service.targets.values()]

    async def start_run(self, body: StartRun) -> Any:
        """Start a run in this process. Answers once its first version (the claim) is written — or, with
        `wait`, once it pauses, completes or fails (then with the run, as GET /runs/{id} gives it)."""
        targets = self.service.targets
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
        cid = body.checkpoint_id or uuid.uuid4().hex
        first_event = self.service.logs.get(cid).last_id
        ex = self.executor.launch(target, cid, "start", input=data, force_new_run=body.force_new_run)
        return await self._answer(ex, first_event, body.wait, 201)

    async def list_runs(self, status: Literal["running", "interrupted", "completed", "failed"] | None = None,
                        limit: int = Query(50, ge=1, le=500),
                        before: str | None = Query(None, description="the `next` cursor of the previous page")) -> Any:
        """The newest version of each run, most recently updated first, a page at a time."""
        try:
            cursor = decode_cursor(before) if before is not None else None
        except ValueError as err:
            return invalid(["query", "before"], str(err))
        metas = await self.store.list(status=status, limit=limit, before=cursor)
        runs = []
        for meta in metas:
            target = self.service.target_of(meta)
            runs.append({**meta_view(meta), "graph": target.name if target else None,
                         "active": meta.checkpoint_id in self.executor.running})
        return {"runs": runs, "next": encode_cursor(metas[-1]) if len(metas) == limit else None}

    async def get_run(self, checkpoint_id: str, version: int | None = Query(None, ge=1)) -> Any:
        """A run: status, step, pending interrupts with what they show, the conversation (an agent) or
        the state (a graph), its output, decisions, and its history (every version, newest first)."""
        try:
            view = await self._view(checkpoint_id, version)
        except WaypointError as err:  # stored bytes that do not decode, a type no module here registers
            return JSONResponse({"detail": f"run '{checkpoint_id}' cannot be read: {err}"}, status_code=500)
        if view is None:
            return _missing(checkpoint_id, version)
        return view

    async def resume_run(self, checkpoint_id: str, body: ResumeRun) -> Any:
        """Resume a run in this process with answers by interrupt ID. Answers once the claim is written by
        compare-and-set (or, with `wait`, once the run pauses again, completes or fails). 409 when the run
        moved on (`expected_version`, an interrupt no longer pending, a completed run) or another resumer won."""
        head = await self.store.history(checkpoint_id, limit=1)
        if not head:
            return _missing(checkpoint_id)
        target = self.service.target_of(head[0])
        if target is None:
            return await self.service.conflict(checkpoint_id, f"run '{checkpoint_id}' was written by a graph this "
                                               f"service does not run (it runs {sorted(self.service.targets)})")
        resume, problem = _resume_data(body, target.kind)
        if problem is None and resume is None:
            problem = await _refuse_unanswered(self.service, head[0])
        if problem is not None:
            return problem
        first_event = self.service.logs.get(checkpoint_id).last_id
        ex = self.executor.launch(target, checkpoint_id, "resume", resume=resume, takeover=body.takeover,
                                  expected_version=body.expected_version)
        return await self._answer(ex, first_event, body.wait, 200)

    async def delete_run(self, checkpoint_id: str,
                         force: bool = Query(False, description="also a run that is running")) -> Any:
        """Delete a run: every version, its blobs and its tool ledger."""
        head = await self.store.history(checkpoint_id, limit=1)
        if not head:
            return _missing(checkpoint_id)
        if head[0].status == "running" and lease_alive(head[0]) and not force:
            return await self.service.conflict(checkpoint_id, f"run '{checkpoint_id}' is running; pass force=true to "
                                               "delete it anyway (its process stops at its next write)")
        running = self.executor.running.get(checkpoint_id)
        if running is not None and running.task is not None:
            running.task.cancel()  # stop spending model calls on a run that is going away
        if not await self.store.delete(checkpoint_id):
            return _missing(checkpoint_id)
        self.service.logs.get(checkpoint_id).append("deleted", {"checkpoint_id": checkpoint_id})
        self.service.logs.hub.append("deleted", {"checkpoint_id": checkpoint_id})
        return Response(status_code=204)

    async def run_events(self, checkpoint_id: str, last_event_id: str | None = Header(None, alias="Last-Event-ID"),
                         after: int | None = Query(None, description="like Last-Event-ID, for clients that cannot "
                                                                     "set headers")) -> Any:
        """The run's events as Server-Sent Events: a `snapshot` first (unless `Last-Event-ID` names an event
        still in the log: then what followed it), then live events as they happen."""
        if checkpoint_id not in self.executor.running and not await self.store.history(checkpoint_id, limit=1):
            return _missing(checkpoint_id)

        async def snapshot() -> dict[str, Any]:
            return await self._view(checkpoint_id) or {"checkpoint_id": checkpoint_id, "status": "deleted"}

        log = self.service.logs.get(checkpoint_id)
        return _sse_response(stream(log, _event_id(last_event_id, after), snapshot))

    async def approvals(self, limit: int = Query(100, ge=1, le=500)) -> Any:
        """What paused runs wait on, newest first: approvals (tool, arguments, digest) and other interrupts."""
        out, unreadable = [], []
        for meta in await self.store.list(status="interrupted", limit=limit):
            target = self.service.target_of(meta)
            try:
                pending = await self.service.pending(meta)
            except WaypointError:  # one damaged (or foreign) run does not hide the others
                unreadable.append(meta.checkpoint_id)
                continue
            for item in pending:
                if item["kind"] != "pause":
                    out.append({"checkpoint_id": meta.checkpoint_id, "graph": target.name if target else None, **item})
        out.sort(key=lambda p: p["paused_at"] or 0, reverse=True)
        return {"approvals": out, "unreadable": unreadable}

    async def service_events(self, last_event_id: str | None = Header(None, alias="Last-Event-ID"),
                             after: int | None = Query(None)) -> Any:
        """Every run's `started`, `interrupt`, `end` and `deleted` events (what the approval page follows)."""
        async def snapshot() -> dict[str, Any]:
            return {"active": sorted(self.executor.running)}

        return _sse_response(stream(self.service.logs.hub, _event_id(last_event_id, after), snapshot))


def _missing(checkpoint_id: str, version: int | None = None) -> JSONResponse:
    what = f"no run '{checkpoint_id}'" if version is None else f"no version {version} of run '{checkpoint_id}'"
    return JSONResponse({"detail": what}, status_code=404)


def _messages(value: Any) -> Any:
    if isinstance(value, str):
        return value
    from waypoint.engine import Message

    return [Message(role=m.role, content=m.content) for m in value]


def _event_id(header: str | None, after: int | None) -> int | None:
    if header is not None:
        try:
            return int(header.strip())
        except ValueError:
            return None  # not one of ours: start over with a snapshot
    return after


def _sse_response(body: Any) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _resume_data(body: ResumeRun, kind: str) -> tuple[Any, JSONResponse | None]:
    """`resume=` for the engine from the answers: `{interrupt_id: data}`, or None (no answers)."""
    out: dict[str, Any] = {}
    for i, a in enumerate(body.answers):
        loc = ["body", "answers", i, "interrupt_id"]
        if a.interrupt_id in out:
            return None, invalid(loc, f"interrupt {a.interrupt_id} is answered twice; give one answer per interrupt")
        if a.action == "restart" and kind != "agent":
            return None, invalid(["body", "answers", i, "action"], "restart is for an agent's paused tool calls")
        out[a.interrupt_id] = _agent_answer(a) if kind == "agent" else _graph_answer(a)
    return (out or None), None


def _agent_answer(a: Any) -> Any:
    """What an agent's paused tool call receives (docs/middleware.md)."""
    from waypoint.engine import Respond, Restart
    from waypoint.middleware import ApprovalResult

    if a.action == "approve":
        return ApprovalResult(approved=True, digest=a.digest)
    if a.action == "reject":
        return ApprovalResult(approved=False, reason=a.reason)
    if a.action == "respond":
        return Respond(a.output)
    return Restart(metadata=a.metadata, replace_input=a.replace_input)


def _graph_answer(a: Any) -> Any:
    """What a plain graph's paused node receives from `get_resume_context()`."""
    if a.action == "respond":
        return a.output
    if a.action == "approve":
        return {"approved": True}
    return {"approved": False, "reason": a.reason} if a.reason else {"approved": False}


async def _refuse_unanswered(service: Service, meta: Any) -> JSONResponse | None:
    """A resume without answers of a run that waits for one is a mistake in the request, not a resume."""
    if meta.status != "interrupted":
        return None
    waiting = [p["id"] for p in await service.pending(meta) if p["kind"] != "pause"]
    if not waiting:
        return None
    return invalid(["body", "answers"], f"run '{meta.checkpoint_id}' waits on interrupt(s) {', '.join(waiting)}: "
                   "answer them (approve, reject, respond or restart)", "missing")
