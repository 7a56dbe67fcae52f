"""A real MCP server for the tests, on the official SDK's server API (`MCPServer`).

    python mcp_server.py JOURNAL                 # stdio
    python mcp_server.py JOURNAL --http PORT     # streamable HTTP on 127.0.0.1:PORT (path /mcp)
    python mcp_server.py JOURNAL --http PORT TOKEN   # ... answering 401 without `Authorization: Bearer TOKEN`
    python mcp_server.py JOURNAL --legacy        # stdio, the 2025-11-25 handshake era only (as most servers are)

Every tool that does something appends a line to JOURNAL (`<tool> <args> <pid>`), so a test can count runs.
`crash_once` kills the server in the middle of its first call (a marker file next to the journal remembers).
A few tools are hostile on purpose: a name no model API accepts, a schema too large to offer, and one the
listing marks as run only as a task (`execution.taskSupport: required`, seen by a 2025-11-25 client) that
refuses every plain call, as such a server does.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import mcp_types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.types import Image

JOURNAL = Path(sys.argv[1])
server = MCPServer("waypoint-test")


def journal(line: str) -> None:
    with JOURNAL.open("a") as fh:
        fh.write(f"{line} {os.getpid()}\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    journal(f"add {a} {b}")
    return a + b


@server.tool()
def delete_file(path: str) -> str:
    """Delete a file (pretends to)."""
    journal(f"delete_file {path}")
    return f"deleted {path}"


@server.tool()
def fail(reason: str) -> str:
    """Always refuses."""
    from mcp.server.mcpserver.exceptions import ToolError

    raise ToolError(f"refused: {reason}")


@server.tool()
def crash_once(note: str, ctx: Context) -> str:
    """Dies in the middle of its first call; answers the next one (journals the idempotency key sent)."""
    key = (ctx.request_context.meta or {}).get("waypoint/idempotency_key")
    marker = JOURNAL.with_suffix(".crashed")
    if not marker.exists():
        marker.write_text("1")
        journal(f"crash_once {note} dying {key}")
        os._exit(3)
    journal(f"crash_once {note} {key}")
    return f"survived {note}"


@server.tool()
def picture() -> Image:
    """An image and no text."""
    return Image(data=b"\x89PNG\r\n\x1a\n" + b"0" * 100, format="png")


@server.tool()
def flood(n: int) -> str:
    """n characters of text."""
    return "x" * n


@server.tool()
def wait_for(note: str, path: str) -> str:
    """Answers once the file `path` exists (a sync tool: the server runs it in a thread)."""
    journal(f"wait_for {note}")
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return f"waited {note}"


@server.tool()
async def freeze(seconds: float) -> str:
    """Blocks the server's event loop: the server answers nothing meanwhile."""
    journal("freeze")
    time.sleep(seconds)
    return "thawed"


@server.tool()
def echo(data: dict) -> str:
    """Echo."""
    journal("echo")
    return "echoed"


@server.tool()
def keyed(note: str, ctx: Context) -> str:
    """Journals the idempotency key the client sent in the request's _meta."""
    meta = ctx.request_context.meta or {}
    journal(f"keyed {note} {meta.get('waypoint/idempotency_key')}")
    return f"keyed {note}"


REVOKED = []


@server.tool()
def revoke() -> str:
    """From now on an HTTP server with a token answers 403."""
    REVOKED.append(True)
    return "revoked"


@server.tool(name="bad name!")
def bad_name() -> str:
    """A name no model API accepts."""
    return "never offered"


@server.tool(description="Huge schema.")
def huge(**kwargs: str) -> str:
    return "never offered"


# A schema larger than Waypoint offers to a model: patch it after registration, as a hostile server could.
_huge = server._tool_manager.get_tool("huge")
_huge.parameters = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "y" * 100}
                                                     for i in range(1000)}}



@server.tool()
def long_report(topic: str) -> str:
    """Runs only as a task: refuses a plain call."""
    from mcp.server.mcpserver.exceptions import ToolError

    journal(f"long_report {topic}")
    raise ToolError("this tool runs only as a task (taskSupport: required); call it with a task")


_listed = server.list_tools


async def _list_tools():
    """The listing, with `long_report` marked as run only as a task (a 2026-07-28 connection drops the mark)."""
    required = mcp_types.ToolExecution(task_support="required")
    return [t.model_copy(update={"execution": required}) if t.name == "long_report" else t for t in await _listed()]


server.list_tools = _list_tools


async def serve_legacy() -> None:
    """stdio in the handshake era only (the SDK's `serve_loop`): the client's `server/discover` probe is refused
    and it falls back to `initialize`, as with a server on a 2025 SDK."""
    from mcp.server.runner import serve_loop
    from mcp.server.stdio import stdio_server

    low = server._lowlevel_server
    async with stdio_server() as (read, write), low.lifespan(low) as state:
        await serve_loop(low, read, write, lifespan_state=state, init_options=low.create_initialization_options())


def guarded(app, token: str):
    """`app` answering 401 to a request without the token, 403 to any once `revoke` ran."""
    async def asgi(scope, receive, send):
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"").decode()
            status = 403 if REVOKED else 401 if given != f"Bearer {token}" else None
            if status is not None:
                await send({"type": "http.response.start", "status": status,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": f'{{"error": "no: {given}"}}'.encode()})
                return
        await app(scope, receive, send)

    return asgi


if __name__ == "__main__":
    if len(sys.argv) > 4 and sys.argv[2] == "--http":
        import uvicorn

        app = guarded(server.streamable_http_app(host="127.0.0.1"), sys.argv[4])
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
    elif len(sys.argv) > 3 and sys.argv[2] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[3]))
    elif len(sys.argv) > 2 and sys.argv[2] == "--legacy":
        import anyio

        anyio.run(serve_legacy)
    else:
        server.run()
