"""Tools from MCP servers (extra `[mcp]`) against a real MCP server the tests start in a subprocess
(tests/procs/mcp_server.py, the official SDK's server API), over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from waypoint.engine import ChatModelAgent, Runner
from waypoint.engine.models import Message, ScriptedChatModel, ToolCall
from waypoint.engine.tools import MCPConnectionError, MCPServerStdio, MCPServerStreamableHTTP, MCPTool
from waypoint.engine.tools.mcp import MAX_SCHEMA_BYTES
from waypoint.middleware import LoggingMiddleware, SafeToolMiddleware, ToolRetryMiddleware
from waypoint.engine import RetryPolicy
from waypoint.stores import SQLiteStore

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


async def test_an_http_server_that_went_away_is_reached_again_once_it_is_back(tmp_path):
    journal, port = tmp_path / "journal", free_port()

    def start():
        proc = subprocess.Popen([sys.executable, str(SERVER), str(journal), "--http", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return proc
            except OSError:
                time.sleep(0.05)
        proc.kill()
        pytest.fail("the MCP test server did not start")

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
    with pytest.raises(MCPConnectionError, match="MCP server 'gone'.*retry"):
        await server.list_tools()
    port = free_port()
    with pytest.raises(MCPConnectionError, match=f"127.0.0.1:{port}"):
        await MCPServerStreamableHTTP(f"http://user:pw@127.0.0.1:{port}/mcp", connect_timeout=20).list_tools()
