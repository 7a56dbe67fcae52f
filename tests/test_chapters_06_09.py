"""Quickstart chapters 6–9, driven as a user drives them: the real CLI in a subprocess, stdin piped, the
offline model (no OPENAI_* in the environment), the database and PROJECT_ROOT in the test's tmp_path.
Cross-process claims use real processes: a paused approval answered by the next process, and a process
that SIGKILLs itself mid-turn resumed by the next one (side effects counted in a file)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

APPROVAL = "\n⚠️  Approval Required ⚠️\nTool: {tool}\nArguments: {arguments}\n\nApprove this action? (y/n): "


def environment(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env.update(PROJECT_ROOT=str(root), WAYPOINT_DB=str(root.parent / "chapters.db"), NO_COLOR="1")
    return env


def chapter(number: int, root: Path, *args: str, stdin: str = "", via_main: bool = False) -> subprocess.CompletedProcess:
    command = ["waypoint.cmd.main", "chapter", str(number)] if via_main else [f"waypoint.cmd.chapters.ch{number:02d}"]
    return subprocess.run([sys.executable, "-m", *command, *args], input=stdin, capture_output=True, text=True,
                          env=environment(root), cwd=root, timeout=60)


def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    return root


# --- chapter 6: callbacks ---------------------------------------------------------------------------------


def test_ch06_traces_every_node_of_each_turn_on_stderr(tmp_path):
    root = project(tmp_path)
    (root / "a.txt").write_text("hello from a\n")
    out = chapter(6, root, "--log", stdin="read a.txt\nhi\n", via_main=True)
    assert out.returncode == 0, out.stderr
    assert "[tool result] hello from a" in out.stdout
    traces = [line for line in out.stderr.splitlines() if line.startswith("[trace] ")]
    nodes = [line.split()[1] for line in traces if re.fullmatch(r"\[trace\] \w+ \d+\.\d\d ms", line)]
    # turn 1 called a tool (prompt, model, tools, model), turn 2 did not; each turn printed its own trace
    assert nodes == ["prompt", "model", "tools", "model", "prompt", "model"]
    assert sum("checkpoints written" in line for line in traces) == 2
    assert not any(line.startswith("[trace]") for line in out.stdout.splitlines())  # stderr only
    logs = [json.loads(line[6:]) for line in out.stderr.splitlines() if line.startswith("[log] ")]
    tool_log = next(r for r in logs if r.get("node") == "tools")
    assert tool_log["tool"] == "read_file" and tool_log["outcome"] == "ok" and tool_log["duration_ms"] >= 0


def test_ch06_logs_only_with_log(tmp_path):
    out = chapter(6, project(tmp_path), stdin="hi\n")
    assert out.returncode == 0, out.stderr
    assert "[trace] model" in out.stderr and "[log]" not in out.stderr


# --- chapter 7: approval ----------------------------------------------------------------------------------

COMMAND = "echo ran >> side.txt"
EXECUTE = APPROVAL.format(tool="execute", arguments=json.dumps({"command": COMMAND}))


def test_ch07_approved_command_runs_once(tmp_path):
    root = project(tmp_path)
    out = chapter(7, root, stdin=f"run the command {COMMAND}\ny\n")
    assert out.returncode == 0, out.stderr
    assert EXECUTE + "✓ Approved, executing...\n[tool result] \n" in out.stdout
    assert (root / "side.txt").read_text() == "ran\n"


def test_ch07_rejected_command_never_runs(tmp_path):
    root = project(tmp_path)
    out = chapter(7, root, stdin=f"run the command {COMMAND}\nn\n")
    assert out.returncode == 0, out.stderr
    assert EXECUTE + "✗ Rejected\n[tool result] tool 'execute' disapproved: rejected at the prompt\n" in out.stdout
    assert not (root / "side.txt").exists()


def test_ch07_pending_approval_survives_the_process(tmp_path):
    root = project(tmp_path)
    first = chapter(7, root, "--session", "s7", stdin=f"run the command {COMMAND}\n")  # EOF at the prompt
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("Approve this action?") == 1 and "Session saved: s7" in first.stdout
    assert not (root / "side.txt").exists()

    second = chapter(7, root, "--session", "s7", stdin="y\n")
    assert second.returncode == 0, second.stderr
    before_loop = second.stdout.split("Enter your message")[0]
    assert "Resuming session: s7" in before_loop and "This session is paused, waiting for you:" in before_loop
    assert EXECUTE + "✓ Approved, executing..." in before_loop
    assert (root / "side.txt").read_text() == "ran\n"

    third = chapter(7, root, "--session", "s7", stdin="")  # nothing pending any more
    assert third.returncode == 0 and "Approve this action?" not in third.stdout
    assert (root / "side.txt").read_text() == "ran\n"  # ran once, in the second process


# --- chapter 8: a graph as a tool -------------------------------------------------------------------------

NOTES = """Team notes

The office opens at nine. Coffee is in the kitchen on the second floor.

Backups run every night at 02:00 and are kept for thirty days. Restoring a backup takes an hour.

Deployments happen on Tuesdays after the review. Nobody deploys on a Friday.
"""


def test_ch08_answers_from_the_document_after_approval(tmp_path):
    root = project(tmp_path)
    (root / "notes.txt").write_text(NOTES)
    question = "when do the backups run?"
    out = chapter(8, root, stdin=f"ask notes.txt about {question}\nyes\n")
    assert out.returncode == 0, out.stderr
    asked = APPROVAL.format(tool="answer_from_document",
                            arguments=json.dumps({"document": "notes.txt", "question": question}))
    assert asked + "✓ Approved, executing...\n" in out.stdout
    result = next(line for line in out.stdout.splitlines() if line.startswith("[tool result]"))
    assert "passage 3" in result and "Backups run every night at 02:00" in result
    assert "Coffee" not in result and "Deployments" not in result


def test_ch08_workflow_keeps_the_best_matching_passages(tmp_path):
    """The workflow itself (the CLI shows a tool result cut at 200 characters): what it keeps, in what order."""
    from waypoint.cmd.fstools import ProjectRoot
    from waypoint.cmd.chapters.rag_workflow import build_rag

    root = project(tmp_path)
    (root / "notes.txt").write_text(NOTES)
    (root / "many.txt").write_text("\n\n".join(f"Deploy step {n}: check the deploy log." for n in range(1, 6)))
    rag = build_rag(ProjectRoot(root)).compile(trigger="all")
    assert rag.invoke({"document": "notes.txt", "question": "when do the backups run?"}) == (
        'notes.txt, passage 3 (2 keywords): "Backups run every night at 02:00 and are kept for thirty days. '
        'Restoring a backup takes an hour."')
    assert rag.invoke({"document": "notes.txt", "question": "where is the pool?"}).startswith(
        "notes.txt does not answer that")
    top = rag.invoke({"document": "many.txt", "question": "which deploy step checks the log?"}).splitlines()
    assert [line.split(" (")[0] for line in top] == ["many.txt, passage 1", "many.txt, passage 2", "many.txt, passage 3"]


def test_ch08_refuses_a_document_outside_the_project(tmp_path):
    root = project(tmp_path)
    (tmp_path / "secret.txt").write_text("The password is swordfish.\n")
    out = chapter(8, root, stdin=f"ask ../secret.txt about what is the password?\ny\n"
                                 f"ask {tmp_path / 'secret.txt'} about what is the password?\ny\n")
    assert out.returncode == 0, out.stderr
    results = [line for line in out.stdout.splitlines() if line.startswith("[tool result]")]
    assert len(results) == 2 and all("is outside the project root" in line for line in results)
    assert "swordfish" not in out.stdout


# --- chapter 9: crash recovery ----------------------------------------------------------------------------


def test_ch09_a_killed_turn_resumes_without_rerunning_finished_calls(tmp_path):
    root = project(tmp_path)
    first = chapter(9, root, "--session", "s9", "--crash-after", "1", stdin="process alpha, beta and gamma\n")
    assert first.returncode == -signal.SIGKILL, first.stderr
    journal = root / "batch.log"
    assert [line.split()[:2] for line in journal.read_text().splitlines()] == [
        ["started", "alpha"], ["finished", "alpha"], ["started", "beta"]]

    second = chapter(9, root, "--session", "s9", stdin="")
    assert second.returncode == 0, second.stderr
    # it waited for the dead process's lease (unless starting took longer than the lease), then resumed
    assert "did not finish (its process stopped while it ran); continuing it" in second.stdout
    assert re.search(r"^\[rerun\] process_item had started and not finished", second.stdout, re.M)
    assert '{"item": "alpha"}): finished before the turn was cut off — its result came from the ledger' in second.stdout
    assert '{"item": "beta"}): had started before the turn was cut off — it ran again' in second.stdout
    assert '{"item": "gamma"}): had not started before the turn was cut off' in second.stdout
    lines = journal.read_text().splitlines()
    count = {(what, item): sum(line.split()[:2] == [what, item] for line in lines)
             for what in ("started", "finished") for item in ("alpha", "beta", "gamma")}
    assert count == {("started", "alpha"): 1, ("finished", "alpha"): 1,   # finished: not run again
                     ("started", "beta"): 2, ("finished", "beta"): 1,     # cut off: ran again, once
                     ("started", "gamma"): 1, ("finished", "gamma"): 1}
    beta = [line for line in lines if line.startswith("started beta")]
    assert beta[0].split("key ")[1].split(",")[0] == beta[1].split("key ")[1].split(",")[0]  # same idempotency key


def test_ch09_a_dead_process_on_this_host_is_taken_over_at_once(tmp_path):
    root = project(tmp_path)
    first = chapter(9, root, "--session", "s9", "--crash-after", "0", stdin="process one\n")
    assert first.returncode == -signal.SIGKILL
    second = chapter(9, root, "--session", "s9", stdin="")
    assert second.returncode == 0, second.stderr
    assert "is gone: taking it over" in second.stdout  # a dead process on this host: no wait, no flag needed
    assert "[tool result] processed one" in second.stdout
    assert [line.split()[0] for line in (root / "batch.log").read_text().splitlines()] == [
        "started", "started", "finished"]


def test_ch09_does_not_take_over_a_session_a_live_process_runs(tmp_path):
    root = project(tmp_path)
    items = ", ".join(f"i{n}" for n in range(30))  # 9 s of work: still running when the second process looks
    owner = subprocess.Popen([sys.executable, "-m", "waypoint.cmd.chapters.ch09", "--session", "s9"], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=environment(root),
                             cwd=root)
    try:
        owner.stdin.write(f"process {items}\n")
        owner.stdin.flush()
        journal = root / "batch.log"
        deadline = time.monotonic() + 30
        while not (journal.exists() and journal.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        second = chapter(9, root, "--session", "s9", stdin="")
        assert owner.poll() is None, "the owner finished too early for this test"
    finally:
        owner.kill()
        owner.wait()
    assert second.returncode == 1
    assert "error: session s9 is in use by another process" in second.stderr
    assert "[tool result]" not in second.stdout and f"pid {owner.pid}" in journal.read_text()
    assert all(f"pid {owner.pid}" in line for line in journal.read_text().splitlines())  # the second ran nothing


# --- hostile text, Ctrl-C at the prompt, bad options -------------------------------------------------------

def test_ch07_shows_a_models_hidden_characters_as_codes_and_warns_before_approval(tmp_path, chat_server):
    """The spoof a person approved in a browser once (`echo hello ‮⁦; rm -rf ~/ ⁩ ⁦#⁩‬`), terminal escapes and a lone
    surrogate: shown as \\uXXXX codes, never obeyed, never a crash."""
    from chat_server import Reply

    spoof = "echo hello \u202e\u2066; rm -rf ~/ \u2069 \u2066#\u2069\u202c \x1b]0;owned\x07 \ud800"
    chat_server.push(Reply(tool_calls=[("c1", "execute", json.dumps({"command": spoof}, ensure_ascii=False))]),
                     Reply("done \x1b[2J\u202eevil \ud800"))
    root = project(tmp_path)
    env = {**environment(root), "OPENAI_API_KEY": "k", "OPENAI_BASE_URL": chat_server.base_url,
           "OPENAI_MODEL": "m"}
    out = subprocess.run([sys.executable, "-m", "waypoint.cmd.chapters.ch07", "--session", "h"], input="run it\nn\n\n",
                         capture_output=True, text=True, env=env, cwd=root, timeout=60)
    assert out.returncode == 0, out.stderr
    for raw in ("\u202e", "\u2066", "\x1b", "\x07"):
        assert raw not in out.stdout and raw not in out.stderr, repr(raw)
    assert "\\u202e" in out.stdout and "invisible or direction-changing" in out.stdout
    assert "Traceback" not in out.stderr


def test_ctrl_c_at_the_approval_prompt_ends_the_chapter_and_answers_nothing(tmp_path):
    import pty

    root = project(tmp_path)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "waypoint.cmd.chapters.ch07", "--session", "cc"], stdin=follower,
                            stdout=follower, stderr=subprocess.PIPE, env=environment(root), cwd=root)
    os.close(follower)
    seen = b""
    try:
        os.write(leader, b"please run the command touch ctrl-c.txt\n")
        deadline = time.monotonic() + 30
        while b"Approve this action?" not in seen:
            assert time.monotonic() < deadline, seen
            seen += os.read(leader, 4096)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 130  # at once: not after the next key
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    assert not (root / "ctrl-c.txt").exists()
    again = chapter(7, root, "--session", "cc", stdin="")  # still paused: nothing was answered
    assert "This session is paused, waiting for you" in again.stdout and "Approve this action?" in again.stdout


def test_chapters_refuse_a_bad_project_root_and_a_bad_database_in_one_line(tmp_path):
    root = project(tmp_path)
    env = {**environment(root), "PROJECT_ROOT": str(tmp_path / "missing")}
    out = subprocess.run([sys.executable, "-m", "waypoint.cmd.chapters.ch07"], input="", capture_output=True, text=True,
                         env=env, cwd=root, timeout=60)
    assert out.returncode == 1 and out.stderr.splitlines()[-1].startswith("error: the project root") \
        and "Traceback" not in out.stderr
    out = chapter(8, root, "--db", "/proc/nope/x.db", stdin="")
    assert out.returncode == 1 and out.stderr.splitlines()[-1].startswith("error: ") and "Traceback" not in out.stderr
