"""A store made before issue 34's incremental encodings still resumes (tests/fixtures/pre34.db, made once by
tests/fixtures/make_pre34.py with the code of that time; the runs are tests/procs/pre34_app.py's): a paused
approval inside an agent used as a tool, a chat that goes on, a graph over a dict list. Whatever encodings come
later, this file must keep decoding and continuing as it does here."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "procs"))
import pre34_app as app  # noqa: E402

from waypoint.engine import Runner  # noqa: E402
from waypoint.middleware import ApprovalResult  # noqa: E402
from waypoint.stores import SQLiteStore  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "pre34.db"


@pytest.fixture
async def store(tmp_path, monkeypatch):
    monkeypatch.setenv("PRE34_LOG", str(tmp_path / "acts"))
    shutil.copy(FIXTURE, tmp_path / "runs.db")
    s = SQLiteStore(tmp_path / "runs.db")
    yield s
    await s.close()


async def test_a_paused_approval_inside_an_agent_tool_resumes_and_its_call_runs_once(store, tmp_path):
    runner = Runner(app.sup(), store=store)
    (call,) = await runner.pending("sup")
    assert (call.tool, call.arguments) == ("act", '{"command": "deploy"}')
    events = [e async for e in runner.resume_with_params("sup", {call.id: ApprovalResult(approved=True,
                                                                                          digest=call.digest)})]
    assert not [e.error for e in events if e.error]
    snap = await runner.app.get_run("sup")
    assert snap.meta.status == "completed" and snap.state.messages[-1].content == "sup: helper: did deploy"
    assert (tmp_path / "acts").read_text() == "deploy\n"


async def test_a_chat_stored_before_goes_on_from_its_conversation(store):
    runner = Runner(app.chat(), store=store)
    [e async for e in runner.run("four", checkpoint_id="chat")]
    messages = (await runner.app.get_run("chat")).state.messages
    assert [m.content for m in messages if m.role == "user"] == ["one", "two", "three", "four"]
    assert [m.content for m in messages if m.role == "tool"] == ["noted one", "noted two", "noted three", "noted four"]
    assert messages[-1].content == "chat: noted four"


async def test_a_graph_over_a_dict_list_resumes_where_it_paused(store):
    graph = app.dicts(store)
    assert await graph.ainvoke(None, checkpoint_id="dicts") == 5
    snap = await graph.get_run("dicts")
    assert [item["step"] for item in snap.state.items] == [1, 2, 3, 4, 5]
