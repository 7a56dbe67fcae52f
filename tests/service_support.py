"""Helpers for the service tests: a real uvicorn on 127.0.0.1 in a thread, agents and graphs to serve,
and an SSE reader."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

TOKEN = "test-token-5f1c2d"
READER = "reader-token-8e7a"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


class Served:
    """`app` on a real uvicorn, in a thread with its own event loop; `.url` once started."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.app = app
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)
        self.url = ""

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        assert not self.thread.is_alive(), "uvicorn did not stop"

    def client(self, token: str | None = TOKEN, **kw: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kw)


def approval_agent(calls: list[str], *, name: str = "ops", delay: float = 0.0, chunk_size: int = 4) -> Any:
    """An agent that asks to run the user's message as a command (approval first), then reports the result.
    `calls` records every command the tool really ran."""
    from waypoint.engine import ChatModelAgent, Message, ToolCall, tool
    from waypoint.engine.models import ScriptedChatModel
    from waypoint.middleware import ApprovalMiddleware

    @tool
    def execute(command: str) -> str:
        """Run a shell command (this one only pretends)."""
        calls.append(command)
        return f"ran {command}"

    def reply(messages: list[Any], tools: list[Any]) -> Any:
        last = messages[-1]
        if last.role == "tool":
            return Message.assistant(f"The tool said: {last.content}")
        call = ToolCall(id=f"call_{len(messages)}", name="execute", arguments=json.dumps({"command": last.content}))
        return Message.assistant("I will run that.", tool_calls=[call])

    model = ScriptedChatModel([reply] * 10_000, chunk_size=chunk_size, delay=delay)
    return ChatModelAgent(name=name, model=model, tools=[execute], middlewares=[ApprovalMiddleware(tools={"execute"})])


def events(response: httpx.Response) -> Iterator[tuple[str | None, str, Any]]:
    """(id, event, data) of each Server-Sent Event of a streamed response, as it arrives."""
    ident, kind, data = None, "message", []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield ident, kind, json.loads("\n".join(data))
            ident, kind, data = None, "message", []
        elif line.startswith("id: "):
            ident = line[4:]
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
