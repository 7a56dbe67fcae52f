"""Tools from MCP servers (extra `[mcp]`) against a real MCP server the tests start in a subprocess
(tests/procs/mcp_server.py, the official SDK's server API), over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from waypoint.engine import ChatModelAgent, Runner
from waypoint.engine.models import Message, ScriptedChatModel, ToolCall
from waypoint.engine.tools import (MCPAuthError, MCPConnectionError, MCPServerStdio, MCPServerStreamableHTTP,
                                   MCPTimeoutError, MCPTool, ToolArgumentError)
from waypoint.adapters.mcp_tools import IDEMPOTENCY_KEY_META, MAX_SCHEMA_BYTES
from waypoint.middleware import LoggingMiddleware, SafeToolMiddleware, ToolRetryMiddleware, transient
from waypoint.engine import AgentMiddleware, RetryPolicy, WaypointError
from waypoint.stores import MemoryStore, SQLiteStore

PROCS = Path(__file__).parent / "procs"
SERVER = PROCS / "mcp_server.py"
AGENT = PROCS / "mcp_agent_proc.py"


def stdio(journal: Path, **options) -> MCPServerStdio:
    return MCPServerStdio(sys.executable, [str(SERVER), str(journal)], name="test", **options)


def lines(journal: Path) -> list[str]:
    return journal.read_text().splitlines() if journal.exists() else []


def asks(*calls: tuple[str, dict]) -> ScriptedChatModel:
    """A model that asks for each call in turn, then says what the last result was."""
    replies = [Message.assistant(tool_calls=[ToolCall(id=f"call_{i}", name=n, arguments=json.dumps(a))])
               for i, (n, a) in enumerate(calls)]
    return ScriptedChatModel([*replies, lambda messages, tools: f"last: {messages[-1].content}"])


async def test_listing_offers_the_servers_tools_with_their_schemas_and_leaves_out_what_no_model_accepts(tmp_path):
    async with stdio(tmp_path / "journal") as server:
        tools = await server.list_tools()
    by_name = {t.name: t for t in tools}
    assert {"add", "delete_file", "fail", "crash_once", "picture", "flood"} <= set(by_name)
    add = by_name["add"]
    assert isinstance(add, MCPTool) and add.info.description == "Add two integers."
    assert add.info.parameters["properties"]["a"]["type"] == "integer" and add.info.parameters["required"] == ["a", "b"]
    assert set(server.skipped) == {"bad name!", "huge"}  # named with the reason, never offered
    assert "letters, digits" in server.skipped["bad name!"] and str(MAX_SCHEMA_BYTES) in server.skipped["huge"]
    async with stdio(tmp_path / "journal", tool_prefix="fs_", include=["add", "fail"]) as server:
        assert sorted(t.name for t in await server.list_tools()) == ["fs_add", "fs_fail"]


async def test_an_agent_calls_mcp_tools_and_reads_their_errors_as_results(tmp_path):
    journal = tmp_path / "journal"
    server = stdio(journal, max_result_chars=120)
    try:
        tools = await server.list_tools()
        model = asks(("add", {"a": 2, "b": 40}), ("fail", {"reason": "not today"}), ("add", {"a": "two"}),
                     ("picture", {}), ("flood", {"n": 500}))
        agent = ChatModelAgent(name="calc", model=model, tools=tools,
                               middlewares=[LoggingMiddleware(), SafeToolMiddleware()])
        events = [e async for e in Runner(agent).run("go")]
    finally:
        await server.aclose()
    results = [(await e.output.get_message()).content for e in events if e.output and e.output.role == "tool"]
    assert results[0] == "42"
    assert results[1].startswith("[tool error] tool 'fail':") and "refused: not today" in results[1]
    assert results[2].startswith("[tool error] tool 'add':") and "validation error" in results[2]
    assert results[3] == "[image: image/png, 144 bytes of base64]"
    assert results[4] == "x" * 120 + "\n[truncated: 380 more characters]"
    assert [line.split()[:3] for line in lines(journal)] == [["add", "2", "40"]]


async def test_a_model_cannot_crash_a_tool_call_with_a_number_too_long_to_read(tmp_path):
    server = stdio(tmp_path / "journal")
    try:
        (add,) = [t for t in await server.list_tools() if t.name == "add"]
        model = ScriptedChatModel([Message.assistant(tool_calls=[
            ToolCall(id="c1", name="add", arguments='{"a": ' + "9" * 5000 + ', "b": 1}')]), "ok"])
        events = [e async for e in Runner(ChatModelAgent(name="n", model=model, tools=[add])).run("go")]
    finally:
        await server.aclose()
    (result,) = [(await e.output.get_message()).content for e in events if e.output and e.output.role == "tool"]
    assert result.startswith("[tool error] tool 'add': the arguments hold a number too long to read")
    assert events[-1].action.exit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_server(tmp_path_factory):
    journal = tmp_path_factory.mktemp("mcp") / "journal"
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), str(journal), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the MCP test server did not start listening within 30 s")
    try:
        yield f"http://127.0.0.1:{port}/mcp", journal
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer test-token"}], ids=["plain", "headers"])
async def test_streamable_http_lists_and_calls(http_server, headers):
    url, journal = http_server
    async with MCPServerStreamableHTTP(url, headers=headers) as server:
        tools = {t.name: t for t in await server.list_tools()}
        assert "delete_file" in tools and "bad name!" in server.skipped
        model = asks(("add", {"a": 1, "b": 1}))
        events = [e async for e in Runner(ChatModelAgent(name="h", model=model, tools=list(tools.values()))).run("x")]
    assert events[-2].output.message.content == "last: 2"
    assert server.name == "127.0.0.1" and "test-token" not in repr(server)


def test_a_connection_per_event_loop_closed_with_its_loop(tmp_path):
    journal = tmp_path / "journal"
    server = stdio(journal)
    tools = asyncio.run(server.list_tools())
    agent = ChatModelAgent(name="sync", model=asks(("add", {"a": 1, "b": 2})), tools=tools)
    Runner(agent).run_sync("first")  # invoke-style: a new event loop per call
    agent = ChatModelAgent(name="sync", model=asks(("add", {"a": 3, "b": 4})), tools=tools)
    Runner(agent).run_sync("second")
    pids = [int(line.split()[-1]) for line in lines(journal)]
    assert len(pids) == 2 and pids[0] != pids[1]  # each loop had its own server process ...
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)  # ... stopped when that loop ended


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is dead for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


async def test_a_server_that_dies_mid_call_is_retried_on_a_new_connection(tmp_path):
    journal = tmp_path / "journal"
    server = stdio(journal)
    try:
        tools = await server.list_tools()
        agent = ChatModelAgent(name="r", model=asks(("crash_once", {"note": "n1"})), tools=tools,
                               middlewares=[ToolRetryMiddleware(RetryPolicy(max_attempts=2, initial_interval=0.01))])
        events = [e async for e in Runner(agent).run("go")]
    finally:
        await server.aclose()
    retries = [e.action.retry for e in events if e.action and e.action.retry]
    assert len(retries) == 1 and "MCPConnectionError" in retries[0].error
    assert events[-2].output.message.content == "last: survived n1"
    died, answered = lines(journal)
    assert died.startswith("crash_once n1 dying") and answered.startswith("crash_once n1 ")
    assert died.split()[-1] != answered.split()[-1]  # a new server process answered


async def test_a_server_that_dies_mid_call_fails_the_run_and_a_resume_runs_the_call_again(tmp_path):
    journal = tmp_path / "journal"
    store = SQLiteStore(tmp_path / "runs.db")
    server = stdio(journal)
    try:
        tools = await server.list_tools()
        agent = ChatModelAgent(name="d", model=asks(("crash_once", {"note": "n2"})), tools=tools)
        runner = Runner(agent, store=store)
        events = [e async for e in runner.run("go", checkpoint_id="t")]
        error = events[-1].error
        assert error is not None and isinstance(error.__cause__, MCPConnectionError)
        assert "MCP server 'test'" in str(error.__cause__) and "tool 'crash_once'" in str(error.__cause__)
        assert (await runner.app.get_run("t")).meta.status == "failed"
        events = [e async for e in runner.resume("t")]
    finally:
        await server.aclose()
        await store.close()
    (rerun,) = [e.action.rerun for e in events if e.action and e.action.rerun]
    assert rerun.name == "crash_once"
    assert events[-2].output.message.content == "last: survived n2"


def start_http(journal: Path, port: int, *extra: str) -> subprocess.Popen:
    """tests/procs/mcp_server.py over streamable HTTP on `port`, once it listens."""
    proc = subprocess.Popen([sys.executable, str(SERVER), str(journal), "--http", str(port), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    pytest.fail("the MCP test server did not start listening within 30 s")


async def test_an_http_server_that_went_away_is_reached_again_once_it_is_back(tmp_path):
    journal, port = tmp_path / "journal", free_port()

    def start():
        return start_http(journal, port)

    proc = start()
    server = MCPServerStreamableHTTP(f"http://127.0.0.1:{port}/mcp", name="crm", timeout=10)
    try:
        assert await server.call_tool("add", {"a": 1, "b": 2}) == "3"
        proc.kill()
        proc.wait()
        with pytest.raises(MCPConnectionError, match="MCP server 'crm'.*tool 'add'"):
            await server.call_tool("add", {"a": 3, "b": 4})
        proc = start()
        assert await server.call_tool("add", {"a": 5, "b": 6}) == "11"  # a new session, nothing to restart
    finally:
        await server.aclose()
        proc.kill()
        proc.wait()


def agent_proc(*args):
    proc = subprocess.run([sys.executable, str(AGENT), *map(str, args)], capture_output=True, text=True, timeout=90)
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.strip()], proc.stderr


def test_an_approval_in_front_of_an_mcp_call_across_two_processes(tmp_path):
    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    code, out, err = agent_proc(db, "ticket-3", journal)
    assert code == 2, err
    assert out[-1]["prompt"].startswith("tool 'delete_file' wants to run with arguments")
    assert lines(journal) == []  # the server did nothing before the approval
    code, out, err = agent_proc(db, "ticket-3", journal, "--approve", out[-1]["interrupt"])
    assert code == 0, err
    assert out[-1] == {"answer": "the server said: deleted /srv/app.log"}
    assert [line.split()[:2] for line in lines(journal)] == [["delete_file", "/srv/app.log"]]  # once, after approval


async def test_an_unreachable_server_says_which_and_what_to_do(tmp_path):
    server = MCPServerStdio(sys.executable, ["-c", "import sys; sys.exit(5)"], name="gone", connect_timeout=20)
    with pytest.raises(MCPConnectionError, match="MCP server 'gone'.*retry") as caught:
        await server.list_tools()
    assert "Group" not in str(caught.value)  # what happened, not the SDK's task group around it
    port = free_port()
    with pytest.raises(MCPConnectionError, match=f"127.0.0.1:{port}") as caught:
        await MCPServerStreamableHTTP(f"http://user:pw@127.0.0.1:{port}/mcp", connect_timeout=20).list_tools()
    assert "ConnectionRefusedError" in str(caught.value) and "Group" not in str(caught.value)


def results_by_call(events) -> dict[str, str]:
    return {e.output.message.tool_call_id: e.output.message.content
            for e in events if e.output and e.output.role == "tool"}


async def test_a_call_that_times_out_leaves_the_connection_to_the_calls_beside_it(tmp_path):
    """One call's timeout abandons that call only: a sibling in flight on the same connection finishes, once."""
    journal, go = tmp_path / "journal", tmp_path / "go"
    server = stdio(journal, timeout=3)
    try:
        await server.call_tool("add", {"a": 1, "b": 1})

        async def sibling():
            await asyncio.sleep(0.5)  # in flight when the first call times out, well within its own timeout
            return await server.call_tool("wait_for", {"note": "sibling", "path": str(go)})

        async def hung():
            try:
                await server.call_tool("wait_for", {"note": "hung", "path": str(tmp_path / "never")})
            finally:
                go.touch()

        failed, answered = await asyncio.gather(hung(), sibling(), return_exceptions=True)
        assert answered == "waited sibling"
        assert isinstance(failed, MCPTimeoutError) and isinstance(failed, TimeoutError)
        assert isinstance(failed, MCPConnectionError)  # what callers caught before; retried by default
        assert "tool 'wait_for' did not answer within 3 s" in str(failed) and "may have run" in str(failed)
        assert await server.call_tool("add", {"a": 2, "b": 2}) == "4"
    finally:
        await server.aclose()
    pids = {line.split()[-1] for line in lines(journal)}
    assert len(pids) == 1  # one server process served everything: the connection was never dropped
    assert [line.split()[:2] for line in lines(journal)].count(["wait_for", "sibling"]) == 1


async def test_a_timed_out_server_that_answers_nothing_any_more_is_dropped_when_nobody_else_uses_it(tmp_path):
    journal = tmp_path / "journal"
    server = stdio(journal, timeout=1)
    try:
        with pytest.raises(MCPTimeoutError, match="tool 'freeze' did not answer within 1 s"):
            await server.call_tool("freeze", {"seconds": 20})  # blocks the server's event loop
        assert await server.call_tool("add", {"a": 2, "b": 3}) == "5"
    finally:
        await server.aclose()
    frozen, added = lines(journal)
    assert frozen.split()[-1] != added.split()[-1]  # a new process answered the next call


BAD_ARGUMENTS = {
    "nested 300 deep": ('{"data": ' + '{"a":' * 300 + "1" + "}" * 300 + "}", "nest deeper than 64 levels"),
    "nested 100,000 deep": ('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}", "too deeply to read"),
    "a lone surrogate": ('{"data": {"a": "\\ud800"}}', "not valid Unicode"),
    "NaN": ('{"data": {"a": NaN}}', "NaN or Infinity"),
    "too large": (json.dumps({"data": {"a": "x" * 1_100_000}}), "bytes, more than this tool takes"),
}


async def test_arguments_the_sdk_cannot_send_are_a_result_the_model_reads_and_never_touch_the_connection(tmp_path):
    journal, go = tmp_path / "journal", tmp_path / "go"
    server = stdio(journal)
    try:
        tools = await server.list_tools()
        calls = [ToolCall(id="side", name="wait_for", arguments=json.dumps({"note": "side", "path": str(go)}))]
        calls += [ToolCall(id=f"bad{i}", name="echo", arguments=a) for i, (a, _) in enumerate(BAD_ARGUMENTS.values())]
        model = ScriptedChatModel([Message.assistant(tool_calls=calls), "done"])
        agent = ChatModelAgent(name="p", model=model, tools=tools,
                               middlewares=[ToolRetryMiddleware(RetryPolicy(max_attempts=3, initial_interval=0.1))])

        async def release():
            await asyncio.sleep(1.0)  # the side effect is in flight while the bad calls fail
            go.touch()

        events, _ = await asyncio.gather(_events(Runner(agent).run("go")), release())
        deep: dict = {}
        for _ in range(300):
            deep = {"a": deep}
        for data in (deep, {"a": "\ud800"}, {"a": float("nan")}, {"a": "x" * 1_100_000}):
            with pytest.raises(ToolArgumentError):  # called directly: refused before anything is sent
                await server.call_tool("echo", {"data": data})
        assert await server.call_tool("add", {"a": 1, "b": 1}) == "2"
    finally:
        await server.aclose()
    results = results_by_call(events)
    assert results.pop("side") == "waited side"
    for i, (_, says) in enumerate(BAD_ARGUMENTS.values()):
        result = results[f"bad{i}"]
        assert result.startswith("[tool error] tool 'echo': the arguments") and says in result, result
    assert not [e for e in events if e.action and e.action.retry]
    assert [line.split()[:2] for line in lines(journal)] == [["wait_for", "side"], ["add", "1"]]  # echo never ran
    assert len({line.split()[-1] for line in lines(journal)}) == 1  # on one connection throughout


async def _events(iterator):
    return [e async for e in iterator]


class KeyRecorder(AgentMiddleware):
    def __init__(self):
        self.keys: list[str] = []

    def wrap_invokable_tool_call(self, endpoint, ctx):
        self.keys.append(ctx.idempotency_key)
        return endpoint


async def test_every_call_sends_its_idempotency_key_in_meta_the_same_on_a_retry(tmp_path):
    journal = tmp_path / "journal"
    server = stdio(journal)
    recorder = KeyRecorder()
    try:
        tools = await server.list_tools()
        model = asks(("keyed", {"note": "k1"}), ("crash_once", {"note": "c1"}))
        agent = ChatModelAgent(name="k", model=model, tools=tools, middlewares=[
            recorder, ToolRetryMiddleware(RetryPolicy(max_attempts=2, initial_interval=0.01))])
        events = [e async for e in Runner(agent, store=MemoryStore()).run("go", checkpoint_id="keys")]
        assert await server.call_tool("keyed", {"note": "direct"}) == "keyed direct"
    finally:
        await server.aclose()
    assert events[-2].output.message.content == "last: survived c1"
    keyed, *_, direct = [line.split() for line in lines(journal) if line.startswith("keyed")]
    assert keyed[:3] == ["keyed", "k1", recorder.keys[0]] and len(recorder.keys[0]) > 8
    died, answered = [line.split() for line in lines(journal) if line.startswith("crash_once")]
    assert died[3] == answered[2] == recorder.keys[1] != recorder.keys[0]  # a retry sends the same key
    assert direct[:3] == ["keyed", "direct", "None"]  # no key given, none sent
    assert IDEMPOTENCY_KEY_META == "waypoint/idempotency_key"  # what docs/ecosystem.md tells server authors


async def test_an_http_server_that_refuses_the_credentials_is_an_auth_error_not_a_connection_failure(tmp_path):
    journal, port = tmp_path / "journal", free_port()
    proc = start_http(journal, port, "s3cret")
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wrong = MCPServerStreamableHTTP(url, headers={"Authorization": "Bearer WRONG-TOKEN"}, name="crm")
        with pytest.raises(MCPAuthError, match=r"MCP server 'crm' .* refused the connection with HTTP 401") as caught:
            await wrong.list_tools()
        assert "WRONG-TOKEN" not in str(caught.value) and not transient(caught.value)
        assert not isinstance(caught.value, ConnectionError) and isinstance(caught.value, WaypointError)
        async with MCPServerStreamableHTTP(url, headers={"Authorization": "Bearer s3cret"}, name="crm") as right:
            assert await right.call_tool("add", {"a": 1, "b": 2}) == "3"
            assert await right.call_tool("revoke", {}) == "revoked"  # from now on: 403
            with pytest.raises(MCPAuthError, match="refused the call to tool 'add' with HTTP 403"):
                await right.call_tool("add", {"a": 3, "b": 4})
    finally:
        proc.kill()
        proc.wait()


async def until(condition, within: float, what: str) -> None:
    """Wait for `condition()` to hold, polling, for at most `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {within:g} s")
        await asyncio.sleep(0.05)


async def test_a_hung_stdio_server_costs_a_call_its_timeout_and_is_replaced_in_the_background(tmp_path):
    """A server stopped dead (SIGSTOP): the call raises at its timeout, not after the close; the next call gets
    a new process; the hung one is killed in the background."""
    journal = tmp_path / "journal"
    server = stdio(journal, timeout=1, connect_timeout=10)
    hung = None
    try:
        assert await server.call_tool("add", {"a": 1, "b": 1}) == "2"
        hung = int(lines(journal)[-1].split()[-1])
        os.kill(hung, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(MCPTimeoutError, match="MCP server 'test' .*tool 'add' did not answer within 1 s"):
            await server.call_tool("add", {"a": 2, "b": 2})
        assert time.monotonic() - started < server.timeout + 3  # measured 1.0 s; before: 10 s (probe + close)
        started = time.monotonic()
        assert await server.call_tool("add", {"a": 3, "b": 3}) == "6"
        assert time.monotonic() - started < server.connect_timeout + 3
        assert int(lines(journal)[-1].split()[-1]) != hung  # a new process answered
        await until(lambda: not _alive(hung), server.close_grace + 10, "the hung server process was killed")
    finally:
        if hung is not None and _alive(hung):
            os.kill(hung, signal.SIGKILL)
        await server.aclose()


async def test_a_hung_http_server_costs_a_call_its_timeout_and_the_next_one_says_what_happened(tmp_path):
    journal, port = tmp_path / "journal", free_port()
    proc = start_http(journal, port)
    server = MCPServerStreamableHTTP(f"http://127.0.0.1:{port}/mcp", name="crm", timeout=1, connect_timeout=3)
    try:
        assert await server.call_tool("add", {"a": 1, "b": 1}) == "2"
        proc.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(MCPTimeoutError, match="MCP server 'crm' .*tool 'add' did not answer within 1 s"):
            await server.call_tool("add", {"a": 2, "b": 2})
        assert time.monotonic() - started < server.timeout + 3  # measured 1.0 s; before: 21 s
        started = time.monotonic()
        with pytest.raises(MCPConnectionError) as caught:  # it answers nothing, not even a new handshake
            await server.call_tool("add", {"a": 3, "b": 3})
        assert time.monotonic() - started < server.connect_timeout + 3  # before: 13 s, an ExceptionGroup
        said = str(caught.value)
        assert said.startswith(f"MCP server 'crm' (http://127.0.0.1:{port}/mcp) could not be reached within "
                               "connect_timeout (3 s): the handshake got no answer")
        assert "the connection before was dropped: it answered nothing within 1 s after a call timed out" in said
        assert "check that the server runs and is not stuck" in said and "Group" not in said
        proc.send_signal(signal.SIGCONT)
        assert await server.call_tool("add", {"a": 5, "b": 6}) == "11"  # back: a new session
        started = time.monotonic()
        await server.aclose()
        assert time.monotonic() - started < server.close_grace + 3  # the closes under way end within their grace
    finally:
        proc.send_signal(signal.SIGCONT)
        await server.aclose()
        proc.kill()
        proc.wait()


async def test_tools_a_server_runs_only_as_tasks_are_left_out_until_tasks_are_supported(tmp_path, caplog):
    """On a 2025-11-25 server a tool marked `taskSupport: required` refuses every plain call: never offered."""
    journal = tmp_path / "journal"
    server = MCPServerStdio(sys.executable, [str(SERVER), str(journal), "--legacy"], name="legacy")
    try:
        with caplog.at_level(logging.WARNING, logger="waypoint.mcp"):
            tools = {t.name for t in await server.list_tools()}
        assert "add" in tools and "long_report" not in tools
        assert "taskSupport: required" in server.skipped["long_report"]
        assert "does not support yet" in server.skipped["long_report"]
        assert any("'long_report' left out" in r.getMessage() for r in caplog.records)
        called = await server.call_tool("long_report", {"topic": "q3"})  # what the model would have met
        assert called.startswith("[tool error] tool 'long_report':") and "runs only as a task" in called
    finally:
        await server.aclose()


async def test_a_session_that_fails_before_its_handshake_is_told_to_the_caller_at_once(tmp_path, monkeypatch):
    """What fails inside the session's own task before the handshake (here: importing the SDK) is the caller's
    error, naming its cause — not a handshake that "got no answer" once connect_timeout has passed."""
    server = stdio(tmp_path / "journal", connect_timeout=600)
    monkeypatch.setitem(sys.modules, "mcp", None)  # `from mcp import Client` raises ImportError
    with pytest.raises(MCPConnectionError, match="import of mcp halted") as caught:
        async with asyncio.timeout(60):
            await server.list_tools()
    assert "no answer" not in str(caught.value)


@pytest.mark.parametrize("option", ["timeout", "connect_timeout"])
@pytest.mark.parametrize("value", [None, 0, -1, "5", float("inf"), True])
def test_a_timeout_that_cannot_bound_a_wait_is_refused_when_the_server_is_described(tmp_path, option, value):
    """None would wait for a hung server for ever; 0 reports a call that ran as unanswered (and a retry runs it
    again); a string fails later as a misleading connection error."""
    from waypoint.engine import GraphBuildError

    with pytest.raises(GraphBuildError, match=rf"MCP server 'test': {option}=.* must be a positive number"):
        stdio(tmp_path / "journal", **{option: value})
    with pytest.raises(GraphBuildError, match=rf"{option}="):
        MCPServerStreamableHTTP("http://127.0.0.1:9/mcp", name="test", **{option: value})
