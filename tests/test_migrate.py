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
