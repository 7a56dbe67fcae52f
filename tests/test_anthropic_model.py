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
    assert answer == Message(role="assistant", content="Hello, world.", usage=USAGE, finish_reason="stop",
                             response_id="msg_test", response_model="claude-test")  # the answer's own names
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


def _answer(**over):
    base = {"id": "m", "type": "message", "role": "assistant", "model": "c", "stop_reason": "end_turn",
            "stop_sequence": None, "content": [{"type": "text", "text": "hi"}],
            "usage": {"input_tokens": 1, "output_tokens": 1}}
    return {**base, **over}


def _start():
    return ("message_start", {"type": "message_start", "message": _answer(content=[], stop_reason=None)})


def _delta(index, **delta):
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


HOSTILE_ANSWERS = {  # a 200 answer the model class cannot read: a proxy's glitch, or a hostile server
    "content is a string": _answer(content="hello"),
    "tool_use id is a number": _answer(content=[{"type": "tool_use", "id": 5, "name": "x", "input": {}}]),
    "usage tokens are text": _answer(usage={"input_tokens": "many", "output_tokens": 1}),
    "stop_reason is a number": _answer(stop_reason=7),
    "text is a number": _answer(content=[{"type": "text", "text": 5}]),
    "the body is a JSON list": [1, 2],
    "the body is not JSON": b"<html>oops</html>",
}
HOSTILE_STREAMS = {
    "a block start without its block": [_start(), ("content_block_start", {"type": "content_block_start", "index": 0})],
    "partial_json is a number": [_start(), ("content_block_start", {"type": "content_block_start", "index": 0,
                                            "content_block": {"type": "tool_use", "id": "t", "name": "x", "input": {}}}),
                                 _delta(0, type="input_json_delta", partial_json=12)],
    "text_delta is a list": [_start(), _delta(0, type="text_delta", text=["a"])],
    "output_tokens is text": [_start(), ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                                           "usage": {"output_tokens": "x"}})],
    "an event is not JSON": [_start(), ("content_block_delta", "{not json")],
}


@pytest.mark.parametrize("streaming,raw", [(False, a) for a in HOSTILE_ANSWERS.values()]
                         + [(True, s) for s in HOSTILE_STREAMS.values()],
                         ids=[*HOSTILE_ANSWERS, *HOSTILE_STREAMS])
async def test_an_answer_the_model_cannot_read_is_a_retryable_model_error(model, server, streaming, raw):
    server.push(Reply(raw=raw))
    with pytest.raises(ModelError) as caught:
        if streaming:
            await collect(model.stream([Message.user("hi")]))
        else:
            await model.generate([Message.user("hi")])
    assert caught.value.retryable is True and caught.value.model == "claude-test"
    assert f"model 'claude-test' at {server.host}" in str(caught.value) and "could not be read" in str(caught.value)
    assert_key_hidden(caught.value)


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
def test_lone_surrogates_from_the_model_are_stored_as_written_and_sent_back_as_u_fffd(server, streaming, tmp_path):
    """A model's text, tool name and arguments holding an unpaired surrogate: the run goes on (the next request
    is valid UTF-8) and the stored conversation keeps exactly what the model wrote."""
    from waypoint.stores import SQLiteStore

    @tool
    def execute(command: str) -> str:
        """Run."""
        return f"ran {command}"

    server.push(Reply("text \ud800 here", tool_calls=[("toolu_1", "execute", '{"command": "ls \\udfff"}'),
                                                       ("toolu_2", "exe\udc00", "{}")]), Reply("done"))
    model = AnthropicChatModel("claude-test", base_url=server.base_url, api_key=KEY)
    runner = Runner(ChatModelAgent(name="u", model=model, tools=[execute]), store=SQLiteStore(tmp_path / "s.db"),
                    streaming=streaming)
    events = runner.run_sync("go", checkpoint_id="u")
    assert events[-1].error is None and events[-2].output.message.content == "done"
    sent = server.bodies[1]["messages"][1]["content"]
    assert sent[0] == {"type": "text", "text": "text \ufffd here"}
    assert sent[1]["input"] == {"command": "ls \ufffd"} and sent[2]["name"] == "exe\ufffd"
    stored = asyncio.run(runner.app.get_run("u")).state.messages
    assert stored[1].content == "text \ud800 here" and stored[1].tool_calls[1].name == "exe\udc00"
    assert "ran ls \udfff" == stored[2].content


@pytest.mark.parametrize("levels", [100, 129, 300, 100_000])
async def test_deeply_nested_arguments_never_stop_the_conversation(model, server, levels):
    """Arguments too deep to send as a `tool_use` input (Python's parser gives up at ~1,000 levels) go as {}:
    the model was already told, by the call's result, that they were unusable."""
    arguments = '{"command": ' + "[" * levels + "]" * levels + "}"
    server.push("ok")
    history = [Message.user("go"), Message.assistant(tool_calls=[ToolCall(id="t1", name="lookup", arguments=arguments)]),
               Message.tool("[tool error] the arguments nest too deeply", tool_call_id="t1", name="lookup")]
    assert (await model.generate(history, tools=TOOLS)).content == "ok"
    sent = server.bodies[0]["messages"][1]["content"][0]["input"]
    assert sent == (json.loads(arguments) if levels <= 127 else {})


async def test_a_request_that_cannot_be_built_is_a_model_error_naming_the_model(server):
    model = AnthropicChatModel("claude-test", base_url=server.base_url, api_key=KEY, metadata={"tags": {"a", "b"}})
    with pytest.raises(ModelError, match=r"model 'claude-test' at 127\.0\.0\.1:\d+: the request could not be built: "
                                         r".*metadata\.tags is a set") as caught:
        await model.generate([Message.user("hi")])
    assert caught.value.retryable is False and server.requests == []


async def test_fields_the_sdk_does_not_take_go_in_the_body_as_they_are(server):
    """This SDK's messages.create takes no temperature=/top_p=: they go in the request body, not a TypeError."""
    model = AnthropicChatModel("claude-test", base_url=server.base_url, api_key=KEY, temperature=0.2, top_p=0.9,
                               extra_body={"top_k": 3})
    server.push("ok")
    await model.generate([Message.user("hi")])
    assert (server.bodies[0]["temperature"], server.bodies[0]["top_p"], server.bodies[0]["top_k"]) == (0.2, 0.9, 3)


async def test_tools_may_be_given_as_tool_objects(model, server):
    @tool
    def execute(command: str) -> str:
        """Run a shell command."""
        return command

    server.push("fine")
    await model.generate([Message.user("hi")], tools=[execute], tool_choice="execute")
    assert server.bodies[0]["tools"][0]["name"] == "execute" and server.bodies[0]["tools"][0]["input_schema"] == \
        execute.info.parameters


def test_repr_shows_the_server_never_the_credentials_of_a_proxy():
    model = AnthropicChatModel("claude-test", base_url="https://alice:PROXY-PASSWORD@proxy.example:8443/anthropic",
                               api_key=KEY)
    assert repr(model) == "AnthropicChatModel(model='claude-test', server='proxy.example:8443')"
    assert model.server == "proxy.example:8443"


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
def test_thinking_blocks_go_back_unchanged_with_the_tool_use_they_led_to(server, streaming, tmp_path):
    """With extended thinking and tool use, the API requires the turn's thinking blocks (with their signatures)
    back; they are kept on the stored message as `reasoning`, never in its content."""
    from waypoint.stores import SQLiteStore

    @tool
    def lookup(word: str) -> str:
        """Look a word up."""
        return "42"

    server.push(Reply(tool_calls=[("toolu_1", "lookup", '{"word": "x"}')], thinking=[("I should look it up.", "SIG1")],
                      redacted=["ENCRYPTED"]), Reply("It is 42."))
    model = AnthropicChatModel("claude-test", base_url=server.base_url, api_key=KEY, max_tokens=2048,
                               thinking={"type": "enabled", "budget_tokens": 1024})
    runner = Runner(ChatModelAgent(name="t", model=model, tools=[lookup]), store=SQLiteStore(tmp_path / "t.db"),
                    streaming=streaming)
    events = runner.run_sync("what is x?", checkpoint_id="t")
    assert events[-2].output.message.content == "It is 42."
    assert server.bodies[1]["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "I should look it up.", "signature": "SIG1"},
        {"type": "redacted_thinking", "data": "ENCRYPTED"},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"word": "x"}}]
    stored = asyncio.run(runner.app.get_run("t")).state.messages[1]
    assert stored.content == "" and [(r.provider, r.kind) for r in stored.reasoning] == [
        ("anthropic", "thinking"), ("anthropic", "redacted_thinking")]
