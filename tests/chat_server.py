"""A real HTTP server on 127.0.0.1 that speaks OpenAI chat completions (JSON and SSE), stdlib only.

Tests push scripted replies (`Reply`) and point an `OpenAIChatModel` at `server.base_url`; the SDK talks
real HTTP to it. Every request is recorded (`server.requests`: JSON body and headers). A reply can be
text (streamed in several chunks), tool calls (streamed as OpenAI does: a first fragment with index, id
and name, then argument fragments), an error status with an OpenAI-style JSON body, a delay before the
answer or between chunks, a connection dropped after N chunks, or a raw answer (any body, any chunks).
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

__all__ = ["Reply", "Recorded", "ChatServer"]


@dataclass
class Reply:
    """One scripted answer. `tool_calls` are `(id, name, arguments)` triples."""

    content: str = ""
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    usage: dict[str, int] | None = field(
        default_factory=lambda: {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18})
    finish_reason: str | None = None  # None: "tool_calls" if there are calls, else "stop"
    status: int = 200
    error: dict[str, Any] | None = None  # the OpenAI-style error object for status >= 400
    headers: dict[str, str] = field(default_factory=dict)
    chunk_size: int = 4  # characters per streamed content / arguments fragment
    interleave: bool = False  # stream the fragments of parallel calls round-robin
    wait: float = 0.0  # seconds before anything is sent
    delay: float = 0.0  # seconds between streamed chunks (after the first one with content)
    drop_after: int | None = None  # close the connection mid-body after this many SSE chunks
    end_after: int | None = None  # end the body properly after this many SSE chunks (no finish, no [DONE])
    raw: Any = None  # a 200 answer as it is: bytes or a JSON value; for a stream, a list of data payloads

    @classmethod
    def failure(cls, status: int, message: str, *, type: str = "server_error", **kw: Any) -> Reply:
        return cls(status=status, error={"message": message, "type": type, "param": None, "code": None}, **kw)


@dataclass
class Recorded:
    """What the client sent."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def _completion(reply: Reply, model: str) -> dict[str, Any]:
    calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in reply.tool_calls]
    message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
    if calls:
        message["tool_calls"] = calls
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": _finish(reply)}],
            "usage": reply.usage}


def _finish(reply: Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def _call_fragments(reply: Reply) -> list[dict[str, Any]]:
    """Tool-call deltas as OpenAI streams them: index/id/name with no arguments, then argument pieces."""
    per_call = []
    for index, (call_id, name, arguments) in enumerate(reply.tool_calls):
        first = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        rest = [{"index": index, "function": {"arguments": p}} for p in _pieces(arguments, reply.chunk_size)]
        per_call.append([first, *rest])
    if not reply.interleave:
        return [f for frags in per_call for f in frags]
    out = []
    for row in range(max((len(f) for f in per_call), default=0)):
        out += [frags[row] for frags in per_call if row < len(frags)]
    return out


def _chunks(reply: Reply, model: str, include_usage: bool) -> list[dict[str, Any]]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": p}) for p in _pieces(reply.content, reply.chunk_size)]
    out += [chunk({"tool_calls": [f]}) for f in _call_fragments(reply)]
    out.append(chunk({}, _finish(reply)))
    if include_usage and reply.usage is not None:
        out.append({"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": model,
                    "choices": [], "usage": reply.usage})
    return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked bodies that can be cut short
    server: ChatServer

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        self.server.requests.append(Recorded(self.path, body, {k.lower(): v for k, v in self.headers.items()}))
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
        try:
            reply = self.server.replies.popleft()
        except IndexError:
            return self._json(418, {"error": {"message": "chat_server: no scripted reply left", "type": "test"}})
        time.sleep(reply.wait)
        try:
            if reply.status >= 400:
                self._json(reply.status, {"error": reply.error or {"message": "error"}}, reply.headers)
            elif reply.raw is not None:
                self._raw(reply.raw, bool(body.get("stream")))
            elif body.get("stream"):
                self._sse(reply, body.get("model", ""), bool((body.get("stream_options") or {}).get("include_usage")))
            else:
                self._json(200, _completion(reply, body.get("model", "")), reply.headers)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
            self.close_connection = True

    def _raw(self, raw: Any, stream: bool) -> None:
        if stream and isinstance(raw, list):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for data in raw:
                text = data if isinstance(data, str) else json.dumps(data)
                self.wfile.write(f"data: {text}\n\n".encode())
            self.wfile.flush()
            self.close_connection = True
            return
        data = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, reply: Reply, model: str, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [f"data: {json.dumps(c)}\n\n" for c in _chunks(reply, model, include_usage)] + ["data: [DONE]\n\n"]
        for n, event in enumerate(events):
            if reply.drop_after is not None and n == reply.drop_after:
                # Close without the terminating zero-length chunk: the client sees a body cut short.
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if reply.end_after is not None and n == reply.end_after:
                break
            if n > 1:  # the opening role chunk and the first real chunk go out at once
                time.sleep(reply.delay)
            self._write_chunk(event.encode())
        self._write_chunk(b"")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class ChatServer(ThreadingHTTPServer):
    """The server; `push()` scripts replies, `requests` records what came in, `close()` stops it."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self._thread = threading.Thread(target=self.serve_forever, args=(0.02,), name="chat_server", daemon=True)
        self._thread.start()

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hanging up is part of the tests
            super().handle_error(request, client_address)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

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
