"""OTelTracing (extra `[otel]`) with the SDK's in-memory exporter: a span per run, node step, model call and
tool call, GenAI attributes, errors as span status, nothing secret unless asked, and a resumed run — in
another process — linked to the run that paused it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from otel_support import recording_provider, span_dicts

from waypoint.engine import END, START, ChatModelAgent, Graph, GraphInterrupted, Interrupt, Runner, tool
from waypoint.engine.models import Message, ScriptedChatModel, ToolCall, Usage
from waypoint.middleware import OTelTracing, SafeToolMiddleware
from waypoint.stores import MemoryStore

SCRIPT = Path(__file__).parent / "procs" / "otel_proc.py"
MCP_SERVER = Path(__file__).parent / "procs" / "mcp_server.py"
SECRET = "hunter2-SECRET"


@pytest.fixture
def traced():
    provider, exporter = recording_provider()
    return OTelTracing(tracer_provider=provider), exporter


def by_name(spans, name):
    found = [s for s in spans if s["name"] == name]
    assert found, (name, [s["name"] for s in spans])
    return found


def everything_recorded(spans) -> str:
    return json.dumps([[s["attributes"], s["description"], s["events"], s["name"]] for s in spans], ensure_ascii=False)


async def test_a_graph_run_is_a_span_with_a_child_per_node_step_and_errors_set_status(traced):
    tracing, exporter = traced

    def fail(x):
        raise ValueError(f"cannot use {SECRET}")

    g = Graph(name="pipeline")
    g.add_node("a", lambda x: x + 1)
    g.add_node("b", fail)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    with pytest.raises(Exception, match="cannot use"):
        await g.compile().ainvoke(1, callbacks=[tracing])
    spans = span_dicts(exporter)
    (run,) = by_name(spans, "waypoint.run pipeline")
    (a,) = by_name(spans, "waypoint.node a")
    (b,) = by_name(spans, "waypoint.node b")
    assert run["parent"] is None and a["parent"] == b["parent"] == run["span_id"]
    assert a["status"] == "UNSET" and (a["attributes"]["waypoint.step"], b["attributes"]["waypoint.step"]) == (0, 1)
    assert b["status"] == run["status"] == "ERROR" and b["attributes"]["error.type"] == "NodeError"
    assert run["attributes"]["waypoint.run.status"] == "failed"
    assert "gen_ai.operation.name" not in run["attributes"]  # a graph, not an agent: no invoke_agent span
    assert SECRET not in everything_recorded(spans)  # an error message may quote what it was given


def agent(model, tracing, *tools_, **kw):
    return ChatModelAgent(name="ops", model=model, tools=tools_ or [lookup], middlewares=[tracing, *kw.pop("mw", ())],
                          **kw)


@tool
def lookup(word: str) -> str:
    """Look a word up."""
    return f"{word} means something"


def scripted():
    usage = Usage(prompt_tokens=30, completion_tokens=4, total_tokens=34)
    call = ToolCall(id="call_1", name="lookup", arguments=json.dumps({"word": SECRET}))
    return ScriptedChatModel([Message(role="assistant", tool_calls=(call,), usage=usage, finish_reason="tool_calls"),
                              Message(role="assistant", content=f"It means {SECRET}.", usage=usage,
                                      finish_reason="stop")])


@pytest.mark.parametrize("streaming", [False, True], ids=["generate", "stream"])
async def test_model_and_tool_calls_follow_the_genai_conventions_and_keep_content_out(traced, streaming):
    tracing, exporter = traced
    runner = Runner(agent(scripted(), tracing), store=MemoryStore(), streaming=streaming, callbacks=[tracing])
    events = [e async for e in runner.run(f"define {SECRET}", checkpoint_id="s1")]
    assert events[-1].action.exit
    spans = span_dicts(exporter)
    (run,) = by_name(spans, "invoke_agent ops")
    nodes = {s["attributes"]["waypoint.node.path"]: s for s in spans if s["name"].startswith("waypoint.node")}
    chats = by_name(spans, "chat scripted")
    (call,) = by_name(spans, "execute_tool lookup")
    assert len(chats) == 2 and {c["parent"] for c in chats} <= {s["span_id"] for s in spans
                                                                if s["name"] == "waypoint.node model"}
    assert call["parent"] == nodes["tools"]["span_id"] and nodes["tools"]["parent"] == run["span_id"]
    assert {s["trace_id"] for s in spans} == {run["trace_id"]}
    first = chats[0]["attributes"]
    assert first["gen_ai.operation.name"] == "chat" and first["gen_ai.request.model"] == "scripted"
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (30, 4)
    assert first["gen_ai.response.finish_reasons"] == ["tool_calls"]
    tool_attrs = call["attributes"]
    assert tool_attrs["gen_ai.operation.name"] == "execute_tool" and tool_attrs["gen_ai.tool.name"] == "lookup"
    assert tool_attrs["gen_ai.tool.call.id"] == "call_1" and tool_attrs["waypoint.tool.rerun"] is False
    assert len(tool_attrs["waypoint.tool.idempotency_key"]) == 32 and tool_attrs["waypoint.checkpoint.id"] == "s1"
    assert run["attributes"]["waypoint.checkpoint.id"] == "s1" and run["attributes"]["waypoint.run.status"] == "completed"
    assert run["kind"] == "INTERNAL" and {c["kind"] for c in chats} == {"CLIENT"}
    assert (run["attributes"]["gen_ai.operation.name"], run["attributes"]["gen_ai.agent.name"]) == ("invoke_agent", "ops")
    assert SECRET not in everything_recorded(spans)  # prompts, answers, arguments, results: none of it


async def test_record_content_records_messages_in_the_genai_format_arguments_and_results(traced):
    """`gen_ai.input.messages` / `gen_ai.output.messages` as the conventions' JSON schemas have them: `role` and
    `parts`, tool calls with their arguments as objects, and a `finish_reason` on every output message."""
    provider, exporter = recording_provider()
    tracing = OTelTracing(tracer_provider=provider, record_content=True)
    runner = Runner(agent(scripted(), tracing), callbacks=[tracing])
    [e async for e in runner.run(f"define {SECRET}")]
    spans = span_dicts(exporter)
    (call,) = by_name(spans, "execute_tool lookup")
    assert json.loads(call["attributes"]["gen_ai.tool.call.arguments"]) == {"word": SECRET}
    assert call["attributes"]["gen_ai.tool.call.result"] == f"{SECRET} means something"
    asked, answered = (c["attributes"] for c in by_name(spans, "chat scripted"))
    request = {"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": {"word": SECRET}}
    assert json.loads(asked["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": f"define {SECRET}"}]}]
    assert json.loads(asked["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [request], "finish_reason": "tool_call"}]
    assert json.loads(answered["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": f"define {SECRET}"}]},
        {"role": "assistant", "parts": [request]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1",
                                    "response": f"{SECRET} means something"}]}]
    assert json.loads(answered["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": f"It means {SECRET}."}], "finish_reason": "stop"}]


class StartNames:
    """A sampler that samples everything and notes each span's name and attributes at its start."""

    def __init__(self):
        self.started = []

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        from opentelemetry.sdk.trace.sampling import Decision, SamplingResult

        self.started.append((name, dict(attributes or {})))
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self):
        return "StartNames"


async def test_an_agents_run_is_an_invoke_agent_span_named_so_at_its_start_once_the_tracer_knows_the_agent():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    sampler, exporter = StartNames(), InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = OTelTracing(tracer_provider=provider)
    for _ in range(2):
        [e async for e in Runner(agent(scripted(), tracing), callbacks=[tracing]).run("define otel")]
    runs = [(name, attributes) for name, attributes in sampler.started if name.endswith(" ops")]
    assert [name for name, _ in runs] == ["waypoint.run ops", "invoke_agent ops"]  # renamed once, then known
    assert runs[1][1]["gen_ai.agent.name"] == "ops" and runs[1][1]["gen_ai.operation.name"] == "invoke_agent"
    assert [s["name"] for s in span_dicts(exporter) if s["parent"] is None] == ["invoke_agent ops"] * 2


async def test_a_model_span_names_the_server_and_the_answer(chat_server):
    """`server.address` / `server.port` from the model's base URL; `gen_ai.response.id` / `.model` from the answer."""
    from chat_server import Reply

    from waypoint.engine.models import OpenAIChatModel

    provider, exporter = recording_provider()
    tracing = OTelTracing(tracer_provider=provider)
    model = OpenAIChatModel("test-model", base_url=chat_server.base_url, api_key="sk-test", timeout=5.0)
    for streaming in (False, True):
        chat_server.push(Reply("hello"))
        [e async for e in Runner(agent(model, tracing), streaming=streaming, callbacks=[tracing]).run("hi")]
    for chat in by_name(span_dicts(exporter), "chat test-model"):
        attributes = chat["attributes"]
        assert (attributes["server.address"], attributes["server.port"]) == ("127.0.0.1", chat_server.server_address[1])
        assert (attributes["gen_ai.response.id"], attributes["gen_ai.response.model"]) == ("chatcmpl-test", "test-model")
        assert attributes["gen_ai.provider.name"] == "openai"
    (run, _) = by_name(span_dicts(exporter), "invoke_agent ops")
    assert run["attributes"]["gen_ai.provider.name"] == "openai"


async def test_an_mcp_answer_marked_is_error_fails_the_call_for_the_trace_and_is_a_result_for_the_model(tmp_path):
    """A real MCP server (tests/procs/mcp_server.py): `fail` answers `isError`, `add` answers."""
    from waypoint.engine.tools import MCPServerStdio

    provider, exporter = recording_provider()
    tracing = OTelTracing(tracer_provider=provider)
    server = MCPServerStdio(sys.executable, [str(MCP_SERVER), str(tmp_path / "journal")], name="calc")
    calls = [ToolCall(id="c1", name="fail", arguments='{"reason": "not today"}'),
             ToolCall(id="c2", name="add", arguments='{"a": 1, "b": 2}')]
    try:
        tools = [t for t in await server.list_tools() if t.name in ("fail", "add")]
        model = ScriptedChatModel([Message.assistant(tool_calls=calls), "done"])
        runner = Runner(ChatModelAgent(name="calc", model=model, tools=tools, middlewares=[tracing]),
                        callbacks=[tracing])
        events = [e async for e in runner.run("go")]
    finally:
        await server.aclose()
    read = {e.output.message.tool_call_id: e.output.message.content for e in events if e.output and e.output.role == "tool"}
    assert read["c1"].startswith("[tool error] tool 'fail':") and "refused: not today" in read["c1"]
    assert read["c2"] == "3"
    spans = span_dicts(exporter)
    (failed,) = by_name(spans, "execute_tool fail")
    (added,) = by_name(spans, "execute_tool add")
    assert (failed["status"], failed["attributes"]["error.type"]) == ("ERROR", "tool_error")
    assert failed["attributes"]["waypoint.tool.outcome"] == "error"
    assert added["status"] == "UNSET" and "error.type" not in added["attributes"]
    assert added["attributes"]["waypoint.tool.outcome"] == "ok"
    for span in (failed, added):  # the MCP conventions' attributes, on the one span of the call
        assert span["attributes"]["mcp.method.name"] == "tools/call"
        assert span["attributes"]["network.transport"] == "pipe" and span["attributes"]["mcp.protocol.version"]
    (run,) = by_name(spans, "invoke_agent calc")
    assert run["status"] == "UNSET" and run["attributes"]["waypoint.run.status"] == "completed"


async def test_a_failing_tool_and_model_set_error_status_with_the_error_type(traced):
    tracing, exporter = traced

    @tool
    def broken(x: str) -> str:
        """Breaks."""
        raise RuntimeError(f"disk full near {SECRET}")

    from waypoint.engine import ModelError

    call = ToolCall(id="c1", name="broken", arguments='{"x": "1"}')
    model = ScriptedChatModel([Message.assistant(tool_calls=[call]),
                               ModelError("model 'm' failed: HTTP 503", status=503, retryable=True, model="m")])
    runner = Runner(agent(model, tracing, broken, mw=[SafeToolMiddleware()]), callbacks=[tracing])
    events = [e async for e in runner.run("go")]
    assert events[-1].error is not None
    spans = span_dicts(exporter)
    (tool_span,) = by_name(spans, "execute_tool broken")
    assert tool_span["status"] == "UNSET"  # SafeToolMiddleware (inside) made the error a result
    failed = by_name(spans, "chat scripted")[1]
    assert failed["status"] == "ERROR" and failed["attributes"]["error.type"] == "ModelError"
    assert failed["attributes"]["http.response.status_code"] == 503
    assert failed["attributes"]["waypoint.error.retryable"] is True
    assert by_name(spans, "invoke_agent ops")[0]["status"] == "ERROR"

    provider, exporter = recording_provider()
    tracing = OTelTracing(tracer_provider=provider)
    runner = Runner(agent(ScriptedChatModel([Message.assistant(tool_calls=[call])]), tracing, broken),
                    callbacks=[tracing])
    [e async for e in runner.run("go")]
    (tool_span,) = by_name(span_dicts(exporter), "execute_tool broken")
    assert tool_span["status"] == "ERROR" and tool_span["attributes"]["error.type"] == "RuntimeError"


async def test_concurrent_runs_on_one_tracer_keep_their_own_spans(traced):
    tracing, exporter = traced

    async def slow(x):
        await asyncio.sleep(0.01)
        return x

    g = Graph(name="pair")
    g.add_node("a", slow)
    g.add_node("b", slow)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    app = g.compile()
    await asyncio.gather(*(app.ainvoke(i, callbacks=[tracing]) for i in range(5)))
    spans = span_dicts(exporter)
    runs = {s["span_id"]: s for s in spans if s["name"] == "waypoint.run pair"}
    assert len(runs) == 5
    for node in (s for s in spans if s["name"].startswith("waypoint.node")):
        assert node["parent"] in runs and runs[node["parent"]]["trace_id"] == node["trace_id"]
    assert sorted(len([n for n in spans if n["parent"] == r]) for r in runs) == [2] * 5


async def test_a_call_rerun_after_its_run_stopped_midway_says_so(traced):
    tracing, exporter = traced
    started = asyncio.Event()

    @tool
    async def deploy(env: str) -> str:
        """Deploy."""
        if not started.is_set():
            started.set()
            await asyncio.sleep(30)  # the run is stopped here
        return f"deployed {env}"

    model = ScriptedChatModel([Message.assistant(tool_calls=[ToolCall(id="c1", name="deploy", arguments='{"env": "prod"}')]),
                               "done"])
    runner = Runner(agent(model, tracing, deploy), store=MemoryStore(), callbacks=[tracing])
    consumer = asyncio.ensure_future(_drain(runner.run("go", checkpoint_id="r")))
    await started.wait()
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    [e async for e in runner.resume("r")]
    calls = by_name(span_dicts(exporter), "execute_tool deploy")
    assert [c["attributes"]["waypoint.tool.rerun"] for c in calls] == [False, True]
    assert calls[0]["attributes"]["waypoint.tool.idempotency_key"] == calls[1]["attributes"]["waypoint.tool.idempotency_key"]


async def _drain(events):
    async for _ in events:
        pass


async def test_model_text_in_names_and_ids_is_made_valid_utf8_and_clipped(traced):
    tracing, exporter = traced
    hostile = "\ud800evil" + "x" * 100_000
    model = ScriptedChatModel([Message.assistant(tool_calls=[ToolCall(id=hostile, name="lookup",
                                                                       arguments='{"word": "w"}')]), "ok"])
    runner = Runner(agent(model, tracing), store=MemoryStore(), callbacks=[tracing])
    cid = "\u202eevil" + "x" * 500  # checkpoint IDs are text (an unpaired surrogate is refused at start)
    [e async for e in runner.run("go", checkpoint_id=cid)]
    spans = span_dicts(exporter)
    (call,) = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "execute_tool"]
    for value in (call["attributes"]["gen_ai.tool.call.id"], call["attributes"]["waypoint.checkpoint.id"]):
        value.encode("utf-8")  # an exporter would drop the whole batch on a lone surrogate
        assert len(value) <= 256
    assert call["attributes"]["waypoint.checkpoint.id"].startswith("\u202eevil")
    assert call["attributes"]["gen_ai.tool.call.id"] == "call_0_0"  # the agent replaced the model's odd ID
    json.dumps([s["attributes"] for s in spans], ensure_ascii=False).encode("utf-8")


def run_proc(*args):
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_resumed_run_in_another_process_links_to_the_run_that_paused_it(tmp_path):
    db = tmp_path / "runs.db"
    first = run_proc(db, "ticket-9")
    pending = first["interrupt"]
    (paused_run,) = by_name(first["spans"], "invoke_agent ops")
    assert paused_run["attributes"]["waypoint.run.status"] == "interrupted"
    assert paused_run["attributes"]["waypoint.interrupt.ids"] == [pending]
    (asked,) = by_name(first["spans"], "execute_tool execute")
    assert asked["attributes"]["waypoint.tool.outcome"] == "paused"

    second = run_proc(db, "ticket-9", "--approve", pending)  # a new process: nothing shared but the file
    (resumed_run,) = by_name(second["spans"], "invoke_agent ops")
    assert resumed_run["trace_id"] != paused_run["trace_id"]  # its own trace (its caller's) ...
    (link,) = resumed_run["links"]  # ... linked to the run that paused it
    assert (link["trace_id"], link["span_id"]) == (paused_run["trace_id"], paused_run["span_id"])
    assert link["attributes"] == {"waypoint.link.type": "resumed_from",
                                  "waypoint.checkpoint.version": paused_run["attributes"]["waypoint.checkpoint.version"]}
    attrs = resumed_run["attributes"]
    assert attrs["waypoint.run.resumed"] is True and attrs["waypoint.resume.ids"] == [pending]
    assert attrs["waypoint.run.resumed_from"] == paused_run["attributes"]["waypoint.checkpoint.version"]
    assert attrs["waypoint.run.status"] == "completed"
    assert attrs["waypoint.checkpoint.version"] > attrs["waypoint.run.resumed_from"]
    (ran,) = by_name(second["spans"], "execute_tool execute")
    assert ran["attributes"]["waypoint.tool.resumed"] is True and ran["attributes"]["waypoint.tool.outcome"] == "ok"
    assert ran["attributes"]["waypoint.tool.idempotency_key"] == asked["attributes"]["waypoint.tool.idempotency_key"]
    assert "secret-dir" not in everything_recorded(first["spans"] + second["spans"])


async def test_without_a_store_nothing_is_carried_and_pauses_still_end_every_span(traced):
    tracing, exporter = traced

    def ask(x):
        raise Interrupt("ok?")

    g = Graph(name="asks")
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    with pytest.raises(GraphInterrupted):
        await g.compile().ainvoke(1, callbacks=[tracing])
    spans = span_dicts(exporter)
    assert [s["name"] for s in spans] == ["waypoint.node ask", "waypoint.run asks"]
    assert spans[0]["attributes"]["waypoint.node.outcome"] == "paused"


async def test_a_streaming_tool_is_one_span_and_node_spans_can_be_left_out():
    provider, exporter = recording_provider()
    tracing = OTelTracing(tracer_provider=provider, record_content=True, node_spans=False)

    @tool
    async def tail(path: str):
        """Stream a file's end."""
        yield f"{path}: 1\n"
        yield f"{path}: 2\n"

    model = ScriptedChatModel([Message.assistant(tool_calls=[ToolCall(id="c1", name="tail",
                                                                       arguments='{"path": "app.log"}')]), "done"])
    runner = Runner(agent(model, tracing, tail), streaming=True, callbacks=[tracing])
    [e async for e in runner.run("go")]
    spans = span_dicts(exporter)
    assert not [s for s in spans if s["name"].startswith("waypoint.node")]
    (run,) = by_name(spans, "invoke_agent ops")
    (call,) = by_name(spans, "execute_tool tail")
    assert call["parent"] == run["span_id"] and call["attributes"]["waypoint.tool.outcome"] == "ok"
    assert call["attributes"]["gen_ai.tool.call.result"] == "app.log: 1\napp.log: 2\n"


async def test_recorded_content_is_the_attempt_a_retry_kept():
    """With `record_content=True` and a retry middleware inside the tracing one, the spans show what was stored:
    never the voided attempt's text, tool calls or chunks."""
    from waypoint.engine import ModelError, RetryPolicy
    from waypoint.middleware import ModelRetryMiddleware, ToolRetryMiddleware

    fast = RetryPolicy(max_attempts=3, initial_interval=0.001, jitter=False)
    tries = {"model": 0, "tool": 0}

    class Flaky:
        name = "flaky"

        async def stream(self, messages, **_):
            if messages[-1].role == "tool":
                yield Message.assistant("done")
                return
            tries["model"] += 1
            if tries["model"] == 1:
                yield Message.assistant("I will wipe it ")
                yield Message.assistant(tool_calls=[ToolCall(index=0, id="void1", name="tail", arguments='{"path": "/etc')])
                raise ModelError("dropped", retryable=True)
            yield Message.assistant("Reading the log ")
            yield Message.assistant(tool_calls=[ToolCall(index=0, id="good1", name="tail", arguments='{"path": "/x"}')])

    @tool
    async def tail(path: str):
        """Stream a file."""
        tries["tool"] += 1
        yield f"attempt{tries['tool']}\n"
        if tries["tool"] == 1:
            raise ConnectionError("dropped")
        yield "line2\n"

    provider, exporter = recording_provider()
    tracing = OTelTracing(tracer_provider=provider, record_content=True)
    runner = Runner(ChatModelAgent(name="o", model=Flaky(), tools=[tail],
                                   middlewares=[tracing, ModelRetryMiddleware(fast), ToolRetryMiddleware(fast)]),
                    store=MemoryStore(), streaming=True, callbacks=[tracing])
    async for event in runner.run("go", checkpoint_id="o"):
        if event.output is not None:
            await event.output.get_message()
    spans = span_dicts(exporter)
    recorded = everything_recorded(spans)
    assert "wipe" not in recorded and "void1" not in recorded and "attempt1" not in recorded
    (tool_span,) = by_name(spans, "execute_tool tail")
    assert tool_span["attributes"]["gen_ai.tool.call.result"] == "attempt2\nline2\n"
