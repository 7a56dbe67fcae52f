"""Tools from MCP servers (extra `[mcp]`, on the official `mcp` SDK): `MCPServerStdio`, `MCPServerStreamableHTTP`.

    server = MCPServerStdio("python", ["my_server.py"])
    tools = await server.list_tools()          # Waypoint `Tool`s, the server's schemas as their parameters
    agent = ChatModelAgent(..., tools=tools, middlewares=[ApprovalMiddleware(tools={"delete_file"})])

An MCP tool is a `Tool` like any other (`MCPTool`, built with `ToolInfo` from the server's listing), so it
runs through every middleware, pauses for approval, is recorded in the tool ledger and is not run twice.

What the server says is untrusted, like a model's output:

- listing: a tool whose name is not 1–64 letters, digits, `_` or `-` (after `tool_prefix`), whose schema is
  not a JSON object schema or is larger than `MAX_SCHEMA_BYTES` / deeper than `MAX_SCHEMA_DEPTH`, whose
  name repeats, or that the server runs only as a task (`execution.taskSupport: required`: tasks are not
  supported, so every call would fail), is left out and named in `server.skipped` (and logged);
  descriptions are clipped;
- results: text blocks joined; images, audio and binary resources described, not inlined; the whole clipped
  to `max_result_chars`; a result marked `isError`, or a JSON-RPC error the server answers with (unknown
  tool, bad arguments), becomes the call's result, `[tool error] ...`, which the model reads and can act on
  — and the call's trace span records it as failed (`ctx.extra["trace"]`, read by `OTelTracing`: the MCP
  semantic conventions' `error.type` `tool_error` or the JSON-RPC code, `mcp.method.name`, ...);
- arguments the model wrote are checked before anything is sent (`MCPTool.parse`): nested deeper than
  `MAX_ARGUMENT_DEPTH`, larger than `MAX_ARGUMENT_BYTES` as JSON, holding an unpaired surrogate, NaN or
  Infinity — what the SDK cannot send — is a `ToolArgumentError` the model reads, never a broken connection;
- every call carries its idempotency key in the request's `_meta` (`IDEMPOTENCY_KEY_META`), so a server can
  apply a call once however often it is sent;
- `timeout` is what a caller waits for an answer, whatever the transport does: then `MCPTimeoutError` is
  raised (an `MCPConnectionError` and a `TimeoutError`: the retry middleware's default policy retries it; the
  call may have run, or still be running). The request is abandoned in the background (the SDK sends the
  server a cancellation) and the connection stays for the other calls on it; when nobody else is using it,
  it is checked in the background (a tool listing within a few seconds) and dropped if it answers nothing —
  calls that come meanwhile wait for that verdict. Opening a connection (a new process for stdio, its
  handshake) waits at most `connect_timeout`, and says what got no answer;
- an HTTP 401 / 403 raises `MCPAuthError` (not retried: the same credentials get the same answer);
- transport failures — the server died, the connection dropped — are not the tool's answer: the call raises
  `MCPConnectionError` (a `ConnectionError`, so the retry middleware's default policy retries it), the
  connection is dropped, and the next call starts a new one (a new process for stdio). Without a retry the
  run fails, stored at its last step; a resume runs the call again, flagged `rerun`, with the same
  idempotency key (docs/agents.md).

Connections: one per running event loop, opened by the first call and owned by a task of that loop (the
SDK's task groups must be entered and left by one task; adapters/_mcp_connection.py). A connection that
is dropped is closed in the background, never on a caller's time (a stdio server's stdin closed, then
SIGTERM, then SIGKILL; an HTTP session's DELETE, given `close_grace` seconds); `aclose()` (or `async with
server:`) ends this loop's connection and waits for the closes under way, and the end of the loop ends them
too (`asyncio.run` cancels the tasks, which stops a stdio server's process).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import threading
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, NoReturn

from waypoint.engine.errors import GraphBuildError, WaypointError
from waypoint.engine.models.schema import ToolInfo
from waypoint.engine.tools.tool import Tool, ToolArgumentError, ToolContext

from ._mcp_connection import Closes, Connection, finished
from ._outgoing import depth as _depth

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
        """The call's result; `ctx.extra["trace"]` tells the call's trace span about it (the MCP semantic
        conventions' attributes, and `error.type` when the server answered with an error)."""
        trace: dict[str, Any] = {}
        ctx.extra["trace"] = trace  # filled as the call goes: kept when it raises
        return await self.server._call(self.remote_name, self.parse(args_json), self.name, ctx.idempotency_key,
                                       trace)


def _seconds(value: Any, what: str, server: str) -> float:
    """A bound in seconds: a positive, finite number. A wait without bound, or one no answer can meet (0: a
    call that ran is reported as unanswered, and retried), is refused when the server is described."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise GraphBuildError(f"MCP server '{server}': {what}={value!r} must be a positive number of seconds (a "
                         f"wait with no bound, or one no server can meet, is refused): say {what}=30, for instance")
    return float(value)


class _MCPServer:
    """Connection management, tool listing and calls shared by both transports."""

    target = ""
    network_transport = ""
    """`network.transport` in traces: "pipe" (stdio) or "tcp" (HTTP)."""
    close_grace = 10.0
    """Seconds a connection that was open gets to end in order (in the background) before it is cancelled."""

    def __init__(self, *, name: str, tool_prefix: str = "", include: Sequence[str] | None = None,
                 exclude: Sequence[str] = (), timeout: float = 60.0, connect_timeout: float = 30.0,
                 max_result_chars: int = 100_000) -> None:
        self.name = name
        self.tool_prefix = tool_prefix
        self.include = None if include is None else frozenset(include)
        self.exclude = frozenset(exclude)
        self.timeout = _seconds(timeout, "timeout", name)
        self.connect_timeout = _seconds(connect_timeout, "connect_timeout", name)
        self.max_result_chars = max_result_chars
        self.skipped: dict[str, str] = {}
        """Tools of the server that were left out, and why."""
        self._connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Connection] = (
            weakref.WeakKeyDictionary())
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
        self._dropped: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, str] = weakref.WeakKeyDictionary()
        """Why each loop's last connection was dropped: the next failure to connect says so."""
        self._closes = Closes()
        self._guard = threading.Lock()

    def _transport(self, connection: Connection) -> Any:
        raise NotImplementedError

    def _trace(self) -> dict[str, Any]:
        """What every call's trace span is told about the server (MCP semantic conventions)."""
        return {"mcp.method.name": "tools/call", "network.transport": self.network_transport}

    async def __aenter__(self) -> _MCPServer:
        await self._connection()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End this loop's connection to the server (a stdio server's process stops) and wait for it — and for
        connections dropped earlier in this loop — to be closed (each close is bounded)."""
        connection = self._connections.pop(asyncio.get_running_loop(), None)
        if connection is not None:
            connection.close()
        await finished(self._closes)

    async def _connection(self) -> Connection:
        """This loop's connection, opened if need be. Waits at most `connect_timeout` in all: for a check of
        the connection after a timed-out call, for another caller's handshake, for its own."""
        loop = asyncio.get_running_loop()
        with self._guard:  # loops in other threads may share the server object
            for stale in [other for other in self._locks if other.is_closed()]:
                self._connections.pop(stale, None)  # its task was cancelled when that loop ended
                del self._locks[stale]
            lock = self._locks.setdefault(loop, asyncio.Lock())
        opening: Connection | None = None
        waited = "the handshake"
        try:
            async with asyncio.timeout(self.connect_timeout), lock:
                connection = self._connections.get(loop)
                if connection is not None and connection.probe is not None:
                    waited = "a check of the connection after a call timed out"
                    await asyncio.wait([connection.probe])  # its verdict: keep the connection or drop it
                    waited = "the handshake"
                    connection = self._connections.get(loop)
                if connection is not None and connection.alive:
                    return connection
                if connection is not None:  # it ended on its own (the server exited, the transport broke)
                    self._drop(connection, f"it ended ({_describe(connection.error)})" if connection.error
                               else "it ended")
                opening = Connection(self._transport, label=self.name, close_grace=self.close_grace,
                                     closes=self._closes)
                await opening.open()
                if opening.error is not None:
                    if opening.refusals:
                        raise self._refused(opening.refused_status) from None
                    raise self._unreachable(opening.error) from opening.error
                self._connections[loop] = opening
                self._dropped.pop(loop, None)
                return opening
        except TimeoutError:
            if opening is not None:
                opening.close()
            raise self._no_answer(loop, waited) from None
        except BaseException:
            if opening is not None:
                opening.close()
            raise

    def _drop(self, connection: Connection, why: str) -> None:
        """Forget `connection` (the next call opens a new one) and close it in the background."""
        loop = asyncio.get_running_loop()
        if self._connections.get(loop) is connection:
            del self._connections[loop]
            self._dropped[loop] = why
        connection.close()

    def _suspect(self, connection: Connection) -> None:
        """After a timed-out request, check the connection in the background — unless other callers are waiting
        on it: their answers (or their own timeouts) tell."""
        if connection.waiting or not connection.alive or connection.probe is not None:
            return
        connection.probe = asyncio.get_running_loop().create_task(self._probe(connection),
                                                                  name=f"mcp-probe:{self.name}")

    async def _probe(self, connection: Connection) -> None:
        """Drop the connection if it does not answer a tool listing within a few seconds and nobody else uses
        it (a wedged server: the next call starts a new one); keep it otherwise."""
        limit = min(self.timeout, _PING_TIMEOUT)
        failed: Exception | None = None
        try:  # a listing, not a ping: the 2026-07-28 protocol removed ping
            await connection.ask(lambda client: client.list_tools(cache_mode="bypass"), limit)
        except Exception as err:  # noqa: BLE001 - a probe that fails in any way means the same
            failed = err
        finally:
            connection.probe = None
        if failed is not None and not connection.waiting:
            why = f"it answered nothing within {limit:g} s after a call timed out"
            if not isinstance(failed, TimeoutError):
                why = f"it failed a check after a call timed out ({_describe(failed)})"
            log.warning("MCP server '%s' (%s): connection dropped: %s", self.name, self.target, why)
            self._drop(connection, why)

    # --- what went wrong -----------------------------------------------------------------------------

    def _no_answer(self, loop: asyncio.AbstractEventLoop, waited: str) -> MCPConnectionError:
        before = self._dropped.get(loop)
        why = f"; the connection before was dropped: {before}" if before else ""
        return MCPConnectionError(
            f"MCP server '{self.name}' ({self.target}) could not be reached within connect_timeout "
            f"({self.connect_timeout:g} s): {waited} got no answer{why} — check that the server runs and is not "
            "stuck (the next call tries again; ToolRetryMiddleware does this), or raise connect_timeout= for a "
            "slow start")

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

    def _failed(self, connection: Connection, err: Exception, refusals: int, tool: str | None,
                keyed: bool = False) -> NoReturn:
        """Raise what a request that failed on `connection` means (`refusals`: the count before it was sent).

        A timeout abandons that one request and keeps the connection for the others (checked in the
        background); a transport failure drops it."""
        from mcp import MCPError
        from mcp_types import REQUEST_TIMEOUT

        if connection.refusals > refusals:  # an HTTP 401 / 403 answered: the SDK reports it as an internal error
            raise self._refused(connection.refused_status, tool) from None
        if isinstance(err, TimeoutError) or isinstance(err, MCPError) and err.code == REQUEST_TIMEOUT:
            self._suspect(connection)
            raise self._timed_out(tool, keyed) from err
        self._drop(connection, f"a request failed ({_describe(err)})")
        raise self._unreachable(err, tool) from err

    # --- listing -------------------------------------------------------------------------------------

    async def list_tools(self) -> list[MCPTool]:
        """The server's tools as Waypoint tools (what `skipped` names left out). Raises `MCPConnectionError`
        (`MCPTimeoutError` when the listing takes longer than `timeout`)."""
        connection = await self._connection()
        refusals = connection.refusals
        try:
            listed = await connection.ask(_all_pages, self.timeout)
        except Exception as err:
            self._failed(connection, err, refusals, None)
        self.skipped = {}
        tools: dict[str, MCPTool] = {}
        for remote in listed:
            if self.include is not None and remote.name not in self.include or remote.name in self.exclude:
                continue
            name = self.tool_prefix + remote.name
            problem = _problem(name, remote, tools)
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
        answer comes within `timeout` (at that moment: the call is abandoned in the background),
        `MCPAuthError` on HTTP 401 / 403, `MCPConnectionError` when the server cannot be reached within
        `connect_timeout` or the transport fails."""
        return await self._call(remote_name, arguments, tool or remote_name, idempotency_key, {})

    async def _call(self, remote_name: str, arguments: dict[str, Any], tool: str, idempotency_key: str | None,
                    trace: dict[str, Any]) -> str:
        """`call_tool`, filling in `trace` for the call's span as it goes (what it holds stays when it raises):
        the MCP conventions' attributes, and `error.type` when the server answered with an error."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError

        check_arguments(arguments)
        meta = {IDEMPOTENCY_KEY_META: idempotency_key} if idempotency_key else None
        trace.update(self._trace())
        connection = await self._connection()
        version = getattr(getattr(connection.client, "session", None), "protocol_version", None)
        if isinstance(version, str):
            trace["mcp.protocol.version"] = version
        refusals = connection.refusals
        try:
            result = await connection.ask(lambda client: client.call_tool(remote_name, arguments, meta=meta),
                                          self.timeout)
        except MCPError as err:
            if err.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT) or connection.refusals > refusals or not connection.alive:
                self._failed(connection, err, refusals, tool, meta is not None)
            trace["error.type"] = trace["rpc.response.status_code"] = str(err.code)
            return self._error_result(tool, f"the MCP server answered with an error: {err.message}")
        except (ValidationError, RuntimeError) as err:  # an answer the protocol does not allow: it was answered
            if not connection.alive:
                self._failed(connection, err, refusals, tool)
            trace["error.type"] = type(err).__name__
            return self._error_result(tool, f"the MCP server's answer could not be read ({_describe(err)}); the "
                                            "call may have run")
        except Exception as err:  # the transport broke, or no answer in time
            self._failed(connection, err, refusals, tool, meta is not None)
        text = _result_text(result)
        if result.is_error:  # the model reads it as a result; for the trace it is a failed call
            text = f"[tool error] tool '{tool}': {text}"
            trace["error.type"] = "tool_error"
        return _clip(text, self.max_result_chars)

    def _error_result(self, tool: str, what: str) -> str:
        return _clip(f"[tool error] tool '{tool}': {what}", self.max_result_chars)


async def _all_pages(client: Any) -> list[Any]:
    listed: list[Any] = []
    cursor = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return listed


def _problem(name: str, remote: Any, seen: Mapping[str, Any]) -> str | None:
    """Why a listed tool cannot be offered to a model, or None."""
    schema = remote.input_schema
    if not _NAME.fullmatch(name):
        return "its name must be 1-64 letters, digits, '_' or '-' (use tool_prefix= within that limit)"
    if name in seen:
        return "the server lists this name twice"
    if getattr(getattr(remote, "execution", None), "task_support", None) == "required":
        return ("the server runs it only as a task (execution.taskSupport: required), which Waypoint does not "
                "support yet: every call would fail")
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


def _describe(err: BaseException | None) -> str:
    """What went wrong, for a message: the error and up to two causes, looking inside exception groups (the
    SDK's task groups wrap what happened in one)."""
    seen: list[str] = []
    while err is not None and len(seen) < 3:
        while isinstance(err, BaseExceptionGroup) and err.exceptions:
            err = err.exceptions[0]
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
        self.network_transport = "pipe"

    def __repr__(self) -> str:
        return f"MCPServerStdio({self.command!r}, {self.args!r})"

    def _transport(self, connection: Connection) -> Any:
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
        self.network_transport = "tcp"
        self.close_grace = 3.0  # an orderly close is one DELETE; a wedged server never answers it
        try:
            port = parts.port
        except ValueError:  # not a port: connecting says so
            port = None
        self._address = (parts.hostname or "", port or (443 if parts.scheme == "https" else 80))

    def __repr__(self) -> str:
        return f"MCPServerStreamableHTTP({self.target!r})"

    def _trace(self) -> dict[str, Any]:
        host, port = self._address
        return {**super()._trace(), "server.address": host, "server.port": port}

    def _transport(self, connection: Connection) -> Any:
        return _http(self.url, self.headers, self.timeout, connection)


@contextlib.asynccontextmanager
async def _http(url: str, headers: dict[str, str], timeout: float, connection: Connection) -> AsyncIterator[Any]:
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
