"""A person's cancel of a run another process executes (engine/keep/cancel.py): real processes, a real SQLite file.

The run executes in a child process (tests/procs/cancel_app.py); this process asks for the cancel through the
store, as `waypoint runs cancel` or the service would. Steps wait at gates the test opens, so every point is an
event: the run is inside a step, the executor read the request, the step may finish.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from waypoint.engine import CheckpointNotFound, NotRunning, Runner, WaypointError
from waypoint.stores import SQLiteStore

PROCS = Path(__file__).parent / "procs"
sys.path.insert(0, str(PROCS))
import cancel_app  # noqa: E402

TIMEOUT = 60.0  # a loaded machine starts a Python process in seconds, not minutes
STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_run_left_behind():
    """A test that fails while its run's process waits at a gate does not leave that process behind."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


class Setup:
    def __init__(self, tmp_path: Path, mode: str, db: str | None = None) -> None:
        self.db, self.mode, self.cid = db or str(tmp_path / "runs.db"), mode, f"{mode}-run"
        self.gates = tmp_path / "gates"
        self.gates.mkdir()
        self.journal = tmp_path / "journal.txt"

    def hold(self, *names: str) -> None:
        for name in names:
            (self.gates / f"hold-{name}").touch()

    def open(self, name: str) -> None:
        (self.gates / f"gate-{name}").touch()

    def start(self, *extra: str) -> subprocess.Popen:
        STARTED.append(subprocess.Popen([sys.executable, str(PROCS / "cancel_app.py"), str(self.db), self.cid, self.mode,
                                 "--gates", str(self.gates), "--journal", str(self.journal), *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        return STARTED[-1]

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.journal.read_text().splitlines()] if self.journal.exists() else []

    def seen(self, name: str, what: str) -> int:
        return sum(1 for words in self.lines() if words[:2] == [name, what])

    def wait(self, name: str, what: str, count: int = 1, proc: subprocess.Popen | None = None) -> None:
        deadline = time.monotonic() + TIMEOUT
        while self.seen(name, what) < count:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"the run's process ended ({proc.returncode}) before '{name} {what}': "
                                     f"{proc.stderr.read()}\n{self.journal.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"'{name} {what}' never came: {self.lines()}")
            time.sleep(0.01)

    def cancel(self, when: str, by: str = "alice@desk") -> object:
        async def ask():
            store = cancel_app.open_store(self.db)
            try:
                app, kind = cancel_app.build(self.mode, cancel_app.Journal(str(self.journal), str(self.gates)), store)
                if kind == "agent":  # Runner.cancel's names for the agent's points
                    when_ = {"after:tools": "after_tool_calls", "after:model": "after_model_call"}.get(when, when)
                    return await app.cancel(self.cid, when=when_, by=by)
                return await app.cancel(self.cid, when=when, by=by)
            finally:
                await store.close()
        return asyncio.run(ask())

    def snapshot(self):
        async def read():
            store = cancel_app.open_store(self.db)
            try:
                app, kind = cancel_app.build(self.mode, cancel_app.Journal(str(self.journal), str(self.gates)), store)
                return await (app.app if kind == "agent" else app).get_run(self.cid)
            finally:
                await store.close()
        return asyncio.run(read())


def ended(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out.strip(), err.strip()


def stopped_cancelled(s: Setup, proc: subprocess.Popen, when: str, by: str = "alice@desk") -> None:
    code, out, err = ended(proc)
    assert code == 5, (code, out, err)
    assert json.loads(out.splitlines()[-1]) == {"cancelled": by, "when": when}
    snap = s.snapshot()
    assert (snap.meta.status, snap.meta.error) == ("interrupted", "cancelled")
    assert (snap.cancelled_by.by, snap.cancelled_by.when) == (by, when)


def continued(s: Setup) -> str:
    for name in ("a", "b", "c", "gated", "fast", "agent-model1", "agent-model2", "inner-model1", "inner-model2",
                 "outer-model1", "outer-model2"):
        s.open(name)
    code, out, err = ended(s.start("--continue-run"))
    assert code == 0, (code, out, err)
    return out


# --- graphs -------------------------------------------------------------------------------------------


def test_cancel_now_stops_a_graph_inside_its_step_and_the_step_runs_again_when_continued(tmp_path):
    s = Setup(tmp_path, "graph")
    s.hold("b")
    proc = s.start()
    s.wait("b", "start", proc=proc)
    request = s.cancel("now")
    assert request.when == "now" and request.by == "alice@desk"
    stopped_cancelled(s, proc, "now")
    assert s.seen("b", "done") == 0  # abandoned inside the step: not written
    assert s.snapshot().pending == ("b",)
    assert json.loads(continued(s)) == ["a", "b", "c"]
    assert [s.seen(n, "start") for n in "abc"] == [1, 2, 1]  # a finished step is not run again


def test_cancel_after_step_lets_the_step_in_flight_finish_and_starts_no_other(tmp_path):
    s = Setup(tmp_path, "graph")
    s.hold("a")
    proc = s.start()
    s.wait("a", "start", proc=proc)
    s.cancel("after_step")
    s.wait("asked", "after_step", proc=proc)
    s.open("a")
    stopped_cancelled(s, proc, "after_step")
    assert (s.seen("a", "done"), s.seen("b", "start")) == (1, 0)
    assert s.snapshot().pending == ("b",)
    assert json.loads(continued(s)) == ["a", "b", "c"]
    assert [s.seen(n, "start") for n in "abc"] == [1, 1, 1]


def test_cancel_after_a_named_node_runs_until_that_node_finished(tmp_path):
    s = Setup(tmp_path, "graph")
    s.hold("a", "b")
    proc = s.start()
    s.wait("a", "start", proc=proc)
    s.cancel("after:b")
    s.wait("asked", "after:b", proc=proc)
    s.open("a")  # a's boundary: b has not run, so the run goes on
    s.wait("b", "start", proc=proc)
    s.open("b")
    stopped_cancelled(s, proc, "after:b")
    assert (s.seen("b", "done"), s.seen("c", "start")) == (1, 0)
    assert json.loads(continued(s)) == ["a", "b", "c"]


def test_a_cancel_naming_no_node_of_the_graph_is_refused_and_the_run_goes_on(tmp_path):
    s = Setup(tmp_path, "graph")
    s.hold("a")
    proc = s.start()
    s.wait("a", "start", proc=proc)
    with pytest.raises(WaypointError, match="names no node"):
        s.cancel("after:typo")
    s.open("a")
    code, out, err = ended(proc)
    assert code == 0 and json.loads(out) == ["a", "b", "c"], err


def test_only_a_running_run_can_be_cancelled(tmp_path):
    s = Setup(tmp_path, "graph")
    with pytest.raises(CheckpointNotFound):
        s.cancel("now")
    code, out, err = ended(s.start())
    assert code == 0, err
    with pytest.raises(NotRunning, match="completed"):
        s.cancel("now")


def test_a_run_whose_process_is_gone_is_not_running_on_the_store_s_clock(tmp_path):
    s = Setup(tmp_path, "graph")
    s.hold("a")
    proc = s.start()
    s.wait("a", "start", proc=proc)
    proc.kill()
    proc.wait()

    async def expire_and_cancel():  # its lease runs out on the store's clock: nothing executes the run
        store = cancel_app.open_store(s.db)
        try:
            head = (await store.history(s.cid, limit=1))[0]
            while await store.clock() <= head.lease_expires:
                await asyncio.sleep(0.05)
            return await store.request_cancel(s.cid, when="now", by="bob")
        finally:
            await store.close()

    with pytest.raises(NotRunning, match="process that ran it is gone"):
        asyncio.run(asyncio.wait_for(expire_and_cancel(), 60))


def test_a_request_made_before_a_continuation_does_not_stop_it(tmp_path):
    s = Setup(tmp_path, "graph")
    s.hold("b")
    proc = s.start()
    s.wait("b", "start", proc=proc)
    s.cancel("after:b")
    s.wait("asked", "after:b", proc=proc)
    proc.kill()  # its process dies inside b, before the point it was asked to stop at; the request stays recorded
    proc.wait()
    again = s.start("--continue-run", "--takeover")
    s.wait("b", "start", 2, proc=again)
    looked = s.seen("looked", "requests")
    s.wait("looked", "requests", looked + 1, proc=again)  # it read the request while inside b …
    s.open("b")
    code, out, err = ended(again)  # … and its claim came after the request: the run is not stopped after b
    assert code == 0 and json.loads(out) == ["a", "b", "c"], (code, out, err)
    assert (s.seen("b", "done"), s.seen("asked", "after:b")) == (1, 1)


# --- agents -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_after_tool_calls_finishes_and_records_the_calls_in_flight_and_calls_no_model(tmp_path, database, request):
    s = Setup(tmp_path, "agent", request.getfixturevalue("pg_url") if database == "postgres" else None)
    s.hold("gated")
    proc = s.start()
    s.wait("gated", "start", proc=proc)
    request = s.cancel("after:tools")
    assert request.when == "after:tools"
    s.wait("asked", "after:tools", proc=proc)
    s.open("gated")
    stopped_cancelled(s, proc, "after:tools")
    assert (s.seen("gated", "done"), s.seen("agent-model2", "start")) == (1, 0)
    assert "fast result; gated result" in continued(s)
    assert (s.seen("fast", "start"), s.seen("gated", "start")) == (1, 1)  # recorded: not run again


def test_after_model_call_keeps_the_answer_and_starts_none_of_its_tool_calls(tmp_path):
    s = Setup(tmp_path, "agent")
    s.hold("agent-model1")
    proc = s.start()
    s.wait("agent-model1", "start", proc=proc)
    s.cancel("after:model")
    s.wait("asked", "after:model", proc=proc)
    s.open("agent-model1")
    stopped_cancelled(s, proc, "after:model")
    assert (s.seen("fast", "start"), s.seen("gated", "start")) == (0, 0)
    messages = s.snapshot().state.messages
    assert [c.name for c in messages[-1].tool_calls] == ["fast", "gated"]  # the answer in flight is kept
    assert "fast result; gated result" in continued(s)
    assert s.seen("agent-model1", "start") == 1  # not asked again


def test_cancel_now_abandons_a_tool_call_in_flight_which_runs_again_with_its_key_when_continued(tmp_path):
    s = Setup(tmp_path, "agent")
    s.hold("gated")
    proc = s.start()
    s.wait("gated", "start", proc=proc)
    s.wait("fast", "done", proc=proc)
    s.cancel("now")
    stopped_cancelled(s, proc, "now")
    assert s.seen("gated", "done") == 0
    assert "fast result; gated result" in continued(s)
    gated = [w for w in s.lines() if w[:2] == ["gated", "start"]]
    assert len(gated) == 2 and gated[0][3] == gated[1][3]  # again, with the same idempotency key
    assert s.seen("fast", "start") == 1  # it finished and was recorded before the cancel


def test_runner_cancel_names_its_points_and_refuses_others(tmp_path):
    runner = Runner(cancel_app.agent(cancel_app.Journal(str(tmp_path / "j"), str(tmp_path))),
                    store=SQLiteStore(tmp_path / "runs.db"))
    with pytest.raises(WaypointError, match="after_tool_calls"):
        asyncio.run(runner.cancel("x", when="after_tools"))
    with pytest.raises(CheckpointNotFound):
        asyncio.run(runner.cancel("x", when="after_tool_calls"))


def test_a_nested_agent_stops_at_its_own_safe_point_and_the_whole_run_is_cancelled(tmp_path):
    s = Setup(tmp_path, "nested")
    s.hold("gated")
    proc = s.start()
    s.wait("gated", "start", proc=proc)
    s.cancel("after:tools")
    s.wait("asked", "after:tools", proc=proc)
    s.open("gated")
    stopped_cancelled(s, proc, "after:tools")
    # the inner agent's calls finished and were recorded; neither it nor the outer agent asked its model again
    assert (s.seen("gated", "done"), s.seen("inner-model2", "start"), s.seen("outer-model2", "start")) == (1, 0, 0)
    continued(s)
    assert (s.seen("fast", "start"), s.seen("gated", "start")) == (1, 1)
    assert (s.seen("inner-model2", "done"), s.seen("outer-model2", "done")) == (1, 1)


def test_a_later_request_replaces_a_safe_point_with_now(tmp_path):
    s = Setup(tmp_path, "graph")
    s.hold("b")
    proc = s.start()
    s.wait("b", "start", proc=proc)
    s.cancel("after:c", by="first")  # b hangs: the safe point after c is never reached …
    s.wait("asked", "after:c", proc=proc)
    s.cancel("now", by="second")  # … so the person asks for now, and it is heard
    s.wait("asked", "now", proc=proc)
    stopped_cancelled(s, proc, "now", by="second")
    assert s.seen("b", "done") == 0


def test_cancel_now_waits_for_a_step_write_in_flight_and_stores_the_run_cancelled_after_it(tmp_path):
    """b's step write has committed but its answer has not come back (a slow link to Postgres; SQLite's busy path
    writes on a thread a task cancel does not stop) when the cancel is read: the cancel waits for the write, then
    stores the run cancelled after it — never a run left running that its caller was told is cancelled."""
    import logging

    from waypoint.engine import END, START, Graph, RunCancelled, recover

    db = tmp_path / "w.db"
    acked, in_flight, asked = asyncio.Event(), asyncio.Event(), asyncio.Event()
    loop_of: list = []

    class SlowAnswer(SQLiteStore):
        async def put(self, meta, *args, **kwargs):
            stored = await super().put(meta, *args, **kwargs)  # committed …
            if meta.step == 2 and meta.status == "running":
                in_flight.set()
                await acked.wait()  # … its answer still on its way
            return stored

    class Heard(logging.Handler):
        def emit(self, record):
            if "cancel requested" in record.getMessage():
                loop_of[0].call_soon_threadsafe(asked.set)

    def step(name):
        async def node(x):
            return x + [name]
        return node

    g = Graph(name="w")
    for name in "abc":
        g.add_node(name, step(name))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    store = SlowAnswer(db)
    app = g.compile(store=store)
    handler = Heard()
    logging.getLogger("waypoint.lease").addHandler(handler)
    logging.getLogger("waypoint.lease").setLevel(logging.INFO)

    async def main():
        loop_of.append(asyncio.get_running_loop())
        run = asyncio.create_task(app.ainvoke([], checkpoint_id="w1"))
        await in_flight.wait()
        other = SQLiteStore(db)
        await other.request_cancel("w1", when="now", by="alice")
        await asyncio.wait_for(asked.wait(), TIMEOUT)  # the executor read it while the write is in flight
        acked.set()
        with pytest.raises(RunCancelled):
            await run
        head = (await other.history("w1", limit=1))[0]
        assert (head.status, head.error) == ("interrupted", "cancelled")
        assert (await app.get_run("w1")).pending == ("c",)  # b's step landed, then the cancel
        assert await recover([app]) == []  # a person's cancel: nothing continues it by itself
        await other.close()
        await store.close()

    try:
        asyncio.run(main())
    finally:
        logging.getLogger("waypoint.lease").removeHandler(handler)
