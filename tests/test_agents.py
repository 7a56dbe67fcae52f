"""ChatModelAgent and Runner: the ReAct loop, tool errors the model can fix, the loop's exits, live
streaming, pauses inside tools, and conversations that continue on one checkpoint ID."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from waypoint.engine import (
    ChatModelAgent,
    CheckpointExists,
    Interrupt,
    MaxIterationsExceeded,
    Message,
    RetryAgentRun,
    Runner,
    StopAgentRun,
    ToolCall,
    ToolContext,
    get_resume_context,
    tool,
)
from waypoint.engine.agents import AgentMiddleware
from waypoint.engine.models import ScriptedChatModel
from waypoint.stores import MemoryStore, SQLiteStore


def ask(*calls: tuple[str, dict | str], content: str = "") -> Message:
    """An assistant message asking for tools: (name, arguments) pairs, IDs call_1, call_2, ..."""
    return Message.assistant(content, [
        ToolCall(id=f"call_{i}", name=name, arguments=args if isinstance(args, str) else json.dumps(args))
        for i, (name, args) in enumerate(calls, start=1)
    ])


async def collect(events) -> list:
    out = []
    async for event in events:
        if event.output is not None:
            out.append((event.output.role, event.output.tool_name, (await event.output.get_message()).content))
        elif event.action is not None:
            out.append(("action", event.action))
        else:
            out.append(("error", event.error))
    return out


def outputs(events: list) -> list:
    return [e for e in events if e[0] in ("assistant", "tool")]


async def test_react_loop_runs_parallel_tools_and_keeps_call_order():
    both_started = asyncio.Event()
    started = Counter()

    @tool
    async def slow_echo(text: str, wait_for_other: bool = False) -> str:
        """Echo text back."""
        started[text] += 1
        if started.total() == 2:
            both_started.set()
        await asyncio.wait_for(both_started.wait(), 2)  # only returns if both calls run at once
        return text.upper()

    model = ScriptedChatModel([ask(("slow_echo", {"text": "a"}), ("slow_echo", {"text": "b"})), "done: A, B"])
    agent = ChatModelAgent(name="par", model=model, instruction="use tools", tools=[slow_echo])
    events = await collect(Runner(agent).run("go"))
    assert outputs(events) == [("assistant", None, ""), ("tool", "slow_echo", "A"), ("tool", "slow_echo", "B"),
                               ("assistant", None, "done: A, B")]
    second_call = model.calls[1].messages
    assert [m.role for m in second_call] == ["system", "user", "assistant", "tool", "tool"]
    assert [m.tool_call_id for m in second_call[3:]] == ["call_1", "call_2"]
    assert events[-1][1].exit is True


async def test_sequential_tools_run_one_after_the_other():
    order = []

    @tool
    async def step(n: int) -> int:
        """One step."""
        order.append(("in", n))
        await asyncio.sleep(0.01)
        order.append(("out", n))
        return n

    model = ScriptedChatModel([ask(("step", {"n": 1}), ("step", {"n": 2})), "ok"])
    agent = ChatModelAgent(name="seq", model=model, tools=[step], sequential_tools=True)
    await collect(Runner(agent).run("go"))
    assert order == [("in", 1), ("out", 1), ("in", 2), ("out", 2)]


async def test_arguments_the_model_got_wrong_go_back_to_it_and_it_corrects_them():
    runs = []

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        runs.append((a, b))
        return a + b

    def correct_it(messages, tools):
        errors = [m.content for m in messages if m.role == "tool"]
        assert "not valid JSON" in errors[0] and "a: Input should be a valid integer" in errors[1]
        assert "no tool named 'mul'" in errors[2] and "the tools are: add" in errors[2]
        return ask(("add", {"a": 2, "b": 3}))

    model = ScriptedChatModel([
        ask(("add", "{not json"), ("add", {"a": "two", "b": 3}), ("mul", {"a": 1})),
        correct_it,
        "2 + 3 = 5",
    ])
    events = await collect(Runner(ChatModelAgent(name="fix", model=model, tools=[add])).run("add 2 and 3"))
    assert runs == [(2, 3)]  # no call with bad arguments ever reached the tool
    assert outputs(events)[-1] == ("assistant", None, "2 + 3 = 5")


async def test_retry_agent_run_answers_the_model_and_the_loop_goes_on():
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        if key == "missing":
            raise RetryAgentRun("no such key; try 'present'")
        return "found"

    model = ScriptedChatModel([ask(("lookup", {"key": "missing"})), ask(("lookup", {"key": "present"})), "found it"])
    events = await collect(Runner(ChatModelAgent(name="r", model=model, tools=[lookup])).run("find"))
    assert [e[2] for e in outputs(events) if e[0] == "tool"] == ["no such key; try 'present'", "found"]
    assert outputs(events)[-1][2] == "found it"


async def test_stop_agent_run_lets_the_batch_finish_then_ends_the_run_completed():
    ran = []

    @tool
    def stopper() -> str:
        """Stop."""
        ran.append("stopper")
        raise StopAgentRun("enough")

    @tool
    async def other() -> str:
        """Other."""
        await asyncio.sleep(0.01)
        ran.append("other")
        return "other done"

    store = MemoryStore()
    model = ScriptedChatModel([ask(("stopper", {}), ("other", {}))])  # a second model call would run out
    runner = Runner(ChatModelAgent(name="s", model=model, tools=[stopper, other]), store=store)
    events = await collect(runner.run("go", checkpoint_id="stop"))
    assert sorted(ran) == ["other", "stopper"] and len(model.calls) == 1
    assert [e[2] for e in outputs(events) if e[0] == "tool"] == ["enough", "other done"]
    assert (await store.history("stop"))[0].status == "completed"
    assert events[-1][1].exit is True


async def test_max_iterations_raises_with_the_last_response():
    @tool
    def again() -> str:
        """Again."""
        return "again"

    model = ScriptedChatModel([ask(("again", {}), content=f"turn {i}") for i in range(5)])
    runner = Runner(ChatModelAgent(name="loop", model=model, tools=[again], max_iterations=3))
    events = await collect(runner.run("go"))
    error = events[-1][1]
    assert isinstance(error, MaxIterationsExceeded) and "max_iterations=3" in str(error)
    assert error.last_response.content == "turn 2"


def test_the_sync_helpers_raise_the_runs_error():
    @tool
    def again() -> str:
        """Again."""
        return "again"

    model = ScriptedChatModel([ask(("again", {})) for _ in range(5)])
    with pytest.raises(MaxIterationsExceeded):
        Runner(ChatModelAgent(name="loop", model=model, tools=[again], max_iterations=2)).run_sync("go")


async def test_return_tool_requests_hands_the_calls_back_without_running_them():
    ran = []

    @tool
    def deploy(env: str) -> str:
        """Deploy."""
        ran.append(env)
        return "deployed"

    model = ScriptedChatModel([ask(("deploy", {"env": "prod"}))])
    agent = ChatModelAgent(name="req", model=model, tools=[deploy], return_tool_requests=True)
    app = agent.compile()
    out = await app.ainvoke("deploy it")
    assert out.tool_calls[0].name == "deploy" and ran == []


async def test_return_directly_ends_with_the_tools_result():
    @tool
    def final_answer(text: str) -> str:
        """Give the final answer."""
        return f"FINAL: {text}"

    model = ScriptedChatModel([ask(("final_answer", {"text": "42"}))])
    agent = ChatModelAgent(name="direct", model=model, tools=[final_answer], return_directly=["final_answer"])
    out = await agent.compile().ainvoke("answer")
    assert out.content == "FINAL: 42" and len(model.calls) == 1


async def test_streaming_is_live_the_first_chunk_arrives_while_the_model_still_produces():
    first_seen = asyncio.Event()
    produced = []

    class SlowModel:
        name = "slow"

        async def generate(self, messages, **kw):  # pragma: no cover - streaming only
            raise AssertionError("the streaming runner must stream")

        async def stream(self, messages, **kw):
            produced.append("first")
            yield Message(role="assistant", content="Hello")
            # the rest only comes once the consumer has seen the first chunk: not live = timeout
            await asyncio.wait_for(first_seen.wait(), 5)
            produced.append("rest")
            yield Message(role="assistant", content=", world")

    runner = Runner(ChatModelAgent(name="live", model=SlowModel()), streaming=True)
    texts = []
    async for event in runner.run("hi"):
        if event.output is not None:
            async for chunk in event.output.stream:
                texts.append(chunk.content)
                if len(texts) == 1:
                    assert produced == ["first"]  # the model has not produced the rest yet
                    first_seen.set()
    assert texts == ["Hello", ", world"]


async def test_a_tool_pause_resumes_with_its_answer_and_the_event_comes_after_the_save(tmp_path):
    store = SQLiteStore(tmp_path / "agent.db")
    runs = Counter()

    @tool
    def transfer(amount: int) -> str:
        """Transfer money."""
        runs["transfer"] += 1
        is_target, _, answer = get_resume_context()
        if not is_target:
            raise Interrupt({"confirm": amount})
        return f"transferred {amount}" if answer == "yes" else "cancelled"

    @tool
    def balance() -> str:
        """Balance."""
        runs["balance"] += 1
        return "100"

    model = ScriptedChatModel([ask(("transfer", {"amount": 5}), ("balance", {})), "all done"])
    runner = Runner(ChatModelAgent(name="bank", model=model, tools=[transfer, balance]), store=store)
    paused = None
    async for event in runner.run("move 5", checkpoint_id="acct"):
        if event.action is not None and event.action.interrupted is not None:
            paused = event.action.interrupted
            assert (await store.history("acct"))[0].status == "interrupted"  # saved before we heard of it
    (ctx,) = paused.contexts
    assert ctx.info == {"confirm": 5} and ctx.address.endswith(";node:tools;tool:transfer:call_1:0")
    events = await collect(runner.resume_with_params("acct", {ctx.id: "yes"}))
    said = [e[2] for e in outputs(events)]  # parallel calls: results come as they finish
    assert sorted(said[:2]) == ["100", "transferred 5"] and said[2:] == ["all done"]
    assert runs == Counter(transfer=2, balance=1)  # the sibling that finished was not run again
    await store.close()


async def test_an_untargeted_tool_pause_pauses_again_without_running():
    runs = Counter()

    def gate(name):
        @tool(name=name)
        def approve() -> str:
            """Needs approval."""
            runs[name] += 1
            if not get_resume_context()[0]:
                raise Interrupt(name)
            return f"{name} ok"
        return approve

    model = ScriptedChatModel([ask(("a", {}), ("b", {})), "both ok"])
    runner = Runner(ChatModelAgent(name="two", model=model, tools=[gate("a"), gate("b")]), store=MemoryStore())
    first = await collect(runner.run("go", checkpoint_id="g"))
    ids = {c.info: c.id for c in first[-1][1].interrupted.contexts}
    second = await collect(runner.resume_with_params("g", {ids["a"]: None}))
    (left,) = second[-1][1].interrupted.contexts
    assert left.id == ids["b"] and runs == Counter(a=2, b=1)
    third = await collect(runner.resume_with_params("g", {ids["b"]: None}))
    assert outputs(third)[-1][2] == "both ok" and runs == Counter(a=2, b=2)


async def test_a_conversation_continues_on_its_checkpoint_id():
    store = MemoryStore()
    model = ScriptedChatModel(["Hi Ada.", lambda msgs, tools: f"You said: {[m.content for m in msgs if m.role == 'user']}"])
    runner = Runner(ChatModelAgent(name="chat", model=model, instruction="be nice"), store=store)
    await collect(runner.run("I am Ada", checkpoint_id="s"))
    events = await collect(runner.run("who am I?", checkpoint_id="s"))
    assert outputs(events)[-1][2] == "You said: ['I am Ada', 'who am I?']"
    assert [m.role for m in model.calls[1].messages] == ["system", "user", "assistant", "user"]


async def test_new_input_for_a_paused_agent_run_is_refused():
    @tool
    def wait() -> str:
        """Wait."""
        raise Interrupt("?")

    runner = Runner(ChatModelAgent(name="w", model=ScriptedChatModel([ask(("wait", {}))]), tools=[wait]),
                    store=MemoryStore())
    await collect(runner.run("go", checkpoint_id="p"))
    with pytest.raises(CheckpointExists):  # nothing ran: raised from the iterator, not an event to miss
        await collect(runner.run("something else", checkpoint_id="p"))


async def test_tool_context_and_schema():
    seen = []

    @tool
    def greet(name: str, times: int = 1, ctx: ToolContext = None) -> str:
        """Greet someone.

        Args:
            name: who to greet
            times: how often
        """
        seen.append((ctx.name, ctx.call_id, ctx.checkpoint_id, len(ctx.idempotency_key), ctx.is_resumed()))
        return " ".join([f"hi {name}"] * times)

    assert greet.info.description == "Greet someone."
    assert greet.info.parameters["required"] == ["name"]
    assert greet.info.parameters["properties"]["name"] == {"type": "string", "description": "who to greet"}
    assert "ctx" not in greet.info.parameters["properties"]
    model = ScriptedChatModel([ask(("greet", {"name": "Bo", "times": 2})), "done"])
    runner = Runner(ChatModelAgent(name="ctx", model=model, tools=[greet]), store=MemoryStore())
    events = await collect(runner.run("greet Bo", checkpoint_id="c"))
    assert ("tool", "greet", "hi Bo hi Bo") in events
    assert seen == [("greet", "call_1", "c", 32, False)]
    assert model.calls[0].tools[0].name == "greet"


async def test_middleware_wraps_tools_and_model_first_is_outermost():
    trace = []

    class Tag(AgentMiddleware):
        def __init__(self, tag):
            self.tag = tag

        def wrap_invokable_tool_call(self, endpoint, ctx):
            async def wrapped(args):
                trace.append(f"{self.tag}>")
                result = await endpoint(args)
                trace.append(f"<{self.tag}")
                return f"{self.tag}({result})"
            return wrapped

        async def before_model(self, ctx):
            trace.append(f"model:{self.tag}")

    @tool
    def ping() -> str:
        """Ping."""
        trace.append("tool")
        return "pong"

    model = ScriptedChatModel([ask(("ping", {})), "ok"])
    runner = Runner(ChatModelAgent(name="mw", model=model, tools=[ping], middlewares=[Tag("A"), Tag("B")]))
    events = await collect(runner.run("go"))
    assert ("tool", "ping", "A(B(pong))") in events
    assert trace[:7] == ["model:A", "model:B", "A>", "B>", "tool", "<B", "<A"]


def test_run_sync_returns_the_events_and_the_graph_is_drawn():
    agent = ChatModelAgent(name="plain", model=ScriptedChatModel(["hello"]))
    events = Runner(agent).run_sync("hi")
    assert events[0].output.message.content == "hello" and events[-1].action.exit
    assert "[model]" in agent.to_mermaid() and "tools" not in agent.to_mermaid()


async def test_a_streamable_tools_chunks_reach_the_consumer_live():
    gate = asyncio.Event()

    @tool
    async def tail_log(lines: int):
        """Stream a log."""
        yield "line 1\n"
        await asyncio.wait_for(gate.wait(), 5)  # the rest only after the consumer saw the first line
        yield "line 2\n"

    model = ScriptedChatModel([ask(("tail_log", {"lines": 2})), "read it"])
    runner = Runner(ChatModelAgent(name="logs", model=model, tools=[tail_log]), streaming=True)
    seen = []
    async for event in runner.run("tail"):
        if event.output is not None and event.output.role == "tool":
            async for chunk in event.output.stream:
                seen.append(chunk.content)
                gate.set()
    assert seen == ["line 1\n", "line 2\n"]
    assert model.calls[1].messages[-1].content == "line 1\nline 2\n"


async def test_a_tools_node_is_a_node_of_any_graph_and_tools_may_bring_their_own_schema():
    from waypoint.engine import END, START, Graph, Tool, ToolInfo, ToolsNode

    def raw(**kwargs):
        return f"raw got {sorted(kwargs)}"

    hand = Tool(raw, info=ToolInfo(name="raw", description="hand-written", parameters={
        "type": "object", "properties": {"anything": {"type": "string"}}}))
    g = Graph(name="plain")
    g.add_node("ask", lambda _: ask(("raw", {"anything": "x", "more": 1})))
    g.add_node("tools", ToolsNode([hand]))
    g.add_edge(START, "ask")
    g.add_edge("ask", "tools")
    g.add_edge("tools", END)
    (result,) = await g.compile().ainvoke(None)
    assert result.content == "raw got ['anything', 'more']" and result.tool_call_id == "call_1"


async def test_the_offline_model_drives_an_agent_without_a_key():
    from waypoint.engine.models import OfflineModel

    ran = []

    @tool
    def execute(command: str) -> str:
        """Run a shell command."""
        ran.append(command)
        return "hello"

    events = await collect(Runner(ChatModelAgent(name="off", model=OfflineModel(), tools=[execute]))
                           .run("please run the command echo hello"))
    assert ran == ["echo hello"]
    assert "hello" in outputs(events)[-1][2]


async def test_a_failed_turn_can_be_abandoned_and_the_conversation_goes_on():
    @tool
    def broken() -> str:
        """Always fails."""
        raise PermissionError("no access")

    store = MemoryStore()
    model = ScriptedChatModel([ask(("broken", {})), lambda msgs, _: f"seen: {[m.content for m in msgs if m.role == 'user']}"])
    runner = Runner(ChatModelAgent(name="f", model=model, tools=[broken]), store=store)
    first = await collect(runner.run("try it", checkpoint_id="c"))
    assert isinstance(first[-1][1], Exception) and (await store.history("c"))[0].status == "failed"
    with pytest.raises(CheckpointExists):
        await collect(runner.run("next", checkpoint_id="c"))
    events = await collect(runner.run("never mind", checkpoint_id="c", force_new_run=True))
    assert outputs(events)[-1][2] == "seen: ['try it', 'never mind']"


async def test_leaving_an_agent_runs_events_early_cancels_the_run_and_saves_it():
    gate = asyncio.Event()

    @tool
    async def slow() -> str:
        """Slow."""
        await gate.wait()
        return "never"

    store = MemoryStore()
    runner = Runner(ChatModelAgent(name="c", model=ScriptedChatModel([ask(("slow", {}))]), tools=[slow]), store=store)
    events = runner.run("go", checkpoint_id="x")
    async for event in events:
        break  # the first event: the assistant's request; the tool is about to wait forever
    await events.aclose()
    meta = (await store.history("x"))[0]
    assert (meta.status, meta.error) == ("interrupted", "cancelled")


async def test_what_a_run_waits_for_reads_by_name_and_a_cancelled_run_waits_for_nothing():
    """`event.pending` / `runner.pending(id)`: the paused calls with tool, arguments, digest and interrupt ID, without
    digging through `action.interrupted.contexts[0].info`; a paused run and a cancelled one (both stored
    `interrupted`) are told apart by `meta.paused` / `meta.cancelled`, not by reading `meta.error`."""
    import hashlib

    from waypoint.engine import CheckpointNotFound
    from waypoint.middleware import ApprovalMiddleware, ApprovalResult

    ran: list[str] = []
    gate = asyncio.Event()

    @tool
    def execute(command: str) -> str:
        """Run a command."""
        ran.append(command)
        return f"ran {command}"

    @tool
    def confirm(amount: int) -> str:
        """Asks a person first."""
        if not get_resume_context()[0]:
            raise Interrupt({"confirm": amount})
        return "confirmed"

    @tool
    async def slow() -> str:
        """Slow."""
        await gate.wait()
        return "never"

    store = MemoryStore()
    model = ScriptedChatModel([ask(("execute", {"command": "ls"}), ("confirm", {"amount": 5})), "done",
                               ask(("slow", {}))])
    agent = ChatModelAgent(name="w", model=model, tools=[execute, confirm, slow],
                           middlewares=[ApprovalMiddleware(tools={"execute"})])
    runner = Runner(agent, store=store)
    paused = [e async for e in runner.run("go", checkpoint_id="p") if e.pending]
    (event,) = paused
    assert event.action.paused and event.action.interrupted is not None  # the engine's InterruptInfo stays
    own, approval = sorted(event.pending, key=lambda p: p.tool)  # confirm, execute
    assert (approval.kind, approval.tool, approval.call_id, approval.arguments) == (
        "approval", "execute", "call_1", '{"command": "ls"}')
    assert approval.digest == hashlib.sha256(b'{"command": "ls"}').hexdigest()
    assert (own.kind, own.tool, own.call_id, own.arguments, own.info) == ("interrupt", "confirm", "call_2", None,
                                                                           {"confirm": 5})
    assert await runner.pending("p") == event.pending  # from the store, without resuming: the same IDs
    snap = await runner.app.get_run("p")
    assert snap.meta.version == (await store.history("p"))[0].version and ran == []  # nothing was resumed
    assert snap.meta.paused and not snap.meta.cancelled and snap.waits_for == event.pending

    answers = {approval.id: ApprovalResult(approved=True, digest=approval.digest), own.id: "yes"}
    await collect(runner.resume_with_params("p", answers))
    assert ran == ["ls"] and await runner.pending("p") == []  # completed: waits for nothing

    events = runner.run("again", checkpoint_id="p")
    async for _ in events:
        break  # the model asked for `slow`, which waits forever: leaving cancels the run
    await events.aclose()
    cancelled = (await runner.app.get_run("p")).meta
    assert cancelled.status == "interrupted" and cancelled.cancelled and not cancelled.paused
    assert await runner.pending("p") == []
    with pytest.raises(CheckpointNotFound, match="no run 'nope'"):
        await runner.pending("nope")


async def test_a_runner_moved_to_another_store_records_there_with_its_callbacks_and_per_call_ones():
    class Seen:
        def __init__(self) -> None:
            self.nodes: list[str] = []

        def on_end(self, event) -> None:
            self.nodes.append(event.node_path[-1])

    kept, extra = Seen(), Seen()
    agent = ChatModelAgent(name="echo", model=ScriptedChatModel(["one", "two"]))
    first, second = MemoryStore(), MemoryStore()
    runner = Runner(agent, store=first, callbacks=[kept], durability="step")
    moved = runner.with_store(second)
    assert moved.store is second and runner.store is first and moved.app.store is second
    assert outputs(await collect(moved.run("hi", checkpoint_id="c", callbacks=[extra]))) == [("assistant", None, "one")]
    assert await first.get("c") is None and (await second.get("c")).meta.status == "completed"
    assert kept.nodes == extra.nodes == ["prompt", "model"]
    await collect(runner.run("again", checkpoint_id="c"))  # the per-call handler was for that run only
    assert kept.nodes == ["prompt", "model"] * 2 and extra.nodes == ["prompt", "model"]
