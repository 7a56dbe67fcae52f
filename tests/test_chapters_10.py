"""Quickstart chapter 10, driven as a user drives it (the real CLI in a subprocess, stdin piped, the offline
model): a supervisor whose tool is a researcher agent; the researcher's tool call needs approval, the question
reaches the top, and the answer — given now or by the next process — lets the researcher, then the supervisor,
finish. Side effects are counted in a file."""

from __future__ import annotations

import json

from test_chapters_06_09 import APPROVAL, chapter, project

NOTES = "Team notes\n\nThe office opens at nine.\n\nBackups run every night at 02:00 and are kept for thirty days.\n"
QUESTION = "when do the backups run?"
ASKED_BY = "\n⚠️  Approval Required ⚠️\nAgent: ch10 › researcher\n"


def test_ch10_the_researchers_call_is_approved_at_the_top_and_both_agents_answer(tmp_path):
    root = project(tmp_path)
    (root / "notes.txt").write_text(NOTES)
    out = chapter(10, root, stdin=f"ask the researcher to ask notes.txt about {QUESTION}\ny\n", via_main=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert f'[tool call] researcher({json.dumps({"request": f"ask notes.txt about {QUESTION}"})})' in out.stdout
    arguments = json.dumps({"document": "notes.txt", "question": QUESTION})
    assert f"[tool call · researcher] answer_from_document({arguments})" in out.stdout
    assert ASKED_BY in out.stdout  # the question names where it was asked
    assert APPROVAL.format(tool="answer_from_document", arguments=arguments).lstrip("\n").split("\n", 1)[1] \
        in out.stdout.split(ASKED_BY)[1]
    result = next(line for line in lines if line.startswith("[tool result · researcher]"))
    assert "Backups run every night at 02:00" in result
    researcher_said = lines.index(next(line for line in lines if line.startswith("[assistant · researcher]")))
    supervisor_said = lines.index(next(line for line in lines if line.startswith("[assistant] ")))
    assert researcher_said < supervisor_said  # the researcher answers, then the supervisor
    assert "- researcher returned:" in "\n".join(lines[supervisor_said:])


def test_ch10_the_pending_approval_inside_the_researcher_survives_the_process(tmp_path):
    root = project(tmp_path)
    ask = "ask the researcher to run the command echo ran >> side.txt\n"
    first = chapter(10, root, "--session", "s10", stdin=ask)  # EOF at the prompt: the run stays paused
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("Approve this action?") == 1 and ASKED_BY in first.stdout
    assert not (root / "side.txt").exists()

    second = chapter(10, root, "--session", "s10", stdin="y\n")  # another process answers it
    assert second.returncode == 0, second.stderr
    before_loop = second.stdout.split("Enter your message")[0]
    assert "This session is paused, waiting for you:" in before_loop and ASKED_BY in before_loop
    assert "✓ Approved, executing..." in before_loop and "[assistant] " in before_loop
    assert (root / "side.txt").read_text() == "ran\n"

    third = chapter(10, root, "--session", "s10", stdin="")  # nothing pending any more; it ran once
    assert third.returncode == 0 and "Approve this action?" not in third.stdout
    assert (root / "side.txt").read_text() == "ran\n"


def test_ch10_a_rejected_call_never_runs_and_the_researcher_says_so(tmp_path):
    root = project(tmp_path)
    out = chapter(10, root, stdin="ask the researcher to run the command echo ran >> side.txt\nn\n")
    assert out.returncode == 0, out.stderr
    assert "[tool result · researcher] tool 'execute' disapproved: rejected at the prompt" in out.stdout
    assert not (root / "side.txt").exists()


def test_ch10_an_operator_approves_the_researchers_call_with_waypoint_runs(tmp_path):
    import re
    import subprocess
    import sys

    from test_chapters_06_09 import environment

    root = project(tmp_path)
    first = chapter(10, root, "--session", "ops", stdin="ask the researcher to run the command echo ran >> side.txt\n")
    assert first.returncode == 0, first.stderr

    def runs(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "waypoint.cmd.main", "runs", *args], capture_output=True, text=True,
                              env=environment(root), cwd=root, timeout=60)

    shown = runs("show", "ops")
    assert shown.returncode == 0, shown.stderr
    (iid,) = re.findall(r"^  ([0-9a-f]{16})  approval of tool 'execute'", shown.stdout, re.M)
    assert ";runnable:researcher;node:tools;tool:execute:" in shown.stdout  # where it was asked
    done = runs("resume", "ops", "--approve", iid)
    assert done.returncode == 0, done.stderr
    assert "[tool result] Here is what the tool returned:" in done.stdout and "completed" in done.stdout
    assert (root / "side.txt").read_text() == "ran\n"
    again = runs("resume", "ops", "--approve", iid)  # the same answer again runs nothing
    assert again.returncode != 0 and (root / "side.txt").read_text() == "ran\n"
