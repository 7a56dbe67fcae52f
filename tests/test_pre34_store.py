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


def test_a_supervisor_killed_inside_its_agent_tool_before_issue_34_is_taken_over_where_it_was(tmp_path):
    """tests/fixtures/pre34_nested.db (tests/fixtures/make_pre34_nested.py): the researcher's finished steps are in
    the supervisor's position encoded whole, as before nested runs had parts of their own. A process of today
    takes it over: the lookup that finished is not run again, the cut-off call runs again under its key, and the
    run's next versions store the researcher's progress in the new encoding."""
    import json
    import subprocess

    db, journal = tmp_path / "runs.db", tmp_path / "journal"
    shutil.copy(Path(__file__).parent / "fixtures" / "pre34_nested.db", db)
    proc = Path(__file__).parent / "procs" / "composition_proc.py"
    done = subprocess.run([sys.executable, str(proc), str(db), "sup", "three", "continue", "--journal", str(journal),
                           "--tool", "slow", "--unguarded", "--takeover"], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" ") for line in journal.read_text().splitlines()]
    assert [r[:2] for r in rows] == [["tool", "slow"], ["model", "researcher"], ["model", "supervisor"]]
    assert rows[0][-1] == "True"  # a rerun of the call the kill cut off
    outputs = [json.loads(line)["output"] for line in done.stdout.splitlines() if '"output"' in line]
    assert outputs[-1][:2] == [["supervisor"], "assistant"] and "slowly found backups" in outputs[-1][2]
    import sqlite3

    with sqlite3.connect(db) as conn:  # before the takeover: whole; after it: parts of its own
        nested = [json.loads(parts) for (parts,) in conn.execute(
            "SELECT parts FROM waypoint_checkpoints WHERE checkpoint_id = 'sup' ORDER BY version")]
    assert not any(n.startswith("n:") for n in nested[0]) and any(n.startswith("n:") for p in nested for n in p)
