"""The AG-UI endpoint (https://docs.ag-ui.com): `POST /agui/{agent}` takes a `RunAgentInput` and answers with
that run's events as AG-UI events (Server-Sent Events, one JSON event per `data:`), and `GET
/runs/{id}/events?format=ag-ui` follows a run as AG-UI events (docs/service.md, "AG-UI").

The thread ID is the run's checkpoint ID. A request without `resume` starts the thread's next turn with the
user's new messages — exactly what `POST /runs` does; one with `resume` answers the interrupts the previous
turn ended with — exactly what `POST /runs/{id}/resume` does, with the same checks and the same claim by
compare-and-set (service/_resume.py, service/_launch.py). Refusals come before the stream, as HTTP statuses in
the service's own words (404, 409, 422), as AG-UI's HTTP binding says; a failure after the claim is RUN_ERROR.
The events come from the run's event log (service/_events.py), translated by service/_agui_events.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from ._agui_events import AguiRun, Batch, CallIds, run_name
from ._agui_input import AguiInput, answers_of, new_input
from ._events import EventLog
from ._launch import claim_of, launch_resume, launch_start
from ._refusals import conflict, missing
from ._responses import SafeJSONResponse, invalid, json_bytes, problem
from ._resume import Prepared, prepare_resume
from ._schemas import ResumeRun, run_id_problem
from ._state import ServiceState

__all__ = ["AguiApi", "follow_as_agui", "AGUI_MEDIA_TYPE"]

AGUI_MEDIA_TYPE = "text/event-stream"


def _data(event: dict[str, Any]) -> bytes:
    return b"data: " + json_bytes(event) + b"\n\n"


class AguiApi:
    """The AG-UI endpoint on `state` (its docstrings are the OpenAPI descriptions)."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    async def run_agent(self, agent: str, body: AguiInput, request: Request) -> Any:
        """Run a served agent the AG-UI way: a `RunAgentInput` in, that run's AG-UI events out (SSE), ending with
        RUN_FINISHED (outcome success, interrupt or cancelled) or RUN_ERROR. The thread is the run's checkpoint
        ID. Without `resume`: the thread's next turn, from the user's new messages (scope `start`); with it: the
        answers to the interrupts its last turn ended with (scope `resume`), checked and claimed as POST
        /runs/{id}/resume does."""
        state = self.state
        state.gate.allow(request.state.waypoint_identity, "resume" if body.resume else "start", request)
        target = state.targets.get(agent)
        if target is None:
            return problem(404, f"no agent '{agent}' here; served: {', '.join(sorted(state.targets))}")
        if target.kind != "agent":
            return invalid(["path", "agent"], f"'{agent}' is a graph; AG-UI serves agents (a graph: POST /runs)")
        why = run_id_problem(body.thread_id)
        if why is not None:
            return invalid(["body", "threadId"], why)
        begun = await (_resume(state, body) if body.resume else _start(state, target, body))
        if isinstance(begun, SafeJSONResponse):
            return begun
        ex, batches = begun
        return StreamingResponse(_run_body(state, ex, body, batches), media_type=AGUI_MEDIA_TYPE,
                                 headers={"X-Accel-Buffering": "no"})


async def _start(state: ServiceState, target: Any, body: AguiInput) -> Any:
    cid = body.thread_id
    head = await state.store.history(cid, limit=1)
    force = False
    if head:
        waiting = await state.answerable(head[0])
        if waiting and head[0].status in ("interrupted", "failed") and head[0].error != "cancelled":
            return await conflict(state, head[0], f"thread '{cid}' waits on {', '.join(waiting)}: answer them in "
                                  "`resume` (one entry per interrupt: status \"resolved\" with payload {\"approved\": "
                                  "true} or {\"approved\": false}, or status \"cancelled\")", pending=waiting)
        # a stopped or failed turn that waits on nobody: the user's new message goes on from it (it is abandoned)
        force = head[0].status == "failed" or (head[0].status == "interrupted" and head[0].error == "cancelled")
    data = new_input(body, continuing=bool(head))
    if isinstance(data, SafeJSONResponse):
        return data
    ex, attempt = await launch_start(state, target, cid, data, force_new_run=force)
    outcome = await claim_of(state, ex, attempt)
    return outcome if isinstance(outcome, SafeJSONResponse) else (ex, None)


async def _resume(state: ServiceState, body: AguiInput) -> Any:
    cid = body.thread_id
    found = await state.store.history(cid, limit=1)
    if not found:
        return missing(cid)
    try:
        pending = {p["id"]: p for p in await state.pending(found[0])}
    except Exception as err:  # noqa: BLE001 - a run that does not decode is not resumed from here
        return problem(500, f"run '{cid}' cannot be read: {type(err).__name__}: {err}")
    answers = answers_of(body, pending)
    if isinstance(answers, SafeJSONResponse):
        return answers
    # bound to the interrupt IDs (minted per pause) and to the version they were read at: the claim
    # compare-and-sets on it, so a run that moved on meanwhile is refused, never resumed on a stale answer
    checked = ResumeRun(answers=answers, expected_version=found[0].version)
    prepared = await prepare_resume(state, cid, checked)
    if not isinstance(prepared, Prepared):
        return prepared
    ex, attempt = await launch_resume(state, cid, prepared)
    outcome = await claim_of(state, ex, attempt)
    if isinstance(outcome, SafeJSONResponse):
        return outcome
    seen = prepared.seen
    return ex, state.agui_calls.get((cid, seen.created_at, seen.version))


async def _run_body(state: ServiceState, ex: Any, body: AguiInput, batches: Any) -> AsyncIterator[bytes]:
    """The AG-UI events of one start or resume, from its claim to its end; the stream then ends."""
    version = ex.claimed.result().version
    created_at = getattr(ex, "created_at", None)
    if created_at is None:  # a worker's claim (the run queue): the run's, as stored
        head = await state.store.history(ex.checkpoint_id, limit=1)
        created_at = head[0].created_at if head else None
    run = AguiRun(body.thread_id, body.run_id, run_name(created_at, version), batches=batches)
    for event in run.started({"checkpointId": ex.checkpoint_id, "version": version, "how": ex.how,
                              "graph": ex.target.name}):
        yield _data(event)
    log: EventLog = ex.log
    position = log.position_after(ex.first_event)
    async for item in _follow(log, 0 if position is None else position):
        if item is None:
            yield b": keep-alive\n\n"
            continue
        events = run.gap() if isinstance(item, int) else run.feed(item.kind, item.data)
        _remember(state.agui_calls, run, ex.checkpoint_id, created_at, item)
        for event in events:
            yield _data(event)
        if run.finished:
            return
    if not run.finished:  # the service is shutting down: the run goes on elsewhere, this stream cannot
        yield _data({"type": "RUN_ERROR", "message": f"the service stopped while thread '{body.thread_id}' ran; "
                     f"it continues elsewhere: follow it with GET /runs/{body.thread_id}/events?format=ag-ui",
                     "code": "unavailable"})


def _remember(ids: CallIds, run: AguiRun, cid: str, created_at: Any, item: Any) -> None:
    """At a pause, the IDs its calls were shown under (for the resume's TOOL_CALL_RESULTs)."""
    if run.finished and not isinstance(item, int) and item.kind == "end" and item.data.get("status") == "interrupted":
        ids.put((cid, created_at, item.data.get("version")), run.batches)


async def _follow(log: EventLog, position: int) -> AsyncIterator[Any]:
    """The log's events from `position` on, as `EventLog.follow` gives them, counted as a reader."""
    log.readers += 1
    try:
        async for item in log.follow(position):
            yield item
    finally:
        log.readers -= 1


async def follow_as_agui(state: ServiceState, checkpoint_id: str, log: EventLog) -> AsyncIterator[bytes]:
    """`GET /runs/{id}/events?format=ag-ui`: the run as it is stored (RUN_STARTED, MESSAGES_SNAPSHOT or
    STATE_SNAPSHOT, and — unless it is running — RUN_FINISHED with its outcome), then each later start or
    resume of it as an AG-UI run of its own, live. Read-only; the stream ends when the run is deleted."""
    position = log.dropped + len(log.events)  # what happens from now on follows the snapshot
    view = await state.view(checkpoint_id)
    if view is None:
        yield _data({"type": "RUN_ERROR", "message": f"no run '{checkpoint_id}'", "code": "not_found"})
        return
    ids = state.agui_calls
    created_at, version = view["created_at"], view["version"]
    run: AguiRun | None = AguiRun(checkpoint_id, f"{checkpoint_id}@{version}", run_name(created_at, version))
    for event in run.started({"checkpointId": checkpoint_id, "version": version, "snapshot": True}):
        yield _data(event)
    for event in _stored(ids, checkpoint_id, view, run):
        yield _data(event)
    if run.finished:
        run = None
    async for item in _follow(log, position):
        if item is None:
            yield b": keep-alive\n\n"
            continue
        events: list[dict[str, Any]] = []
        if isinstance(item, int):
            events = run.gap() if run is not None else []
        elif item.kind == "started" and run is None:
            v = item.data.get("version")
            run = AguiRun(checkpoint_id, f"{checkpoint_id}@{v}", run_name(created_at, v),
                          batches=ids.get((checkpoint_id, created_at, v - 1)) if isinstance(v, int) else None)
            events = run.started({"checkpointId": checkpoint_id, "version": v, "how": item.data.get("how")})
        elif run is not None:
            events = run.feed(item.kind, item.data)
        elif item.kind == "deleted":
            events = [{"type": "RUN_STARTED", "threadId": checkpoint_id, "runId": f"{checkpoint_id}@deleted"},
                      {"type": "RUN_ERROR", "message": f"run '{checkpoint_id}' was deleted", "code": "deleted"}]
        for event in events:
            yield _data(event)
        if item is not None and not isinstance(item, int) and item.kind == "deleted":
            return
        if run is not None and run.finished:
            run = None


def _stored(ids: CallIds, checkpoint_id: str, view: dict[str, Any], run: AguiRun) -> list[dict[str, Any]]:
    """The stored run's snapshot in `run`, and its end unless it is running. Its last calls get the IDs an AG-UI
    stream showed them under, or new ones every later reader (and the resume) then uses."""
    key = (checkpoint_id, view["created_at"], view["version"])
    known = ids.get(key)
    path = next((tuple(p.get("run_path") or ()) for p in view.get("interrupts") or ()), None) \
        or next(iter(known), None) or (str(view.get("graph")),)
    snapshot, batch = _snapshot(view, run.name, known.get(path))
    if batch is not None:
        run.batches[path] = batch
        if view["status"] == "interrupted" and not known:
            ids.put(key, {path: batch})
    if view["status"] == "running":
        return [snapshot]
    run.feed("interrupt", {"interrupts": view.get("interrupts") or []})
    return [snapshot, *run.feed("end", {"status": view["status"], "version": view["version"],
                                        "error": view.get("error")})]


def _snapshot(view: dict[str, Any], name: str, known: Batch | None) -> tuple[dict[str, Any], Batch | None]:
    """The stored conversation (an agent) or state (a graph), with IDs minted from its positions — the last
    assistant message's calls under the IDs a stream showed them under (`known`), if one did — and those calls."""
    if view.get("messages") is None:
        state = view.get("state")
        return {"type": "STATE_SNAPSHOT", "snapshot": state if isinstance(state, dict) else {"value": state}}, None
    out: list[dict[str, Any]] = []
    batch: Batch | None = None
    calls: list[tuple[Any, int]] = []  # the last assistant message's calls not answered yet: (model ID, position)
    for i, m in enumerate(view["messages"]):
        mid, role = f"{name}.s{i}", m.get("role")
        content = m.get("content") if isinstance(m.get("content"), str) else ""
        if role == "tool" and batch is not None and calls:  # paired in order, by the model's ID (which may repeat)
            at = next((j for j, (model_id, _) in enumerate(calls) if model_id == m.get("tool_call_id")), 0)
            position = calls.pop(at)[1]
            batch.answered.add(position)
            out.append({"id": mid, "role": "tool", "content": content, "toolCallId": batch.ids[position]})
        elif role == "assistant":
            made = [c for c in m.get("tool_calls") or () if isinstance(c, dict)]
            ids = known.ids if known is not None and len(known.ids) == len(made) and i == _last_calls(view) \
                else [f"{mid}.c{k}" for k in range(len(made))]
            shown = [{"id": call_id, "type": "function",
                      "function": {"name": str(c.get("name") or ""), "arguments": c.get("arguments_json") or ""}}
                     for call_id, c in zip(ids, made)]
            batch = Batch(list(ids), [c.get("id") for c in made]) if made else None
            calls = [(c.get("id"), k) for k, c in enumerate(made)]
            out.append({"id": mid, "role": "assistant", "content": content, **({"toolCalls": shown} if shown else {})})
        elif role in ("user", "system"):
            out.append({"id": mid, "role": role, "content": content})
    return {"type": "MESSAGES_SNAPSHOT", "messages": out}, batch


def _last_calls(view: dict[str, Any]) -> int:
    """The position of the last assistant message with tool calls in the stored conversation (-1: none)."""
    return max((i for i, m in enumerate(view["messages"]) if m.get("role") == "assistant" and m.get("tool_calls")),
               default=-1)
