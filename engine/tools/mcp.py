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
- arguments the model wrote are checked before anything is sent (`MCPTool.parse`): nested deeper than
  `MAX_ARGUMENT_DEPTH`, larger than `MAX_ARGUMENT_BYTES` as JSON, holding an unpaired surrogate, NaN or
  Infinity — what the SDK cannot send — is a `ToolArgumentError` the model reads, never a broken connection;
- every call carries its idempotency key in the request's `_meta` (`IDEMPOTENCY_KEY_META`), so a server can
  apply a call once however often it is sent;
- no answer within `timeout` raises `MCPTimeoutError` (an `MCPConnectionError` and a `TimeoutError`: the retry
  middleware's default policy retries it; the call may have run, or still be running): the SDK abandons that
  one request (sending the server a cancellation) and the connection stays for the other calls on it — it is
  dropped only when nobody else is using it and it no longer answers at all;
- an HTTP 401 / 403 raises `MCPAuthError` (not retried: the same credentials get the same answer);
- transport failures — the server died, the connection dropped — are not the tool's answer: the call raises
  `MCPConnectionError` (a `ConnectionError`, so the retry middleware's default policy retries it), the
  connection is dropped, and the next call starts a new one (a new process for stdio). Without a retry the
  run fails, stored at its last step; a resume runs the call again, flagged `rerun`, with the same
  idempotency key (docs/agents.md).

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
from typing import Any, NoReturn

from ..errors import WaypointError
from ..models._outgoing import depth as _depth
from ..models.schema import ToolInfo
from .tool import Tool, ToolArgumentError, ToolContext

__all__ = ["MCPServerStdio", "MCPServerStreamableHTTP", "MCPTool", "MCPConnectionError", "MCPTimeoutError",
           "MCPAuthError", "MAX_SCHEMA_BYTES", "MAX_SCHEMA_DEPTH", "MAX_ARGUMENT_BYTES", "MAX_ARGUMENT_DEPTH",
           "IDEMPOTENCY_KEY_META"]

log = logging.getLogger("waypoint.mcp")

MAX_SCHEMA_BYTES = 65_536
"""A tool schema larger than this (as JSON) is left out: it would cost every model call that much."""
MAX_SCHEMA_DEPTH = 32
"""A tool schema nested deeper than this is left out."""
MAX_ARGUMENT_BYTES = 1_048_576
"""Arguments larger than this (as UTF-8 JSON) are not sent: the model is told to send less."""
MAX_ARGUMENT_DEPTH = 64
"""Arguments nested deeper than this are not sent (the SDK cannot serialize ~250 levels)."""
IDEMPOTENCY_KEY_META = "waypoint/idempotency_key"
"""The `_meta` key of every `tools/call` request that holds the call's `ToolContext.idempotency_key`."""
_MAX_DESCRIPTION = 4096
_PING_TIMEOUT = 5.0
_MAX_PAGES = 100
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class MCPConnectionError(WaypointError, ConnectionError):
    """The MCP server could not be reached, died, or did not answer in time. The message names the server
    and the tool and says what to do; after a transport failure the next call opens a new connection."""


class MCPTimeoutError(MCPConnectionError, TimeoutError):
    """No answer within the server's `timeout`. That one request was abandoned (the server is sent a
    cancellation) and the connection kept for the other calls on it; the call may have run, or still be
    running, on the server."""


class MCPAuthError(WaypointError, PermissionError):
    """An MCP server over HTTP refused the credentials (HTTP 401 / 403): not retried, since the same headers
    get the same answer. The message never quotes the headers or the server's reply."""


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[truncated: {len(text) - limit} more characters]"


def check_arguments(arguments: Any) -> None:
    """Raise `ToolArgumentError` (a message for the model) unless the SDK can send `arguments` as they are."""
    if not isinstance(arguments, dict):
        raise ToolArgumentError(f"the arguments must be a JSON object, not {type(arguments).__name__}")
    if _depth(arguments, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:  # before json.dumps, which recurses
        raise ToolArgumentError(f"the arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels; send flatter arguments")
    try:
        size = len(json.dumps(arguments, ensure_ascii=False, allow_nan=False).encode("utf-8"))
    except UnicodeEncodeError:
        raise ToolArgumentError("the arguments hold text that is not valid Unicode (an unpaired surrogate such as "
                                "\\ud800); send plain text") from None
    except ValueError:
        raise ToolArgumentError("the arguments hold NaN or Infinity, which JSON does not allow; send numbers") from None
    if size > MAX_ARGUMENT_BYTES:
        raise ToolArgumentError(f"the arguments are {size} bytes, more than this tool takes ({MAX_ARGUMENT_BYTES}); "
                                "send less")


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

    def parse(self, args_json: str) -> dict[str, Any]:
        """The arguments as a JSON object the SDK can send; `ToolArgumentError` tells the model what is wrong."""
        try:
            arguments = super().parse(args_json)
        except RecursionError:
            raise ToolArgumentError(f"the arguments nest too deeply to read; send at most {MAX_ARGUMENT_DEPTH} "
                                    "levels") from None
        check_arguments(arguments)
        return arguments

    async def invoke(self, args_json: str, ctx: ToolContext) -> str:
        return await self.server.call_tool(self.remote_name, self.parse(args_json), tool=self.name,
                                           idempotency_key=ctx.idempotency_key)


class _Connection:
    """One MCP session, owned by a task of the loop it runs in (entered and left by that task)."""

    def __init__(self, server: _MCPServer) -> None:
        self.server = server
        self.client: Any = None
        self.error: BaseException | None = None
        self.ready = asyncio.Event()
        self.closing = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.in_flight = 0
        """Requests waiting for their answer on this connection: it is not dropped from under them."""
        self.refusals = 0
        """HTTP 401 / 403 answers seen on this connection (counted by the HTTP client's response hook)."""
        self.refused_status = 0

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
            if self.refusals:
                raise self.server._refused(self.refused_status) from None
            raise self.server._unreachable(self.error) from self.error

    async def _hold(self) -> None:
        from mcp import Client

        try:
            async with Client(self.server._transport(self), read_timeout_seconds=self.server.timeout) as client:
                self.client = client
                self.ready.set()
                await self.closing.wait()
        except Exception as err:  # noqa: BLE001 - reported to whoever waits on the connection
            self.error = err
        finally:
            self.client = None
            self.ready.set()

    def refused(self, status: int) -> None:
        self.refusals += 1
        self.refused_status = status

    @contextlib.contextmanager
    def request(self) -> Any:
        """Count a request in flight for as long as it waits."""
        self.in_flight += 1
        try:
            yield self.client
        finally:
            self.in_flight -= 1

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

    def _transport(self, connection: _Connection) -> Any:
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

    def _refused(self, status: int, tool: str | None = None) -> MCPAuthError:
        what = f"the call to tool '{tool}'" if tool else "the connection"
        return MCPAuthError(
            f"MCP server '{self.name}' ({self.target}) refused {what} with HTTP {status}: the credentials are "
            "missing, wrong or not allowed — check the credentials this server is given (headers=, such as an "
            "Authorization token, or the URL); a retry with the same ones will not help")

    def _timed_out(self, tool: str | None, keyed: bool = False) -> MCPTimeoutError:
        if tool is None:
            return MCPTimeoutError(f"MCP server '{self.name}' ({self.target}) did not list its tools within "
                                   f"{self.timeout:g} s — retry, or raise timeout=")
        again = (f"with the same idempotency key (_meta '{IDEMPOTENCY_KEY_META}'), so only a server that checks "
                 "that key is safe from running it twice") if keyed else "without an idempotency key"
        return MCPTimeoutError(
            f"MCP server '{self.name}' ({self.target}): tool '{tool}' did not answer within {self.timeout:g} s; "
            "the call may have run, or still be running, on the server (it was sent a cancellation) — a retry "
            f"(ToolRetryMiddleware retries timeouts) sends it again {again}; raise timeout= if the tool is slow")

    async def _failed(self, connection: _Connection, err: Exception, refusals: int, tool: str | None,
                      keyed: bool = False) -> NoReturn:
        """Raise what a request that failed on `connection` means (`refusals`: the count before it was sent).

        A timeout abandons that one request and keeps the connection for the others; only a transport
        failure, or a timed-out connection nobody else uses that no longer answers, is dropped."""
        from mcp import MCPError
        from mcp_types import REQUEST_TIMEOUT

        if connection.refusals > refusals:  # an HTTP 401 / 403 answered: the SDK reports it as an internal error
            raise self._refused(connection.refused_status, tool) from None
        if isinstance(err, MCPError) and err.code == REQUEST_TIMEOUT:
            await self._probe(connection)
            raise self._timed_out(tool, keyed) from err
        await self._drop(connection)
        raise self._unreachable(err, tool) from err

    async def _probe(self, connection: _Connection) -> None:
        """After a timeout: drop the connection if nobody else uses it and it does not answer a probe (a request
        for its tool listing) within a few seconds — a wedged server: the next call starts a new one; keep it
        otherwise."""
        if connection.in_flight or not connection.alive:
            return
        try:
            async with asyncio.timeout(min(self.timeout, _PING_TIMEOUT)):
                with connection.request() as client:  # no ping: the 2026-07-28 protocol removed it
                    await client.list_tools(cache_mode="bypass")
        except Exception:  # noqa: BLE001 - a probe that fails in any way means the same
            if not connection.in_flight:
                await self._drop(connection)

    # --- listing -------------------------------------------------------------------------------------

    async def list_tools(self) -> list[MCPTool]:
        """The server's tools as Waypoint tools (what `skipped` names left out). Raises `MCPConnectionError`."""
        connection = await self._connection()
        listed, cursor, refusals = [], None, connection.refusals
        try:
            with connection.request() as client:
                for _ in range(_MAX_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    listed.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except Exception as err:
            await self._failed(connection, err, refusals, None)
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

    async def call_tool(self, remote_name: str, arguments: dict[str, Any], *, tool: str | None = None,
                        idempotency_key: str | None = None) -> str:
        """Call a tool of the server; its result (or the error it answers with) as the text the model reads.

        `idempotency_key` goes to the server in the request's `_meta` (`IDEMPOTENCY_KEY_META`). Raises
        `ToolArgumentError` for arguments the SDK cannot send (nothing is sent), `MCPTimeoutError` when no
        answer comes within `timeout`, `MCPAuthError` on HTTP 401 / 403, `MCPConnectionError` when the
        transport fails."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError

        tool = tool or remote_name
        check_arguments(arguments)
        meta = {IDEMPOTENCY_KEY_META: idempotency_key} if idempotency_key else None
        connection = await self._connection()
        refusals = connection.refusals
        try:
            with connection.request() as client:
                result = await client.call_tool(remote_name, arguments, meta=meta)
        except MCPError as err:
            if err.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT) or connection.refusals > refusals or not connection.alive:
                await self._failed(connection, err, refusals, tool, meta is not None)
            return self._error_result(tool, f"the MCP server answered with an error: {err.message}")
        except (ValidationError, RuntimeError) as err:  # an answer the protocol does not allow: it was answered
            if not connection.alive:
                await self._failed(connection, err, refusals, tool)
            return self._error_result(tool, f"the MCP server's answer could not be read ({_describe(err)}); the "
                                            "call may have run")
        except Exception as err:  # the transport broke
            await self._failed(connection, err, refusals, tool)
        text = _result_text(result)
        if result.is_error:
            text = f"[tool error] tool '{tool}': {text}"
        return _clip(text, self.max_result_chars)

    def _error_result(self, tool: str, what: str) -> str:
        return _clip(f"[tool error] tool '{tool}': {what}", self.max_result_chars)


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

    def _transport(self, connection: _Connection) -> Any:
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

    def _transport(self, connection: _Connection) -> Any:
        return _http(self.url, self.headers, self.timeout, connection)


@contextlib.asynccontextmanager
async def _http(url: str, headers: dict[str, str], timeout: float, connection: _Connection) -> AsyncIterator[Any]:
    """The SDK's streamable-HTTP transport on an HTTP client that sends `headers` and tells `connection` of
    every 401 / 403 (the SDK turns those into a bare 'internal error'); the client is closed after."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def seen(response: Any) -> None:
        if response.status_code in (401, 403):
            connection.refused(response.status_code)

    # The SDK's own client when no headers are given (its default timeouts), as before.
    client = create_mcp_http_client(headers=headers or None,
                                    timeout=httpx2.Timeout(30.0, read=max(timeout, 30.0)) if headers else None)
    client.event_hooks = {"response": [seen]}
    async with client:
        async with streamable_http_client(url, http_client=client) as streams:
            yield streams
