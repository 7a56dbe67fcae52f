"""OpenAIChatModel against a real chat-completions server on 127.0.0.1 (tests/chat_server.py)."""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import warnings

import pytest
from chat_server import Reply

from waypoint.engine import ModelError
from waypoint.engine.models import Message, OpenAIChatModel, ToolCall, ToolInfo, Usage, concat_messages

KEY = "sk-test-WAYPOINT-0123456789-SECRET"
TOOLS = [
    ToolInfo(name="lookup", description="Look a word up.",
             parameters={"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}),
    ToolInfo(name="clock", description="The time."),
]
USAGE = Usage(prompt_tokens=11, completion_tokens=7, total_tokens=18)


@pytest.fixture
def model(chat_server):
    return OpenAIChatModel("test-model", base_url=chat_server.base_url, api_key=KEY, timeout=5.0)


async def collect(stream):
    return [chunk async for chunk in stream]


def assert_key_hidden(err: BaseException) -> None:
    seen = []
    while err is not None and err not in seen:
        seen.append(err)
        assert KEY not in str(err) and KEY not in repr(err), err
        err = err.__cause__ or err.__context__


async def test_generate_returns_the_assistant_message_with_usage(model, chat_server):
    chat_server.push(Reply("Hello, world."))
    answer = await model.generate([Message.user("hi")])
    assert answer == Message(role="assistant", content="Hello, world.", usage=USAGE, finish_reason="stop",
                             response_id="chatcmpl-test", response_model="test-model")  # the answer's own names
    assert model.name == "test-model"
    (sent,) = chat_server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body == {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}


async def test_stream_yields_chunks_as_they_arrive(model, chat_server):
    text = "The quick brown fox jumps over the lazy dog."
    chat_server.push(Reply(text, chunk_size=5, delay=0.04), Reply(text))
    started = time.perf_counter()
    first_at, chunks = None, []
    async for chunk in model.stream([Message.user("story")]):
        first_at = first_at or time.perf_counter() - started
        chunks.append(chunk)
    total = time.perf_counter() - started
    assert first_at < total - 0.25  # 9 content chunks, 40 ms apart: the first came long before the end
    assert [c.content for c in chunks[:9]] == ["The q", "uick ", "brown", " fox ", "jumps", " over", " the ",
                                               "lazy ", "dog."]
    assert chunks[-1] == Message(role="assistant", usage=USAGE)  # usage arrives last
    whole = concat_messages(chunks)
    assert whole == await model.generate([Message.user("story")])
    assert whole.content == text and whole.usage == USAGE and whole.finish_reason == "stop"
    assert chat_server.bodies[0]["stream"] is True
    assert chat_server.bodies[0]["stream_options"] == {"include_usage": True}


async def test_streamed_tool_call_fragments_join_into_whole_calls(model, chat_server):
    calls = [("call_a", "lookup", '{"word": "graph"}'), ("call_b", "clock", '{"zone": "UTC"}')]
    chat_server.push(Reply(tool_calls=calls, chunk_size=6, interleave=True), Reply(tool_calls=calls))
    chunks = await collect(model.stream([Message.user("two things")], tools=TOOLS))
    fragments = [c.tool_calls[0] for c in chunks if c.tool_calls]
    # Kept exactly as streamed: an opening fragment per call, then argument pieces, interleaved.
    assert fragments[:4] == [
        ToolCall(index=0, id="call_a", name="lookup", arguments=""),
        ToolCall(index=1, id="call_b", name="clock", arguments=""),
        ToolCall(index=0, arguments='{"word'),
        ToolCall(index=1, arguments='{"zone'),
    ]
    whole = concat_messages(chunks)
    assert whole.tool_calls == (
        ToolCall(index=0, id="call_a", name="lookup", arguments='{"word": "graph"}'),
        ToolCall(index=1, id="call_b", name="clock", arguments='{"zone": "UTC"}'),
    )
    assert whole.finish_reason == "tool_calls" and whole.content == ""
    assert whole == await model.generate([Message.user("two things")], tools=TOOLS)


async def test_request_carries_a_tool_round_trip(model, chat_server):
    chat_server.push(Reply("It means a network."))
    conversation = [
        Message.system("Be brief."),
        Message.user("What is a graph?"),
        Message.assistant(tool_calls=[ToolCall(id="call_1", name="lookup", arguments='{"word": "graph"}'),
                                      ToolCall(id="call_2", name="clock", arguments="")]),
        Message.tool("a network of nodes", tool_call_id="call_1", name="lookup"),
        Message.tool("12:00", tool_call_id="call_2", name="clock"),
    ]
    await model.generate(conversation, tools=TOOLS)
    body = chat_server.bodies[0]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a graph?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "graph"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "clock", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a network of nodes"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    ]
    assert body["tools"] == [
        {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                          "parameters": TOOLS[0].parameters}},
        {"type": "function", "function": {"name": "clock", "description": "The time.",
                                          "parameters": {"type": "object", "properties": {}}}},
    ]


@pytest.mark.parametrize("choice, wire", [
    ("auto", "auto"), ("required", "required"), ("none", "none"),
    ("clock", {"type": "function", "function": {"name": "clock"}}),
])
async def test_tool_choice_forms(model, chat_server, choice, wire):
    chat_server.push(Reply("ok"), Reply("ok"))
    await model.generate([Message.user("hi")], tools=TOOLS, tool_choice=choice)
    await collect(model.stream([Message.user("hi")], tools=TOOLS, tool_choice=choice))
    assert [b["tool_choice"] for b in chat_server.bodies] == [wire, wire]


async def test_no_tools_means_no_tools_and_no_tool_choice(model, chat_server):
    chat_server.push(Reply("ok"))
    await model.generate([Message.user("hi")], tools=[], tool_choice="required")
    assert "tools" not in chat_server.bodies[0] and "tool_choice" not in chat_server.bodies[0]


async def test_tool_choice_must_name_an_offered_tool(model, chat_server):
    with pytest.raises(ModelError, match="tool_choice names tool 'nope'") as caught:
        await model.generate([Message.user("hi")], tools=TOOLS, tool_choice="nope")
    assert caught.value.retryable is False and chat_server.requests == []


async def test_temperature_and_extra_arguments_are_sent(chat_server):
    model = OpenAIChatModel("m", base_url=chat_server.base_url, api_key=KEY, temperature=0.2, max_tokens=50,
                            extra_body={"top_k": 3})
    chat_server.push(Reply("ok"))
    await model.generate([Message.user("hi")])
    body = chat_server.bodies[0]
    assert (body["temperature"], body["max_tokens"], body["top_k"]) == (0.2, 50, 3)


@pytest.mark.parametrize("status, retryable, advice", [
    (429, True, "rate limited"),
    (500, True, "server error"),
    (503, True, "server error"),
    (400, False, "check the messages"),
    (401, False, "OPENAI_API_KEY"),
    (404, False, "check the model name and base_url"),
])
@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
async def test_http_errors_become_model_errors(model, chat_server, status, retryable, advice, streaming):
    # A careless server echoes the key back: the message must not repeat it.
    headers = {"Retry-After": "2"} if status == 429 else {}
    chat_server.push(Reply.failure(status, f"upstream said no (key {KEY})", headers=headers))
    with pytest.raises(ModelError) as caught:
        if streaming:
            await collect(model.stream([Message.user("hi")]))
        else:
            await model.generate([Message.user("hi")])
    err = caught.value
    assert (err.status, err.retryable, err.model) == (status, retryable, "test-model")
    text = str(err)
    assert "model 'test-model'" in text and chat_server.host in text and f"HTTP {status}" in text
    assert "upstream said no (key ***)" in text and advice in text
    if status == 429:
        assert "wait 2 s" in text
    assert_key_hidden(err)


async def test_a_long_error_body_is_cut_short_without_cutting_the_key_in_half(model, chat_server):
    chat_server.push(Reply.failure(502, "<html>" + "x" * 290 + KEY + "</html>"))
    with pytest.raises(ModelError) as caught:
        await model.generate([Message.user("hi")])
    text = str(caught.value)
    assert "x" * 290 + "***" in text and "</html>" not in text and KEY[:12] not in text


async def test_the_cause_is_chained_when_it_does_not_hold_the_key(model, chat_server):
    chat_server.push(Reply.failure(500, "boom"))
    with pytest.raises(ModelError) as caught:
        await model.generate([Message.user("hi")])
    assert "Error code: 500" in str(caught.value.__cause__)
    assert_key_hidden(caught.value)


async def test_a_timeout_is_retryable_without_status(chat_server):
    model = OpenAIChatModel("slow", base_url=chat_server.base_url, api_key=KEY, timeout=0.15)
    chat_server.push(Reply("late", wait=0.6))
    with pytest.raises(ModelError) as caught:
        await model.generate([Message.user("hi")])
    err = caught.value
    assert (err.status, err.retryable) == (None, True)
    assert "no answer within 0.15 s" in str(err) and "model 'slow'" in str(err) and chat_server.host in str(err)
    assert_key_hidden(err)


async def test_a_stream_that_stalls_times_out(chat_server):
    model = OpenAIChatModel("slow", base_url=chat_server.base_url, api_key=KEY, timeout=0.15)
    chat_server.push(Reply("one two three four", chunk_size=4, delay=0.6))
    got = []
    with pytest.raises(ModelError) as caught:
        async for chunk in model.stream([Message.user("hi")]):
            got.append(chunk)
    assert got == [Message(role="assistant", content="one ")]
    assert (caught.value.status, caught.value.retryable) == (None, True)
    assert "after 1 streamed chunks" in str(caught.value)


async def test_a_dropped_connection_mid_stream_is_retryable(model, chat_server):
    chat_server.push(Reply("abcdefghijklmnop", chunk_size=4, drop_after=3))
    got = []
    with pytest.raises(ModelError) as caught:
        async for chunk in model.stream([Message.user("hi")]):
            got.append(chunk.content)
    assert got == ["abcd", "efgh"]  # the opening role chunk carries nothing and is not yielded
    err = caught.value
    assert (err.status, err.retryable) == (None, True)
    assert "connection dropped" in str(err) and "after 2 streamed chunks" in str(err) and chat_server.host in str(err)
    assert_key_hidden(err)


async def test_a_consumer_may_stop_a_stream_early(model, chat_server):
    chat_server.push(Reply("many words to come", chunk_size=2, delay=0.02), Reply("next"))
    stream = model.stream([Message.user("hi")])
    assert (await stream.__anext__()).content == "ma"
    await stream.aclose()  # closes the response; the client stays usable
    assert (await model.generate([Message.user("again")])).content == "next"


async def test_a_stream_that_ends_without_finishing_is_an_error(model, chat_server):
    chat_server.push(Reply("abcdefgh", chunk_size=4, end_after=2))
    with pytest.raises(ModelError, match="without a finish_reason") as caught:
        await collect(model.stream([Message.user("hi")]))
    assert (caught.value.status, caught.value.retryable) == (None, True)


async def test_an_unreachable_server_is_retryable():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAIChatModel("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, timeout=2)
    with pytest.raises(ModelError) as caught:
        await model.generate([Message.user("hi")])
    err = caught.value
    assert (err.status, err.retryable) == (None, True)
    assert f"127.0.0.1:{port}" in str(err) and "check base_url" in str(err)
    assert_key_hidden(err)


def test_one_model_serves_several_event_loops_and_closes_their_clients(chat_server):
    model = OpenAIChatModel("m", base_url=chat_server.base_url, api_key=KEY)
    chat_server.push(Reply("first"), Reply("second"), Reply("third"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert asyncio.run(model.generate([Message.user("1")])).content == "first"
        assert asyncio.run(model.generate([Message.user("2")])).content == "second"
        assert asyncio.run(collect(model.stream([Message.user("3")])))[0].content == "thir"
        del model
        gc.collect()
    leaks = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == [], [str(w.message) for w in leaks]


def test_repr_shows_the_server_never_a_key_or_the_credentials_of_a_proxy(chat_server):
    model = OpenAIChatModel("m", base_url=chat_server.base_url, api_key=KEY)
    assert KEY not in repr(model) and chat_server.host in repr(model)
    proxied = OpenAIChatModel("m", base_url="https://alice:PROXY-PASSWORD@proxy.example:8443/v1", api_key=KEY)
    assert repr(proxied) == "OpenAIChatModel(model='m', server='proxy.example:8443')" == f"OpenAIChatModel(model='m', " \
        f"server={proxied.server!r})"


def test_no_key_for_api_openai_com_is_refused_at_once(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelError, match="set OPENAI_API_KEY") as caught:
        OpenAIChatModel("gpt-4o-mini")
    assert "api.openai.com" in str(caught.value)


async def test_a_local_server_needs_no_key(chat_server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = OpenAIChatModel("llama3", base_url=chat_server.base_url)
    chat_server.push(Reply("hi"))
    assert (await model.generate([Message.user("hi")])).content == "hi"
    assert chat_server.requests[0].headers["authorization"] == "Bearer not-needed"


def _completion(**over):
    base = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
    return {**base, **over}


def _chunk(delta, finish=None):
    return {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


HOSTILE_ANSWERS = {  # a 200 answer the model class cannot read: a proxy's glitch, or a hostile server
    "no choices": _completion(choices=[]),
    "a tool call id is a number": _completion(choices=[{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "tool_calls": [{"id": 5, "type": "function", "function": {"name": "x", "arguments": "{}"}}]}}]),
    "the body is a JSON list": [1, 2],
    "the body is not JSON": b"<html>oops</html>",
}
HOSTILE_STREAMS = {
    "a chunk is not JSON": [_chunk({"content": "a"}), "{not json"],
    "content is a list": [_chunk({"content": ["a"]})],
    "a finish_reason is a number": [_chunk({"content": "a"}, finish=7)],
}


@pytest.mark.parametrize("streaming,raw", [(False, a) for a in HOSTILE_ANSWERS.values()]
                         + [(True, s) for s in HOSTILE_STREAMS.values()],
                         ids=[*HOSTILE_ANSWERS, *HOSTILE_STREAMS])
async def test_an_answer_the_model_cannot_read_is_a_retryable_model_error(model, chat_server, streaming, raw):
    chat_server.push(Reply(raw=raw))
    with pytest.raises(ModelError) as caught:
        if streaming:
            await collect(model.stream([Message.user("hi")]))
        else:
            await model.generate([Message.user("hi")])
    assert caught.value.retryable is True and caught.value.model == "test-model"
    assert f"model 'test-model' at {chat_server.host}" in str(caught.value)
    assert "could not be read" in str(caught.value)
    assert_key_hidden(caught.value)


async def test_lone_surrogates_go_out_as_u_fffd_and_the_messages_keep_them(model, chat_server):
    history = [Message.user("go"),
               Message.assistant("text \ud800 here", tool_calls=[ToolCall(id="c\udc00", name="exe\udfff",
                                                                           arguments='{"command": "ls \ud800"}')]),
               Message.tool("ran \ud800", tool_call_id="c\udc00", name="exe\udfff")]
    kept = [m.model_copy(deep=True) for m in history]
    chat_server.push("done")
    assert (await model.generate(history)).content == "done"
    sent = chat_server.bodies[0]["messages"]
    assert sent[1]["content"] == "text \ufffd here" and sent[2]["content"] == "ran \ufffd"
    assert sent[1]["tool_calls"][0] == {"id": "c\ufffd", "type": "function",
                                        "function": {"name": "exe\ufffd", "arguments": '{"command": "ls \ufffd"}'}}
    assert history == kept  # what is stored is never touched


async def test_a_request_that_cannot_be_built_is_a_model_error_naming_the_model(chat_server):
    model = OpenAIChatModel("test-model", base_url=chat_server.base_url, api_key=KEY, metadata={"n": float("nan")})
    with pytest.raises(ModelError, match=r"model 'test-model' at 127\.0\.0\.1:\d+: the request could not be "
                                         r"built: .*metadata\.n is nan") as caught:
        await model.generate([Message.user("hi")])
    assert caught.value.retryable is False and chat_server.requests == []
