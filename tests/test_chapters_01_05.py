"""Quickstart chapters 1-5, driven as a user would: the real CLI in a subprocess, stdin piped.

The offline model answers unless a test points the OpenAI model at the local chat server
(tests/chat_server.py) to see what the model was sent, or to time the tokens.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from chat_server import Reply

WAYPOINT = str(Path(sys.executable).parent / "waypoint")
SECRET = "TOP SECRET: the launch codes"


def environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PROJECT_ROOT", "WAYPOINT_"))}
    env.update(WAYPOINT_DB=str(tmp_path / "waypoint.db"), NO_COLOR="1", **extra)
    return env


def chapter(n: int, *args: str, tmp_path: Path, stdin: str = "", cwd: Path | None = None,
            **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"waypoint.cmd.chapters.ch{n:02d}", *args], input=stdin, text=True,
                          capture_output=True, timeout=30, cwd=cwd or tmp_path, env=environ(tmp_path, **env))


def openai_env(server) -> dict[str, str]:
    return {"OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": server.base_url, "OPENAI_MODEL": "test-model"}


def answers(stdout: str) -> list[str]:
    return re.findall(r"\[assistant\] (.*)", stdout)


def stored_messages(db: Path, session: str) -> list[tuple[str, str]]:
    from waypoint.cmd.chapters.ch03 import build_agent
    from waypoint.engine import Runner
    from waypoint.engine.models import OfflineModel
    from waypoint.stores import SQLiteStore

    async def read():
        store = SQLiteStore(db)
        try:
            snap = await Runner(build_agent(model=OfflineModel()), store=store).app.get_run(session)
        finally:
            await store.close()
        return [(m.role, m.content) for m in snap.state.messages]

    return asyncio.run(read())


def timed_output(cmd: list[str], stdin: str, env: dict[str, str], cwd: Path) -> list[tuple[float, bytes]]:
    """(seconds since start, bytes read so far) each time stdout grows."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env, cwd=cwd)
    proc.stdin.write(stdin.encode())
    proc.stdin.close()
    seen, steps = b"", []
    while chunk := proc.stdout.read1(1024):
        seen += chunk
        steps.append((time.monotonic() - start, seen))
    assert proc.wait(timeout=30) == 0
    return steps


def live(steps: list[tuple[float, bytes]], first: bytes, last: bytes) -> bool:
    """True if `first` was on screen well before `last` arrived: tokens shown as the model made them."""
    shown = next(t for t, seen in steps if first in seen)
    done = next(t for t, seen in steps if last in seen)
    return done - shown > 0.4


# --- chapter 1 ------------------------------------------------------------------------------------------

def test_ch01_prints_one_streamed_answer(tmp_path):
    out = subprocess.run([WAYPOINT, "chapter", "1", "what is waypoint?"], capture_output=True, text=True,
                         timeout=30, cwd=tmp_path, env=environ(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith('[assistant] You said: "what is waypoint?".')
    assert "offline model" in out.stderr  # the banner says which model answered, on stderr


def test_ch01_without_a_question_prints_the_usage_and_exits_2(tmp_path):
    out = chapter(1, tmp_path=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == 'usage: waypoint chapter 1 "your question"'
    assert out.stdout == ""


def test_ch01_streams_the_answer_to_the_instruction_and_question(tmp_path, chat_server):
    chat_server.push(Reply(content="un deux trois quatre cinq six", chunk_size=4, delay=0.1))
    cmd = [WAYPOINT, "chapter", "1", "--instruction", "Answer in French.", "count", "to six"]
    steps = timed_output(cmd, "", environ(tmp_path, **openai_env(chat_server)), tmp_path)
    assert steps[-1][1] == b"[assistant] un deux trois quatre cinq six\n"
    assert live(steps, b"[assistant] un", b"cinq six")
    (body,) = chat_server.bodies
    assert body["stream"] is True
    assert [(m["role"], m["content"]) for m in body["messages"]] == [("system", "Answer in French."),
                                                                    ("user", "count to six")]


# --- chapter 2 ------------------------------------------------------------------------------------------

def test_ch02_answers_each_line_until_an_empty_one(tmp_path):
    out = chapter(2, tmp_path=tmp_path, stdin="hello\nlist .\n\nnever sent\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Enter your message (empty line to exit):\nyou> ")
    assert answers(out.stdout) == [
        'You said: "hello". I am the offline model and follow fixed rules: try "run <command>", "read <path>", '
        '"list <dir>" or "ask <document> about <question>".',
        "You asked: \"list .\". I would use the 'ls' tool for that, but it is not available to me here, "
        "so I cannot do it."]
    assert "never sent" not in out.stdout
    assert not (tmp_path / "waypoint.db").exists()  # chapter 2 keeps the conversation in memory only


def test_ch02_exits_cleanly_at_the_end_of_input(tmp_path):
    out = chapter(2, tmp_path=tmp_path, stdin="hello\n")
    assert out.returncode == 0, out.stderr
    assert len(answers(out.stdout)) == 1
    assert out.stdout.endswith("you> \n")
    assert out.stderr.count("\n") == 1  # the model banner, nothing else


def test_ch02_streams_live_and_sends_the_whole_conversation(tmp_path, chat_server):
    chat_server.push(Reply(content="Hi Ada, nice to meet you.", chunk_size=4, delay=0.1), "Your name is Ada.")
    steps = timed_output([WAYPOINT, "chapter", "2"], "my name is Ada\nwhat is my name?\n",
                         environ(tmp_path, **openai_env(chat_server)), tmp_path)
    assert live(steps, b"[assistant] Hi A", b"meet you.")
    assert answers(steps[-1][1].decode()) == ["Hi Ada, nice to meet you.", "Your name is Ada."]
    last = [(m["role"], m["content"]) for m in chat_server.bodies[-1]["messages"]]
    assert last == [("system", "You are a helpful assistant."), ("user", "my name is Ada"),
                    ("assistant", "Hi Ada, nice to meet you."), ("user", "what is my name?")]


# --- chapter 3 ------------------------------------------------------------------------------------------

def new_session(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, out.stderr
    (session,) = re.findall(r"^Created new session: (\S+)$", out.stdout, re.M)
    return session


def test_ch03_a_second_process_resumes_the_session(tmp_path, chat_server):
    first = chapter(3, tmp_path=tmp_path, stdin="my name is Ada\n\n")
    session = new_session(first)
    assert first.stdout.endswith(f"Session saved: {session}\nResume with: waypoint chapter 3 --session {session}\n")

    chat_server.push("Your name is Ada.")  # the second process talks to a model that records what it sees
    second = chapter(3, "--session", session, tmp_path=tmp_path, stdin="what is my name?\n\n",
                     **openai_env(chat_server))
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith(f"Resuming session: {session}\nSession title: my name is Ada\n"
                                    "Enter your message (empty line to exit):\n")
    sent = [(m["role"], m["content"]) for m in chat_server.bodies[0]["messages"]]
    assert sent[:2] == [("system", "You are a helpful assistant."), ("user", "my name is Ada")]
    assert sent[-1] == ("user", "what is my name?") and len(sent) == 4
    assert stored_messages(tmp_path / "waypoint.db", session)[1:] == [
        ("user", "my name is Ada"), sent[2], ("user", "what is my name?"), ("assistant", "Your name is Ada.")]


def test_ch03_title_named_sessions_and_empty_ones(tmp_path):
    long = "please remember that the deployment window is Tuesday between nine and eleven"
    session = new_session(chapter(3, "--session", "planning", tmp_path=tmp_path, stdin=f"{long}\n\n"))
    assert session == "planning"  # an ID of your choosing names a new session
    again = chapter(3, "--session", "planning", tmp_path=tmp_path, stdin="")
    assert f"Session title: {long[:60]}\n" in again.stdout
    empty = chapter(3, tmp_path=tmp_path, stdin="\n")
    assert f"Session {new_session(empty)} is empty: nothing was saved." in empty.stdout
    other = tmp_path / "other.db"
    elsewhere = chapter(3, "--db", str(other), tmp_path=tmp_path, stdin="hi\n\n")
    assert f"--session {new_session(elsewhere)} --db {other}\n" in elsewhere.stdout
    assert other.exists()


def test_ch03_finishes_a_turn_that_failed_before_the_next_one(tmp_path, chat_server):
    refused = Reply.failure(400, "the request was refused", type="invalid_request_error")
    chat_server.push(refused, refused, "Answer to the first.", "Answer to the third.")
    out = chapter(3, "--session", "s", tmp_path=tmp_path, stdin="first\nsecond\nthird\n\n", **openai_env(chat_server))
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("[error] NodeError: node 'model' failed: ModelError") == 2
    assert out.stdout.count("The last turn of this session did not finish (failed: ") == 2
    assert "CheckpointExists" not in out.stderr  # "second" was not sent, since the failed turn could not be finished
    assert out.stderr.count("[error] the last turn failed again, so this message was not sent") == 1
    assert answers(out.stdout) == ["Answer to the first.", "Answer to the third."]
    assert [m["content"] for m in chat_server.bodies[-1]["messages"]][1:] == [
        "first", "Answer to the first.", "third"]


def test_ch03_ctrl_c_saves_the_session_and_the_next_process_finishes_the_turn(tmp_path, chat_server):
    chat_server.push(Reply(content="a slow answer, cut off half-way " * 6, chunk_size=4, delay=0.1),
                     "The whole answer.", "And the next one.")
    env = environ(tmp_path, **openai_env(chat_server))
    proc = subprocess.Popen([sys.executable, "-m", "waypoint.cmd.chapters.ch03", "--session", "s"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    try:
        proc.stdin.write(b"tell me slowly\n")
        proc.stdin.flush()
        seen = b""
        while b"[assistant] a sl" not in seen and (chunk := proc.stdout.read1(1024)):
            seen += chunk
        meanwhile = chapter(3, "--session", "s", tmp_path=tmp_path, stdin="hello?\n\n")  # a second terminal
        assert re.search(r"^error: session s is in use by another process \(.*, lease until \d\d:\d\d:\d\d\); close that "
                         r"chapter first$", meanwhile.stderr, re.M), meanwhile.stderr
        assert meanwhile.returncode == 1 and "you>" not in meanwhile.stdout  # refused before anything ran
        proc.send_signal(signal.SIGINT)  # while the answer streams
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert (seen + out).endswith(b"\nSession saved: s\nResume with: waypoint chapter 3 --session s\n")
    assert b"Traceback" not in err

    again = chapter(3, "--session", "s", tmp_path=tmp_path, stdin="and then?\n\n", **openai_env(chat_server))
    assert "The last turn of this session did not finish (cancelled); continuing it" in again.stdout
    assert answers(again.stdout) == ["The whole answer.", "And the next one."]
    assert [m["content"] for m in chat_server.bodies[-1]["messages"]][1:] == [
        "tell me slowly", "The whole answer.", "and then?"]


def test_ch03_errors_are_one_line(tmp_path):
    out = chapter(3, "--db", str(tmp_path), tmp_path=tmp_path, stdin="hi\n\n")  # a directory, not a file
    assert out.returncode == 1
    assert out.stderr.splitlines()[1:] == [
        f"error: cannot use the database {tmp_path} (unable to open database file); pass --db with the path of a "
        "file you can write"]  # after the model banner, one line
    blank = chapter(3, "--session", " ", tmp_path=tmp_path)
    assert blank.returncode == 1 and blank.stderr.splitlines()[-1] == (
        "error: --session needs an ID (leave it out to start a new session)")
    plain_run(tmp_path / "waypoint.db", "job-1")
    job = chapter(3, "--session", "job-1", tmp_path=tmp_path, stdin="hi\n\n")
    assert job.returncode == 1 and job.stderr.splitlines()[1:] == [
        "error: checkpoint 'job-1' holds a run that is not a chat session of chapter 3; it belongs to 'plain'; pick "
        "another --session, or leave it out to start a new one"]


def test_ch03_refuses_a_session_another_chapters_agent_wrote(tmp_path):
    """A session is a run of one agent: chapter 3 does not continue chapter 2's, 4's or the demo's run (it used
    to, and changed the run's graph)."""
    (tmp_path / "project").mkdir()
    four = chapter(4, "--session", "shared", tmp_path=tmp_path, stdin="list .\n\n", PROJECT_ROOT=str(tmp_path / "project"))
    assert four.returncode == 0, four.stderr
    three = chapter(3, "--session", "shared", tmp_path=tmp_path, stdin="hello\n\n")
    assert three.returncode == 1 and three.stderr.splitlines()[1:] == [
        "error: checkpoint 'shared' holds a run that is not a chat session of chapter 3; it belongs to 'ch04'; "
        "pick another --session, or leave it out to start a new one"]
    assert stored_messages(tmp_path / "waypoint.db", "shared")[-1][0] == "assistant"  # untouched


DOC_SESSION = "d4f29b46-db1a-40f9-a6da-7cd0e294ccbc"  # the ID docs/chapters/03-sessions.md's samples show


def test_ch03_the_docs_snippet_reads_the_docs_session_and_says_when_there_is_none(tmp_path):
    """The page's "read a session yourself" snippet, as printed, with the page's own session ID: in a directory
    without that session it says so (it raised AttributeError on None); after the page's two processes it
    prints what its comments say."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "chapters" / "03-sessions.md").read_text()
    (snippet,) = [b for b in re.findall(r"```py\n(.*?)```", page, re.S) if "async def show" in b]
    assert DOC_SESSION in snippet
    read = [sys.executable, "-c", snippet]
    missing = subprocess.run(read, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=environ(tmp_path))
    assert missing.returncode == 0, missing.stderr
    assert missing.stdout == f"no session {DOC_SESSION} in .waypoint/waypoint.db\n"

    db = str(tmp_path / ".waypoint" / "waypoint.db")
    for said in ("my name is Ada and I like graphs", "what is my name?"):
        turn = chapter(3, "--session", DOC_SESSION, "--db", db, tmp_path=tmp_path, stdin=f"{said}\n\n")
        assert turn.returncode == 0, turn.stderr
    found = subprocess.run(read, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=environ(tmp_path))
    assert found.returncode == 0, found.stderr
    first, *messages = found.stdout.splitlines()
    promised = re.findall(r"# (.*)", snippet.split("print(snap.meta.status", 1)[1])[:2]
    assert first == promised[0] == "completed 6"
    assert [m.split()[0] for m in messages] == promised[1].split(", ")


def test_ch03_refuses_the_demos_run_without_db_as_it_does_with_it(tmp_path):
    """`waypoint demo` stores its run in .waypoint/demo.db and prints its ID; `--session <that ID>` without `--db`
    used to start a new chat under it in .waypoint/waypoint.db."""
    env = {k: v for k, v in environ(tmp_path).items() if k != "WAYPOINT_DB"}
    demo = subprocess.run([WAYPOINT, "demo"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stderr
    (ticket,) = re.findall(r"the run's checkpoint ID is (\S+)", demo.stdout)
    three = subprocess.run([WAYPOINT, "chapter", "3", "--session", ticket], input="hello\n\n", cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert three.returncode == 1 and three.stdout == ""
    assert three.stderr.splitlines()[1:] == [
        f"error: checkpoint '{ticket}' is a run of the demo, stored in .waypoint/demo.db, not a chat session of "
        "chapter 3; pick another --session, or leave it out to start a new one"]
    with_db = subprocess.run([WAYPOINT, "chapter", "3", "--session", ticket, "--db", ".waypoint/demo.db"],
                             input="hello\n\n", cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert with_db.returncode == 1 and "it belongs to 'waypoint-demo'" in with_db.stderr
    assert _history(tmp_path / ".waypoint" / "waypoint.db", ticket) == []  # no chat was started under the ID


def _history(db: Path, checkpoint_id: str) -> list:
    from waypoint.stores import SQLiteStore

    async def read():
        store = SQLiteStore(db)
        try:
            return await store.history(checkpoint_id)
        finally:
            await store.close()

    return asyncio.run(read()) if db.exists() else []


def plain_run(db: Path, checkpoint_id: str) -> None:
    """A run of a plain graph (not an agent) stored under `checkpoint_id`."""
    from waypoint.engine import END, START, Graph
    from waypoint.stores import SQLiteStore

    g = Graph(name="plain")
    g.add_node("upper", str.upper)
    g.add_edge(START, "upper")
    g.add_edge("upper", END)

    async def run():
        store = SQLiteStore(db)
        try:
            await g.compile(store=store).ainvoke("x", checkpoint_id=checkpoint_id)
        finally:
            await store.close()

    asyncio.run(run())


# --- chapter 4 ------------------------------------------------------------------------------------------

def project(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "project", tmp_path / "outside"
    (root / "src").mkdir(parents=True)
    outside.mkdir()
    (root / "notes.txt").write_text("remember the milk\n")
    (outside / "secret.txt").write_text(SECRET + "\n")
    (root / "link.txt").symlink_to(outside / "secret.txt")
    return root, outside


def test_ch04_lists_and_reads_inside_the_project_root(tmp_path):
    root, _ = project(tmp_path)
    out = chapter(4, tmp_path=tmp_path, stdin="list .\nread notes.txt\n\n", PROJECT_ROOT="project")
    assert out.returncode == 0, out.stderr
    assert f"Project root: {root}\nEnter your message" in out.stdout  # made absolute
    assert '[tool call] ls({"path": "."})\n[tool result] link.txt notes.txt src/\n' in out.stdout
    assert '[tool call] read_file({"path": "notes.txt"})\n[tool result] remember the milk\n' in out.stdout
    assert answers(out.stdout)[-1] == "Here is what the tool returned:"


def test_ch04_refuses_paths_outside_the_root(tmp_path):
    root, outside = project(tmp_path)
    asks = ["read ../outside/secret.txt", f"read {outside / 'secret.txt'}", "read link.txt", "list ../outside"]
    out = chapter(4, tmp_path=tmp_path, stdin="\n".join(asks) + "\n\n", PROJECT_ROOT=str(root))
    assert out.returncode == 0, out.stderr
    results = re.findall(r"^\[tool result\] (.*)$", out.stdout, re.M)
    paths = ["../outside/secret.txt", str(outside / "secret.txt"), "link.txt", "../outside"]
    assert len(results) == len(paths)
    for result, path in zip(results, paths):  # (a result line is cut at 200 characters)
        assert result.startswith(f"path '{path}' is outside the project root"), result
    assert "TOP SECRET" not in out.stdout + out.stderr


def test_ch04_root_defaults_to_the_working_directory_and_must_exist(tmp_path):
    root, _ = project(tmp_path)
    out = chapter(4, tmp_path=tmp_path, stdin="run pwd\n\n", cwd=root)
    assert f"Project root: {root}\n" in out.stdout
    assert f'[tool call] execute({{"command": "pwd"}})\n[tool result] {root}\n' in out.stdout
    missing = chapter(4, tmp_path=tmp_path, stdin="\n", PROJECT_ROOT="nowhere")
    assert missing.returncode == 1
    assert missing.stderr.splitlines()[-1] == (
        f"error: the project root {tmp_path / 'nowhere'} is not a directory; set PROJECT_ROOT to your "
        "project's directory (or unset it to use the working directory)")


# --- chapter 5 ------------------------------------------------------------------------------------------

def test_ch05_a_failing_command_is_a_tool_error_and_a_dropped_connection_is_retried(tmp_path):
    root, _ = project(tmp_path)
    stdin = "run ls missing-file\ncheck the status of api\ncheck the status of web\n\n"
    out = chapter(5, tmp_path=tmp_path, stdin=stdin, PROJECT_ROOT=str(root))
    assert out.returncode == 0, out.stderr
    results = re.findall(r"^\[tool result\] (.*)$", out.stdout, re.M)
    assert results[0].startswith("[tool error] command exited with code 2: ls: ")
    assert "missing-file" in results[0]
    assert results[1:] == ['{"service":"api","status":"operational","checked":"simulated status page"}',
                           '{"service":"web","status":"operational","checked":"simulated status page"}']
    assert re.findall(r"\[retry\] .*", out.stderr) == [
        "[retry] tool call failed, retrying: ConnectionError: connection to the status page of 'api' was reset"]
    assert len(answers(out.stdout)) == 3  # the run went on after each


def test_ch05_retries_a_model_call_the_server_throttled(tmp_path, chat_server):
    root, _ = project(tmp_path)
    chat_server.push(Reply.failure(429, "Rate limit reached", type="rate_limit_error"), "Hello again.")
    out = chapter(5, tmp_path=tmp_path, stdin="hello\n\n", PROJECT_ROOT=str(root), **openai_env(chat_server))
    assert out.returncode == 0, out.stderr
    assert re.search(r"^\[retry\] model call failed, retrying: ModelError: .*429", out.stderr, re.M), out.stderr
    assert answers(out.stdout) == ["Hello again."]


def test_chapter_agents_are_found_by_their_name_for_waypoint_runs(tmp_path, monkeypatch):
    from waypoint.cmd.agents import find_agent

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("PROJECT_ROOT", str(tmp_path))
    for name, tools in (("ch03", set()), ("ch04", {"ls", "read_file", "execute"}),
                        ("ch05", {"ls", "execute", "fetch_status"})):
        agent = find_agent(name)
        assert agent.name == name and tools <= set(agent.tools_node.tools)
