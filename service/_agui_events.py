"""A run's log events (service/_events.py, as docs/service.md lists them) as AG-UI events: one `AguiRun` per
AG-UI run — one start or resume of a Waypoint run — fed the log events of that execution in order.

Identity is minted here, never taken from the model: a message is `<run>.m<n>`, a tool call `<run>.c<n>`, a
tool result `<run>.r<n>`, where `<run>` names the execution (the Waypoint run's incarnation and the version of
its claim). A model that repeats a call ID, or sends none, still gives each call its own TOOL_CALL_START /
ARGS / END; its results are paired with their calls by position in the assistant message (the service's
`tool_result.position`), else by the model's ID in call order. What is open is closed before the run ends,
and the run ends once: RUN_FINISHED (outcome success, interrupt or cancelled) or RUN_ERROR.

A paused call's ID must outlive the stream that showed it: the resumed run answers it with TOOL_CALL_RESULT
against the same ID. `CallIds` keeps, per paused version, the IDs its calls were shown under; a resume that
finds none (the service restarted, another one showed the pause) shows the calls again under new IDs first.
"""

from __future__ import annotations

import datetime
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from waypoint.engine.run.resume import segment_of

from ._agui_input import APPROVAL_SCHEMA

__all__ = ["AguiRun", "CallIds", "Batch", "run_name", "ARGS_CHUNK"]

ARGS_CHUNK = 64 * 1024
"""Characters of a call's arguments per TOOL_CALL_ARGS event (huge arguments come in several)."""
_KEEP = 10_000


def run_name(created_at: float | None, version: int | None) -> str:
    """The prefix of every ID minted for one execution of a run: unique within the thread."""
    return f"wp{int((created_at or 0) * 1_000_000):x}-{version or 0}"


@dataclass
class Batch:
    """The calls of one assistant message: their minted IDs by position, and which have a result."""

    ids: list[str]
    model_ids: list[str | None]
    answered: set[int] = field(default_factory=set)

    def pair(self, model_id: Any, position: Any) -> int | None:
        """The position of the call a result answers: its own position if given, else the first call with
        that model ID that has no result yet."""
        if isinstance(position, int) and 0 <= position < len(self.ids) and position not in self.answered:
            return position
        return next((k for k, m in enumerate(self.model_ids) if m == model_id and k not in self.answered), None)


class CallIds:
    """The IDs paused calls were shown under, per (run, created_at, paused version), bounded."""

    def __init__(self, keep: int = _KEEP) -> None:
        self.keep = keep
        self.batches: OrderedDict[tuple[str, float | None, int | None], dict[tuple[str, ...], Batch]] = OrderedDict()

    def put(self, key: tuple[str, float | None, int | None], batches: dict[tuple[str, ...], Batch]) -> None:
        self.batches[key] = batches
        self.batches.move_to_end(key)
        while len(self.batches) > self.keep:
            self.batches.popitem(last=False)

    def get(self, key: tuple[str, float | None, int | None]) -> dict[tuple[str, ...], Batch]:
        found = self.batches.get(key)
        return {path: Batch(list(b.ids), list(b.model_ids), set(b.answered)) for path, b in (found or {}).items()}


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class AguiRun:
    """One AG-UI run (thread `thread_id`, run `run_id`) of one execution named `name`; `feed` turns each log
    event into AG-UI events, `finished` is set once the run is closed. `batches`: the calls a resumed pause
    was shown under (`CallIds.get`)."""

    def __init__(self, thread_id: str, run_id: str, name: str, *,
                 batches: dict[tuple[str, ...], Batch] | None = None) -> None:
        self.thread_id, self.run_id, self.name = thread_id, run_id, name
        self.batches: dict[tuple[str, ...], Batch] = batches or {}
        self.counter = 0
        self.open_text: tuple[str, tuple[str, ...]] | None = None  # (message ID, run_path)
        self.last_text: dict[tuple[str, ...], str] = {}
        self.last_message: dict[tuple[str, ...], tuple[str, Batch | None, list[tuple[str, Any]]]] = {}
        self.steps: list[str] = []
        self.pending: list[dict[str, Any]] = []
        self.error: dict[str, Any] | None = None
        self.finished = False

    def _mint(self, kind: str) -> str:
        self.counter += 1
        return f"{self.name}.{kind}{self.counter}"

    def started(self, metadata: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id, "protocolVersion": "1.0",
                 "metadata": {"waypoint": metadata}}]

    def feed(self, kind: str, data: dict[str, Any]) -> list[dict[str, Any]]:
        """The AG-UI events for one log event (none once the run is closed)."""
        if self.finished:
            return []
        path = tuple(str(p) for p in data.get("run_path") or ())
        if kind == "token":
            return self._token(str(data.get("text") or ""), path)
        if kind == "message":
            return self._message(data, path)
        if kind == "tool_result":
            return self._result(data, path)
        if kind in ("decision", "retry", "rerun"):
            out = self._close_text() if kind == "retry" else []  # what was streamed since the last message is void
            return out + [{"type": "CUSTOM", "name": f"waypoint.{kind}", "value": data}]
        if kind == "node":
            return self._step(str(data.get("node")), data.get("event") == "start")
        if kind == "interrupt":
            self.pending = list(data.get("interrupts") or ())
        elif kind == "error":
            self.error = data
        elif kind == "end":
            return self._end(data)
        elif kind == "deleted":
            return self._close() + [self._run_error(f"thread '{self.thread_id}' was deleted while it ran", "deleted")]
        return []

    def gap(self) -> list[dict[str, Any]]:
        """This reader fell behind the run's log: what it missed is not shown (tokens, calls)."""
        return self._close_text() + [{"type": "CUSTOM", "name": "waypoint.gap", "value": {
            "detail": "this stream fell behind the run; some of its events are not shown (GET /runs/{id} has them)"}}]

    # --- text ------------------------------------------------------------------------------------------

    def _token(self, text: str, path: tuple[str, ...]) -> list[dict[str, Any]]:
        if not text:
            return []
        out: list[dict[str, Any]] = []
        if self.open_text is not None and self.open_text[1] != path:
            out += self._close_text()
        if self.open_text is None:
            message_id = self._mint("m")
            self.open_text = (message_id, path)
            out.append({"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant",
                        "metadata": {"waypoint": {"runPath": list(path)}}})
        return out + [{"type": "TEXT_MESSAGE_CONTENT", "messageId": self.open_text[0], "delta": text}]

    def _close_text(self) -> list[dict[str, Any]]:
        if self.open_text is None:
            return []
        (message_id, path), self.open_text = self.open_text, None
        self.last_text[path] = message_id
        return [{"type": "TEXT_MESSAGE_END", "messageId": message_id}]

    # --- tool calls --------------------------------------------------------------------------------------

    def _message(self, data: dict[str, Any], path: tuple[str, ...]) -> list[dict[str, Any]]:
        """The assistant's whole message: ends its streamed text (or shows it whole, when no token came: a run
        followed from the store), then opens and closes each of its calls. A restated message (what was stored
        differs from what streamed) keeps the calls it did not change under their IDs."""
        before = self.last_message.pop(path, None) if data.get("restated") else None
        streamed = self.open_text is not None and self.open_text[1] == path
        out = self._close_text()
        content = data.get("content") if isinstance(data.get("content"), str) else ""
        if not streamed and content and (before is None or content != before[0]):
            self.last_text.pop(path, None)
            out += self._token(content, path) + self._close_text()
        elif not streamed and before is None:
            self.last_text.pop(path, None)
        calls = [c for c in data.get("tool_calls") or () if isinstance(c, dict)]
        shown = [(str(c.get("name") or ""), c.get("arguments_json")) for c in calls]
        old = before[1] if before is not None else None
        ids: list[str] = []
        for k, (call, what) in enumerate(zip(calls, shown)):
            if old is not None and k < len(old.ids) and before is not None and before[2][k] == what:
                ids.append(old.ids[k])  # the same call, stored under another model ID
                continue
            ids.append(self._mint("c"))
            out += self._call(ids[-1], what[0], what[1], self.last_text.get(path), path, call.get("id"))
        if old is not None:  # a call shown before that the stored message no longer holds as it was
            for k, call_id in enumerate(old.ids):
                if call_id not in ids:
                    out.append({"type": "TOOL_CALL_RESULT", "messageId": self._mint("r"), "toolCallId": call_id,
                                "role": "tool", "content": "[not run: the agent stored this call otherwise; see "
                                "the call shown after it]"})
        if calls:
            self.batches[path] = Batch(ids, [c.get("id") for c in calls])
        self.last_message[path] = (content, self.batches.get(path) if calls else None, shown)
        return out

    def _call(self, call_id: str, name: str, arguments: Any, parent: str | None, path: tuple[str, ...],
              model_id: Any) -> list[dict[str, Any]]:
        start: dict[str, Any] = {"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name,
                                 "metadata": {"waypoint": {"modelCallId": model_id, "runPath": list(path)}}}
        if parent is not None:
            start["parentMessageId"] = parent
        text = arguments if isinstance(arguments, str) else ""
        args = [{"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": text[i:i + ARGS_CHUNK]}
                for i in range(0, len(text), ARGS_CHUNK)]
        return [start, *args, {"type": "TOOL_CALL_END", "toolCallId": call_id}]

    def _result(self, data: dict[str, Any], path: tuple[str, ...]) -> list[dict[str, Any]]:
        out = self._close_text()
        batch = self.batches.get(path)
        at = batch.pair(data.get("call_id"), data.get("position")) if batch is not None else None
        if batch is None or at is None:  # a call this stream did not show (it fell behind, or a restart)
            call_id = self._mint("c")
            out += self._call(call_id, str(data.get("name") or ""), None, None, path, data.get("call_id"))
        else:
            batch.answered.add(at)
            call_id = batch.ids[at]
        content = data.get("content")
        return out + [{"type": "TOOL_CALL_RESULT", "messageId": self._mint("r"), "toolCallId": call_id,
                       "content": content if isinstance(content, str) else str(content), "role": "tool"}]

    # --- steps and the end -------------------------------------------------------------------------------

    def _step(self, node: str, start: bool) -> list[dict[str, Any]]:
        if start and node not in self.steps:
            self.steps.append(node)
            return [{"type": "STEP_STARTED", "stepName": node}]
        if not start and node in self.steps:
            self.steps.remove(node)
            return [{"type": "STEP_FINISHED", "stepName": node}]
        return []

    def _close(self) -> list[dict[str, Any]]:
        out = self._close_text()
        out += [{"type": "STEP_FINISHED", "stepName": s} for s in self.steps]
        self.steps = []
        return out

    def _run_error(self, message: str, code: str) -> dict[str, Any]:
        self.finished = True
        return {"type": "RUN_ERROR", "message": message, "code": code}

    def _end(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        status, error = data.get("status"), data.get("error")
        out = self._close()
        if self.error is not None or status == "failed":
            what = self.error or {"type": "Failed", "message": error or "the run failed"}
            return out + [self._run_error(f"thread '{self.thread_id}' failed: {what.get('message')}",
                                          str(what.get("type")))]
        if status == "deleted":
            return out + [self._run_error(f"thread '{self.thread_id}' was deleted while it ran", "deleted")]
        if status == "cancelled" or error == "cancelled":
            outcome: dict[str, Any] = {"type": "cancelled"}
        elif status == "interrupted" and self.pending:
            interrupts = []
            for p in self.pending:
                shown, item = self._interrupt(p)
                out += shown
                interrupts.append(item)
            outcome = {"type": "interrupt", "interrupts": interrupts}
        else:
            outcome = {"type": "success"}
        self.finished = True
        return out + [{"type": "RUN_FINISHED", "threadId": self.thread_id, "runId": self.run_id, "outcome": outcome,
                       "metadata": {"waypoint": {"checkpointId": self.thread_id, "version": data.get("version"),
                                                 "status": status}}}]

    def _interrupt(self, p: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """One pending interrupt as an AG-UI `Interrupt` (and the call it is about, shown now if this stream
        never showed it)."""
        kind, tool = p.get("kind"), p.get("tool")
        item: dict[str, Any] = {"id": p["id"], "metadata": {"waypoint": {
            k: p.get(k) for k in ("kind", "tool", "call_id", "arguments_json", "digest", "version", "run_path",
                                  "address", "info") if p.get(k) is not None}}}
        if isinstance(p.get("deadline"), (int, float)):
            item["expiresAt"] = _iso(p["deadline"])
        shown: list[dict[str, Any]] = []
        where = segment_of(str(p.get("address") or ""), "tool")
        if tool is not None and where is not None:
            path = tuple(str(x) for x in p.get("run_path") or ())
            batch = self.batches.get(path)
            position = int(where[2]) if len(where) > 2 and where[2].isdigit() else None
            if batch is not None and position is not None and position < len(batch.ids):
                item["toolCallId"] = batch.ids[position]
            else:
                item["toolCallId"] = self._mint("c")
                shown = self._call(item["toolCallId"], str(tool), p.get("arguments_json"), None, path, p.get("call_id"))
        if kind == "approval":
            item.update(reason="tool_call", message=f"Approve this call of {tool!r}?", responseSchema=APPROVAL_SCHEMA)
        elif kind == "pause":
            item.update(reason="waypoint:pause", message="The run is paused: resume it (no payload needed).")
        else:
            item.update(reason="input_required" if "toolCallId" not in item else "tool_call",
                        message="The run waits for an answer: its payload is what the paused code receives.")
        return shown, item
