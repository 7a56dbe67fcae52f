"""Tool calls under retries, streams and failures: what ran is what was stored is what the consumer saw.

A retried model stream voids its attempt (tool calls included), a retried streaming tool voids its chunks,
RetryAgentRun / StopAgentRun after chunks leave the consumer with what was stored, sequential tools stop at
the first pause or failure, the cheaper durability modes are refused for agents, unknown tools go through
the middlewares, an abandoned turn leaves a valid conversation, the retry limit is exact, and a consumer
that stops reading holds the run instead of growing a queue.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from chat_server import Reply

from waypoint.engine import (
    END,
    START,
    ChatModelAgent,
    Graph,
    GraphBuildError,
    Message,
    ModelError,
    NodeError,
    RetryAgentRun,
    RetryPolicy,
    Runner,
    StopAgentRun,
    ToolCall,
    tool,
)
from waypoint.engine.compose import compiled as compiled_module
from waypoint.engine.models import OpenAIChatModel, ScriptedChatModel
from waypoint.middleware import ApprovalMiddleware, ApprovalResult, ModelRetryMiddleware, ToolRetryMiddleware
from waypoint.stores import MemoryStore

FAST = RetryPolicy(max_attempts=3, initial_interval=0.001, jitter=False)
ran: Counter = Counter()


@pytest.fixture(autouse=True)
def fresh():
    ran.clear()


def calls(*pairs: tuple[str, dict], ids=None) -> Message:
    return Message.assistant(tool_calls=[ToolCall(id=(ids or [f"call_{i}" for i in range(len(pairs))])[i], name=n,
                                                  arguments=json.dumps(a)) for i, (n, a) in enumerate(pairs)])


@tool
def execute(command: str) -> str:
    """Run a shell command."""
    ran[command] += 1
    return f"ran {command}"


async def consume(events) -> list[tuple]:
    """Every event as a consumer sees it: each output read to its end (streams included)."""
    seen = []
    async for event in events:
        if event.output is not None:
            seen.append(("output", event.output.role, (await event.output.get_message()).content))
        elif event.action is not None and event.action.retry is not None:
            seen.append(("retry", event.action.retry.what, event.action.retry.attempt))
        elif event.action is not None and event.action.interrupted is not None:
            seen.append(("paused", tuple(c.id for c in event.action.interrupted.contexts)))
        elif event.error is not None:
            seen.append(("error", event.error))
    return seen


# --- 1. a retried model stream voids its attempt --------------------------------------------------------

@pytest.mark.parametrize("first", [
    Reply(tool_calls=[("call_rm", "execute", json.dumps({"command": "rm -rf /srv/data"}))], chunk_size=3,
          drop_after=3),
    Reply("The answer is 42.", chunk_size=4, drop_after=4),
])
async def test_a_retried_model_stream_voids_what_the_failed_attempt_streamed(chat_server, first):
    chat_server.push(first)
    chat_server.push(Reply("The answer is 42."))
    model = OpenAIChatModel("m", base_url=chat_server.base_url, api_key="k", timeout=5.0)
    agent = ChatModelAgent(name="r", model=model, tools=[execute], middlewares=[ModelRetryMiddleware(FAST)])
    runner = Runner(agent, store=MemoryStore(), streaming=True)
    seen = await consume(runner.run("what is it?", checkpoint_id="r"))
    assert not ran  # the voided attempt's tool call never ran
    assert ("retry", "model", 1) in seen and not [s for s in seen if s[0] == "error"]
    answers = [s[2] for s in seen if s[:2] == ("output", "assistant")]
    assert answers[-1] == "The answer is 42."  # the consumer ends with what was stored
    stored = (await runner.app.get_run("r")).state.messages
    assert [m.content for m in stored if m.role == "assistant"] == ["The answer is 42."]
    assert not any(m.tool_calls for m in stored)


# --- 2. streaming tools under retries and the agent-run signals -----------------------------------------------

async def test_a_retried_streaming_tool_stores_and_shows_only_the_last_attempt():
    @tool
    async def tail(path: str):
        """Stream a file."""
        ran["tail"] += 1
        yield "line 1\n"
        if ran["tail"] < 3:
            raise ConnectionError("dropped")
        yield "line 2\n"

    model = ScriptedChatModel([calls(("tail", {"path": "x"})), lambda msgs, _: "ok"])
    runner = Runner(ChatModelAgent(name="t", model=model, tools=[tail], middlewares=[ToolRetryMiddleware(FAST)]),
                    store=MemoryStore(), streaming=True)
    seen = await consume(runner.run("go", checkpoint_id="t"))
    assert ran["tail"] == 3 and [s for s in seen if s[0] == "retry"] == [("retry", "tool", 1), ("retry", "tool", 2)]
    tools = [s[2] for s in seen if s[:2] == ("output", "tool")]
    assert tools[-1] == "line 1\nline 2\n"  # the last stream the consumer got is the stored result
    stored = [m.content for m in (await runner.app.get_run("t")).state.messages if m.role == "tool"]
    assert stored == ["line 1\nline 2\n"]


@pytest.mark.parametrize("signal", [RetryAgentRun, StopAgentRun])
async def test_an_agent_run_signal_after_chunks_leaves_the_consumer_with_what_was_stored(signal):
    @tool
    async def report(topic: str):
        """Stream a report."""
        yield "partial "
        yield "words"
        raise signal(f"{signal.__name__}: start over")

    model = ScriptedChatModel([calls(("report", {"topic": "x"})), lambda msgs, _: "ok"])
    runner = Runner(ChatModelAgent(name="s", model=model, tools=[report]), store=MemoryStore(), streaming=True)
    seen = await consume(runner.run("go", checkpoint_id="s"))
    tools = [s[2] for s in seen if s[:2] == ("output", "tool")]
    stored = [m.content for m in (await runner.app.get_run("s")).state.messages if m.role == "tool"]
    assert stored == [f"{signal.__name__}: start over"] and tools[-1] == stored[0]


# --- the retry limit is exact ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["invokable", "streamable"])
async def test_a_tool_is_tried_exactly_max_attempts_times(kind):
    if kind == "invokable":
        @tool
        def flaky(n: int) -> str:
            """Always drops."""
            ran["flaky"] += 1
            raise ConnectionError("dropped")
    else:
        @tool
        async def flaky(n: int):
            """Always drops, after a chunk."""
            ran["flaky"] += 1
            yield "x"
            raise ConnectionError("dropped")

    model = ScriptedChatModel([calls(("flaky", {"n": 1}))])
    runner = Runner(ChatModelAgent(name="f", model=model, tools=[flaky], middlewares=[ToolRetryMiddleware(FAST)]),
                    streaming=kind == "streamable")
    seen = await consume(runner.run("go"))
    assert ran["flaky"] == 3 and len([s for s in seen if s[0] == "retry"]) == 2
    assert isinstance(seen[-1][1], NodeError)


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_model_is_tried_exactly_max_attempts_times(streaming):
    class Down:
        name = "down"

        async def generate(self, messages, **_):
            ran["model"] += 1
            raise ModelError("model 'down' at test: HTTP 503", status=503, retryable=True)

        async def stream(self, messages, **_):
            ran["model"] += 1
            yield Message.assistant("partial")
            raise ModelError("model 'down' at test: dropped", retryable=True)

    runner = Runner(ChatModelAgent(name="d", model=Down(), middlewares=[ModelRetryMiddleware(FAST)]),
                    streaming=streaming)
    seen = await consume(runner.run("go"))
    assert ran["model"] == 3 and len([s for s in seen if s[0] == "retry"]) == 2
    assert isinstance(seen[-1][1], NodeError)


# --- 3. sequential tools stop at the first pause or failure -----------------------------------------------------

async def test_sequential_tools_wait_behind_a_paused_call():
    model = ScriptedChatModel([calls(("execute", {"command": "backup /data"}), ("execute", {"command": "delete /data"})),
                               lambda msgs, _: "done"])
    guard = ApprovalMiddleware(tools={"execute"}, when=lambda name, args: "backup" in args)
    runner = Runner(ChatModelAgent(name="q", model=model, tools=[execute], middlewares=[guard],
                                   sequential_tools=True), store=MemoryStore())
    seen = await consume(runner.run("go", checkpoint_id="q"))
    (paused,) = [s for s in seen if s[0] == "paused"]
    assert not ran  # delete did not start while backup waited for its approval
    await consume(runner.resume_with_params("q", {paused[1][0]: ApprovalResult(approved=True)}))
    assert list(ran) == ["backup /data", "delete /data"]


async def test_sequential_tools_stop_at_a_failed_call():
    @tool
    def backup(path: str) -> str:
        """Back up."""
        raise OSError("disk full")

    model = ScriptedChatModel([calls(("backup", {"path": "/data"}), ("execute", {"command": "delete /data"}))])
    runner = Runner(ChatModelAgent(name="f", model=model, tools=[backup, execute], sequential_tools=True),
                    store=MemoryStore())
    seen = await consume(runner.run("go", checkpoint_id="f"))
    assert isinstance(seen[-1][1], NodeError) and "disk full" in str(seen[-1][1]) and not ran


# --- 4. durability modes without a ledger are refused for agents ------------------------------------------------

@pytest.mark.parametrize("durability", ["exit", "interrupt"])
def test_an_agent_with_tools_refuses_durability_without_a_ledger(durability):
    agent = ChatModelAgent(name="pay", model=ScriptedChatModel([]), tools=[execute])
    with pytest.raises(GraphBuildError, match="durability='step'"):
        Runner(agent, store=MemoryStore(), durability=durability)
    Runner(agent, durability=durability)  # nothing stored: nothing to resume, nothing refused


# --- 5. the unknown-tool handler runs through the middlewares ---------------------------------------------------

async def test_the_unknown_tool_handler_is_guarded_like_a_tool():
    def shell(name: str, arguments: str) -> str:
        ran[arguments] += 1
        return f"{name} ran"

    model = ScriptedChatModel([calls(("shell", {"cmd": "rm -rf /"})), lambda msgs, _: msgs[-1].content])
    agent = ChatModelAgent(name="u", model=model, tools=[execute], unknown_tool_handler=shell,
                           middlewares=[ApprovalMiddleware(tools=lambda name: True)])
    runner = Runner(agent, store=MemoryStore())
    seen = await consume(runner.run("go", checkpoint_id="u"))
    (paused,) = [s for s in seen if s[0] == "paused"]
    assert not ran  # it waits for a person like any call
    seen = await consume(runner.resume_with_params("u", {paused[1][0]: ApprovalResult(approved=False)}))
    assert not ran and seen[-1][2] == "tool 'shell' disapproved"


# --- 6. an abandoned turn leaves a conversation a server accepts -------------------------------------------------

async def test_force_new_run_closes_the_abandoned_calls(chat_server):
    chat_server.push(Reply(tool_calls=[("c1", "execute", '{"command": "ls"}'), ("c2", "execute", '{"command": "pwd"}')]))
    chat_server.push(Reply("fresh start"))
    model = OpenAIChatModel("m", base_url=chat_server.base_url, api_key="k", timeout=5.0)
    runner = Runner(ChatModelAgent(name="a", model=model, tools=[execute],
                                   middlewares=[ApprovalMiddleware({"execute"})]), store=MemoryStore())
    await consume(runner.run("list", checkpoint_id="a"))
    seen = await consume(runner.run("never mind", checkpoint_id="a", force_new_run=True))
    assert seen[-1][2] == "fresh start" and not ran
    sent = chat_server.bodies[1]["messages"]
    asked = [c["id"] for m in sent if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    answered = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert asked == answered == ["c1", "c2"]  # every call has its tool message, before the next user turn
    assert [m["role"] for m in sent][-4:] == ["assistant", "tool", "tool", "user"]
    assert "abandoned" in sent[-2]["content"]


# --- 7. a model takes the tools @tool made ------------------------------------------------------------------------

async def test_a_model_accepts_tools_made_by_the_decorator(chat_server):
    chat_server.push(Reply("fine"))
    model = OpenAIChatModel("m", base_url=chat_server.base_url, api_key="k", timeout=5.0)
    assert (await model.generate([Message.user("hi")], tools=[execute, execute.info])).content == "fine"
    wire = chat_server.bodies[0]["tools"]
    assert [t["function"]["name"] for t in wire] == ["execute", "execute"]
    assert wire[0]["function"]["description"] == "Run a shell command."


# --- 8. a consumer that stops reading holds the run -----------------------------------------------------------------

async def test_a_consumer_that_stops_reading_holds_the_run_at_a_bounded_buffer(monkeypatch):
    monkeypatch.setattr(compiled_module, "EVENT_BUFFER", 20)
    steps = Counter()

    def step(n: int) -> int:
        steps["n"] += 1
        return n + 1

    g = Graph(name="loop")
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_branch("step", lambda n: "step" if n < 500 else END, ends=["step", END])
    events = g.compile(max_steps=1000).aevents(0)
    await events.__anext__()
    for _ in range(50):  # the consumer keeps the iterator and reads nothing
        await asyncio.sleep(0)
    held = steps["n"]
    assert held < 30  # about 20 events' worth of steps, not the whole run
    rest = [e async for e in events]
    assert steps["n"] == 500 and rest[-1].kind == "end"


# --- the ledger replays finished calls in-process, too -------------------------------------------------------------

async def test_a_cancelled_tools_step_resumes_without_running_a_finished_call_again():
    gate = asyncio.Event()
    started = asyncio.Event()

    @tool
    async def fast(n: int) -> str:
        """Fast (async: it has finished, and its result is in the ledger, before slow starts waiting)."""
        ran["fast"] += 1
        return "fast done"

    @tool
    async def slow(n: int) -> str:
        """Slow."""
        ran["slow"] += 1
        started.set()
        await gate.wait()
        return "slow done"

    model = ScriptedChatModel([calls(("fast", {"n": 1}), ("slow", {"n": 2})), lambda msgs, _: "all done"])
    runner = Runner(ChatModelAgent(name="c", model=model, tools=[fast, slow]), store=MemoryStore())
    events = runner.run("go", checkpoint_id="c")
    consumer = asyncio.ensure_future(consume(events))
    await started.wait()
    consumer.cancel()  # the run is cancelled mid-step and saved at its last finished step
    with pytest.raises(asyncio.CancelledError):
        await consumer
    snap = await runner.app.get_run("c")
    assert snap.meta.status == "interrupted" and snap.meta.error == "cancelled"
    gate.set()
    seen = [e async for e in runner.resume("c")]
    assert ran == Counter({"fast": 1, "slow": 2})  # fast came from the ledger; slow ran again
    reruns = [e.action.rerun.name for e in seen if e.action is not None and e.action.rerun is not None]
    assert reruns == ["slow"] and seen[-1].action.exit


# --- found by attacking: hostile arguments, sync code, a bypass ------------------------------------------------------

async def test_arguments_nested_too_deep_are_an_error_the_model_reads():
    deep = "[" * 100_000 + "]" * 100_000
    model = ScriptedChatModel([Message.assistant(tool_calls=[ToolCall(id="c", name="execute",
                                                                      arguments=f'{{"command": {deep}}}')]),
                               lambda msgs, _: msgs[-1].content])
    runner = Runner(ChatModelAgent(name="deep", model=model, tools=[execute]), store=MemoryStore())
    seen = await consume(runner.run("go", checkpoint_id="deep"))
    assert "nested too deeply" in seen[-1][2] and not ran


def test_a_plain_generator_is_refused_as_a_tool():
    def lines(path: str):
        """Lines."""
        yield "a"

    with pytest.raises(TypeError, match="async def"):
        tool(lines)


async def test_a_sync_unknown_tool_handler_runs_off_the_loop():
    import time as clock

    def slow_handler(name: str, arguments: str) -> str:
        clock.sleep(0.4)
        return "handled"

    model = ScriptedChatModel([calls(("nope", {})), lambda msgs, _: msgs[-1].content])
    runner = Runner(ChatModelAgent(name="h", model=model, tools=[execute], unknown_tool_handler=slow_handler))
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    seen = await consume(runner.run("go"))
    task.cancel()
    assert seen[-1][2] == "handled" and ticks >= 15


async def test_a_tools_node_refuses_a_stored_run_without_a_ledger():
    """`compile()` refuses the cheaper durability modes for an agent; `with_store(..., durability=...)` must
    not be a way around it."""
    model = ScriptedChatModel([calls(("execute", {"command": "pay"}))])
    app = ChatModelAgent(name="b", model=model, tools=[execute]).compile().with_store(MemoryStore(), durability="exit")
    with pytest.raises(NodeError, match="durability='step'"):
        await app.ainvoke("go", checkpoint_id="b")
    assert not ran


async def test_a_streaming_consumer_ends_with_the_message_that_was_stored():
    """The agent replaces repeated call IDs and an `after_model` hook redacts the text: the live chunks differ
    from what is stored, so the consumer's last output for the call is the stored message."""
    from waypoint.engine import AgentMiddleware

    class Redact(AgentMiddleware):
        async def after_model(self, ctx, message):
            return message.model_copy(update={"content": message.content.replace("SECRET", "[redacted]")})

    first = Message.assistant("the SECRET plan", tool_calls=[ToolCall(id="dup", name="execute", arguments='{"command": "a"}'),
                                                            ToolCall(id="dup", name="execute", arguments='{"command": "b"}')])
    model = ScriptedChatModel([first, lambda msgs, _: "done"])
    runner = Runner(ChatModelAgent(name="r", model=model, tools=[execute], middlewares=[Redact()]),
                    store=MemoryStore(), streaming=True)
    shown = []
    async for event in runner.run("go", checkpoint_id="r"):
        if event.output is not None and event.output.role == "assistant":
            shown.append(await event.output.get_message())
    stored = next(m for m in (await runner.app.get_run("r")).state.messages if m.tool_calls)
    last = [m for m in shown if m.tool_calls or "plan" in (m.content or "")][-1]
    assert last.content == stored.content == "the [redacted] plan"
    assert [c.id for c in last.tool_calls] == [c.id for c in stored.tool_calls] == ["dup", "call_0_1"]


@pytest.mark.parametrize("how", ["paused", "failed"])
async def test_an_abandoned_turn_tells_the_model_what_did_run(how):
    """A call that finished before its sibling paused (or failed) keeps its real result when the turn is
    abandoned; only the calls that did not finish are marked abandoned."""
    @tool
    def delete(path: str) -> str:
        """Delete."""
        if how == "failed":
            raise OSError("disk gone")
        return "deleted"

    model = ScriptedChatModel([calls(("execute", {"command": "send email"}), ("delete", {"path": "/x"})),
                               lambda msgs, _: "fresh start"])
    guard = [ApprovalMiddleware({"delete"})] if how == "paused" else []
    runner = Runner(ChatModelAgent(name="a", model=model, tools=[execute, delete], middlewares=guard),
                    store=MemoryStore())
    await consume(runner.run("go", checkpoint_id="a"))
    assert ran["send email"] == 1
    await consume(runner.run("never mind", checkpoint_id="a", force_new_run=True))
    told = {m.tool_call_id: m.content for m in (await runner.app.get_run("a")).state.messages if m.role == "tool"}
    assert told["call_0"] == "ran send email" and "abandoned" in told["call_1"]
    assert ran["send email"] == 1
