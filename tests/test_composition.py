"""Agents made of agents, in one process: loops stopped by BreakLoop, handoffs, live tokens of an agent used as a
tool, turns and hostile call IDs that must never share a pause or a key, a nested agent that changed, and the
build errors of compositions. The cross-process guarantees are in tests/test_composition_cross_process.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from waypoint.engine import (
    END,
    START,
    AgentTool,
    BreakLoop,
    ChatModelAgent,
    Graph,
    GraphBuildError,
    GraphInterrupted,
    GraphMismatch,
    NodeError,
    LoopAgent,
    Message,
    ParallelAgent,
    Runner,
    SequentialAgent,
    ToolCall,
    ToolContext,
    ToolsNode,
    UnknownInterrupt,
    tool,
)
from waypoint.middleware import ApprovalMiddleware, ApprovalResult, classify_interrupt
from waypoint.stores import MemoryStore


class Asks:
    """Asks for `rounds[n]` ([name, arguments] per call) after n tool rounds in this turn; then answers
    "<name>: <the tool results of its last round>" (or "<name>: <last user message>" without tools)."""

    def __init__(self, name: str, rounds=(), ids=None) -> None:
        self.name, self.rounds, self.ids, self.calls = name, list(rounds), ids, 0

    async def generate(self, messages, tools=None, **_):
        self.calls += 1
        turn_start = max(i for i, m in enumerate(messages) if m.role == "user")
        mine = {t.name for t in tools or ()}  # a handoff hands over another agent's tool calls too
        done = sum(1 for m in messages[turn_start:] if m.role == "assistant" and m.tool_calls
                   and {c.name for c in m.tool_calls} <= mine)
        if done < len(self.rounds):
            calls = [ToolCall(id=self.ids[i] if self.ids else f"call_{done}_{i}", name=n, arguments=json.dumps(a))
                     for i, (n, a) in enumerate(self.rounds[done])]
            return Message.assistant(tool_calls=calls)
        if messages[-1].role == "tool":
            results = [m.content for m in messages[turn_start:] if m.role == "tool"]
            return Message.assistant(f"{self.name}: " + "; ".join(results[-len(self.rounds[-1]):]))
        return Message.assistant(f"{self.name}: {messages[turn_start].content}")

    async def stream(self, messages, **kw):
        yield await self.generate(messages, **kw)


async def events_of(iterator) -> list:
    out = []
    async for event in iterator:
        if event.output is not None:
            await event.output.get_message()
        out.append(event)
    return out


def paused(events) -> list:
    return [e for e in events if e.action is not None and e.action.interrupted is not None][-1].action.interrupted.contexts


async def said(events) -> list[tuple[tuple[str, ...], str, str]]:
    return [(e.run_path, e.output.role, (await e.output.get_message()).content) for e in events if e.output]


# --- LoopAgent and BreakLoop ---------------------------------------------------------------------------------------

def _loop(max_iterations: int, stop_at: int | None):
    checks = []

    @tool
    def check(draft: str) -> str:
        """Check a draft; good enough ends the loop."""
        checks.append(draft)
        if stop_at is not None and len(checks) >= stop_at:
            raise BreakLoop(f"good enough: {draft}")
        return f"not yet: {draft}"

    writer = ChatModelAgent(name="writer", model=Asks("writer"), output_key="draft")
    critic = ChatModelAgent(name="critic", model=Asks("critic", [[["check", {"draft": "v"}]]]), tools=[check],
                            instruction="Check {draft}.")
    return LoopAgent("refine", [writer, critic], max_iterations=max_iterations), writer, critic, checks


async def test_a_loop_agent_ends_when_a_tool_raises_break_loop():
    loop, writer, critic, checks = _loop(max_iterations=5, stop_at=2)
    events = await events_of(Runner(loop, store=MemoryStore()).run("write a haiku", checkpoint_id="l"))
    assert len(checks) == 2 and writer.model.calls == 2 and critic.model.calls == 3  # 2 iterations, no third
    assert events[-1].action.exit
    snap = await Runner(loop, store=MemoryStore()).app.ainvoke("write a haiku")
    assert snap.content == "good enough: v"  # the loop answers with what ended it


async def test_a_loop_agent_stops_at_max_iterations_and_a_break_ends_only_the_innermost_loop():
    loop, writer, _, checks = _loop(max_iterations=3, stop_at=None)
    out = await loop.compile().ainvoke("go")
    assert len(checks) == 3 and writer.model.calls == 3 and out.content == "critic: not yet: v"

    inner, _, _, inner_checks = _loop(max_iterations=5, stop_at=1)  # breaks at its first check, every time
    tally = ChatModelAgent(name="tally", model=Asks("tally"))
    outer = LoopAgent("outer", [inner, tally], max_iterations=2)
    await outer.compile().ainvoke("go")
    assert len(inner_checks) == 2 and tally.model.calls == 2  # the outer loop went on after each inner break


# --- handoffs -----------------------------------------------------------------------------------------------------

async def test_a_handoff_gives_the_conversation_to_the_named_agent_and_a_pause_there_resumes_there():
    refunds = []

    @tool
    def refund(amount: int) -> str:
        """Refund."""
        refunds.append(amount)
        return f"refunded {amount}"

    billing = ChatModelAgent(name="billing", model=Asks("billing", [[["refund", {"amount": 5}]]]), tools=[refund],
                             description="Refunds and invoices.", middlewares=[ApprovalMiddleware(tools={"refund"})])
    triage_model = Asks("triage", [[["transfer_to_agent", {"agent_name": "billing"}]]])
    triage = ChatModelAgent(name="triage", model=triage_model, instruction="Route.", handoffs=[billing])
    assert "billing" in triage.tools_node.tools["transfer_to_agent"].info.description
    runner = Runner(triage, store=MemoryStore())
    first = await events_of(runner.run("I was charged twice", checkpoint_id="h"))
    transfers = [e for e in first if e.action is not None and e.action.transfer]
    assert [(e.run_path, e.action.transfer) for e in transfers] == [(("triage",), "billing")]
    (ctx,) = paused(first)
    assert classify_interrupt(ctx).tool == "refund" and ctx.address.startswith("runnable:triage;node:billing;")
    second = await events_of(runner.resume_with_params("h", {ctx.id: ApprovalResult(approved=True)}))
    assert refunds == [5] and triage_model.calls == 1  # triage did not run again
    assert (await said(second))[-1] == (("triage", "billing"), "assistant", "billing: refunded 5")
    snap = await runner.app.get_run("h")  # the next turn (at triage) sees who answered
    assert snap.state.messages[-1].name == "billing" and snap.state.messages[-1].content == "billing: refunded 5"


async def test_a_transfer_to_an_unknown_agent_is_a_tool_error_the_model_can_correct():
    billing = ChatModelAgent(name="billing", model=Asks("billing"))
    model = Asks("triage", [[["transfer_to_agent", {"agent_name": "sales"}]]])
    triage = ChatModelAgent(name="triage", model=model, handoffs=[billing])
    out = await triage.compile().ainvoke("hi")
    assert out.content.startswith("triage: [tool error] there is no agent named 'sales'") and billing.model.calls == 0


async def test_a_transfer_answered_without_running_hands_nothing_over_whatever_its_text_says():
    """The transfer call is guarded by an approval, and the person answers it with `Respond` — the very text a
    transfer returns. The tool did not run, so nothing is handed over: what ran decides, not the text."""
    from waypoint.engine import Respond

    billing = ChatModelAgent(name="billing", model=Asks("billing"))
    model = Asks("triage", [[["transfer_to_agent", {"agent_name": "billing"}]]])
    triage = ChatModelAgent(name="triage", model=model, handoffs=[billing],
                            middlewares=[ApprovalMiddleware(tools={"transfer_to_agent"})])
    runner = Runner(triage, store=MemoryStore())
    (ctx,) = paused(await events_of(runner.run("route me", checkpoint_id="r")))
    events = await events_of(runner.resume_with_params("r", {ctx.id: Respond("Transferred to agent 'billing'.")}))
    assert billing.model.calls == 0 and not any(e.action is not None and e.action.transfer for e in events)
    assert (await said(events))[-1] == (("triage",), "assistant", "triage: Transferred to agent 'billing'.")


async def test_new_input_abandons_the_paused_turn_of_a_workflow_agent_too():
    """`force_new_run` over a paused `SequentialAgent` (its second agent waits for an approval): the new turn runs
    from the conversation as stored — it used to raise AttributeError ('SequentialAgent' has no 'tools_node')."""
    acted = []

    @tool
    def act(what: str) -> str:
        """Act."""
        acted.append(what)
        return f"did {what}"

    first = ChatModelAgent(name="first", model=Asks("first"))
    second = ChatModelAgent(name="second", model=Asks("second", [[["act", {"what": "x"}]]]), tools=[act],
                            middlewares=[ApprovalMiddleware(tools={"act"})])
    runner = Runner(SequentialAgent("pipeline", [first, second]), store=MemoryStore())
    assert paused(await events_of(runner.run("one", checkpoint_id="p")))
    events = await events_of(runner.run("two", checkpoint_id="p", force_new_run=True))
    assert paused(events) and acted == []  # the new turn asks anew; nothing of the abandoned one ran
    snap = await runner.app.get_run("p")
    assert [m.content for m in snap.state.messages if m.role == "user"] == ["one", "two"]


# --- live tokens, turns, hostile IDs --------------------------------------------------------------------------------

async def test_the_agent_tools_tokens_reach_the_caller_live_marked_with_its_path():
    reader_has_first = asyncio.Event()

    class Streams:
        name = "streams"

        async def generate(self, messages, **_):
            raise AssertionError("a streaming runner streams")

        async def stream(self, messages, **_):
            yield Message.assistant("half ")
            await asyncio.wait_for(reader_has_first.wait(), 10)  # the rest only once the caller has the first part
            yield Message.assistant("done")

    researcher = ChatModelAgent(name="researcher", model=Streams())

    supervisor = ChatModelAgent(name="boss", model=Asks("boss", [[["researcher", {"request": "look"}]]]),
                                tools=[AgentTool(researcher)])
    seen = []
    async for event in Runner(supervisor, streaming=True).run("go"):
        if event.output is not None and event.run_path == ("boss", "researcher"):
            async for chunk in event.output.stream:
                seen.append(chunk.content)
                reader_has_first.set()
        elif event.output is not None:
            await event.output.get_message()
        assert event.run_path and event.agent_name == event.run_path[-1]  # every event says whose it is
    assert seen == ["half ", "done"]


async def test_an_agent_tool_in_two_turns_never_shares_a_pause_or_a_key():
    keys = []

    @tool
    def search(query: str, ctx: ToolContext) -> str:
        """Search."""
        keys.append(ctx.idempotency_key)
        return f"found {query}"

    researcher = ChatModelAgent(name="researcher", model=Asks("researcher", [[["search", {"query": "x"}]]]),
                                tools=[search], middlewares=[ApprovalMiddleware(tools={"search"})])
    boss = ChatModelAgent(name="boss", model=Asks("boss", [[["researcher", {"request": "x"}]]]),
                          tools=[AgentTool(researcher)])
    runner = Runner(boss, store=MemoryStore())
    (first,) = paused(await events_of(runner.run("one", checkpoint_id="t")))
    await events_of(runner.resume_with_params("t", {first.id: ApprovalResult(approved=True)}))
    (second,) = paused(await events_of(runner.run("two", checkpoint_id="t")))
    assert second.id != first.id and second.address == first.address  # the same point, another pause
    with pytest.raises(UnknownInterrupt):  # the first turn's answer, replayed, approves nothing
        await events_of(runner.resume_with_params("t", {first.id: ApprovalResult(approved=True)}))
    await events_of(runner.resume_with_params("t", {second.id: ApprovalResult(approved=True)}))
    assert len(keys) == 2 and keys[0] != keys[1]


@pytest.mark.parametrize("ids", [("call_1", "call_1"), ("x;runnable:evil", "x%3Brunnable%3Aevil"), ("", "")])
async def test_two_calls_of_an_agent_tool_are_told_apart_whatever_ids_the_model_wrote(ids):
    """A bare tools node (no agent renames the IDs): the calls are told apart by position."""
    ran = []

    @tool
    def act(n: int, ctx: ToolContext) -> str:
        """Act."""
        ran.append((n, ctx.idempotency_key))
        return f"did {n}"

    def worker(n):
        return ChatModelAgent(name="worker", model=Asks("worker", [[["act", {"n": n}]]]), tools=[act],
                              middlewares=[ApprovalMiddleware(tools={"act"})])

    node = ToolsNode([AgentTool(worker(0))])
    g = Graph(name="calls")
    g.add_node("tools", node.ainvoke)
    g.add_edge(START, "tools")
    g.add_edge("tools", END)
    app = g.compile(store=MemoryStore())
    message = Message.assistant(tool_calls=[ToolCall(id=i, name="worker", arguments=json.dumps({"request": f"r{n}"}))
                                            for n, i in enumerate(ids)])
    with pytest.raises(GraphInterrupted) as caught:
        await app.ainvoke(message, checkpoint_id="h")
    a, b = caught.value.info.contexts
    assert a.id != b.id and a.address != b.address and ";runnable:evil" not in a.address + b.address
    with pytest.raises(GraphInterrupted) as again:  # approving one runs that one only
        await app.ainvoke(None, checkpoint_id="h", resume={a.id: ApprovalResult(approved=True)})
    assert len(ran) == 1 and [c.id for c in again.value.info.contexts] == [b.id]
    await app.ainvoke(None, checkpoint_id="h", resume={b.id: ApprovalResult(approved=True)})
    assert len(ran) == 2 and ran[0][1] != ran[1][1]


async def test_an_agent_tool_that_is_itself_approved_asks_again_for_its_own_tool():
    ran = []

    @tool
    def search(query: str) -> str:
        """Search."""
        ran.append(query)
        return "found"

    researcher = ChatModelAgent(name="researcher", model=Asks("researcher", [[["search", {"query": "q"}]]]),
                                tools=[search], middlewares=[ApprovalMiddleware(tools={"search"})])
    boss = ChatModelAgent(name="boss", model=Asks("boss", [[["researcher", {"request": "q"}]]]),
                          tools=[AgentTool(researcher)], middlewares=[ApprovalMiddleware(tools={"researcher"})])
    runner = Runner(boss, store=MemoryStore())
    (outer,) = paused(await events_of(runner.run("go", checkpoint_id="a")))
    assert classify_interrupt(outer).tool == "researcher"
    (inner,) = paused(await events_of(runner.resume_with_params("a", {outer.id: ApprovalResult(approved=True)})))
    assert inner.id != outer.id and classify_interrupt(inner).tool == "search" and ran == []  # its own answer
    with pytest.raises(UnknownInterrupt):  # the outer answer was consumed where it answered
        await events_of(runner.resume_with_params("a", {outer.id: ApprovalResult(approved=True)}))
    last = await events_of(runner.resume_with_params("a", {inner.id: ApprovalResult(approved=True)}))
    assert ran == ["q"] and last[-1].action.exit
    decisions = (await runner.app.get_run("a")).state.decisions  # every approval given anywhere in the run
    assert [(d.tool, d.verb, d.run_path) for d in decisions] == [("researcher", "approved", ()),
                                                               ("search", "approved", ("researcher",))]


async def test_decisions_two_agent_tools_deep_reach_the_outer_run_with_their_path_and_survive_a_new_process():
    ran = []

    @tool
    def delete(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return "deleted"

    def build():
        clerk = ChatModelAgent(name="clerk", model=Asks("clerk", [[["delete", {"path": "/a"}], ["delete",
                                                                                             {"path": "/b"}]]]),
                               tools=[delete], middlewares=[ApprovalMiddleware(tools={"delete"})])
        lead = ChatModelAgent(name="lead", model=Asks("lead", [[["clerk", {"request": "clean"}]]]),
                              tools=[AgentTool(clerk)])
        return ChatModelAgent(name="boss", model=Asks("boss", [[["lead", {"request": "clean"}]]]),
                              tools=[AgentTool(lead)])

    store = MemoryStore()
    first = paused(await events_of(Runner(build(), store=store).run("go", checkpoint_id="d")))
    assert sorted(classify_interrupt(c).arguments for c in first) == ['{"path": "/a"}', '{"path": "/b"}']
    runner = Runner(build(), store=store)  # another Runner, as another process would build it
    by_path = {classify_interrupt(c).arguments: c.id for c in first}
    answers = {by_path['{"path": "/a"}']: ApprovalResult(approved=True),
               by_path['{"path": "/b"}']: ApprovalResult(approved=False, reason="keep it")}
    last = await events_of(runner.resume_with_params("d", answers))
    assert last[-1].action.exit and ran == ["/a"]
    decisions = (await runner.app.get_run("d")).state.decisions
    assert sorted((d.verb, d.reason, d.run_path) for d in decisions) == [
        ("approved", None, ("lead", "clerk")), ("rejected", "keep it", ("lead", "clerk"))]


async def test_full_history_hands_the_agent_tool_the_conversation():
    class Echo:
        name = "echo"

        async def generate(self, messages, **_):
            return Message.assistant(" / ".join(f"{m.role}:{m.content}" for m in messages))

    helper = ChatModelAgent(name="helper", model=Echo())
    boss = ChatModelAgent(name="boss", instruction="secret", model=Asks("boss", [[["helper", {"request": "sum up"}]]]),
                          tools=[AgentTool(helper, full_history=True)])
    out = await boss.compile().ainvoke("the user asked this")
    assert out.content == "boss: user:the user asked this / user:sum up"  # not the instruction, not the tool calls


async def test_a_nested_agent_that_changed_since_its_pause_is_refused():
    def build(extra_tools):
        @tool
        def search(query: str) -> str:
            """Search."""
            return "found"

        researcher = ChatModelAgent(name="researcher", model=Asks("researcher", [[["search", {"query": "q"}]]]),
                                    tools=[search, *extra_tools], middlewares=[ApprovalMiddleware(tools={"search"})])
        return ChatModelAgent(name="boss", model=Asks("boss", [[["researcher", {"request": "q"}]]]),
                              tools=[AgentTool(researcher)])

    store = MemoryStore()
    (ctx,) = paused(await events_of(Runner(build([]), store=store).run("go", checkpoint_id="m")))
    handoff = ChatModelAgent(name="other", model=Asks("other"))
    changed = build([]).tools_node.tools["researcher"].agent
    changed.handoffs = (handoff,)  # the researcher's graph now has another node
    changed.tools_node = ToolsNode([*changed.tools_node.tools.values()], middlewares=changed.middlewares)
    runner = Runner(build([]), store=store)
    runner.agent.tools_node.tools["researcher"].agent = changed
    runner.agent.tools_node.tools["researcher"]._shapes.clear()
    events = await events_of(runner.resume_with_params("m", {ctx.id: ApprovalResult(approved=True)}))
    assert isinstance(events[-1].error, GraphMismatch) and "'researcher' nested at runnable:boss;node:tools;tool:" \
        in str(events[-1].error)


# --- building compositions -------------------------------------------------------------------------------------------

def test_compositions_refuse_what_cannot_work():
    a = ChatModelAgent(name="a", model=Asks("a"))
    with pytest.raises(GraphBuildError, match="two sub-agents are named 'a'"):
        SequentialAgent("s", [a, a])
    with pytest.raises(GraphBuildError, match="at least one agent"):
        ParallelAgent("p", [])
    with pytest.raises(GraphBuildError, match="max_iterations"):
        LoopAgent("l", [a], max_iterations=0)
    with pytest.raises(GraphBuildError, match="loop agents sharing one session"):
        SequentialAgent("s", [LoopAgent("l", [a]), SequentialAgent("t", [LoopAgent("l", [ChatModelAgent(
            name="b", model=Asks("b"))])])])
    with pytest.raises(GraphBuildError, match="may not be named 'tools'"):
        ChatModelAgent(name="t", model=Asks("t"), handoffs=[ChatModelAgent(name="tools", model=Asks("x"))])
    one = ChatModelAgent(name="one", model=Asks("one"))
    two = ChatModelAgent(name="two", model=Asks("two"), handoffs=[one])
    one.handoffs = (two,)
    one.tools_node = ToolsNode([*two.tools_node.tools.values()])
    with pytest.raises(GraphBuildError, match="lead back to it"):
        two.compile()

    @tool
    def act() -> str:
        """Act."""
        return "ok"

    with_tools = SequentialAgent("s", [ChatModelAgent(name="b", model=Asks("b"), tools=[act])])
    with pytest.raises(GraphBuildError, match="durability='exit'"):
        Runner(with_tools, store=MemoryStore(), durability="exit")


def test_each_composition_draws_its_graph_with_a_box_per_sub_agent():
    a, b = (ChatModelAgent(name=n, model=Asks(n)) for n in "ab")
    sequential = SequentialAgent("s", [a, b]).to_mermaid()
    assert "n1[[a]]" in sequential and "n2[[b]]" in sequential and 'n1 -. "b" .-> n2' in sequential
    parallel = ParallelAgent("p", [a, b]).to_mermaid()
    assert "n1 --> n3" in parallel and "n2 --> n3" in parallel and "n3[join]" in parallel
    loop = LoopAgent("l", [a, b]).to_mermaid()
    assert 'n2 -. "a" .-> n1' in loop and 'n2 -. "exit" .-> n3' in loop
    triage = ChatModelAgent(name="t", model=Asks("t"), handoffs=[ChatModelAgent(name="billing", model=Asks("b"))])
    assert 'n2 -. "billing" .-> n3' in triage.to_mermaid() and "n3[[billing]]" in triage.to_mermaid()


async def test_nested_runs_recording_their_steps_at_once_write_one_version_at_a_time():
    """Parallel branches record their steps concurrently; on a store whose writes take time (a network database),
    each write must still compare-and-set on the version before it."""

    class Slow(MemoryStore):
        async def put(self, *args, **kwargs):
            await asyncio.sleep(0.001)  # a write in flight, as over a network
            return await super().put(*args, **kwargs)

    class Thinks:
        name = "thinks"

        async def generate(self, messages, **_):
            await asyncio.sleep(0)
            return Message.assistant("ok")

    agents = [ChatModelAgent(name=n, model=Thinks()) for n in "abc"]
    store = Slow()
    out = await ParallelAgent("p", agents).compile(store=store).ainvoke("go", checkpoint_id="w")
    assert out.content == "[a] ok\n\n[b] ok\n\n[c] ok"
    versions = [m.version for m in await store.history("w", limit=100)]
    assert sorted(versions) == list(range(1, len(versions) + 1))


async def test_a_failed_resume_inside_an_agent_tool_asks_again_under_a_new_id():
    ran = []

    @tool
    def search(query: str) -> str:
        """Search."""
        ran.append(query)
        return "found"

    researcher = ChatModelAgent(name="researcher", model=Asks("researcher", [[["search", {"query": "q"}]]]),
                                tools=[search], middlewares=[ApprovalMiddleware(tools={"search"})])
    boss = ChatModelAgent(name="boss", model=Asks("boss", [[["researcher", {"request": "q"}]]]),
                          tools=[AgentTool(researcher)])
    runner = Runner(boss, store=MemoryStore())
    (first,) = paused(await events_of(runner.run("go", checkpoint_id="f")))
    failed = await events_of(runner.resume_with_params("f", {first.id: "yes"}))  # not an approval: the run fails
    assert failed[-1].error is not None and ran == []
    with pytest.raises(UnknownInterrupt):  # the same answer again (a client retry) answers nothing
        await events_of(runner.resume_with_params("f", {first.id: ApprovalResult(approved=True)}))
    (again,) = (await runner.app.get_run("f")).interrupts.contexts
    assert again.id != first.id and again.address == first.address
    last = await events_of(runner.resume_with_params("f", {again.id: ApprovalResult(approved=True)}))
    assert last[-1].action.exit and ran == ["q"]


async def test_a_nested_run_that_failed_after_its_answer_continues_without_asking_again(tmp_path):
    """supervisor -> AgentTool(researcher) -> search under approval: the approved search runs, then the
    researcher's next model call fails once. The failed run goes on from the researcher's last saved step:
    nobody is asked again, and search does not run again (it used to be stuck with nothing to answer)."""
    from waypoint.stores import SQLiteStore

    ran = []

    @tool
    def search(query: str, ctx: ToolContext) -> str:
        """Search."""
        ran.append(ctx.idempotency_key)
        return f"found {query}"

    class FailsOnce(Asks):
        failed = False

        async def generate(self, messages, tools=None, **kw):
            if messages[-1].role == "tool" and not FailsOnce.failed:
                FailsOnce.failed = True
                raise RuntimeError("provider 503")
            return await super().generate(messages, tools=tools, **kw)

    store = SQLiteStore(tmp_path / "runs.db")
    researcher = ChatModelAgent(name="researcher", model=FailsOnce("researcher", [[["search", {"query": "x"}]]]),
                                tools=[search], middlewares=[ApprovalMiddleware(tools={"search"})])
    boss = ChatModelAgent(name="boss", model=Asks("boss", [[["researcher", {"request": "q"}]]]),
                          tools=[AgentTool(researcher)])
    runner = Runner(boss, store=store)
    (pause,) = paused(await events_of(runner.run("go", checkpoint_id="t")))
    events = await events_of(runner.resume_with_params("t", {pause.id: ApprovalResult(approved=True)}))
    assert any(e.error for e in events) and len(ran) == 1
    snap = await runner.app.get_run("t")
    assert snap.meta.status == "failed" and snap.interrupts.contexts == ()  # nothing to answer: it just goes on
    events = await events_of(runner.resume("t"))
    assert events[-1].action is not None and events[-1].action.exit
    assert not any(e.action is not None and e.action.interrupted is not None for e in events)
    assert (await store.history("t", limit=1))[0].status == "completed" and len(ran) == 1
    await store.close()


async def test_a_subgraph_that_failed_after_its_answer_continues_without_asking_again():
    from waypoint.engine import END, START, Graph, Interrupt, get_resume_context
    from waypoint.stores import MemoryStore

    calls = []

    async def ask(x):
        target, has_data, data = get_resume_context()
        if not (target and has_data):
            raise Interrupt({"question": "go?"})
        calls.append("ask")
        return x

    async def work(x):
        calls.append("work")
        if calls.count("work") == 1:
            raise RuntimeError("transient")
        return x + 1

    inner = Graph(name="inner")
    inner.add_node("ask", ask)
    inner.add_node("work", work)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", "work")
    inner.add_edge("work", END)
    outer = Graph(name="outer")
    outer.add_node("inner", inner.compile())
    outer.add_edge(START, "inner")
    outer.add_edge("inner", END)
    app = outer.compile(store=MemoryStore())
    with pytest.raises(GraphInterrupted) as paused_at:
        await app.ainvoke(1, checkpoint_id="g")
    (ctx,) = paused_at.value.info.contexts
    with pytest.raises(NodeError):
        await app.ainvoke(None, checkpoint_id="g", resume={ctx.id: "yes"})
    assert await app.ainvoke(None, checkpoint_id="g") == 2
    assert calls == ["ask", "work", "work"]  # asked once; only the failed node ran again


async def test_a_nested_run_that_went_on_is_continued_beside_a_sibling_call_that_is_answered():
    """The agent tool's run went on past its answered pause, then failed; its sibling call still waits. Answering
    the sibling continues both: the agent tool from its saved step, without a new question."""
    ran = []

    @tool
    def search(query: str) -> str:
        """Search."""
        ran.append("search")
        return f"found {query}"

    @tool
    def deploy(target: str) -> str:
        """Deploy."""
        ran.append("deploy")
        return f"deployed {target}"

    class FailsOnce(Asks):
        failed = False

        async def generate(self, messages, tools=None, **kw):
            if messages[-1].role == "tool" and not FailsOnce.failed:
                FailsOnce.failed = True
                raise RuntimeError("provider 503")
            return await super().generate(messages, tools=tools, **kw)

    researcher = ChatModelAgent(name="researcher", model=FailsOnce("researcher", [[["search", {"query": "x"}]]]),
                                tools=[search], middlewares=[ApprovalMiddleware(tools={"search"})])
    boss = ChatModelAgent(name="boss", model=Asks("boss", [[["researcher", {"request": "q"}], ["deploy", {"target": "t"}]]]),
                          tools=[AgentTool(researcher), deploy], middlewares=[ApprovalMiddleware(tools={"deploy"})])
    runner = Runner(boss, store=MemoryStore())
    pending = {classify_interrupt(c).tool: c.id for c in paused(await events_of(runner.run("go", checkpoint_id="s")))}
    events = await events_of(runner.resume_with_params("s", {pending["search"]: ApprovalResult(approved=True)}))
    assert any(e.error for e in events) and ran == ["search"]  # the researcher failed after its search
    snap = await runner.app.get_run("s")
    (left,) = snap.interrupts.contexts
    assert classify_interrupt(left).tool == "deploy"
    events = await events_of(runner.resume_with_params("s", {left.id: ApprovalResult(approved=True)}))
    assert events[-1].action is not None and events[-1].action.exit, [e.error for e in events if e.error]
    assert sorted(ran) == ["deploy", "search"]
