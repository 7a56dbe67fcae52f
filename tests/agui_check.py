"""Reading an AG-UI stream as a front end would, and checking it: every event parses as the protocol's published
type (`ag-ui-protocol`'s `ag_ui.core.Event`, with no field that type does not know), and the stream is well
formed (docs.ag-ui.com, "Runs and Steps", "Text Messages", "Tool Calls", "Interrupts and Resume")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
from pydantic import BaseModel, TypeAdapter

from ag_ui.core import Event

_EVENT: TypeAdapter[Any] = TypeAdapter(Event)


def agui_events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Each event of a streamed AG-UI response (one JSON object per `data:`), as it arrives."""
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield json.loads("\n".join(data))
            data = []
        elif line.startswith("data: "):
            data.append(line[6:])
        else:
            assert line.startswith(":") or line.startswith("retry:"), f"not an SSE line of ours: {line!r}"


def _no_unknown_fields(model: Any, where: str) -> None:
    if isinstance(model, BaseModel):
        assert not model.model_extra, f"{where}: fields the protocol does not know: {sorted(model.model_extra)}"
        for name in type(model).model_fields:
            _no_unknown_fields(getattr(model, name), f"{where}.{name}")
    elif isinstance(model, list):
        for i, item in enumerate(model):
            _no_unknown_fields(item, f"{where}[{i}]")


class StreamCheck:
    """The rules a consumer enforces on one stream. `known_calls`: tool call IDs earlier runs on the thread
    showed (a resumed run answers them)."""

    def __init__(self, known_calls: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.known_calls = set(known_calls)
        self.run: str | None = None
        self.closed = True
        self.open_text: set[str] = set()
        self.open_calls: set[str] = set()
        self.started_calls: list[str] = []
        self.args: dict[str, str] = {}
        self.open_steps: set[str] = set()
        self.events: list[dict[str, Any]] = []

    def feed(self, raw: dict[str, Any]) -> None:
        event = _EVENT.validate_python(raw)
        _no_unknown_fields(event, raw.get("type", "?"))
        self.events.append(raw)
        kind = raw["type"]
        if kind == "RUN_STARTED":
            assert self.closed, "RUN_STARTED while a run is active"
            self.run, self.closed = raw["runId"], False
            return
        assert not self.closed or kind == "RUN_ERROR", f"{kind} outside a run"
        getattr(self, "_" + kind.lower(), lambda e: None)(raw)

    def _text_message_start(self, e: dict[str, Any]) -> None:
        assert e["messageId"] not in self.open_text, "a text message opened twice"
        self.open_text.add(e["messageId"])

    def _text_message_content(self, e: dict[str, Any]) -> None:
        assert e["messageId"] in self.open_text, "content for a message that is not open"

    def _text_message_end(self, e: dict[str, Any]) -> None:
        self.open_text.remove(e["messageId"])

    def _tool_call_start(self, e: dict[str, Any]) -> None:
        call = e["toolCallId"]
        assert call not in self.open_calls and call not in self.started_calls and call not in self.known_calls, \
            f"tool call {call} started again: two calls would merge"
        self.open_calls.add(call)
        self.started_calls.append(call)
        self.args[call] = ""

    def _tool_call_args(self, e: dict[str, Any]) -> None:
        assert e["toolCallId"] in self.open_calls, "arguments for a call that is not open"
        self.args[e["toolCallId"]] += e["delta"]

    def _tool_call_end(self, e: dict[str, Any]) -> None:
        self.open_calls.remove(e["toolCallId"])

    def _tool_call_result(self, e: dict[str, Any]) -> None:
        call = e["toolCallId"]
        assert call in self.started_calls or call in self.known_calls, f"a result for a call never shown: {call}"
        assert call not in self.open_calls, "a result for a call still open"

    def _messages_snapshot(self, e: dict[str, Any]) -> None:
        for m in e["messages"]:
            self.known_calls.update(c["id"] for c in m.get("toolCalls") or ())
            if m["role"] == "tool":
                assert m["toolCallId"] in self.known_calls, "a tool message for a call the snapshot does not hold"

    def _step_started(self, e: dict[str, Any]) -> None:
        assert e["stepName"] not in self.open_steps
        self.open_steps.add(e["stepName"])

    def _step_finished(self, e: dict[str, Any]) -> None:
        self.open_steps.remove(e["stepName"])

    def _run_finished(self, e: dict[str, Any]) -> None:
        assert e["runId"] == self.run, "RUN_FINISHED for another run"
        assert not (self.open_text or self.open_calls or self.open_steps), "something is open at RUN_FINISHED"
        outcome = e.get("outcome") or {"type": "success"}
        if outcome["type"] == "interrupt":
            ids = [i["id"] for i in outcome["interrupts"]]
            assert len(set(ids)) == len(ids), "two interrupts share an ID"
            for i in outcome["interrupts"]:
                if "toolCallId" in i:
                    assert i["toolCallId"] in self.started_calls or i["toolCallId"] in self.known_calls
        self.closed = True

    def _run_error(self, e: dict[str, Any]) -> None:
        self.closed = True


def read_stream(response: httpx.Response, known_calls: set[str] = frozenset()) -> StreamCheck:  # type: ignore[assignment]
    """The whole stream of one AG-UI response, checked event by event; it must end with a closed run."""
    assert response.status_code == 200, response.read().decode()
    assert response.headers["content-type"].startswith("text/event-stream")
    check = StreamCheck(known_calls)
    for raw in agui_events(response):
        assert check.events or raw["type"] in ("RUN_STARTED", "RUN_ERROR"), "a stream opens with RUN_STARTED"
        check.feed(raw)
    assert check.events and check.closed, "the stream ended without closing its run"
    return check


def types(check: StreamCheck) -> list[str]:
    """The event types, each run of TEXT_MESSAGE_CONTENT (or TOOL_CALL_ARGS) shown once."""
    out: list[str] = []
    for e in check.events:
        if e["type"] in ("TEXT_MESSAGE_CONTENT", "TOOL_CALL_ARGS") and out and out[-1] == e["type"]:
            continue
        out.append(e["type"])
    return out
