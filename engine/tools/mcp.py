"""Tools from MCP servers (extra `[mcp]`, on the official `mcp` SDK): `MCPServerStdio`, `MCPServerStreamableHTTP`.

    server = MCPServerStdio("python", ["my_server.py"])
    tools = await server.list_tools()          # Waypoint `Tool`s, the server's schemas as their parameters
    agent = ChatModelAgent(..., tools=tools, middlewares=[ApprovalMiddleware(tools={"delete_file"})])

An MCP tool is a `Tool` like any other (`MCPTool`, built with `ToolInfo` from the server's listing), so it
runs through every middleware, pauses for approval, is recorded in the tool ledger and is not run twice.

What the server says is untrusted, like a model's output:

- listing: a tool whose name is not 1–64 letters, digits, `_` or `-` (after `tool_prefix`), whose schema is
  not a JSON object schema or is larger than `MAX_SCHEMA_BYTES` / deeper than `MAX_SCHEMA_DEPTH`, or whose
  name repeats, is left out and named in `server.skipped` (and logged); descriptions are clipped;
- results: text blocks joined; images, audio and binary resources described, not inlined; the whole clipped
  to `max_result_chars`; a result marked `isError`, or a JSON-RPC error the server answers with (unknown
  tool, bad arguments), becomes the call's result, `[tool error] ...`, which the model reads and can act on;
- transport failures — the server died, the connection dropped, no answer within `timeout` — are not the
  tool's answer: the call raises `MCPConnectionError` (a `ConnectionError`, so the retry middleware's default
  policy retries it), the connection is dropped, and the next call starts a new one (a new process for
  stdio). Without a retry the run fails, stored at its last step; a resume runs the call again, flagged
  `rerun`, with the same idempotency key (docs/agents.md).

Connections: one per running event loop, opened by the first call and owned by a task of that loop (the
SDK's task groups must be entered and left by one task); `aclose()` (or `async with server:`) ends them,
and so does the end of the loop (`asyncio.run` cancels the task, which stops a stdio server's process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ..errors import WaypointError
from ..models.schema import ToolInfo
from .tool import Tool, ToolContext

__all__ = ["MCPServerStdio", "MCPServerStreamableHTTP", "MCPTool", "MCPConnectionError", "MAX_SCHEMA_BYTES",
           "MAX_SCHEMA_DEPTH"]

log = logging.getLogger("waypoint.mcp")

MAX_SCHEMA_BYTES = 65_536
"""A tool schema larger than this (as JSON) is left out: it would cost every model call that much."""
MAX_SCHEMA_DEPTH = 32
"""A tool schema nested deeper than this is left out."""
_MAX_DESCRIPTION = 4096
_MAX_PAGES = 100
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class MCPConnectionError(WaypointError, ConnectionError):
    """The MCP server could not be reached, died, or did not answer in time. The message names the server
    and the tool and says what to do; the next call opens a new connection."""


def _depth(value: Any, limit: int) -> int:
    """How deeply `value` nests (stops counting past `limit`)."""
    stack, deepest = [(value, 1)], 0
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[truncated: {len(text) - limit} more characters]"


class MCPTool(Tool):
    """A tool of an MCP server: its arguments are checked to be a JSON object and sent to the server, which
    validates them against its own schema (an error there is a result the model reads)."""

    def __init__(self, server: _MCPServer, remote_name: str, info: ToolInfo) -> None:
        async def call(**_: Any) -> str:  # never called: invoke() below sends the call to the server
            raise NotImplementedError

        super().__init__(call, info=info)
        self.server = server
        self.remote_name = remote_name

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r} of {self.server.name!r})"

    async def invoke(self, args_json: str, ctx: ToolContext) -> str:
        return await self.server.call_tool(self.remote_name, self.parse(args_json), tool=self.name)


class _Connection:
    """One MCP session, owned by a task of the loop it runs in (entered and left by that task)."""

    def __init__(self, server: _MCPServer) -> None:
        self.server = server
        self.client: Any = None
        self.error: BaseException | None = None
        self.ready = asyncio.Event()
        self.closing = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def open(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._hold(), name=f"mcp:{self.server.name}")
        try:
            async with asyncio.timeout(self.server.connect_timeout):
                await self.ready.wait()
        except TimeoutError:
            await self.close()
            raise MCPConnectionError(
                f"MCP server '{self.server.name}' ({self.server.target}) did not answer the handshake within "
                f"{self.server.connect_timeout:g} s — check that it starts, or raise connect_timeout=") from None
        if self.error is not None:
            raise self.server._unreachable(self.error) from self.error

    async def _hold(self) -> None:
        from mcp import Client

        try:
            async with Client(self.server._transport(), read_timeout_seconds=self.server.timeout) as client:
                self.client = client
                self.ready.set()
                await self.closing.wait()
        except Exception as err:  # noqa: BLE001 - reported to whoever waits on the connection
            self.error = err
        finally:
            self.client = None
            self.ready.set()

    @property
    def alive(self) -> bool:
        return self.client is not None and not self.closing.is_set()

    async def close(self) -> None:
        self.closing.set()
        if self.task is not None and not self.task.done():
            await asyncio.wait([self.task], timeout=10)
            if not self.task.done():
                self.task.cancel()


class _MCPServer:
    """Connection management, tool listing and calls shared by both transports."""

    target = ""

    def __init__(self, *, name: str, tool_prefix: str = "", include: Sequence[str] | None = None,
                 exclude: Sequence[str] = (), timeout: float = 60.0, connect_timeout: float = 30.0,
                 max_result_chars: int = 100_000) -> None:
        self.name = name
        self.tool_prefix = tool_prefix
        self.include = None if include is None else frozenset(include)
        self.exclude = frozenset(exclude)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_result_chars = max_result_chars
        self.skipped: dict[str, str] = {}
        """Tools of the server that were left out, and why."""
        self._connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Connection] = (
            weakref.WeakKeyDictionary())
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
        self._guard = threading.Lock()

    def _transport(self) -> Any:
        raise NotImplementedError

    async def __aenter__(self) -> _MCPServer:
        await self._connection()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End this loop's connection to the server (a stdio server's process stops)."""
        connection = self._connections.pop(asyncio.get_running_loop(), None)
        if connection is not None:
            await connection.close()

    async def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        with self._guard:  # loops in other threads may share the server object
            for stale in [other for other in self._locks if other.is_closed()]:
                self._connections.pop(stale, None)  # its task was cancelled when that loop ended
                del self._locks[stale]
            lock = self._locks.setdefault(loop, asyncio.Lock())
        async with lock:
            connection = self._connections.get(loop)
            if connection is not None and connection.alive:
                return connection
            if connection is not None:
                await connection.close()
            connection = _Connection(self)
            try:
                await connection.open()
            except BaseException:
                await connection.close()
                raise
            self._connections[loop] = connection
            return connection

    async def _drop(self, connection: _Connection) -> None:
        loop = asyncio.get_running_loop()
        if self._connections.get(loop) is connection:
            del self._connections[loop]
        await connection.close()

    def _unreachable(self, err: BaseException, tool: str | None = None) -> MCPConnectionError:
        what = f"the call to tool '{tool}' failed" if tool else "the connection failed"
        return MCPConnectionError(
            f"MCP server '{self.name}' ({self.target}): {what}: {_describe(err)} — retry (the next call opens a "
            "new connection; ToolRetryMiddleware does this), and check that the server runs")

    # --- listing -------------------------------------------------------------------------------------

    async def list_tools(self) -> list[MCPTool]:
        """The server's tools as Waypoint tools (what `skipped` names left out). Raises `MCPConnectionError`."""
        connection = await self._connection()
        listed, cursor = [], None
        try:
            for _ in range(_MAX_PAGES):
                page = await connection.client.list_tools(cursor=cursor)
                listed.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        except Exception as err:
            await self._drop(connection)
            raise self._unreachable(err) from err
        self.skipped = {}
        tools: dict[str, MCPTool] = {}
        for remote in listed:
            if self.include is not None and remote.name not in self.include or remote.name in self.exclude:
                continue
            name = self.tool_prefix + remote.name
            problem = _problem(name, remote.input_schema, tools)
            if problem is not None:
                self.skipped[name] = problem
                log.warning("MCP server '%s': tool %r left out: %s", self.name, name[:80], problem)
                continue
            info = ToolInfo(name=name, description=_clip(remote.description or "", _MAX_DESCRIPTION),
                            parameters=dict(remote.input_schema))
            tools[name] = MCPTool(self, remote.name, info)
        return list(tools.values())

    # --- calls ---------------------------------------------------------------------------------------

    async def call_tool(self, remote_name: str, arguments: dict[str, Any], *, tool: str | None = None) -> str:
        """Call a tool of the server; its result (or the error it answers with) as the text the model reads."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        tool = tool or remote_name
        connection = await self._connection()
        try:
            result = await connection.client.call_tool(remote_name, arguments)
        except MCPError as err:
            if err.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT) or not connection.alive:
                await self._drop(connection)
                raise self._unreachable(err, tool) from err
            return _clip(f"[tool error] tool '{tool}': the MCP server answered with an error: {err.message}",
                         self.max_result_chars)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the transport broke (or the server sent what the protocol does not allow)
            await self._drop(connection)
            raise self._unreachable(err, tool) from err
        text = _result_text(result)
        if result.is_error:
            text = f"[tool error] tool '{tool}': {text}"
        return _clip(text, self.max_result_chars)


def _problem(name: str, schema: Any, seen: Mapping[str, Any]) -> str | None:
    """Why a listed tool cannot be offered to a model, or None."""
    if not _NAME.fullmatch(name):
        return "its name must be 1-64 letters, digits, '_' or '-' (use tool_prefix= within that limit)"
    if name in seen:
        return "the server lists this name twice"
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return "its input schema is not a JSON object schema"
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError):
        return "its input schema is not JSON"
    if size > MAX_SCHEMA_BYTES:
        return f"its input schema is {size} bytes, more than MAX_SCHEMA_BYTES ({MAX_SCHEMA_BYTES})"
    if _depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        return f"its input schema nests deeper than MAX_SCHEMA_DEPTH ({MAX_SCHEMA_DEPTH})"
    return None


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {len(block.data)} bytes of base64]"
    if kind == "resource_link":
        return f"[resource: {block.uri}]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if text is not None:
            return text
        return f"[resource {resource.uri}: {getattr(resource, 'mime_type', None) or 'binary'}]"
    return f"[{kind} content]"


def _result_text(result: Any) -> str:
    parts = [_block_text(b) for b in result.content or ()]
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False, default=str)
    return "\n".join(parts)


def _describe(err: BaseException) -> str:
    seen: list[str] = []
    while err is not None and len(seen) < 3:
        text = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        if text not in seen:
            seen.append(text)
        err = err.__cause__ or err.__context__
    return " <- ".join(seen)[:500]


class MCPServerStdio(_MCPServer):
    """An MCP server started as a subprocess (`command` with `args`), spoken to over its stdin/stdout.

    `env` is added to the SDK's safe default environment (PATH, HOME, ...: not the whole of yours, so no
    stray secret reaches the server); `cwd` is its working directory. Options: `name` (in messages and
    traces; default the command), `tool_prefix`, `include` / `exclude` (remote tool names), `timeout` (per
    request), `connect_timeout`, `max_result_chars`.
    """

    def __init__(self, command: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
                 cwd: str | None = None, name: str | None = None, **options: Any) -> None:
        super().__init__(name=name or command.rsplit("/", 1)[-1], **options)
        self.command, self.args = command, list(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.target = f"stdio: {command}"

    def __repr__(self) -> str:
        return f"MCPServerStdio({self.command!r}, {self.args!r})"

    def _transport(self) -> Any:
        from mcp import StdioServerParameters

        return StdioServerParameters(command=self.command, args=self.args, env=self.env, cwd=self.cwd)


class MCPServerStreamableHTTP(_MCPServer):
    """An MCP server at `url`, over streamable HTTP. `headers` go with every request (an
    `Authorization` header, say); they never appear in messages. Options as for `MCPServerStdio`."""

    def __init__(self, url: str, *, headers: Mapping[str, str] | None = None, name: str | None = None,
                 **options: Any) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        super().__init__(name=name or parts.hostname or url, **options)
        self.url = url
        self.headers = dict(headers or {})
        self.target = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"  # never user:password

    def __repr__(self) -> str:
        return f"MCPServerStreamableHTTP({self.target!r})"

    def _transport(self) -> Any:
        return self.url if not self.headers else _with_headers(self.url, self.headers, self.timeout)


@contextlib.asynccontextmanager
async def _with_headers(url: str, headers: dict[str, str], timeout: float) -> AsyncIterator[Any]:
    """The SDK's streamable-HTTP transport on an HTTP client that sends `headers` (and is closed after)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=max(timeout, 30.0))) as client:
        async with streamable_http_client(url, http_client=client) as streams:
            yield streams
