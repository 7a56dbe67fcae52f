"""AnthropicChatModel (extra `[anthropic]`) against a real messages-API server on 127.0.0.1
(tests/anthropic_server.py): the official SDK talks HTTP and SSE to it."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import pytest
from anthropic_server import AnthropicServer, Reply

from waypoint.engine import ChatModelAgent, ModelError, Runner, tool
from waypoint.engine.models import AnthropicChatModel, Message, ToolCall, ToolInfo, Usage, concat_messages
from waypoint.engine.models import model_from_env as from_env

KEY = "sk-ant-test-WAYPOINT-0123456789-SECRET"
TOOLS = [ToolInfo(name="lookup", description="Look a word up.",
                  parameters={"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}),
         ToolInfo(name="clock", description="The time.")]
USAGE = Usage(prompt_tokens=11, completion_tokens=7, total_tokens=18)


@pytest.fixture
def server():
    s = AnthropicServer()
    try:
        yield s
    finally:
        s.close()
    assert not s.replies, f"{len(s.replies)} scripted replies were never requested"


@pytest.fixture
def model(server):
    return AnthropicChatModel("claude-test", base_url=server.base_url, api_key=KEY, timeout=5.0)


async def collect(stream):
    return [chunk async for chunk in stream]


def assert_key_hidden(err: BaseException) -> None:
    seen = []
    while err is not None and err not in seen:
        seen.append(err)
        assert KEY not in str(err) and KEY not in repr(err), err
        err = err.__cause__ or err.__context__


async def test_generate_sends_the_messages_api_request_and_reads_the_answer(model, server):
    server.push(Reply("Hello, world."))
    answer = await model.generate([Message.system("Be brief."), Message.user("hi")])
    assert answer == Message(role="assistant", content="Hello, world.", usage=USAGE, finish_reason="stop")
    (sent,) = server.requests
    assert sent.path == "/v1/messages" and "anthropic-version" in sent.headers
    assert KEY in (sent.headers.get("x-api-key"), sent.headers.get("authorization", "").removeprefix("Bearer "))
    assert sent.body == {"model": "claude-test", "max_tokens": 4096, "system": "Be brief.",
                         "messages": [{"role": "user", "content": "hi"}]}


async def test_stream_yields_text_as_it_arrives(model, server):
    text = "The quick brown fox jumps over the lazy dog."
    server.push(Reply(text, chunk_size=5, delay=0.04), Reply(text))
    started = time.perf_counter()
    first_at, chunks = None, []
    async for chunk in model.stream([Message.user("story")]):
        first_at = first_at or time.perf_counter() - started
        chunks.append(chunk)
    assert first_at < time.perf_counter() - started - 0.25  # 9 text deltas, 40 ms apart
    assert [c.content for c in chunks[:3]] == ["The q", "uick ", "brown"]
    whole = concat_messages(chunks)
    assert whole == await model.generate([Message.user("story")])
    assert whole.usage == USAGE and whole.finish_reason == "stop" and server.bodies[0]["stream"] is True


async def test_streamed_tool_use_joins_into_the_calls_generate_returns(model, server):
    calls = [("toolu_a", "lookup", '{"word": "graph"}'), ("toolu_b", "clock", "")]  # clock: no input deltas
    server.push(Reply("Let me check.", tool_calls=calls, chunk_size=6), Reply("Let me check.", tool_calls=calls))
    chunks = await collect(model.stream([Message.user("two things")], tools=TOOLS))
    streamed = concat_messages(chunks)
    whole = await model.generate([Message.user("two things")], tools=TOOLS)
    for message in (streamed, whole):
        assert message.content == "Let me check." and message.finish_reason == "tool_calls"
        assert [(c.id, c.name, json.loads(c.arguments), c.index) for c in message.tool_calls] == [
            ("toolu_a", "lookup", {"word": "graph"}, 0), ("toolu_b", "clock", {}, 1)]
    assert server.bodies[0]["tools"] == [
        {"name": "lookup", "description": "Look a word up.", "input_schema": TOOLS[0].parameters},
        {"name": "clock", "description": "The time.", "input_schema": {"type": "object", "properties": {}}}]
    assert server.bodies[0]["tool_choice"] == {"type": "auto"}


async def test_tool_results_go_back_as_tool_result_blocks_in_one_user_turn(model, server):
    server.push("It is noon and a graph is a set of nodes.")
    history = [
        Message.system("You help."), Message.user("two things"),
        Message.assistant("Checking.", tool_calls=[ToolCall(id="toolu_a", name="lookup", arguments='{"word": "graph"}'),
                                                   ToolCall(id="toolu_b", name="clock", arguments="not json")]),
        Message.tool("nodes and edges", tool_call_id="toolu_a", name="lookup"),
        Message.tool("12:00", tool_call_id="toolu_b", name="clock"),
    ]
    await model.generate(history, tools=TOOLS)
    assert server.bodies[0]["messages"] == [
        {"role": "user", "content": "two things"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_a", "name": "lookup", "input": {"word": "graph"}},
            {"type": "tool_use", "id": "toolu_b", "name": "clock", "input": {}}]},  # bad JSON: already answered
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "nodes and edges"},
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": "12:00"}]},
    ]


@pytest.mark.parametrize("choice,wire", [("required", {"type": "any"}), ("none", {"type": "none"}),
                                         ("clock", {"type": "tool", "name": "clock"})])
async def test_tool_choice_forms(model, server, choice, wire):
    server.push("ok")
    await model.generate([Message.user("x")], tools=TOOLS, tool_choice=choice)
    assert server.bodies[0]["tool_choice"] == wire
    with pytest.raises(ModelError, match="tool_choice names tool 'nope'"):
        await model.generate([Message.user("x")], tools=TOOLS, tool_choice="nope")


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
@pytest.mark.parametrize("status,kind,retryable,advice", [
    (401, "authentication_error", False, "ANTHROPIC_API_KEY"),
    (400, "invalid_request_error", False, "max_tokens"),
    (429, "rate_limit_error", True, "rate limited"),
    (500, "api_error", True, "retry later"),
    (529, "overloaded_error", True, "overloaded"),
])
async def test_http_errors_become_model_errors(model, server, status, kind, retryable, advice, streaming):
    server.push(Reply.failure(status, f"bad thing; your key {KEY} was used", type=kind))
    with pytest.raises(ModelError) as caught:
        if streaming:
            await collect(model.stream([Message.user("x")]))
        else:
            await model.generate([Message.user("x")])
    err = caught.value
    assert (err.status, err.retryable, err.model) == (status, retryable, "claude-test")
    assert f"model 'claude-test' at {server.host}" in str(err) and advice in str(err) and kind in str(err)
    assert_key_hidden(err)


async def test_a_long_error_body_is_cut_short_without_cutting_the_key_in_half(model, server):
    server.push(Reply.failure(502, "<html>" + "x" * 290 + KEY + "</html>"))
    with pytest.raises(ModelError) as caught:
        await model.generate([Message.user("hi")])
    text = str(caught.value)
    assert "x" * 290 + "***" in text and "</html>" not in text and KEY[:12] not in text
    assert_key_hidden(caught.value)


async def test_an_error_event_mid_stream_is_a_model_error_by_its_type(model, server):
    server.push(Reply("partial answer", error_after=4, error={"type": "overloaded_error", "message": "Overloaded"}))
    with pytest.raises(ModelError) as caught:
        await collect(model.stream([Message.user("x")]))
    assert caught.value.retryable and caught.value.status is None
    assert "overloaded_error: Overloaded" in str(caught.value) and "error event in the stream" in str(caught.value)


async def test_a_dropped_connection_mid_stream_is_retryable(model, server):
    server.push(Reply("a long answer that never ends", drop_after=4))
    with pytest.raises(ModelError) as caught:
        await collect(model.stream([Message.user("x")]))
    assert caught.value.retryable and caught.value.status is None
    assert "after" in str(caught.value) and "streamed chunks" in str(caught.value)


async def test_a_timeout_is_retryable(server):
    model = AnthropicChatModel("claude-test", base_url=server.base_url, api_key=KEY, timeout=0.3)
    server.push(Reply("late", wait=1.0))
    with pytest.raises(ModelError) as caught:
        await model.generate([Message.user("x")])
    assert caught.value.retryable and caught.value.status is None and "no answer within 0.3 s" in str(caught.value)


async def test_an_unreachable_server_is_retryable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = AnthropicChatModel("claude-test", base_url=f"http://127.0.0.1:{port}", api_key=KEY, timeout=2)
    with pytest.raises(ModelError) as caught:
        await model.generate([Message.user("x")])
    assert caught.value.retryable and "connection failed" in str(caught.value)
    assert_key_hidden(caught.value)


def test_no_key_for_the_anthropic_api_is_refused_at_once(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with pytest.raises(ModelError, match="set ANTHROPIC_API_KEY"):
        AnthropicChatModel("claude-test")


def test_one_model_serves_several_event_loops(server):
    model = AnthropicChatModel("claude-test", base_url=server.base_url, api_key=KEY)
    server.push("one", "two")
    assert asyncio.run(model.generate([Message.user("a")])).content == "one"
    assert asyncio.run(model.generate([Message.user("b")])).content == "two"


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
def test_an_agent_runs_a_tool_through_the_anthropic_model(server, streaming):
    @tool
    def lookup(word: str) -> str:
        """Look a word up."""
        return f"{word}: a set of nodes and edges"

    server.push(Reply(tool_calls=[("toolu_1", "lookup", '{"word": "graph"}')]), Reply("A graph has nodes."))
    model = AnthropicChatModel("claude-test", base_url=server.base_url, api_key=KEY)
    runner = Runner(ChatModelAgent(name="a", model=model, tools=[lookup]), streaming=streaming)
    events = runner.run_sync("what is a graph?")
    said = [(e.output.role, e.output.message.content if e.output.message else None) for e in events if e.output]
    assert said[-1] == ("assistant", "A graph has nodes.")
    last = server.bodies[-1]["messages"]
    assert last[-1] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "graph: a set of nodes and edges"}]}


def test_model_from_env_picks_anthropic_by_its_key(monkeypatch, server):
    for name in ("OPENAI_API_KEY", "ANTHROPIC_MODEL", "WAYPOINT_MODEL_PROVIDER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    model = from_env()
    assert isinstance(model, AnthropicChatModel) and (model.name, model.server) == ("claude-haiku-4-5", server.host)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")  # both keys: OpenAI, as before, unless asked otherwise
    assert type(from_env()).__name__ == "OpenAIChatModel"
    monkeypatch.setenv("WAYPOINT_MODEL_PROVIDER", "anthropic")
    assert isinstance(from_env(), AnthropicChatModel)
    monkeypatch.setenv("WAYPOINT_MODEL_PROVIDER", "offline")
    assert type(from_env()).__name__ == "OfflineModel"
    monkeypatch.setenv("WAYPOINT_MODEL_PROVIDER", "gemini")
    with pytest.raises(ModelError, match="WAYPOINT_MODEL_PROVIDER='gemini'"):
        from_env()


def test_importing_the_models_does_not_import_anthropic():
    code = ("import sys, waypoint.engine.models as m\n"
            "from waypoint.engine.models import AnthropicChatModel\n"
            "before = 'anthropic' in sys.modules\n"
            "AnthropicChatModel('x', base_url='http://127.0.0.1:9', api_key='k')\n"
            "print(before, 'anthropic' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]
