"""`waypoint runs` driven as a user drives it: the real command in a subprocess, on a database made by
real runs (tests/procs/runs_fixtures.py: agent runs paused for approval, a completed agent run, a plain
graph paused on an Interrupt, a failed run; crashed runs under a live or an expired lease)."""

from __future__ import annotations

import json
import os
import pty
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROCS = Path(__file__).parent / "procs"
WAYPOINT = Path(sys.executable).parent / "waypoint"
APPROVAL = "runnable:ops-test;node:tools;tool:execute:call_1:0"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "WAYPOINT_"))}
    env.update(PYTHONPATH=str(PROCS), NO_COLOR="1", **extra)
    return env


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("runs") / "runs.db"
    subprocess.run([sys.executable, str(PROCS / "runs_fixtures.py"), str(db)], check=True, env=_env(), timeout=60)
    return db


@pytest.fixture
def db(template, tmp_path) -> Path:
    """A copy of the fixture database, for this test to change."""
    for f in template.parent.glob(template.name + "*"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path / template.name


def runs(*args, db: Path | None = None, stdin=None, **env: str) -> tuple[int, str, str]:
    cmd = [str(WAYPOINT), "runs", *map(str, args)] + (["--db", str(db)] if db is not None else [])
    cwd = db.parent if db is not None else None
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=_env(**env), cwd=cwd,
                          stdin=stdin if stdin is not None else subprocess.DEVNULL)
    return proc.returncode, proc.stdout, proc.stderr


def pending_ids(db: Path, cid: str, *graph: str) -> list[str]:
    """The IDs `waypoint runs show` lists for a run (each pause of each run has its own)."""
    code, out, err = runs("show", cid, *graph, "--json", db=db)
    assert code == 0, err
    return [p["id"] for p in json.loads(out)["interrupts"]]


def refused(result: tuple[int, str, str], *words: str) -> str:
    """An error as the CLI must give it: exit 1, one line on stderr, no traceback; returns the line."""
    code, _, err = result
    assert code == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err
    return err


# --- reading -----------------------------------------------------------------------------------------------

def test_list_shows_each_run_with_its_status_pending_interrupts_and_graph(db):
    code, out, err = runs("list", db=db)
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["ID", "STATUS", "VERSION", "STEP", "PENDING", "UPDATED", "GRAPH"]
    table = {row.split()[0]: row.split() for row in rows}
    assert set(table) == {"approve-me", "reject-me", "respond-me", "two-calls", "chat-done", "refund-7", "broken-1",
                          "typed-1", "signed-1"}
    assert table["two-calls"][4] == "2"
    assert table["approve-me"][1] == "interrupted" and table["approve-me"][4] == "1"
    assert table["approve-me"][-2:] == ["ops-test", "(agent)"]
    assert table["refund-7"][1] == "interrupted" and table["refund-7"][-1] == "refunds"
    assert table["chat-done"][1] == "completed" and table["chat-done"][4] == "-"
    assert table["broken-1"][1] == "failed"
    assert time.strftime("%Y-%m-%d") in table["broken-1"][5]  # local time


def test_list_filters_by_status_limits_and_speaks_json(db):
    code, out, _ = runs("list", "--status", "interrupted", "--json", db=db)
    assert code == 0
    found = {r["checkpoint_id"]: r for r in json.loads(out)}
    assert set(found) == {"approve-me", "reject-me", "respond-me", "two-calls", "refund-7", "typed-1", "signed-1"}
    assert found["approve-me"]["kind"] == "agent" and found["refund-7"]["graph"] == "refunds"
    assert len(found["approve-me"]["interrupts"]) == 1
    code, out, _ = runs("list", "--limit", "2", db=db)
    assert code == 0 and len(out.splitlines()) == 3
    assert runs("list", "--status", "completed", "--json", db=db)[1].count("checkpoint_id") == 1


def test_runs_only_their_graph_can_read_are_marked_and_read_with_graph(db):
    """A state type only the graph's module registers, a codec with a signing key: --graph brings both."""
    code, out, err = runs("list", db=db)
    rows = {row.split()[0]: row for row in out.splitlines()[1:]}
    assert code == 0 and rows["typed-1"].endswith("(unreadable)") and rows["signed-1"].endswith("(unreadable)")
    assert "'tests.Ticket'" in err and "show|resume typed-1 --graph MODULE:ATTR" in err
    refused(runs("show", "typed-1", db=db), "'tests.Ticket'", "--graph MODULE:ATTR")
    refused(runs("show", "signed-1", db=db), "signed", "--graph MODULE:ATTR")
    code, out, _ = runs("show", "typed-1", "--graph", "runs_fixtures:typed", "--json", db=db)
    assert code == 0 and json.loads(out)["state"] == {"title": "disk full", "priority": 2}
    code, out, _ = runs("show", "signed-1", "--graph", "runs_fixtures:signed", db=db)
    assert code == 0 and "refund 5?" in out
    (iid,) = pending_ids(db, "signed-1", "--graph", "runs_fixtures:signed")
    code, out, err = runs("resume", "signed-1", "--respond", iid, '"yes"', "--graph", "runs_fixtures:signed", db=db)
    assert code == 0 and '[output] "refund 5: yes"' in out, err


def test_show_an_agent_run_paused_for_approval(db):
    (approve,) = pending_ids(db, "approve-me")
    code, out, err = runs("show", "approve-me", db=db)
    assert code == 0, err
    assert "status    interrupted" in out and "ops-test (agent)" in out
    assert "[system] You run commands." in out and "[user] run echo hello" in out
    assert '[tool call] execute({"command": "echo hello"}) (call call_1)' in out
    assert f"{approve}  approval of tool 'execute' (call call_1)" in out
    assert '"command": "echo hello"' in out.split("arguments", 1)[1]  # pretty-printed, one key a line
    assert f"--approve {approve}" in out and f"--reject {approve} --reason TEXT" in out
    assert "b'" not in out and "\\x" not in out and "digest" not in out  # no raw bytes, no codec internals


def test_show_json_is_structured(db):
    code, out, _ = runs("show", "approve-me", "--json", db=db)
    shown = json.loads(out)
    assert code == 0 and shown["kind"] == "agent" and shown["status"] == "interrupted"
    assert len(shown["fingerprint"]) >= 12  # the version of the graph that wrote it (docs/resume.md, "Deploys")
    assert [m["role"] for m in shown["messages"]] == ["system", "user", "assistant"]
    assert shown["messages"][2]["tool_calls"] == [{"id": "call_1", "name": "execute",
                                                   "arguments": {"command": "echo hello"}}]
    (pending,) = shown["interrupts"]
    assert pending["kind"] == "approval" and pending["tool"] == "execute"
    assert pending["arguments"] == {"command": "echo hello"} and pending["address"] == APPROVAL
    # the same agent paused the same call in three runs: three pauses, three IDs
    others = [pending_ids(db, cid)[0] for cid in ("reject-me", "respond-me")]
    assert len({pending["id"], *others}) == 3


def test_show_a_plain_graph_and_a_failed_run(db):
    code, out, _ = runs("show", "refund-7", db=db)
    assert code == 0
    assert "pending nodes: review" in out and '"seen": 120' in out and '"receipt": "<6 bytes>"' in out
    assert "PDF" not in out and "\\x00" not in out
    assert "interrupt at node review" in out and '{"question": "refund 120?"}' in out
    assert "--graph MODULE:ATTR --respond" in out
    code, out, _ = runs("show", "broken-1", db=db)
    assert code == 0 and "status    failed" in out
    assert "error     NodeError: node 'fail' failed: ValueError: cannot handle 'x'" in out
    assert "retry the failed step" in out


def test_history_lists_versions_newest_first(db):
    code, out, _ = runs("history", "approve-me", db=db)
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["VERSION", "STATUS", "STEP", "WRITTEN", "ORIGIN", "ERROR"]
    assert [r.split()[0] for r in rows] == ["4", "3", "2", "1"]
    assert rows[0].split()[1] == "interrupted" and rows[-1].split()[1] == "running"
    versions = json.loads(runs("history", "broken-1", "--json", db=db)[1])
    assert [v["version"] for v in versions] == [2, 1] and versions[0]["error"].startswith("NodeError")


# --- resuming ------------------------------------------------------------------------------------------------

def test_approve_an_agent_run_from_another_process(db, tmp_path):
    journal = tmp_path / "journal"
    (iid,) = pending_ids(db, "approve-me")
    code, out, err = runs("resume", "approve-me", "--approve", iid, "--graph", "runs_fixtures:build_agent", db=db,
                          RUNS_JOURNAL=str(journal))
    assert code == 0, err
    assert "[decision] approved execute (call call_1)" in out
    assert "[tool result] ran echo hello" in out and "[assistant] the tool said: ran echo hello" in out
    assert out.splitlines()[-1].startswith("run approve-me completed at version")
    assert len(journal.read_text().splitlines()) == 1  # the tool ran once, in the CLI's process
    code, out, _ = runs("show", "approve-me", db=db)
    assert "approved execute (call call_1) at version 5" in out and "pending interrupts" not in out
    refused(runs("resume", "approve-me", "--approve", iid, "--graph", "runs_fixtures:agent", db=db),
            "has completed", "nothing to resume")


def test_a_run_whose_tools_are_not_confined_has_no_project_root(db, tmp_path):
    """Only chapter sessions (chapters 4-10) keep a project root: other agents' and graphs' runs show none, and
    `--project-root` for one is refused rather than ignored (tests/test_chapters_roots.py has the sessions)."""
    code, out, err = runs("show", "approve-me", db=db)
    assert code == 0 and "\n  root " not in out and "--project-root" not in out, err
    assert json.loads(runs("show", "approve-me", "--json", db=db)[1])["project_root"] is None
    assert json.loads(runs("show", "refund-7", "--json", db=db)[1])["project_root"] is None
    (iid,) = pending_ids(db, "approve-me")
    refused(runs("resume", "approve-me", "--approve", iid, "--graph", "runs_fixtures:build_agent", "--project-root",
                 tmp_path, db=db), "--project-root", "--graph", "'approve-me'")
    script = ("import sys, runs_fixtures, waypoint.cmd.agents as agents\n"
              "agents.find_agent = lambda name: runs_fixtures.build_agent() if name == 'ops-test' else None\n"
              "from waypoint.cmd.runs import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", script, "resume", "approve-me", "--approve", iid, "--project-root",
                           str(tmp_path), "--db", str(db)], capture_output=True, text=True, timeout=60, env=_env())
    refused((proc.returncode, proc.stdout, proc.stderr), "'approve-me'", "not confined", "leave out --project-root")
    assert pending_ids(db, "approve-me") == [iid]  # nothing ran


def test_reject_with_a_reason(db, tmp_path):
    journal = tmp_path / "journal"
    (iid,) = pending_ids(db, "reject-me")
    code, out, err = runs("resume", "reject-me", "--reject", iid, "--reason", "not on a Friday",
                          "--graph", "runs_fixtures:agent", db=db, RUNS_JOURNAL=str(journal))
    assert code == 0, err
    assert "[assistant] the tool said: tool 'execute' disapproved: not on a Friday" in out
    assert "[decision] rejected execute (call call_1): not on a Friday" in out
    assert not journal.exists()  # never ran


def test_respond_supplies_the_tools_result(db, tmp_path):
    journal = tmp_path / "journal"
    (iid,) = pending_ids(db, "respond-me")
    code, out, err = runs("resume", "respond-me", "--respond", iid, '"all done"', "--graph", "runs_fixtures:agent",
                          "--json", db=db, RUNS_JOURNAL=str(journal))
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "completed" and result["output"]["content"] == "the tool said: all done"
    assert [d["verb"] for d in result["decisions"]] == ["responded"]
    assert not journal.exists()


def test_a_call_not_answered_pauses_again(db, tmp_path):
    journal = tmp_path / "journal"
    first, second = pending_ids(db, "two-calls")
    code, out, err = runs("resume", "two-calls", "--approve", first, "--graph", "runs_fixtures:agent", db=db,
                          RUNS_JOURNAL=str(journal))
    assert code == 0, err
    assert out.splitlines()[-1].startswith("run two-calls paused again at version ") and second in out
    assert journal.read_text().split()[:2] == ["execute", "ls"]  # the approved call ran, the other did not
    code, out, err = runs("resume", "two-calls", "--reject", second, "--reason", "no", "--graph",
                          "runs_fixtures:agent", "--json", db=db, RUNS_JOURNAL=str(journal))
    result = json.loads(out)
    assert code == 0 and result["status"] == "completed", err
    assert result["output"]["content"] == "the tool said: ran ls; tool 'execute' disapproved: no"
    assert len(journal.read_text().splitlines()) == 1  # ls ran once, across both resumes


@pytest.mark.parametrize("target", ["runs_fixtures:refunds", "runs_fixtures:refunds_compiled"])
def test_resume_a_plain_graph_with_graph(db, target):
    (refund,) = pending_ids(db, "refund-7")
    code, out, err = runs("resume", "refund-7", "--respond", refund, '"yes"', "--graph", target, db=db)
    assert code == 0, err
    assert '[output] "refund 120: yes"' in out and "run refund-7 completed" in out
    shown = json.loads(runs("show", "refund-7", "--json", db=db)[1])
    assert shown["state"] == {"seen": 120, "receipt": "<6 bytes>", "answer": "yes"}
    assert shown["output"] == "refund 120: yes"


def test_approve_and_reject_on_a_plain_graph_pass_a_dict(db, template, tmp_path):
    (iid,) = pending_ids(db, "refund-7")
    code, out, _ = runs("resume", "refund-7", "--approve", iid, "--graph", "runs_fixtures:refunds", "--json", db=db)
    assert code == 0 and json.loads(out)["output"] == "refund 120: {'approved': True}"
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(template, other / "runs.db")
    code, out, _ = runs("resume", "refund-7", "--reject", iid, "--reason", "too much", "--graph",
                        "runs_fixtures:refunds", "--json", db=other / "runs.db")
    assert code == 0 and json.loads(out)["output"] == "refund 120: {'approved': False, 'reason': 'too much'}"


@pytest.mark.parametrize("args,words", [
    (["approve-me", "--approve", "0123456789abcdef", "--graph", "runs_fixtures:agent"],
     ["no pending interrupt 0123456789abcdef", "pending: "]),
    (["approve-me", "--graph", "runs_fixtures:agent"], ["waits on interrupt", "--approve IID"]),
    (["chat-done", "--graph", "runs_fixtures:agent"], ["has completed"]),
    (["refund-7", "--respond", "REFUND", "1"], ["graph 'refunds', not by an agent", "--graph"]),
    (["refund-7", "--respond", "REFUND", "1", "--graph", "runs_fixtures:steps"],
     ["written by another graph", "name was 'refunds', now 'steps'"]),
    (["approve-me", "--approve", "x", "--graph", "no_such_module:agent"], ["cannot import 'no_such_module'"]),
    (["approve-me", "--approve", "x", "--graph", "runs_fixtures:execute"], ["is a Tool, not a ChatModelAgent"]),
    (["approve-me", "--respond", "x", "yes", "--graph", "runs_fixtures:agent"], ["'yes' is not JSON"]),
    (["nope", "--approve", "x", "--graph", "runs_fixtures:agent"], ["no run 'nope'"]),
])
def test_a_resume_that_cannot_be_done_is_refused_in_one_line(db, tmp_path, args, words):
    journal = tmp_path / "journal"
    if "REFUND" in args:
        args = [pending_ids(db, "refund-7")[0] if a == "REFUND" else a for a in args]
    refused(runs("resume", *args, db=db, RUNS_JOURNAL=str(journal)), *words)
    assert not journal.exists()


def test_a_later_version_of_the_graph_that_adds_a_node_resumes_the_run(db):
    """A deploy that cannot change what the run did (docs/resume.md, "Deploys"): `runs_fixtures:other` adds a node
    after the one the run is paused at."""
    (iid,) = pending_ids(db, "refund-7")
    code, out, err = runs("resume", "refund-7", "--approve", iid, "--graph", "runs_fixtures:other", "--json", db=db)
    assert code == 0, err
    assert json.loads(out)["output"] == "refund 120: {'approved': True}"


def test_an_agent_no_command_defines_needs_graph(db):
    refused(runs("resume", "approve-me", "--approve", pending_ids(db, "approve-me")[0], db=db),
            "agent 'ops-test', which no waypoint command defines", "--graph")


def test_without_graph_the_agent_comes_from_find_agent(db, tmp_path):
    """The path a chapter's run takes: the stored graph name is looked up with `find_agent`."""
    script = ("import sys, runs_fixtures, waypoint.cmd.agents as agents\n"
              "agents.find_agent = lambda name: runs_fixtures.build_agent() if name == 'ops-test' else None\n"
              "from waypoint.cmd.runs import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    journal = tmp_path / "journal"
    proc = subprocess.run([sys.executable, "-c", script, "resume", "approve-me", "--approve",
                           pending_ids(db, "approve-me")[0], "--db", str(db)], capture_output=True, text=True,
                          timeout=60, env=_env(RUNS_JOURNAL=str(journal)))
    assert proc.returncode == 0, proc.stderr
    assert "[tool result] ran echo hello" in proc.stdout and journal.read_text().count("execute") == 1


def fixture(db: Path, *args: str) -> None:
    subprocess.run([sys.executable, str(PROCS / "runs_fixtures.py"), str(db), *args], env=_env(), timeout=60)


def test_a_run_whose_process_is_gone_from_this_host_is_said_so_and_taken_over_without_a_guess(db):
    """Its lease is live, but its owner is a PID of this host that is gone: the engine knows (engine/keep/owners.py), so
    `show` says so instead of "unless it died", and `resume` takes it over without --takeover."""
    fixture(db, "crash", "job-1", "60")
    code, out, _ = runs("show", "job-1", db=db)
    assert code == 0 and "status    running" in out and "s left)" in out
    (lease,) = [line for line in out.splitlines() if line.startswith("  lease ")]
    assert lease.endswith("on this host, and it is gone: resuming it takes it over at once"), lease
    assert "unless it died" not in out and "--takeover" not in out
    assert "take it over (its process is gone): waypoint runs" in out
    code, out, err = runs("resume", "job-1", "--graph", "runs_fixtures:steps", db=db)
    assert code == 0, err
    assert out.splitlines()[0].startswith("resuming run job-1 (graph steps) in this process, taking it over from ")
    assert '[output] "worked on job"' in out and out.splitlines()[-1] == "run job-1 completed at version 3"


def test_takeover_of_a_run_whose_process_is_alive_is_one_refusal(db, tmp_path):
    """A live owner on this host: `resume --takeover` is refused before anything runs, in one line (it printed a
    "resuming" line, the engine's refusal and the run's status), and `show` says that process runs it."""
    gate = tmp_path / "release"
    holder = subprocess.Popen([sys.executable, str(PROCS / "runs_fixtures.py"), str(db), "hold", "job-3", str(gate)],
                              env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().split() == ["holding", str(holder.pid)]  # inside its node, lease held
        code, out, _ = runs("show", "job-3", db=db)
        assert code == 0 and f"process {holder.pid} on this host, and it is alive: that process is running it" in out
        assert "unless it died" not in out and "--takeover" not in out
        for extra in ((), ("--takeover",)):
            result = runs("resume", "job-3", "--graph", "runs_fixtures:steps", *extra, db=db)
            line = refused(result, f"process {holder.pid} on this host, and it is alive", "wait for it")
            assert result[1] == ""  # nothing else printed: nothing ran
            assert ("--takeover takes over only a process that is gone" in line) == bool(extra)
    finally:
        gate.touch()
        _, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    assert runs("show", "job-3", "--json", db=db)[1].count('"status": "completed"') == 1


def test_a_run_held_on_another_host_needs_takeover(db):
    """What this host cannot see stays the caller's word: --takeover, said as such."""
    fixture(db, "crash-elsewhere", "job-4", "60")
    code, out, _ = runs("show", "job-4", db=db)
    assert code == 0 and "held by another-host:" in out and "on another host, is running it, unless it died" in out
    assert "if its process (on another host) is dead: waypoint runs" in out and "--takeover" in out
    refused(runs("resume", "job-4", "--graph", "runs_fixtures:steps", db=db), "another host", "--takeover")
    code, out, err = runs("resume", "job-4", "--graph", "runs_fixtures:steps", "--takeover", db=db)
    assert code == 0, err
    assert '[output] "worked on job"' in out


def test_a_crashed_run_whose_lease_expired_is_shown_so_and_continues(db):
    fixture(db, "crash", "job-2", "0.1")
    time.sleep(0.2)
    code, out, _ = runs("list", "--status", "running", db=db)
    assert code == 0 and "running (lease expired)" in out
    code, out, _ = runs("show", "job-2", db=db)
    assert "lease     expired at" in out and "the process that ran it is gone" in out
    code, out, err = runs("resume", "job-2", "--graph", "runs_fixtures:steps", "--json", db=db)
    assert code == 0, err
    assert json.loads(out)["status"] == "completed"


# --- deleting ------------------------------------------------------------------------------------------------

def test_delete_needs_yes_without_a_terminal(db):
    refused(runs("delete", "chat-done", db=db), "without confirmation", "--yes")
    assert runs("history", "chat-done", db=db)[0] == 0  # still there
    code, out, _ = runs("delete", "chat-done", "--yes", db=db)
    assert code == 0 and out.strip() == "deleted run chat-done (3 versions)"
    refused(runs("history", "chat-done", db=db), "no run 'chat-done'")
    refused(runs("delete", "chat-done", "--yes", db=db), "no run 'chat-done'")


@pytest.mark.parametrize("answer,deleted", [("y", True), ("n", False)])
def test_delete_asks_on_a_terminal(db, answer, deleted):
    main, replica = pty.openpty()
    try:
        os.write(main, f"{answer}\n".encode())
        code, out, err = runs("delete", "chat-done", db=db, stdin=replica)
    finally:
        os.close(main)
        os.close(replica)
    assert "Delete run chat-done (completed, 3 version(s)) for good? [y/N]" in out
    assert (code == 0) is deleted, err
    assert (runs("history", "chat-done", db=db)[0] == 1) is deleted


# --- what the database holds -----------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["list"], ["show", "x"], ["history", "x"], ["delete", "x", "--yes"],
                                     ["resume", "x", "--graph", "runs_fixtures:agent"]])
def test_a_missing_database_is_an_error_and_is_not_created(tmp_path, command):
    missing = tmp_path / "nowhere" / "runs.db"
    refused(runs(*command, "--db", missing), "no database at", "--db")
    assert not missing.parent.exists()


def test_a_missing_database_by_default_is_not_created(tmp_path):
    proc = subprocess.run([str(WAYPOINT), "runs", "list"], capture_output=True, text=True, cwd=tmp_path, env=_env())
    refused((proc.returncode, proc.stdout, proc.stderr), ".waypoint/waypoint.db", "WAYPOINT_DB")
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_waypoint_database_is_refused_untouched(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    refused(runs("list", "--db", text), "cannot be read as a SQLite database")
    refused(runs("list", "--db", tmp_path), "is not a file")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    before = other.read_bytes()
    refused(runs("show", "x", "--db", other), "not a Waypoint database")
    assert other.read_bytes() == before


def test_an_unknown_run_or_version(db):
    refused(runs("show", "nope", db=db), "no run 'nope'", "waypoint runs")
    refused(runs("history", "nope", db=db), "no run 'nope'")
    refused(runs("show", "approve-me", "--version", "9", db=db), "no version 9", "versions 1-4")


def test_a_corrupted_record_is_one_line_and_the_rest_still_reads(db):
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE waypoint_checkpoints SET header = x'00112233' WHERE checkpoint_id = 'reject-me' "
                     "AND version = 4")
    refused(runs("show", "reject-me", db=db), "run 'reject-me' version 4", "history reject-me")
    refused(runs("resume", "reject-me", "--approve", "x", "--graph", "runs_fixtures:agent", db=db), "version 4")
    code, out, err = runs("list", db=db)
    assert code == 0 and "(unreadable)" in out and "reject-me" in err and "Traceback" not in err
    assert runs("history", "reject-me", db=db)[0] == 0
    code, out, _ = runs("show", "reject-me", "--version", "3", db=db)  # an older version still reads
    assert code == 0 and "3 of 4 (an older one)" in out


@pytest.mark.parametrize("args", [[], ["list", "--limit", "0"], ["list", "--status", "bogus"], ["show"],
                                  ["frobnicate"]])
def test_usage_errors_exit_2(db, args):
    code, _, err = runs(*args)
    assert code == 2 and "usage: waypoint runs" in err and "Traceback" not in err


# --- words a newcomer found wrong -------------------------------------------------------------------------

def test_options_before_the_command_belong_to_it(db):
    first = subprocess.run([str(WAYPOINT), "--json", "runs", "list", "--db", str(db)], capture_output=True,
                           text=True, timeout=60, env=_env())
    assert first.returncode == 0, first.stderr
    proc = subprocess.run([str(WAYPOINT), "--json", "--db", str(db), "runs", "list"], capture_output=True, text=True,
                          timeout=60, env=_env())
    assert proc.returncode == 0 and {r["checkpoint_id"] for r in json.loads(proc.stdout)} >= {"approve-me"}


def test_advice_names_the_database_it_was_given(db):
    line = refused(runs("show", "nope", db=db), "no run 'nope'")
    assert f"--db {db}" in line and "list` shows the runs" in line
    line = refused(runs("resume", "nope", "--approve", "x", "--graph", "runs_fixtures:agent", db=db), "no run 'nope'")
    assert f"--db {db}" in line


def test_runs_reads_a_postgres_database_by_url(pg_url):
    """What `waypoint worker` and `waypoint serve` store, an operator reads with the same --db."""
    import asyncio

    from waypoint.engine import END, START, Graph
    from waypoint.stores import SQLStore

    async def make():
        store = SQLStore(pg_url)
        g = Graph(name="pgraph")
        g.add_node("a", lambda x: x + 1)
        g.add_edge(START, "a")
        g.add_edge("a", END)
        await g.compile(store=store).ainvoke(1, checkpoint_id="on-postgres")
        await store.close()

    asyncio.run(make())
    proc = subprocess.run([str(WAYPOINT), "runs", "list", "--json", "--db", pg_url], capture_output=True, text=True,
                          timeout=60, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert [(r["checkpoint_id"], r["status"]) for r in json.loads(proc.stdout)] == [("on-postgres", "completed")]
    bad = pg_url.replace("postgresql+asyncpg://", "postgresql+asyncpg://nobody:secret@", 1) if "@" not in pg_url \
        else pg_url.rsplit("/", 1)[0] + "/no_such_database"
    proc = subprocess.run([str(WAYPOINT), "runs", "list", "--db", bad], capture_output=True, text=True, timeout=60,
                          env=_env())
    assert proc.returncode == 1 and "cannot open the database" in proc.stderr and "secret" not in proc.stderr


def test_show_writes_hidden_characters_as_codes_and_warns(tmp_path):
    """A model's bidi controls, zero-width characters, terminal escapes and lone surrogates are shown as
    \\uXXXX (never obeyed by the terminal), in the arguments, the tool name and the run ID."""
    script = r'''
import asyncio, sys
from waypoint.engine import ChatModelAgent, Message, Runner, ToolCall, tool
from waypoint.engine.models import ScriptedChatModel
from waypoint.middleware import ApprovalMiddleware
from waypoint.stores import SQLiteStore

@tool(name="exe\u200bcute")
def execute(command: str) -> str:
    """Run it."""
    return command

ARGS = '{"command": "echo hello \u202e\u2066; rm -rf ~/ \u2069 \u2066#\u2069\u202c \\u001b[2J ls \\ud800"}'
model = ScriptedChatModel([Message.assistant("ok", tool_calls=[ToolCall(id="c1", name="exe\u200bcute", arguments=ARGS)])])
agent = ChatModelAgent(name="ops-test", model=model, tools=[execute],
                       middlewares=[ApprovalMiddleware(tools=lambda n: True)])

async def main():
    async for _ in Runner(agent, store=SQLiteStore(sys.argv[1])).run("go", checkpoint_id="bidi \u202erun"):
        pass

asyncio.run(main())
'''
    db = tmp_path / "runs.db"
    subprocess.run([sys.executable, "-c", script, str(db)], check=True, env=_env(), timeout=60)
    code, out, err = runs("show", "bidi \u202erun", db=db)
    assert code == 0 and "status    interrupted" in out, err
    for hidden in ("\u202e", "\u2066", "\u200b", "\x1b"):
        assert hidden not in out, repr(hidden)
    for shown in ("run bidi \\u202erun", "exe\\u200bcute", "echo hello \\u202e\\u2066; rm -rf ~/", "\\u001b[2J",
                  "ls \\ud800"):
        assert shown in out, (shown, out)
    assert out.count("invisible or direction-changing") == 2, out  # at the call, and at its pending approval
    code, out, _ = runs("list", db=db)
    assert code == 0 and "bidi \\u202erun" in out and "\u202e" not in out


# --- docs/cli.md's session, made by its own code ------------------------------------------------------------------

def _normal(text: str) -> list[str]:
    """Lines with what differs from run to run written as placeholders: interrupt IDs, times, column padding."""
    text = re.sub(r"\b[0-9a-f]{16}\b", "IID", text)
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "TIME", text)
    return [" ".join(line.split()) for line in text.strip().splitlines()]


def test_the_session_docs_cli_md_shows_is_made_by_the_code_it_shows(tmp_path):
    """docs/cli.md's modules and the script it says makes `session-1` and `refund-7`, run as written; then its
    samples, command by command, are what the commands print (IDs and times aside)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    for block in re.findall(r"```py\n(.*?)```", page, re.S):
        name = re.match(r"# (\w+\.py)", block)
        if name:
            (tmp_path / name.group(1)).write_text(block)
    assert {p.name for p in tmp_path.glob("*.py")} == {"ops.py", "refunds.py", "make_runs.py"}
    samples = {}
    for block in re.findall(r"```text\n(.*?)```", page, re.S):
        for command, output in re.findall(r"^\$ (.+)\n((?:(?!\$ ).*\n?)*)", block, re.M):
            samples.setdefault(command, output)
    made = subprocess.run([sys.executable, "make_runs.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert made.returncode == 0, made.stderr
    assert _normal(made.stdout) == _normal(samples["python make_runs.py"])
    ids = dict(line.split(" waits for ") for line in made.stdout.splitlines())
    approve, respond = ids["session-1"].split(":")[0], ids["refund-7"]
    doc_ids = re.findall(r"\b[0-9a-f]{16}\b", samples["python make_runs.py"])
    for command in ("waypoint runs list", "waypoint runs show session-1", "waypoint runs show refund-7",
                    f"waypoint runs resume session-1 --approve {doc_ids[0]} --graph ops:build_agent",
                    f"waypoint runs resume refund-7 --respond {doc_ids[1]} '\"yes\"' --graph refunds:graph",
                    "waypoint runs history session-1"):
        words = shlex.split(command.replace(doc_ids[0], approve).replace(doc_ids[1], respond))
        out = subprocess.run([str(WAYPOINT), *words[1:]], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, (command, out.stderr)
        assert _normal(out.stdout) == _normal(samples[command]), command
