"""ScriptedChatModel, OfflineModel, model_from_env, and what importing the models package loads."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import waypoint.engine.models as models
from waypoint.engine import ModelError
from waypoint.engine.models import (
    ChatModel,
    Message,
    OfflineModel,
    OpenAIChatModel,
    ScriptedChatModel,
    ToolCall,
    ToolInfo,
    Usage,
    concat_messages,
    model_from_env,
)

AGENT_TOOLS = [ToolInfo(name=n) for n in ("execute", "read_file", "ls", "answer_from_document")]


async def collect(stream):
    return [chunk async for chunk in stream]


def test_models_all_is_curated():
    assert set(models.__all__) >= {"ChatModel", "Message", "ToolCall", "ToolInfo", "Usage", "OpenAIChatModel",
                                   "ScriptedChatModel", "OfflineModel", "model_from_env", "concat_messages"}
    for name in models.__all__:
        assert getattr(models, name) is not None, name


def test_importing_the_models_does_not_import_openai():
    code = (
        "import sys, waypoint.engine, waypoint.engine.models as m\n"
        "from waypoint.engine.models import OpenAIChatModel, ScriptedChatModel, OfflineModel, model_from_env\n"
        "before = 'openai' in sys.modules\n"
        "m.model_from_env()  # no key: the offline model\n"
        "offline = 'openai' in sys.modules\n"
        "OpenAIChatModel('x', base_url='http://127.0.0.1:9/v1')\n"
        "print(before, offline, 'openai' in sys.modules)\n"
    )
    env = {"PATH": "/usr/bin:/bin"}  # no OPENAI_API_KEY
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "True"]


def test_every_model_is_a_chat_model(monkeypatch):
    for model in (ScriptedChatModel([]), OfflineModel(),
                  OpenAIChatModel("m", base_url="http://127.0.0.1:9/v1", api_key="k")):
        assert isinstance(model, ChatModel)


# --- ScriptedChatModel ---


async def test_scripted_replies_of_each_kind_in_order():
    call = Message.assistant(tool_calls=[ToolCall(id="c1", name="ls", arguments='{"path": "."}')])

    async def async_reply(messages, tools):
        return f"async saw {len(messages)} messages"

    model = ScriptedChatModel([
        "plain text",
        call,
        lambda messages, tools: f"sync saw {[t.name for t in tools]}",
        async_reply,
        ValueError("scripted failure"),
    ])
    hi = [Message.user("hi")]
    assert await model.generate(hi) == Message.assistant("plain text")
    assert await model.generate(hi, tools=AGENT_TOOLS[:1], tool_choice="required") == Message.assistant(
        tool_calls=[ToolCall(id="c1", name="ls", arguments='{"path": "."}', index=0)])
    assert (await model.generate(hi, tools=AGENT_TOOLS[:2])).content == "sync saw ['execute', 'read_file']"
    assert (await model.generate([*hi, Message.assistant("x")])).content == "async saw 2 messages"
    with pytest.raises(ValueError, match="scripted failure"):
        await model.generate(hi)
    assert [c.tool_choice for c in model.calls] == ["auto", "required", "auto", "auto", "auto"]
    assert model.calls[1].tools == tuple(AGENT_TOOLS[:1]) and model.calls[0].tools == ()
    assert model.calls[3].messages == (Message.user("hi"), Message.assistant("x"))


async def test_scripted_stream_in_words_and_in_characters():
    text = "Graphs run in steps."
    words = await collect(ScriptedChatModel([text]).stream([]))
    assert [c.content for c in words] == ["Graphs ", "run ", "in ", "steps."]
    chars = await collect(ScriptedChatModel([text], chunk_size=6).stream([]))
    assert [c.content for c in chars] == ["Graphs", " run i", "n step", "s."]
    assert concat_messages(words) == concat_messages(chars) == Message.assistant(text)


async def test_scripted_stream_sends_tool_calls_as_fragments_by_index():
    reply = Message(role="assistant", content="Let me look.", finish_reason="tool_calls",
                    usage=Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7),
                    tool_calls=(ToolCall(id="a", name="read_file", arguments='{"path": "README.md"}'),
                                ToolCall(id="b", name="ls", arguments='{"path": "docs"}')))
    model = ScriptedChatModel([reply, reply], chunk_size=5)
    chunks = await collect(model.stream([Message.user("go")]))
    fragments = [c.tool_calls[0] for c in chunks if c.tool_calls]
    assert fragments[0] == ToolCall(index=0, id="a", name="read_file", arguments='{"pat')
    assert fragments[1] == ToolCall(index=0, arguments='h": "')
    assert {f.index for f in fragments} == {0, 1} and len(fragments) > 4
    assert chunks[-1].usage == reply.usage and chunks[-1].finish_reason == "tool_calls"
    assert all(c.usage is None for c in chunks[:-1])
    assert concat_messages(chunks) == await model.generate([Message.user("go")])


async def test_scripted_stream_waits_between_chunks():
    model = ScriptedChatModel(["a b c d e"], delay=0.03)
    started, stamps = time.perf_counter(), []
    async for _ in model.stream([]):
        stamps.append(time.perf_counter() - started)
    assert stamps[0] < 0.02 and stamps[-1] >= 0.12


async def test_scripted_model_running_out_says_how_many_were_scripted():
    model = ScriptedChatModel(["only one"], name="planner")
    await model.generate([])
    with pytest.raises(ModelError) as caught:
        await collect(model.stream([]))
    err = caught.value
    assert "'planner'" in str(err) and "call 2" in str(err) and "1 replies were scripted" in str(err)
    assert err.model == "planner" and err.retryable is False and len(model.calls) == 2


async def test_a_scripted_model_error_reaches_the_caller_as_is():
    boom = ModelError("rate limited", status=429, retryable=True, model="scripted")
    model = ScriptedChatModel([boom])
    with pytest.raises(ModelError) as caught:
        await collect(model.stream([]))
    assert caught.value is boom


# --- OfflineModel ---


@pytest.mark.parametrize("request_, tool, arguments", [
    ("execute ls -la", "execute", {"command": "ls -la"}),
    ("Please run the command `echo hi`", "execute", {"command": "echo hi"}),
    ("RUN pytest -q.", "execute", {"command": "pytest -q"}),
    ("can you please execute make test", "execute", {"command": "make test"}),
    ("read README.md", "read_file", {"path": "README.md"}),
    ("Please read the file 'docs/agents.md'", "read_file", {"path": "docs/agents.md"}),
    ("list src", "ls", {"path": "src"}),
    ("List the files in /tmp", "ls", {"path": "/tmp"}),
    ("ask handbook.pdf about the refund policy?", "answer_from_document",
     {"document": "handbook.pdf", "question": "the refund policy?"}),
])
async def test_offline_phrasings_call_their_tool(request_, tool, arguments):
    answer = await OfflineModel().generate([Message.user(request_)], tools=AGENT_TOOLS)
    (call,) = answer.tool_calls
    assert (call.name, json.loads(call.arguments), call.id) == (tool, arguments, "call_1")
    assert answer.finish_reason == "tool_calls"


@pytest.mark.parametrize("tools, tool_choice", [
    ([ToolInfo(name="read_file")], "auto"),  # execute is not offered
    (None, "auto"),
    (AGENT_TOOLS, "none"),
    (AGENT_TOOLS, "read_file"),  # a different tool is forced
])
async def test_offline_without_the_tool_answers_in_plain_words(tools, tool_choice):
    answer = await OfflineModel().generate([Message.user("run ls")], tools=tools, tool_choice=tool_choice)
    assert answer.tool_calls == ()
    assert "'execute' tool" in answer.content and "run ls" in answer.content


async def test_offline_summarises_tool_results():
    conversation = [
        Message.user("read a.txt"),
        Message.assistant(tool_calls=[ToolCall(id="call_1", name="read_file", arguments='{"path": "a.txt"}')]),
        Message.tool("hello from a.txt", tool_call_id="call_1", name="read_file"),
        Message.tool("x" * 500, tool_call_id="call_2", name="ls"),
    ]
    answer = await OfflineModel().generate(conversation, tools=AGENT_TOOLS)
    lines = answer.content.splitlines()
    assert answer.tool_calls == () and lines[0] == "Here is what the 2 tools returned:"
    assert lines[1] == "- read_file returned: hello from a.txt"
    assert lines[2].startswith("- ls returned: xxx") and lines[2].endswith("…") and len(lines[2]) < 230


async def test_offline_plain_reply_echoes_the_request():
    answer = await OfflineModel().generate([Message.user("What a lovely day")], tools=AGENT_TOOLS)
    assert answer.tool_calls == () and '"What a lovely day"' in answer.content
    assert "run <command>" in answer.content


async def test_offline_ids_are_deterministic_and_unique_in_a_conversation():
    model = OfflineModel()
    conversation = [Message.user("read a.txt")]
    first = await model.generate(conversation, tools=AGENT_TOOLS)
    assert first == await OfflineModel().generate(conversation, tools=AGENT_TOOLS)
    conversation += [first, Message.tool("A", tool_call_id=first.tool_calls[0].id, name="read_file")]
    conversation += [await model.generate(conversation, tools=AGENT_TOOLS), Message.user("read b.txt")]
    second = await model.generate(conversation, tools=AGENT_TOOLS)
    assert [first.tool_calls[0].id, second.tool_calls[0].id] == ["call_1", "call_3"]


async def test_offline_streams_words_that_join_into_the_answer():
    model = OfflineModel()
    for request in ("hello there", "read notes.md"):
        chunks = await collect(model.stream([Message.user(request)], tools=AGENT_TOOLS))
        assert concat_messages(chunks) == await model.generate([Message.user(request)], tools=AGENT_TOOLS)
    words = await collect(model.stream([Message.user("hello there")]))
    assert len(words) > 5 and words[0].content == "You "


def test_offline_model_says_what_it_is():
    assert "offline" in OfflineModel.banner and "OPENAI_API_KEY" in OfflineModel().banner
    assert OfflineModel().name == "offline"


# --- model_from_env ---


def test_model_from_env_without_a_key_is_offline(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("WAYPOINT_MODEL_PROVIDER", raising=False)
    assert isinstance(model_from_env(), OfflineModel)
    monkeypatch.setenv("OPENAI_API_KEY", "")
    assert isinstance(model_from_env(), OfflineModel)


def test_model_from_env_with_a_key_is_openai(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-key")
    monkeypatch.delenv("WAYPOINT_MODEL_PROVIDER", raising=False)
    monkeypatch.delenv("OPENAI_MODEL", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    model = model_from_env()
    assert isinstance(model, OpenAIChatModel)
    assert (model.name, model.base_url) == ("gpt-4o-mini", "https://api.openai.com/v1")
    monkeypatch.setenv("OPENAI_MODEL", "llama3.1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:11434/v1")
    model = model_from_env()
    assert (model.name, model.base_url, model.server) == ("llama3.1", "http://localhost:11434/v1", "localhost:11434")


async def test_the_offline_model_streams_word_by_word_at_the_pace_asked(monkeypatch):
    import time

    from waypoint.engine import Message
    from waypoint.engine.models import OfflineModel, model_from_env

    monkeypatch.setenv("WAYPOINT_OFFLINE_PACE", "0.05")
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "WAYPOINT_MODEL_PROVIDER"):
        monkeypatch.delenv(name, raising=False)
    model = model_from_env()
    assert isinstance(model, OfflineModel) and model.word_delay == 0.05
    times, words = [], []
    async for chunk in model.stream([Message.user("hello there, how are you today")]):
        times.append(time.monotonic())
        words.append(chunk.content)
    assert len(words) > 3 and "".join(words) == (await model.generate([Message.user("hello there, how are you today")])).content
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= 0.04  # readable: one word at a time, not all at once
    monkeypatch.setenv("WAYPOINT_OFFLINE_PACE", "fast")
    with pytest.raises(Exception, match="WAYPOINT_OFFLINE_PACE"):
        model_from_env()


def test_reasoning_blocks_join_across_chunks_and_a_message_stored_before_them_still_reads():
    from pydantic import BaseModel, ConfigDict

    from waypoint.engine.models import Reasoning
    from waypoint.engine.codec.serde import Serializer, TypeRegistry

    thought = Reasoning(provider="anthropic", kind="thinking", text="hmm", signature="S")
    hidden = Reasoning(provider="anthropic", kind="redacted_thinking", data="D")
    joined = concat_messages([Message(role="assistant", reasoning=(thought,)), Message(role="assistant", content="a"),
                              Message(role="assistant", reasoning=(hidden,))])
    assert joined.reasoning == (thought, hidden) and joined.content == "a"
    assert Serializer().decode_value(Serializer().encode_value(joined)) == joined  # registered, no pickle

    old = TypeRegistry()  # Message as it was stored before `reasoning` existed

    @old.register(name="waypoint.Message")
    class OldMessage(BaseModel):
        model_config = ConfigDict(frozen=True)
        role: str
        content: str = ""
        tool_calls: tuple = ()
        tool_call_id: str | None = None
        name: str | None = None
        usage: None = None
        finish_reason: str | None = None

    stored = Serializer(registry=old).encode_value([OldMessage(role="assistant", content="hello", finish_reason="stop")])
    assert Serializer().decode_value(stored) == [Message(role="assistant", content="hello", finish_reason="stop")]
