"""Moving a run a deploy refused onto the new version (`update_state(..., goto=, answer=)`, engine/keep/migrate.py):
what it refuses, with nothing written, and what a resume under the new version then does. The real deploys
(one process pauses under v1, another migrates and resumes under v2) are in tests/test_deploys.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from waypoint.engine import (
    END,
    START,
    ChatModelAgent,
    CheckpointConflict,
    Graph,
    GraphInterrupted,
    GraphMismatch,
    Interrupt,
    Respond,
    Runner,
    UnknownInterrupt,
    WaypointError,
    get_resume_context,
    tool,
)
from waypoint.engine.keep import update_state
from waypoint.engine.models import OfflineModel
from waypoint.middleware import ApprovalMiddleware
from waypoint.stores import MemoryStore, SQLiteStore

RAN: list[str] = []


@tool
def execute(command: str) -> str:
    """Run a shell command."""
    RAN.append(command)
    return f"ran {command}"


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


def ask(x):
    if not get_resume_context()[0]:
        raise Interrupt({"question": "go on?"})
    return x + 1


def build(paused_at: str = "ask", *, trigger: str = "any", extra: bool = False) -> Graph:
    g = Graph(name="flow")
    g.add_node("prepare", lambda x: x + 1)
    g.add_node(paused_at, ask)
    g.add_node("finish", lambda x: f"done {x}")
    g.add_edge(START, "prepare")
    g.add_edge("prepare", paused_at)
    g.add_edge(paused_at, "finish")
    if extra:
        g.add_node("audit", lambda x: x)
        g.add_edge(START, "audit")
        g.add_edge("audit", END)
    g.add_edge("finish", END)
    return g


async def paused_run(store, graph: Graph | None = None, **compile_options) -> str:
    app = (graph or build()).compile(store=store, **compile_options)
    with pytest.raises(GraphInterrupted) as info:
        await app.ainvoke(1, checkpoint_id="r")
    return info.value.info.contexts[0].id


def agent(tools) -> ChatModelAgent:
    guarded = ["execute"] if execute in tools else ["read_file"]
    return ChatModelAgent(name="ops", model=OfflineModel(), instruction="You run commands.", tools=tools,
                          middlewares=[ApprovalMiddleware(guarded)])


async def paused_agent(store) -> tuple[str, str]:
    async for event in Runner(agent([execute]), store=store).run("please execute echo hi", checkpoint_id="r"):
        for call in event.pending:
            return call.id, call.call_id
    raise AssertionError("the agent did not pause")


async def last_answer(events) -> str:
    """The last assistant message's text; the run's error, if any, raised."""
    texts = []
    async for event in events:
        if event.error is not None:
            raise event.error
        if event.output is not None and event.output.role == "assistant":
            texts.append((await event.output.get_message()).content)
    return texts[-1]


@pytest.mark.parametrize("request_, match", [
    ({"goto": "nowhere"}, r"goto='nowhere' is not a node of this version of graph 'flow' \(nodes: prepare, ask_again"),
    ({"goto": "finish", "as_node": "finish"}, "they do not go with as_node= or version="),
    ({"answer": {"call_1": "x"}}, r"run 'r' has no pending tool call 'call_1' \(pending calls: none\)"),
])
async def test_a_migration_that_does_not_fit_the_run_is_refused_by_name_and_nothing_is_written(request_, match):
    store = MemoryStore()
    await paused_run(store)
    before = await store.history("r")
    v2 = build("ask_again").compile(store=store)
    with pytest.raises(WaypointError, match=match):
        await v2.update_state("r", {}, **request_)
    assert await store.history("r") == before


async def test_goto_with_every_node_of_the_run_still_there_is_refused():
    store = MemoryStore()
    await paused_run(store)
    with pytest.raises(WaypointError, match=r"every node it is at \(ask\) is in this version .* nothing was written"):
        await build(extra=True).compile(store=store).update_state("r", {}, goto="finish")


async def test_a_migration_that_would_leave_the_run_where_v2_cannot_continue_it_is_refused():
    store = MemoryStore()
    await paused_run(store)
    before = await store.history("r")
    with pytest.raises(GraphMismatch, match=r"node 'ask', where the run is, is gone; name the node .*goto=NODE"):
        await build("ask_again").compile(store=store).update_state("r", {})
    assert await store.history("r") == before


async def test_goto_is_refused_for_a_dag():
    store = MemoryStore()
    await paused_run(store, trigger="all")
    with pytest.raises(WaypointError, match="DAG or a workflow, which resumes only under the structure"):
        await build("ask_again").compile(store=store, trigger="all").update_state("r", {}, goto="ask_again")


async def test_an_edit_under_a_compatible_later_version_is_a_migration_with_its_origin():
    store = MemoryStore()
    iid = await paused_run(store)
    v2 = build(extra=True).compile(store=store)
    meta = await v2.update_state("r", {})
    assert meta.origin == "r@3 migrate" and meta.status == "interrupted"
    assert await v2.ainvoke(None, checkpoint_id="r", resume={iid: True}) == "done 3"


async def test_a_dry_run_says_what_it_would_write_and_writes_nothing():
    store = MemoryStore()
    await paused_run(store)
    before = await store.history("r")
    v2 = build("ask_again").compile(store=store)
    planned = await update_state(v2.shape, "r", {}, goto="ask_again", dry_run=True)
    assert planned.version == 4 and planned.origin == "r@3 migrate goto ask_again (from ask)"
    assert await store.history("r") == before


async def test_a_migration_of_a_run_under_a_live_lease_is_refused_by_the_store_whatever_this_clock_says(
        tmp_path, monkeypatch):
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(x):
        started.set()
        await release.wait()
        return x

    def version(later: bool) -> Graph:
        g = Graph(name="flow")
        g.add_node("slow", slow)
        g.add_edge(START, "slow")
        g.add_edge("slow", END)
        if later:  # a later version, which may continue the run (a migration)
            g.add_node("audit", lambda x: x)
            g.add_edge(START, "audit")
            g.add_edge("audit", END)
        return g

    store = SQLiteStore(str(tmp_path / "runs.db"))
    try:
        task = asyncio.ensure_future(version(later=False).compile(store=store).ainvoke(1, checkpoint_id="r"))
        await started.wait()
        assert (await store.history("r", limit=1))[0].status == "running"
        before = await store.history("r")
        v2 = version(later=True).compile(store=store)
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 3600)  # this process's clock an hour ahead
        with pytest.raises(CheckpointConflict, match=r"run 'r' is running|lease"):
            await v2.update_state("r", {})
        monkeypatch.setattr(time, "time", real)
        assert await store.history("r") == before
        release.set()
        assert await task == 1
    finally:
        release.set()
        await store.close()


async def test_answering_a_pause_that_is_not_a_tool_call_is_refused():
    store = MemoryStore()
    iid = await paused_run(store)
    with pytest.raises(WaypointError, match=rf"no pending tool call '{iid}'"):
        await build(extra=True).compile(store=store).update_state("r", {}, answer={iid: "x"})


async def test_a_removed_tools_call_is_answered_on_its_behalf_the_tool_never_runs_and_the_decision_is_recorded():
    RAN.clear()
    store = MemoryStore()
    iid, call = await paused_agent(store)
    v2 = Runner(agent([read_file]), store=store)
    meta = await v2.update_state("r", {}, answer={call: "done by hand"})
    assert meta.status == "running" and meta.origin.endswith(f"migrate answer {call} (execute)")
    assert await v2.pending("r") == []  # nobody needs to answer it again
    assert "execute returned: done by hand" in await last_answer(v2.resume("r"))
    snap = await v2.app.get_run("r")
    assert snap.meta.status == "completed" and [d.verb for d in snap.state.decisions] == ["responded"]
    assert RAN == []


async def test_a_resume_under_v2_may_answer_a_removed_tools_call_itself_with_respond():
    RAN.clear()
    store = MemoryStore()
    iid, _ = await paused_agent(store)
    v2 = Runner(agent([read_file]), store=store)
    assert "execute returned: by hand" in await last_answer(v2.resume_with_params("r", {iid: Respond("by hand")}))
    assert RAN == []


async def test_a_second_answer_for_a_call_already_answered_by_a_migration_is_refused():
    store = MemoryStore()
    _, call = await paused_agent(store)
    v2 = Runner(agent([read_file]), store=store)
    await v2.update_state("r", {}, answer={call: "one"})
    before = await store.history("r")
    with pytest.raises(UnknownInterrupt, match=rf"call '{call}' was already answered by version 5 .* that answer stands"):
        await v2.update_state("r", {}, answer={call: "two"})
    assert await store.history("r") == before
    assert "execute returned: one" in await last_answer(v2.resume("r"))


# --- found under attack ------------------------------------------------------------------------------------

def _nested(tmp_path, version: str, *args: str) -> dict:
    import json
    import subprocess
    import sys
    from pathlib import Path

    proc = Path(__file__).parent / "procs" / "nested_state_app.py"
    out = subprocess.run([sys.executable, str(proc), str(tmp_path / "n.db"), version, *args], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_change_inside_a_nested_model_is_refused_and_moved_with_values(tmp_path):
    """v1 stores `Item(n=7)`; v2's `Item.n` is a list of strings. The field `item`'s annotation says `Item` in both:
    what is compared is what an `Item` holds, so v2 refuses the run (not CheckpointCorrupted: nothing it cannot
    decode is decoded) and update_state(values=) moves it."""
    iid = _nested(tmp_path, "v1", "pause")["iid"]
    refused = _nested(tmp_path, "v2", "resume", iid)
    assert refused["kind"] == "GraphMismatch" and "state field 'item' changed type" in refused["error"], refused
    assert "migrate state item" in _nested(tmp_path, "v2", "migrate")["origin"]
    assert _nested(tmp_path, "v2", "resume", iid) == {"out": 2}


async def test_update_state_refuses_a_value_the_state_would_not_read_back():
    from pydantic import BaseModel

    from waypoint.engine.codec.serde import register_type

    @register_type(name="test_migrate.Count")
    class Count(BaseModel):
        count: int = 0

    g = Graph(name="counted", state=Count)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    store = MemoryStore()
    app = g.compile(store=store)
    with pytest.raises(GraphInterrupted):
        await app.ainvoke(1, checkpoint_id="c1")
    before = (await store.history("c1", limit=1))[0].version
    with pytest.raises(WaypointError, match="(?s)does not fit its class .* Nothing was written"):
        await app.update_state("c1", {"count": "not a number"})
    assert (await store.history("c1", limit=1))[0].version == before
    assert (await app.get_run("c1")).state.count == 0  # still readable


async def test_goto_refuses_a_node_that_paused_part_way_through_a_step_that_ran_calls():
    from waypoint.engine import Message, ToolCall

    ran: list[str] = []

    @tool
    def log_payment(amount: int) -> str:
        """Log a payment."""
        ran.append(f"log {amount}")
        return "logged"

    class Both:
        async def generate(self, messages, **_):
            if messages[-1].role == "tool":
                return Message.assistant("done")
            return Message.assistant(tool_calls=[ToolCall(id="a", name="log_payment", arguments='{"amount": 100}'),
                                                 ToolCall(id="b", name="execute", arguments='{"command": "deploy"}')])

        async def stream(self, messages, **_):
            yield await self.generate(messages)

    store = MemoryStore()
    agent = ChatModelAgent(name="pay", model=Both(), tools=[log_payment, execute],
                           middlewares=[ApprovalMiddleware({"execute"})])
    app = agent.compile(store=store)
    with pytest.raises(GraphInterrupted):
        await app.ainvoke("pay", checkpoint_id="p1")
    assert ran == ["log 100"]
    loaded = await app.get_run("p1")
    node = next(iter(loaded.pending))  # the tools node the run paused in
    before = (await store.history("p1", limit=1))[0].version
    from waypoint.engine.keep.migrate import _check_nothing_ran
    from waypoint.engine.keep.checkpoint import Checkpointer

    reader = Checkpointer(store=store, serializer=app.get_serializer(), checkpoint_id="p1",
                          graph_structure=app.structure)
    pos = (await reader.load()).position
    with pytest.raises(WaypointError, match="1 of its calls already ran"):
        _check_nothing_ran(pos, node, "act", "p1")
    assert (await store.history("p1", limit=1))[0].version == before and ran == ["log 100"]


def test_a_changed_subgraph_a_nested_run_is_under_way_in_is_a_conflict():
    from waypoint.engine.keep.content import deploy_conflicts
    from waypoint.engine.run import RunPosition

    inner = {"name": "inner", "trigger": "any", "nodes": {"slow": "node"}, "edges": [], "branches": []}
    renamed = {**inner, "nodes": {"slow2": "node"}}
    old = {"name": "outer", "trigger": "any", "nodes": {"sub": inner}, "edges": [], "branches": []}
    new = {**old, "nodes": {"sub": renamed}}
    running = RunPosition(pending={"sub": 1}, nested={"runnable:outer;node:sub": b"..."})
    assert deploy_conflicts(old, new, running) and "nested run" in deploy_conflicts(old, new, running)[0]
    assert deploy_conflicts(old, new, RunPosition(pending={"sub": 1})) == []  # not started inside: nothing to lose


async def test_a_nested_agent_tools_removed_tool_is_refused_before_the_claim():
    """The researcher (an agent used as a tool) paused for approval of `search`; v2's researcher has no `search`:
    one GraphMismatch naming the nested agent and the tool, nothing written (it used to be claimed and loop)."""
    from test_composition import Asks, events_of, paused

    from waypoint.engine import AgentTool
    from waypoint.middleware import ApprovalResult

    @tool
    def search(query: str) -> str:
        """Search."""
        RAN.append(f"search {query}")
        return "found"

    @tool
    def lookup(query: str) -> str:
        """Look up."""
        return "looked"

    def boss(inner):
        researcher = ChatModelAgent(name="researcher", model=Asks("researcher", [[["search", {"query": "x"}]]]),
                                    tools=inner, middlewares=[ApprovalMiddleware(tools={inner[0].name})])
        return ChatModelAgent(name="boss", model=Asks("boss", [[["researcher", {"request": "x"}]]]),
                              tools=[AgentTool(researcher)])

    store = MemoryStore()
    (pause,) = paused(await events_of(Runner(boss([search]), store=store).run("go", checkpoint_id="t")))
    before = (await store.history("t", limit=1))[0].version
    v2 = Runner(boss([lookup]), store=store)
    with pytest.raises(GraphMismatch, match="in agent tool 'researcher': its pending call .* to tool 'search'"):
        await v2.app.ainvoke(None, checkpoint_id="t", resume={pause.id: ApprovalResult(approved=True)})
    assert (await store.history("t", limit=1))[0].version == before and "search x" not in RAN
