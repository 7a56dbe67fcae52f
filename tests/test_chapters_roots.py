"""The project root a chapter session's tools are confined to travels with the session (issue 28).

Driven as a user drives it: the real CLI in subprocesses, the offline model, one database for all the
processes (`WAYPOINT_DB`). A session is started in its project directory and answered from another one —
with `waypoint runs resume` or `waypoint chapter N --session` — and the side effect of the approved command
must land in the session's project root and nowhere else. A session whose root cannot be known (stored
before roots were stored with runs, or whose directory is gone) is refused in one line naming the run and
`--project-root`, and nothing runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

COMMAND = "echo ran >> side.txt"
ASK = f"run the command {COMMAND}\n"

OLD_SESSION = """\
import asyncio, sys
from waypoint.engine import Runner
from waypoint.cmd.console import open_store
from waypoint.cmd.fstools import ProjectRoot
from waypoint.cmd.chapters.ch07 import build_agent

async def main(db, root, session, text):
    # what chapter 7 wrote before runs kept their project root: the agent confined to `root`, and nothing
    # in the run that says so
    runner = Runner(build_agent(root=ProjectRoot(root)), store=open_store(db), streaming=True)
    async for _ in runner.run(text, checkpoint_id=session):
        pass
    await runner.store.close()

asyncio.run(main(*sys.argv[1:]))
"""


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """The session's project directory and the approver's working directory (both empty)."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    return project.resolve(), elsewhere.resolve()


def waypoint(tmp_path: Path, *args: str, cwd: Path, stdin: str = "", project_root: Path | None = None,
             ) -> subprocess.CompletedProcess:
    """`waypoint ARGS` in `cwd`, on the test's database; PROJECT_ROOT only when given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PROJECT_ROOT", "WAYPOINT_"))}
    env.update(WAYPOINT_DB=str(tmp_path / "chapters.db"), NO_COLOR="1")
    if project_root is not None:
        env["PROJECT_ROOT"] = str(project_root)
    return subprocess.run([sys.executable, "-m", "waypoint.cmd.main", *args], input=stdin, capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=60)


def shown(tmp_path: Path, session: str, cwd: Path) -> dict:
    out = waypoint(tmp_path, "runs", "show", session, "--json", cwd=cwd)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def refused(out: subprocess.CompletedProcess, *words: str) -> str:
    """Exit 1, one error line on stderr (after a chapter's model banner; no traceback) holding `words`; the line."""
    assert out.returncode == 1, (out.stdout, out.stderr)
    lines = [line for line in out.stderr.strip().splitlines() if not line.startswith("offline model:")]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.stderr, out.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def side_effects(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.rglob("side.txt"))


def paused(tmp_path: Path, project: Path, session: str) -> str:
    """Chapter 7 started in `project` (its working directory, no PROJECT_ROOT), paused for approval of
    COMMAND, the person gone (EOF at the prompt); the interrupt ID."""
    first = waypoint(tmp_path, "chapter", "7", "--session", session, cwd=project, stdin=ASK)
    assert first.returncode == 0, first.stderr
    assert "Approve this action?" in first.stdout and side_effects(tmp_path) == []
    (pending,) = shown(tmp_path, session, project)["interrupts"]
    return pending["id"]


def test_approved_from_another_directory_the_command_runs_in_the_sessions_project_root(tmp_path):
    project, elsewhere = dirs(tmp_path)
    iid = paused(tmp_path, project, "s7")

    page = waypoint(tmp_path, "runs", "show", "s7", cwd=elsewhere)
    assert page.returncode == 0, page.stderr
    assert f"\n  root      {project}\n" in page.stdout
    assert shown(tmp_path, "s7", elsewhere)["project_root"] == str(project)

    # what would confine the tools elsewhere is refused before anything runs
    refused(waypoint(tmp_path, "runs", "resume", "s7", "--approve", iid, "--project-root", str(elsewhere),
                     cwd=elsewhere), "'s7'", str(project), "--project-root")
    refused(waypoint(tmp_path, "runs", "resume", "s7", "--approve", iid, "--graph",
                     "waypoint.cmd.chapters.ch07:build_agent", cwd=elsewhere), "'s7'", str(project), "--graph")
    assert side_effects(tmp_path) == []

    done = waypoint(tmp_path, "runs", "resume", "s7", "--approve", iid, cwd=elsewhere, project_root=elsewhere)
    assert done.returncode == 0, done.stderr
    assert f"project root {project}" in done.stdout.splitlines()[0]
    assert "completed" in done.stdout.splitlines()[-1]
    assert side_effects(tmp_path) == [project / "side.txt"] and (project / "side.txt").read_text() == "ran\n"
    assert list(elsewhere.iterdir()) == []
    assert shown(tmp_path, "s7", elsewhere)["project_root"] == str(project)  # the resume stored it again


def test_a_session_continued_from_another_directory_keeps_its_project_root(tmp_path):
    project, elsewhere = dirs(tmp_path)
    paused(tmp_path, project, "s7")

    other = tmp_path / "other"
    other.mkdir()
    refused(waypoint(tmp_path, "chapter", "7", "--session", "s7", cwd=elsewhere, stdin="y\n", project_root=other),
            "s7", str(project), "PROJECT_ROOT")
    assert side_effects(tmp_path) == []

    again = waypoint(tmp_path, "chapter", "7", "--session", "s7", cwd=elsewhere, stdin="y\n")
    assert again.returncode == 0, again.stderr
    assert f"Project root: {project}" in again.stdout and "✓ Approved, executing..." in again.stdout
    assert side_effects(tmp_path) == [project / "side.txt"] and list(elsewhere.iterdir()) == []

    more = waypoint(tmp_path, "chapter", "7", "--session", "s7", cwd=elsewhere, stdin="run the command pwd\ny\n")
    assert more.returncode == 0, more.stderr
    assert f"[tool result] {project}" in more.stdout  # the next turn's command too
    assert list(elsewhere.iterdir()) == []


def test_a_crashed_turn_continued_by_runs_resume_works_in_the_sessions_project_root(tmp_path):
    """A plain continue (no answer): chapter 9's turn killed mid-call, finished from another directory."""
    project, elsewhere = dirs(tmp_path)
    first = waypoint(tmp_path, "chapter", "9", "--session", "s9", "--crash-after", "0", cwd=project,
                     stdin="process one\n")
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert shown(tmp_path, "s9", elsewhere)["project_root"] == str(project)
    done = waypoint(tmp_path, "runs", "resume", "s9", "--takeover", cwd=elsewhere)  # its process is dead: we saw it
    assert done.returncode == 0, done.stderr
    assert [line.split()[:2] for line in (project / "batch.log").read_text().splitlines()] == [
        ["started", "one"], ["started", "one"], ["finished", "one"]]
    assert list(elsewhere.iterdir()) == []


def test_a_session_stored_without_its_root_is_refused_until_project_root_names_it(tmp_path):
    project, elsewhere = dirs(tmp_path)
    old = subprocess.run([sys.executable, "-c", OLD_SESSION, str(tmp_path / "chapters.db"), str(project), "old",
                          ASK.strip()], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")})
    assert old.returncode == 0, old.stderr
    (pending,) = shown(tmp_path, "old", elsewhere)["interrupts"]
    assert shown(tmp_path, "old", elsewhere)["project_root"] is None
    page = waypoint(tmp_path, "runs", "show", "old", cwd=elsewhere)
    assert "\n  root      unknown" in page.stdout and "--project-root DIR" in page.stdout

    refused(waypoint(tmp_path, "runs", "resume", "old", "--approve", pending["id"], cwd=elsewhere),
            "'old'", "--project-root DIR")
    refused(waypoint(tmp_path, "chapter", "7", "--session", "old", cwd=elsewhere, stdin="y\n"),
            "old", "--project-root DIR")
    refused(waypoint(tmp_path, "runs", "resume", "old", "--approve", pending["id"], "--project-root",
                     str(tmp_path / "missing"), cwd=elsewhere), str(tmp_path / "missing"), "not a directory")
    assert side_effects(tmp_path) == []

    asked = waypoint(tmp_path, "chapter", "7", "--session", "old", "--project-root", str(project), cwd=elsewhere)
    assert asked.returncode == 0, asked.stderr  # EOF at the prompt: nothing ran, so the root is not stored yet
    assert f"Project root: {project}\n" in asked.stdout and "Approve this action?" in asked.stdout
    assert f"Resume with: waypoint chapter 7 --session old --project-root {project}\n" in asked.stdout

    done = waypoint(tmp_path, "runs", "resume", "old", "--approve", pending["id"], "--project-root", str(project),
                    cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert side_effects(tmp_path) == [project / "side.txt"] and list(elsewhere.iterdir()) == []
    assert shown(tmp_path, "old", elsewhere)["project_root"] == str(project)  # known from now on


def test_a_session_whose_project_root_is_gone_is_refused_until_project_root_names_another(tmp_path):
    project, elsewhere = dirs(tmp_path)
    iid = paused(tmp_path, project, "s7")
    moved = tmp_path / "moved"
    project.rename(moved)

    page = waypoint(tmp_path, "runs", "show", "s7", cwd=elsewhere)
    assert f"\n  root      {project} (no longer a directory" in page.stdout
    refused(waypoint(tmp_path, "runs", "resume", "s7", "--approve", iid, cwd=elsewhere),
            "'s7'", str(project), "--project-root DIR")
    refused(waypoint(tmp_path, "chapter", "7", "--session", "s7", cwd=elsewhere, stdin="y\n"),
            "s7", str(project), "--project-root DIR")
    assert side_effects(tmp_path) == []

    again = waypoint(tmp_path, "chapter", "7", "--session", "s7", "--project-root", str(moved), cwd=elsewhere,
                     stdin="y\n")
    assert again.returncode == 0, again.stderr
    assert f"Project root: {moved}" in again.stdout
    assert "Resume with: waypoint chapter 7 --session s7\n" in again.stdout  # stored now: no flag needed
    assert side_effects(tmp_path) == [moved / "side.txt"] and list(elsewhere.iterdir()) == []
    assert shown(tmp_path, "s7", elsewhere)["project_root"] == str(moved)
