"""Helpers for the service tests: `waypoint serve` in a child process (`ServeProcess`), a real uvicorn on
127.0.0.1 in a thread (`Served`), agents and graphs to serve, and an SSE reader."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

TOKEN = "test-token-5f1c2d"
READER = "reader-token-8e7a"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


PROCS = Path(__file__).resolve().parent / "procs"
SERVE_TOKEN = "serve-token-9a8b7c6d5e4f"
SERVED = "service_agent:build,service_agent:raw,service_agent:steps"


class ServeProcess:
    """`waypoint serve` on a free port in a child process (the agents of tests/procs/service_agent.py);
    its output is collected. `ran()` lists the commands its tools really ran; `gate` is the file that
    releases a held call."""

    def __init__(self, tmp: Path, *, agents: str = SERVED, token: str = SERVE_TOKEN, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, db: str | None = None) -> None:
        self.tmp, self.token = tmp, token
        self.tool_log, self.gate = tmp / "ran.txt", tmp / "gate"
        full_env = {**os.environ, "WAYPOINT_TOKEN": token, "SERVICE_TOOL_LOG": str(self.tool_log),
                    "SERVICE_GATE": str(self.gate),
                    "PYTHONPATH": os.pathsep.join([str(PROCS), os.environ.get("PYTHONPATH", "")]), **(env or {})}
        full_env = {k: v for k, v in full_env.items() if not k.startswith("OPENAI_")}
        self.env = full_env
        waypoint = str(Path(sys.executable).parent / "waypoint")
        self.proc = subprocess.Popen([waypoint, "serve", "--db", db or str(tmp / "runs.db"), "--agents", agents,
                                      "--port", "0", *args], cwd=tmp, env=full_env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.output: list[str] = []
        self.lines: queue.Queue[str] = queue.Queue()
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._drain, args=(stream,), daemon=True).start()
        self.url = self._wait_for_banner()
        self.host, self.port = "127.0.0.1", int(self.url.rsplit(":", 1)[1])

    def _drain(self, stream: Any) -> None:
        for line in stream:
            self.output.append(line)
            self.lines.put(line)

    def _wait_for_banner(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith("waypoint serve: http://"):
                return line.split()[2].removesuffix("/ui")
        self.stop()
        raise AssertionError("waypoint serve did not start:\n" + "".join(self.output))

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        time.sleep(0.1)  # let the drain threads read what is left
        return "".join(self.output)

    def ran(self) -> list[str]:
        return self.tool_log.read_text().splitlines() if self.tool_log.exists() else []

    def started(self) -> list[str]:
        started = Path(str(self.tool_log) + ".started")
        return started.read_text().splitlines() if started.exists() else []

    def client(self, token: str | None = "", **kw: Any) -> httpx.Client:
        token = self.token if token == "" else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30, **kw)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def raw_input(*calls: tuple[str, str]) -> str:
    """The user message that makes the `raw` agent ask for exactly these (tool name, arguments text) calls."""
    return json.dumps({"calls": [{"name": n, "arguments": a} for n, a in calls]})


def wait_until(condition: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not met in {timeout} s"
        time.sleep(0.02)


def wait_for_worker(db: Path, graph: str, timeout: float = 60.0) -> None:
    """Wait until one `waypoint worker` serving `graph` has registered in the SQLite file `db`."""
    import sqlite3

    def registered() -> bool:
        try:
            with sqlite3.connect(db) as conn:
                return conn.execute("SELECT COUNT(*) FROM waypoint_workers WHERE graph = ?", (graph,)).fetchone()[0] == 1
        except sqlite3.Error:
            return False

    wait_until(registered, timeout, f"a worker serving {graph}")


def run_until(client: httpx.Client, cid: str, status: str, timeout: float = 20.0) -> dict:
    """GET the run until it has `status` and this service no longer executes it."""
    def reached() -> dict | None:
        run = client.get(f"/runs/{cid}").json()
        return run if run.get("status") == status and not run.get("active") else None

    return wait_until(reached, timeout, f"run {cid} {status}")


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
