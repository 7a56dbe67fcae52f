"""Deploys (docs/resume.md, "Deploys"): a run paused by one process under one version of a graph or agent is
resumed by another process that built the next version. A change that cannot change what the run already did
continues it; one that can is refused, naming the run and what changed, and nothing is written."""

from __future__ import annotations

import json
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
