"""Deploys (docs/resume.md, "Deploys"): a run paused by one process under one version of a graph or agent is
resumed by another process that built the next version. A change that cannot change what the run already did
continues it; one that can is refused, naming the run and what changed, and nothing is written."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

PROC = Path(__file__).parent / "procs" / "deploy_app.py"


def deploy(tmp_path: Path, version: str, *args: str) -> dict:
    env = {**__import__("os").environ, "EFFECTS": str(tmp_path / "effects.txt")}
    out = subprocess.run([sys.executable, str(PROC), str(tmp_path / "app.db"), version, *args], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_a_graph_paused_under_v1_is_finished_by_a_v2_that_added_a_node(tmp_path):
    iid = deploy(tmp_path, "graph-v1", "pause")["iid"]
    assert deploy(tmp_path, "graph-v2-added", "resume", iid) == {"out": "done 30"}  # (1+1+1) * 10: audit ran


def test_a_deploy_that_renamed_the_node_a_run_is_paused_at_is_refused_naming_it(tmp_path):
    iid = deploy(tmp_path, "graph-v1", "pause")["iid"]
    got = deploy(tmp_path, "graph-v2-renamed", "resume", iid)
    assert got["kind"] == "GraphMismatch" and "run 'run-1'" in got["error"], got
    assert "node 'ask', where the run is, is gone" in got["error"] and "migrate=" in got["error"]
    assert deploy(tmp_path, "graph-v1", "resume", iid) == {"out": "done 3"}  # untouched: v1 still finishes it


def test_an_approval_paused_under_v1_is_approved_under_a_v2_with_a_new_tool_and_instructions_and_runs_once(
        tmp_path):
    iid = deploy(tmp_path, "agent-v1", "pause")["iid"]
    assert effects(tmp_path) == []
    got = deploy(tmp_path, "agent-v2", "resume", iid)
    assert "out" in got, got
    assert effects(tmp_path) == ["echo deployed"]


@pytest.mark.parametrize("later", ["agent-v2-dropped"])
def test_a_deploy_that_removed_a_pending_calls_tool_is_refused_naming_the_tool(tmp_path, later):
    iid = deploy(tmp_path, "agent-v1", "pause")["iid"]
    got = deploy(tmp_path, later, "resume", iid)
    assert got.get("kind") == "GraphMismatch", got
    assert "run 'run-1'" in got["error"] and "tool 'execute'" in got["error"], got
    assert effects(tmp_path) == []
    deploy(tmp_path, "agent-v1", "resume", iid)  # nothing was written: the version that has the tool still can
    assert effects(tmp_path) == ["echo deployed"]


# --- moving a refused run on (update_state's goto= / answer= / values; docs/resume.md, "Deploys") ---------------

def test_a_run_paused_at_a_renamed_node_is_moved_to_the_new_node_and_finishes_under_v2(tmp_path):
    iid = deploy(tmp_path, "graph-v1", "pause")["iid"]
    refused = deploy(tmp_path, "graph-v2-renamed", "resume", iid)
    assert "goto=NODE" in refused["error"] and "waypoint runs migrate run-1" in refused["error"], refused
    moved = deploy(tmp_path, "graph-v2-renamed", "migrate", json.dumps({"goto": "ask_again"}))
    assert moved["status"] == "interrupted" and moved["origin"].startswith("run-1@"), moved
    assert moved["origin"].endswith(" migrate goto ask_again (from ask)"), moved
    again = deploy(tmp_path, "graph-v2-renamed", "resume")["paused"]  # the new node runs, and asks its own question
    assert again != iid
    assert deploy(tmp_path, "graph-v2-renamed", "resume", again) == {"out": "done 3"}
    assert effects(tmp_path) == ["prepare 1"]  # the step before the pause never ran again


def test_a_pending_call_whose_tool_was_removed_is_answered_on_its_behalf_and_the_run_finishes_under_v2(tmp_path):
    paused = deploy(tmp_path, "agent-v1", "pause")
    refused = deploy(tmp_path, "agent-v2-dropped", "resume", paused["iid"])
    assert "answer=" in refused["error"] and "--answer CALL_ID JSON" in refused["error"], refused
    moved = deploy(tmp_path, "agent-v2-dropped", "migrate", json.dumps({"answer": {paused["call"]: "ran by hand"}}))
    assert moved["origin"].endswith(f" migrate answer {paused['call']} (execute)"), moved
    done = deploy(tmp_path, "agent-v2-dropped", "resume")  # a plain resume, in another process, continues with it
    assert "execute returned: ran by hand" in done["out"], done  # the model read the answer given for the call
    assert effects(tmp_path) == []  # and the tool never ran


def test_answering_a_call_whose_tool_is_still_there_is_refused_and_nothing_is_written(tmp_path):
    paused = deploy(tmp_path, "agent-v1", "pause")
    got = deploy(tmp_path, "agent-v2", "migrate", json.dumps({"answer": {paused["call"]: "x"}}))
    assert got["kind"] == "WaypointError" and "still has its tool 'execute'" in got["error"], got
    assert "--respond" in got["error"]
    assert "out" in deploy(tmp_path, "agent-v2", "resume", paused["iid"])  # untouched: the approval still answers it
    assert effects(tmp_path) == ["echo deployed"]


STATE = Path(__file__).parent / "procs" / "state_app.py"


def tally(tmp_path: Path, version: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, str(STATE), str(tmp_path / "state.db"), version, *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_state_field_that_changed_type_is_refused_naming_it_until_it_is_given_a_value_of_the_new_type(tmp_path):
    iid = tally(tmp_path, "v1", "pause")["iid"]
    got = tally(tmp_path, "v2-type", "resume", iid)
    assert got["kind"] == "GraphMismatch" and "run 'run-1'" in got["error"], got
    assert "state field 'count' changed type: it was int, now str" in got["error"]
    assert "update_state('run-1', {'count': <a str>})" in got["error"] and "runs migrate run-1" in got["error"]
    bad = tally(tmp_path, "v2-type", "migrate", json.dumps({"count": 3}))  # not a str: refused, nothing written
    assert bad["kind"] == "WaypointError" and "does not fit its new type" in bad["error"], bad
    assert tally(tmp_path, "v2-type", "migrate", json.dumps({"note": "x"}))["kind"] == "GraphMismatch"  # no count
    moved = tally(tmp_path, "v2-type", "migrate", json.dumps({"count": "three"}))
    assert moved["origin"] == "run-1@3 migrate state count (int -> str)" and moved["version"] == 4, moved
    assert tally(tmp_path, "v2-type", "resume", iid) == {"out": "'three' 'bumped'"}  # the same pause answers it


def test_a_refused_state_change_writes_nothing_and_the_version_that_wrote_the_run_still_finishes_it(tmp_path):
    iid = tally(tmp_path, "v1", "pause")["iid"]
    assert tally(tmp_path, "v2-type", "resume", iid)["kind"] == "GraphMismatch"
    assert tally(tmp_path, "v1", "resume", iid) == {"out": "0 'bumped'"}


def test_a_state_field_the_run_holds_that_is_gone_is_refused_and_a_migration_drops_it(tmp_path):
    iid = tally(tmp_path, "v1", "pause")["iid"]
    got = tally(tmp_path, "v2-removed", "resume", iid)
    assert got["kind"] == "GraphMismatch" and "state field 'note' (of type str) is gone" in got["error"], got
    assert tally(tmp_path, "v2-removed", "migrate", "{}")["origin"] == "run-1@3 migrate drop note"
    assert tally(tmp_path, "v2-removed", "resume", iid) == {"out": "0 None"}


def test_a_field_added_with_a_default_is_compatible_and_one_without_needs_a_value(tmp_path):
    iid = tally(tmp_path, "v1", "pause")["iid"]
    assert tally(tmp_path, "v2-added", "resume", iid) == {"out": "0 'bumped'"}
    (tmp_path / "state.db").unlink()
    iid = tally(tmp_path, "v1", "pause")["iid"]
    got = tally(tmp_path, "v2-required", "resume", iid)
    assert "state field 'owner' (str) was added without a default" in got["error"], got
    assert tally(tmp_path, "v2-required", "migrate", json.dumps({"owner": "ops"}))["status"] == "interrupted"
    assert tally(tmp_path, "v2-required", "resume", iid) == {"out": "0 'bumped'"}


def test_a_pydantic_state_whose_field_changed_type_is_refused_as_a_mismatch_not_as_a_damaged_record(tmp_path):
    iid = tally(tmp_path, "model-v1", "pause")["iid"]
    got = tally(tmp_path, "model-v2-type", "resume", iid)
    assert got["kind"] == "GraphMismatch" and "'count' changed type: it was int, now str" in got["error"], got
    tally(tmp_path, "model-v2-type", "migrate", json.dumps({"count": "x"}))
    assert tally(tmp_path, "model-v2-type", "resume", iid) == {"out": "'x' 'bumped'"}


def test_a_run_written_before_state_schemas_were_kept_resumes_and_what_it_holds_is_still_compared(tmp_path):
    iid = tally(tmp_path, "v1", "pause", "legacy")["iid"]  # its stored structure has no state schema
    assert tally(tmp_path, "v1", "resume", iid) == {"out": "0 'bumped'"}
    (tmp_path / "state.db").unlink()
    iid = tally(tmp_path, "v1-dag", "pause", "legacy")["iid"]  # a DAG needs the same fingerprint: still the same
    assert tally(tmp_path, "v1-dag", "resume", iid) == {"out": "0 'bumped'"}
    (tmp_path / "state.db").unlink()
    iid = tally(tmp_path, "v1", "pause", "legacy")["iid"]
    assert tally(tmp_path, "v2-type", "resume", iid) == {"out": "0 'bumped'"}  # types unknown: not compared
    (tmp_path / "state.db").unlink()
    iid = tally(tmp_path, "v1", "pause", "legacy")["iid"]
    got = tally(tmp_path, "v2-removed", "resume", iid)  # but the fields it holds are
    assert got["kind"] == "GraphMismatch" and "state field 'note' is gone" in got["error"], got


def runs(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """`waypoint runs ... --db <the test's database>` as an operator types it, next to deploy_app.py (importable)."""
    env = {**__import__("os").environ, "EFFECTS": str(tmp_path / "effects.txt"), "NO_COLOR": "1"}
    waypoint = Path(sys.executable).with_name("waypoint")
    out = subprocess.run([str(waypoint), "runs", *args, "--db", str(tmp_path / "app.db")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=PROC.parent)
    return out.returncode, out.stdout, out.stderr


def test_runs_migrate_answers_a_removed_tools_call_and_runs_resume_finishes_it_without_running_the_tool(tmp_path):
    paused = deploy(tmp_path, "agent-v1", "pause")
    graph = "deploy_app:agent_v2_dropped"
    code, _, err = runs(tmp_path, "migrate", "run-1", "--graph", graph)  # no answer: refused, naming what to give
    assert code == 1 and "--answer CALL_ID JSON" in err and "nothing was written" in err, err
    code, out, err = runs(tmp_path, "migrate", "run-1", "--graph", graph, "--answer", paused["call"], '"by hand"',
                          "--dry-run")
    assert code == 0 and "migrate answer call_1 (execute)" in out and "nothing written (--dry-run)" in out, out + err
    code, out, err = runs(tmp_path, "migrate", "run-1", "--graph", graph, "--answer", paused["call"], '"by hand"',
                          "--json")
    assert code == 0, err
    written = json.loads(out)
    assert written["written"] and written["status"] == "running" and written["origin"].endswith("answer call_1 (execute)")
    code, out, err = runs(tmp_path, "resume", "run-1", "--graph", graph)
    assert code == 0 and "responded execute (call call_1)" in out and "execute returned: by hand" in out, out + err
    assert effects(tmp_path) == []


def test_runs_migrate_refuses_a_node_the_new_version_does_not_have_and_moves_the_run_to_one_it_has(tmp_path):
    iid = deploy(tmp_path, "graph-v1", "pause")["iid"]
    graph = "deploy_app:graph_v2_renamed"
    code, out, err = runs(tmp_path, "resume", "run-1", "--graph", graph, "--respond", iid, "true")
    assert code == 1 and "waypoint runs migrate run-1" in err, err
    code, _, err = runs(tmp_path, "migrate", "run-1", "--graph", graph, "--goto", "nope")
    assert code == 1 and "goto='nope' is not a node" in err and "ask_again" in err, err
    code, out, err = runs(tmp_path, "migrate", "run-1", "--graph", graph, "--goto", "ask_again")
    assert code == 0 and "migrated at version 4 (interrupted, from run-1@3 migrate goto ask_again (from ask))" in out, err
    again = deploy(tmp_path, "graph-v2-renamed", "resume")["paused"]
    code, out, err = runs(tmp_path, "resume", "run-1", "--graph", graph, "--respond", again, "true")
    assert code == 0 and "[output] \"done 3\"" in out, out + err
    assert effects(tmp_path) == ["prepare 1"]


def test_runs_migrate_gives_a_state_field_that_changed_type_its_new_value(tmp_path):
    iid = tally(tmp_path, "v1", "pause")["iid"]
    graph, db = "state_app:tally_v2_type", str(tmp_path / "state.db")
    waypoint = Path(sys.executable).with_name("waypoint")

    def migrate(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(waypoint), "runs", "migrate", "run-1", "--db", db, "--graph", graph, *args],
                              capture_output=True, text=True, timeout=120, cwd=STATE.parent)

    bad = migrate("--values", "[1]")
    assert bad.returncode == 1 and "--values takes a JSON object" in bad.stderr, bad.stderr
    missing = migrate("--values", "{}")
    assert missing.returncode == 1 and "state field 'count' changed type: it was int, now str" in missing.stderr
    done = migrate("--values", '{"count": "seven"}')
    assert done.returncode == 0 and "migrate state count (int -> str)" in done.stdout, done.stderr
    assert tally(tmp_path, "v2-type", "resume", iid) == {"out": "'seven' 'bumped'"}


def test_keeping_the_state_schema_leaves_the_graph_fingerprint_what_it_was(tmp_path):
    """The schema is stored beside the structure, not in the fingerprint: a run written before it was kept and one
    written now by the same graph have one fingerprint (what `runs show`, `runs resume` and recovery match on)."""
    waypoint = Path(sys.executable).with_name("waypoint")
    prints = []
    for legacy in ((), ("legacy",)):
        tally(tmp_path, "v1", "pause", *legacy)
        shown = subprocess.run([str(waypoint), "runs", "show", "run-1", "--db", str(tmp_path / "state.db"), "--graph",
                                "state_app:tally_v1", "--json"], capture_output=True, text=True, timeout=120,
                               cwd=STATE.parent)
        assert shown.returncode == 0, shown.stderr
        prints.append(json.loads(shown.stdout)["fingerprint"])
        (tmp_path / "state.db").unlink()
    assert prints[0] == prints[1]


def test_a_service_running_v2_shows_and_resumes_a_run_paused_under_v1(tmp_path):
    """A deploy of `waypoint serve` whose graph gained a node (another fingerprint): v2's API shows the run v1
    paused as its own graph's, and resumes it through v2 (the engine judges the deploy at the resume)."""
    from service_support import ServeProcess

    iid = deploy(tmp_path, "graph-v1", "pause")["iid"]
    with sqlite3.connect(tmp_path / "app.db") as conn:
        (paused_at,), = conn.execute("SELECT MAX(version) FROM waypoint_checkpoints WHERE checkpoint_id = 'run-1'")
    serve = ServeProcess(tmp_path, agents="deploy_app:graph_v2_added", db=str(tmp_path / "app.db"),
                         env={"EFFECTS": str(tmp_path / "effects.txt")})
    try:
        with serve.client() as client:
            answer = client.post("/runs/run-1/resume", json={"answers": [  # the first request: nothing read yet
                {"interrupt_id": iid, "action": "respond", "output": True}], "expected_version": paused_at,
                "wait": True})
            assert answer.status_code == 200 and answer.json()["status"] == "completed", answer.text
            run = client.get("/runs/run-1").json()
            assert run["graph"] == "deploy" and run["output"] == "done 30", run  # (1+1+1) * 10: v2's audit ran
    finally:
        serve.stop()
