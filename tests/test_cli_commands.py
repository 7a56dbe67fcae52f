"""The `waypoint` commands as a newcomer meets them, in real subprocesses: a worker without the Postgres driver,
`serve` on a port in use, what `--help` says, and the line a worker logs for each run it claims."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

PROCS = Path(__file__).parent / "procs"
WAYPOINT = str(Path(sys.executable).parent / "waypoint")
PG_URL = "postgresql+asyncpg://user@127.0.0.1:1/db"  # never reached: the driver is missing

NO_ASYNCPG = '''import sys

class _NotInstalled:
    """Imports of asyncpg fail as they do where `pip install .` installed no [postgres] extra."""

    def find_spec(self, name, path=None, target=None):
        if name == "asyncpg" or name.startswith("asyncpg."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
'''


def _env(*paths: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "WAYPOINT_"))}
    env.update(PYTHONPATH=os.pathsep.join(map(str, (*paths, PROCS))), NO_COLOR="1", **extra)
    return env


def _without_asyncpg(tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "no-asyncpg"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(NO_ASYNCPG)
    env = _env(shim)
    probe = subprocess.run([sys.executable, "-c", "import asyncpg"], env=env, capture_output=True, text=True,
                           timeout=30)
    assert probe.returncode == 1 and "No module named 'asyncpg'" in probe.stderr  # the shim works
    return env


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# --- item 7: starting fails at once, in one line -------------------------------------------------------------

def test_a_worker_without_the_postgres_driver_exits_at_once_naming_the_extra(tmp_path):
    """It used to print its banner and stay up for good, taking the missing module for a database that is down."""
    env = _without_asyncpg(tmp_path)
    out = subprocess.run([WAYPOINT, "worker", "--db", PG_URL, "--graphs", "runs_fixtures:steps"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and out.stdout == ""
    line = one_line(out.stderr)
    assert line.startswith("waypoint worker: SQLStore('postgresql+asyncpg://user@127.0.0.1:1/db') needs the asyncpg "
                           "driver, which is not installed"), line
    assert line.endswith("install the postgres extra: pip install '.[postgres]'"), line


def test_runs_without_the_postgres_driver_says_so_in_one_line(tmp_path):
    out = subprocess.run([WAYPOINT, "runs", "list", "--db", PG_URL], env=_without_asyncpg(tmp_path), cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "pip install '.[postgres]'" in one_line(out.stderr)


def test_serve_on_a_port_in_use_says_so_in_one_line_and_exits_1(tmp_path):
    pytest.importorskip("fastapi")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([WAYPOINT, "serve", "--db", str(tmp_path / "runs.db"), "--agents", "service_agent:build",
                              "--port", str(port)], env=_env(WAYPOINT_TOKEN="serve-token-9a8b7c6d5e4f"), cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    line = one_line(out.stdout + out.stderr)
    assert line == (f"waypoint serve: cannot listen on 127.0.0.1:{port}: Address already in use (another process "
                    "listens there: stop it, or pass another --port; --port 0 takes any free one)")


# --- item 9: what --help says --------------------------------------------------------------------------------

def _help(*words: str) -> str:
    out = subprocess.run([WAYPOINT, *words, "--help"], env=_env(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    return out.stdout


def test_chapter_help_lists_the_chapters():
    text = _help("chapter")
    assert text.startswith("usage: waypoint chapter [-h] N")
    assert "waypoint chapter N --help" in text
    assert " 3  sessions stored as checkpoint IDs (--session)" in text and "10  agents made of agents" in text


def test_runs_help_says_db_takes_a_url():
    text = " ".join(_help("runs").split())
    assert "the SQLite file" not in text
    assert "--db DB the database: a SQLite file, or a URL (sqlite:///path, postgresql+asyncpg://...)" in text


def test_worker_help_shows_the_defaults():
    text = " ".join(_help("worker").split())
    for option, default in (("--concurrency CONCURRENCY", "8"), ("--poll SECONDS", "1.0"),
                            ("--drain SECONDS", "30.0"), ("--pool POOL", "10"), ("--max-attempts N", "10")):
        after = text.split(f" {option} ", 1)[1]
        assert f"(default: {default})" in after.split(" --", 1)[0], (option, after[:200])


def test_demo_help_says_what_the_demo_does():
    text = _help("demo")
    description = text.split("\n\n")[1]
    assert description.startswith("A tour in three processes on one SQLite file"), text


# --- item 9: a worker says which run it claimed --------------------------------------------------------------

def test_a_worker_logs_one_line_per_claimed_run_at_the_default_level(tmp_path):
    db = tmp_path / "queue.db"
    worker = subprocess.Popen([WAYPOINT, "worker", "--db", str(db), "--graphs", "runs_fixtures:steps", "--poll", "0.2"],
                              env=_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    threading.Thread(target=lambda: [lines.put(line) for line in worker.stderr], daemon=True).start()
    try:
        _until(lines, seen, lambda line: line.startswith("waypoint worker "))  # the banner: it is up
        outcome = asyncio.run(_submit_and_wait(db, "w-1"))
        assert outcome == "completed"
        claimed = _until(lines, seen, lambda line: "claimed run 'w-1'" in line)
        assert claimed.endswith(": claimed run 'w-1': start (graph 'steps'), attempt 1"), claimed
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    assert worker.returncode == 0
    seen += list(lines.queue)
    assert sum("claimed run" in line for line in seen) == 1, seen


def _until(lines: queue.Queue[str], seen: list[str], condition, timeout: float = 30.0) -> str:
    """The first line of the worker's log for which `condition` holds (every line read is kept in `seen`)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic())).rstrip("\n")
        except queue.Empty:
            raise AssertionError(f"no such line in the worker's log within {timeout} s: {seen}") from None
        seen.append(line)
        if condition(line):
            return line


async def _submit_and_wait(db: Path, checkpoint_id: str) -> str:
    from waypoint.stores import RunQueue, SQLiteStore

    store = SQLiteStore(db)
    try:
        q = RunQueue(store)
        await q.submit("steps", "job", checkpoint_id)
        return (await q.wait(checkpoint_id, timeout=60)).outcome
    finally:
        await store.close()
