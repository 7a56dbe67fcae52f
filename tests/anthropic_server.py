"""A real HTTP server on 127.0.0.1 that speaks Anthropic's messages API (JSON and SSE), stdlib only.

Tests push scripted replies (`Reply`) and point an `AnthropicChatModel` at `server.base_url`; the SDK talks
real HTTP to it. Every request is recorded (`server.requests`: JSON body and headers). A reply can be text
(streamed as text deltas), tool calls (`tool_use` blocks; streamed as a block start, then
`input_json_delta` fragments), thinking blocks before them (streamed as `thinking_delta` and
`signature_delta` events), an error status with Anthropic's error body, an `error` event in the middle
of a stream, a delay, a connection dropped after N events, or a raw answer (any body, any events).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Reply", "Recorded", "AnthropicServer"]


@dataclass
class Reply:
    """One scripted answer. `tool_calls` are `(id, name, input_json_text)` triples."""

    content: str = ""
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)  # "" input: no input_json_delta at all
    usage: dict[str, int] = field(default_factory=lambda: {"input_tokens": 11, "output_tokens": 7})
    stop_reason: str | None = None  # None: "tool_use" if there are calls, else "end_turn"
    status: int = 200
    error: dict[str, Any] | None = None  # Anthropic's error object for status >= 400 (or a mid-stream event)
    error_after: int | None = None  # send `error` as an SSE error event after this many events
    headers: dict[str, str] = field(default_factory=dict)
    chunk_size: int = 4
    wait: float = 0.0
    delay: float = 0.0
    drop_after: int | None = None  # close the connection mid-body after this many SSE events
    thinking: list[tuple[str, str]] = field(default_factory=list)  # (thinking, signature) blocks, first
    redacted: list[str] = field(default_factory=list)  # redacted_thinking blocks' data, after those
    raw: Any = None  # a 200 answer as it is: bytes or a JSON value; for a stream, a list of (event, data)

    @classmethod
    def failure(cls, status: int, message: str, *, type: str = "api_error", **kw: Any) -> Reply:
        return cls(status=status, error={"type": type, "message": message}, **kw)


@dataclass
class Recorded:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def _stop(reply: Reply) -> str:
    return reply.stop_reason or ("tool_use" if reply.tool_calls else "end_turn")


def _thinking(reply: Reply) -> list[dict[str, Any]]:
    return [{"type": "thinking", "thinking": t, "signature": s} for t, s in reply.thinking] + \
        [{"type": "redacted_thinking", "data": d} for d in reply.redacted]


def _message(reply: Reply, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = _thinking(reply)
    content += [{"type": "text", "text": reply.content}] if reply.content else []
    content += [{"type": "tool_use", "id": i, "name": n, "input": json.loads(a) if a else {}}
                for i, n, a in reply.tool_calls]
    return {"id": "msg_test", "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": _stop(reply), "stop_sequence": None, "usage": reply.usage}


def _events(reply: Reply, model: str) -> list[tuple[str, dict[str, Any]]]:
    start = _message(Reply(usage={"input_tokens": reply.usage["input_tokens"], "output_tokens": 1}), model)
    start.update(content=[], stop_reason=None)
    out: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    index = 0
    for block in _thinking(reply):
        if block["type"] == "redacted_thinking":
            out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        else:
            out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                "type": "thinking", "thinking": "", "signature": ""}}))
            out += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "thinking_delta", "thinking": p}})
                    for p in _pieces(block["thinking"], reply.chunk_size)]
            out.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": "signature_delta", "signature": block["signature"]}}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    if reply.content:
        out.append(("content_block_start", {"type": "content_block_start", "index": index,
                                            "content_block": {"type": "text", "text": ""}}))
        out += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                         "delta": {"type": "text_delta", "text": p}})
                for p in _pieces(reply.content, reply.chunk_size)]
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    for call_id, name, arguments in reply.tool_calls:
        out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
            "type": "tool_use", "id": call_id, "name": name, "input": {}}}))
        out += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                         "delta": {"type": "input_json_delta", "partial_json": p}})
                for p in _pieces(arguments, reply.chunk_size)]
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    out.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": _stop(reply),
                                                                     "stop_sequence": None},
                                  "usage": {"output_tokens": reply.usage["output_tokens"]}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: AnthropicServer

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.server.requests.append(Recorded(self.path, body, {k.lower(): v for k, v in self.headers.items()}))
        if self.path.rstrip("/") != "/v1/messages":
            return self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})
        try:
            reply = self.server.replies.popleft()
        except IndexError:
            return self._json(418, {"type": "error", "error": {"type": "test", "message": "no scripted reply"}})
        time.sleep(reply.wait)
        try:
            if reply.status >= 400:
                self._json(reply.status, {"type": "error", "error": reply.error or {}}, reply.headers)
            elif reply.raw is not None:
                self._raw(reply.raw, bool(body.get("stream")))
            elif body.get("stream"):
                self._sse(reply, body.get("model", ""))
            else:
                self._json(200, _message(reply, body.get("model", "")), reply.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _raw(self, raw: Any, stream: bool) -> None:
        if stream and isinstance(raw, list):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for name, data in raw:
                text = data if isinstance(data, str) else json.dumps(data)
                self._write_chunk(f"event: {name}\ndata: {text}\n\n".encode())
            self._write_chunk(b"")
            return
        data = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, reply: Reply, model: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for n, (name, data) in enumerate(_events(reply, model)):
            if reply.drop_after is not None and n == reply.drop_after:
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if reply.error_after is not None and n == reply.error_after:
                self._write_chunk(f"event: error\ndata: {json.dumps({'type': 'error', 'error': reply.error})}\n\n"
                                  .encode())
                break
            if n > 1:
                time.sleep(reply.delay)
            self._write_chunk(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self._write_chunk(b"")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class AnthropicServer(ThreadingHTTPServer):
    """The server; `push()` scripts replies, `requests` records what came in, `close()` stops it."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self._thread = threading.Thread(target=self.serve_forever, args=(0.02,), name="anthropic_server",
                                        daemon=True)
        self._thread.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def push(self, *replies: Reply | str) -> None:
        self.replies.extend(Reply(content=r) if isinstance(r, str) else r for r in replies)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests]

    def close(self) -> None:
        self.shutdown()
        self.server_close()
