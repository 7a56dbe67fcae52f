"""Pauses with deadlines (docs/resume.md, "Deadlines"): a pause nobody answers in time is answered by its deadline
— an approval rejected as expired, a sleep woken — by whoever recovers runs, on the store's clock, exactly once
against an answer that races it; an answer that came in time is never expired and one that comes late is refused.

Cross-process cases drive tests/procs/deadline_app.py on a SQLite file: one process pauses and exits, another
recovers (the embedder's `recover(watch=True)` loop, or `waypoint serve`) or answers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from waypoint.engine import (END, START, ChatModelAgent, Expired, Graph, GraphInterrupted, Interrupt, Message, NodeError,
                             PauseExpired, ToolCall, get_resume_context, read_run, recover, tool)
from waypoint.engine.keep.store import CheckpointMeta
from waypoint.middleware import ApprovalMiddleware, ApprovalResult
from waypoint.stores import MemoryStore, SQLiteStore

from service_support import ServeProcess, wait_until

PROC = Path(__file__).parent / "procs" / "deadline_app.py"
SLACK = 30.0
"""Seconds past a deadline by which a loaded machine has surely expired it (recovery looks every 0.2 s)."""


def app(tmp_path: Path, *args: str, check: bool = True) -> dict:
    out = subprocess.run([sys.executable, str(PROC), str(tmp_path / "app.db"), *args], capture_output=True,
                         text=True, timeout=120, env=_env(tmp_path))
    assert out.returncode == 0 or not check, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "EFFECTS": str(tmp_path / "effects.txt")}


def recovering(tmp_path: Path, every: float = 0.2) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(PROC), str(tmp_path / "app.db"), "recover", "--every", str(every)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path))


def effects(tmp_path: Path) -> list[str]:
    path = tmp_path / "effects.txt"
    return path.read_text().splitlines() if path.exists() else []


async def _newest(db: Path, cid: str) -> CheckpointMeta:
    store = SQLiteStore(db)
    try:
        return (await store.history(cid, limit=1))[0]
    finally:
        await store.close()


async def _snapshot(db: Path, cid: str):
    store = SQLiteStore(db)
    try:
        return await read_run(store, cid), await store.clock()
    finally:
        await store.close()


def newest(tmp_path: Path, cid: str) -> CheckpointMeta:
    return asyncio.run(_newest(tmp_path / "app.db", cid))


def until_rest(tmp_path: Path, cid: str, timeout: float) -> CheckpointMeta:
    return wait_until(lambda: (m := newest(tmp_path, cid)).status == "completed" and m, timeout, f"run {cid} ends")


def store_clock_now(tmp_path: Path) -> float:
    return asyncio.run(_snapshot(tmp_path / "app.db", "none"))[1]


def wait_past(tmp_path: Path, deadline: float) -> None:
    wait_until(lambda: store_clock_now(tmp_path) > deadline, SLACK, "the deadline to pass on the store's clock")


def stop(proc: subprocess.Popen) -> str:
    proc.kill()
    _, err = proc.communicate(timeout=30)
    return err


# --- the acceptance: an approval nobody answers --------------------------------------------------------------

def test_an_approval_nobody_answers_is_rejected_as_expired_by_the_recovery_loop_and_the_tool_never_runs(tmp_path):
    paused = app(tmp_path, "pause", "r1", "--expires", "2")["r1"]
    meta = newest(tmp_path, "r1")
    assert meta.status == "interrupted" and meta.deadline == pytest.approx(paused["deadline"])
    snap, now = asyncio.run(_snapshot(tmp_path / "app.db", "r1"))
    assert 0 < paused["deadline"] - now <= 2.0  # counted from when the pause was stored, on the store's clock
    recovery = recovering(tmp_path)
    try:
        done = until_rest(tmp_path, "r1", 2.0 + SLACK)
    finally:
        err = stop(recovery)
    assert effects(tmp_path) == []  # the tool never ran
    snap, _ = asyncio.run(_snapshot(tmp_path / "app.db", "r1"))
    told = snap.state.messages[-1].content
    assert told.startswith("model read: tool 'execute' disapproved: the approval expired at ") and \
        told.endswith(" without an answer"), told
    (decision,) = snap.state.decisions
    assert decision.verb == "expired" and decision.tool == "execute" and decision.reason.startswith("no answer by ")
    assert done.updated_at >= paused["deadline"]  # never before its time (one host: the clocks agree)
    assert "no answer came by the deadline of interrupt " + paused["iid"] in err, err[-2000:]


def test_waypoint_serve_shows_the_time_left_and_expires_the_approval(tmp_path):
    paused = app(tmp_path, "pause", "r1", "--expires", "6")["r1"]
    serve = ServeProcess(tmp_path, agents="deadline_app:ops", db=str(tmp_path / "app.db"),
                         env={"EFFECTS": str(tmp_path / "effects.txt")})
    try:
        client = httpx.Client(base_url=serve.url, headers={"Authorization": f"Bearer {serve.token}"}, timeout=30)
        run = client.get("/runs/r1").json()
        if run["status"] == "interrupted":  # read before its deadline (a loaded machine may be late)
            (pending,) = run["interrupts"]
            assert pending["deadline"] == pytest.approx(paused["deadline"]) and 0 < pending["expires_in"] <= 6
            (listed,) = [a for a in client.get("/approvals").json()["approvals"] if a["checkpoint_id"] == "r1"]
            assert listed["deadline"] == pytest.approx(paused["deadline"]) and listed["expires_in"] <= 6
        ended = wait_until(lambda: (r := client.get("/runs/r1").json())["status"] == "completed" and r, 6 + SLACK,
                           "the approval to expire under waypoint serve")
        assert [d["verb"] for d in ended["decisions"]] == ["expired"]
        assert "the approval expired at" in ended["messages"][-1]["content"]
        assert effects(tmp_path) == []
    finally:
        serve.stop()


# --- answers in time, answers too late, and the race between them ------------------------------------------

def test_a_run_answered_before_its_deadline_is_never_expired(tmp_path):
    # 8 s: the answer is a fresh process, and a loaded CI machine took more than 1.5 s to start one
    paused = app(tmp_path, "pause", "r1", "--expires", "8")["r1"]
    assert app(tmp_path, "answer", "r1", paused["iid"]) == {"out": "model read: ran echo hi"}
    wait_past(tmp_path, paused["deadline"])
    outcomes = asyncio.run(_recover_once(tmp_path))
    assert outcomes == []  # nothing was due: the run had moved on
    assert effects(tmp_path) == ["r1 echo hi"]
    assert newest(tmp_path, "r1").deadline is None


def test_an_answer_after_the_deadline_is_refused_and_writes_nothing(tmp_path):
    paused = app(tmp_path, "pause", "r1", "--expires", "0.5")["r1"]
    before = newest(tmp_path, "r1")
    wait_past(tmp_path, paused["deadline"])
    late = app(tmp_path, "answer", "r1", paused["iid"])
    assert late["kind"] == "PauseExpired" and f"interrupt {paused['iid']} expired at" in late["error"], late
    assert "run 'r1'" in late["error"] and "nothing was written" in late["error"]
    assert newest(tmp_path, "r1").version == before.version and effects(tmp_path) == []
    (outcome,) = asyncio.run(_recover_once(tmp_path))
    assert outcome.checkpoint_id == "r1" and outcome.outcome == "expired"
    assert effects(tmp_path) == []


def test_an_answer_racing_the_expiry_gives_each_run_exactly_one_outcome(tmp_path):
    ids = [f"r{i}" for i in range(8)]
    paused = app(tmp_path, "pause", *ids, "--expires", "10")  # the answers' processes are up well before
    recovery = recovering(tmp_path, every=0.02)
    try:
        # each answer lands at its own moment around its run's deadline: some before, some after, some at once
        answers = [subprocess.Popen([sys.executable, str(PROC), str(tmp_path / "app.db"), "answer", cid,
                                     paused[cid]["iid"], "--at", str(paused[cid]["deadline"] + (i - 4) * 0.01)],
                                    stdout=subprocess.PIPE, text=True, env=_env(tmp_path))
                   for i, cid in enumerate(ids)]
        said = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in answers]
        for cid in ids:
            until_rest(tmp_path, cid, 10 + SLACK)
    finally:
        stop(recovery)
    ran = effects(tmp_path)
    for cid, answer in zip(ids, said):
        snap, _ = asyncio.run(_snapshot(tmp_path / "app.db", cid))
        verbs = [d.verb for d in snap.state.decisions]
        if "out" in answer:  # the answer won: the call ran once, and nothing expired it
            assert verbs == ["approved"] and ran.count(f"{cid} echo hi") == 1, (cid, verbs, ran)
        else:  # the expiry won: the answer was refused, the call never ran
            assert answer["kind"] in ("PauseExpired", "CheckpointConflict", "UnknownInterrupt", "CheckpointError"), \
                answer
            assert verbs == ["expired"] and f"{cid} echo hi" not in ran, (cid, verbs, ran)


async def _recover_once(tmp_path: Path):
    sys.path.insert(0, str(PROC.parent))
    try:
        import deadline_app
    finally:
        sys.path.remove(str(PROC.parent))
    store = SQLiteStore(tmp_path / "app.db")
    try:
        return await recover([deadline_app.agent(store, 1.0), deadline_app.sleeper(store, 1.0)])
    finally:
        await store.close()


# --- a durable sleep ---------------------------------------------------------------------------------------

def test_a_graph_sleeps_without_a_process_and_wakes_after_its_deadline_in_another(tmp_path):
    paused = app(tmp_path, "sleep", "s1", "--seconds", "1.5")["s1"]
    snap, now = asyncio.run(_snapshot(tmp_path / "app.db", "s1"))
    (pending,) = snap.waits_for
    assert pending.kind == "sleep" and pending.info.note == "cool down" and pending.deadline == paused["deadline"]
    assert effects(tmp_path) == []  # the node did not go on: the process that paused it has exited
    recovery = recovering(tmp_path)
    try:
        until_rest(tmp_path, "s1", 1.5 + SLACK)
    finally:
        stop(recovery)
    snap, _ = asyncio.run(_snapshot(tmp_path / "app.db", "s1"))
    assert snap.output == 20
    (woke,) = effects(tmp_path)
    assert float(woke.split()[1]) >= paused["deadline"]  # not before its time, by the store's clock


# --- in one process: the rules ---------------------------------------------------------------------------

def _asker(**interrupt):
    def ask(x):
        is_target, has_data, data = get_resume_context()
        if not has_data:
            raise Interrupt({"question": "go on?"}, **interrupt)
        return {"got": data}

    g = Graph(name="asker")
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


async def _paused(app, cid="g1"):
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke(1, checkpoint_id=cid)
    (ctx,) = paused.value.info.contexts
    return ctx


async def _due(store, deadline: float) -> None:
    while await store.clock() <= deadline:
        await asyncio.sleep(0.01)


async def test_a_deadline_is_counted_on_the_stores_clock_whatever_this_process_thinks(tmp_path, monkeypatch):
    store = SQLiteStore(tmp_path / "g.db")
    app = _asker(deadline=timedelta(seconds=30)).compile(store=store)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # this process's clock is an hour fast
    ctx = await _paused(app)
    stored = await store.clock()
    monkeypatch.setattr(time, "time", real)
    assert 29 < ctx.deadline - stored <= 30, ctx.deadline - stored
    assert await store.list_due() == []
    await store.close()


async def test_on_deadline_is_the_answer_the_node_gets_and_expired_is_refused_before_it_is_due():
    store = MemoryStore()
    app = _asker(deadline=0.3, on_deadline="carried on alone").compile(store=store)
    ctx = await _paused(app)
    with pytest.raises(PauseExpired, match="is not due until"):
        await app.ainvoke(None, checkpoint_id="g1", resume={ctx.id: Expired(ctx.deadline)})
    await _due(store, ctx.deadline)
    (outcome,) = await recover([app])
    assert outcome.outcome == "expired"
    assert (await app.get_run("g1")).output == {"got": "carried on alone"}


async def test_expired_is_no_answer_for_a_pause_without_a_deadline():
    app = _asker().compile(store=MemoryStore())
    ctx = await _paused(app)
    assert ctx.deadline is None
    with pytest.raises(PauseExpired, match="has no deadline"):
        await app.ainvoke(None, checkpoint_id="g1", resume={ctx.id: Expired(time.time())})


def test_a_deadline_must_say_a_time():
    with pytest.raises(ValueError, match="needs a timezone"):
        Interrupt("x", deadline=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="finite number of seconds"):
        Interrupt("x", deadline="tomorrow")
    with pytest.raises(ValueError, match="needs a deadline"):
        Interrupt("x", on_deadline="y")
    from waypoint.engine import GraphBuildError

    with pytest.raises(GraphBuildError, match="on_expiry='reject'"):
        ApprovalMiddleware({"x"}, expires_after=5, on_expiry="approve")
    with pytest.raises(GraphBuildError, match="expires_after"):
        ApprovalMiddleware({"x"}, expires_after=0)


class _TwoCalls:
    async def generate(self, messages, **_):
        if messages[-1].role == "tool":
            return Message.assistant("done")
        return Message.assistant(tool_calls=[ToolCall(id="a", name="pay", arguments='{"n": 1}'),
                                             ToolCall(id="b", name="pay", arguments='{"n": 2}')])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


async def test_a_pause_shown_again_keeps_its_first_deadline():
    @tool
    def pay(n: int) -> str:
        """Pay."""
        return f"paid {n}"

    store = MemoryStore()
    app = ChatModelAgent(name="payer", model=_TwoCalls(), tools=[pay],
                         middlewares=[ApprovalMiddleware({"pay"}, expires_after=600)]).compile(store=store)
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke("pay both", checkpoint_id="p1")
    first, second = paused.value.info.contexts
    await asyncio.sleep(0.05)
    with pytest.raises(GraphInterrupted) as again:
        await app.ainvoke(None, checkpoint_id="p1", resume={first.id: ApprovalResult(approved=True)})
    (still,) = again.value.info.contexts
    assert still.id == second.id and still.deadline == second.deadline  # not pushed back by the first answer
    assert (await store.history("p1", limit=1))[0].deadline == second.deadline


async def test_a_node_that_asks_again_keeps_its_pauses_first_deadline():
    def ask(name):
        def node(x):
            is_target, has_data, data = get_resume_context()
            if not has_data:
                raise Interrupt({"ask": name}, deadline=timedelta(seconds=600))
            return {name: data}
        return node

    def both(state):
        if not get_resume_context()[1]:
            raise Interrupt({"ask": "both"}, deadline=timedelta(seconds=600))
        return state

    g = Graph(name="twice")
    g.add_node("one", ask("one"))
    g.add_node("two", both)
    g.add_edge(START, "one")
    g.add_edge("one", "two")
    g.add_edge("two", END)
    store = MemoryStore()
    app = g.compile(store=store)
    first = await _paused(app)
    await asyncio.sleep(0.05)
    with pytest.raises(GraphInterrupted) as again:  # targeted without data: the node asks again, same pause
        await app.ainvoke(None, checkpoint_id="g1", resume=[first.id])
    (still,) = again.value.info.contexts
    assert still.id == first.id and still.deadline == first.deadline


def test_runs_show_says_when_a_pause_expires_by_the_stores_clock(tmp_path):
    paused = app(tmp_path, "pause", "r1", "--expires", "600")["r1"]
    waypoint = str(Path(sys.executable).parent / "waypoint")
    shown = subprocess.run([waypoint, "runs", "show", "r1", "--db", str(tmp_path / "app.db")], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    (line,) = [ln for ln in shown.stdout.splitlines() if ln.strip().startswith("deadline")]
    assert "left by the store's clock" in line and (" min " in line or " s left" in line), line
    as_json = subprocess.run([waypoint, "runs", "show", "r1", "--db", str(tmp_path / "app.db"), "--json"],
                             capture_output=True, text=True, timeout=60)
    (pending,) = json.loads(as_json.stdout)["interrupts"]
    assert pending["deadline"] == pytest.approx(paused["deadline"]) and 0 < pending["expires_in"] <= 600


def _asker_v2(renamed: bool = False):
    def ask(x):
        if not get_resume_context()[1]:
            raise Interrupt({"question": "go on?"}, deadline=0.3, on_deadline="no answer")
        return {"got": get_resume_context()[2]}

    g = Graph(name="asker")
    at = "ask_again" if renamed else "ask"
    g.add_node(at, ask)
    g.add_node("audit", lambda d: {**d, "audited": True})
    g.add_edge(START, at)
    g.add_edge(at, "audit")
    g.add_edge("audit", END)
    return g


async def test_after_a_deploy_the_next_version_expires_what_the_last_one_paused(tmp_path, caplog):
    store = SQLiteStore(tmp_path / "g.db")
    v1 = _asker(deadline=0.3, on_deadline="no answer").compile(store=store)
    ctx = await _paused(v1)
    await _due(store, ctx.deadline)
    assert await recover([_asker_v2(renamed=True).compile(store=store)]) == []  # cannot continue it: left
    assert "written by a graph this process does not serve" in caplog.text
    (outcome,) = await recover([_asker_v2().compile(store=store)])  # an added node: it can
    assert outcome.outcome == "expired"
    assert (await store.history("g1", limit=1))[0].status == "completed"
    snap = await read_run(store, "g1")
    assert snap.output == {"got": "no answer", "audited": True}
    await store.close()


def test_a_waypoint_worker_expires_a_due_approval_through_the_queue(tmp_path):
    paused = app(tmp_path, "pause", "r1", "--expires", "2")["r1"]
    env = {**_env(tmp_path), "DEADLINE_EXPIRES": "2",
           "PYTHONPATH": os.pathsep.join([str(PROC.parent), os.environ.get("PYTHONPATH", "")])}
    worker = subprocess.Popen([sys.executable, "-m", "waypoint.cmd.main", "worker", "--db", str(tmp_path / "app.db"),
                               "--graphs", "deadline_app:ops", "--poll", "0.2"], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        until_rest(tmp_path, "r1", 2 + SLACK)
    finally:
        err = stop(worker)
    snap, _ = asyncio.run(_snapshot(tmp_path / "app.db", "r1"))
    assert [d.verb for d in snap.state.decisions] == ["expired"], err[-3000:]
    assert "the approval expired at" in snap.state.messages[-1].content and effects(tmp_path) == []
    assert paused["iid"] in err  # the worker said which pause it expired


# --- found under attack ------------------------------------------------------------------------------------

class _Asks:
    """Asks for `execute` with each of `calls` (call ID, arguments); then repeats what the tools answered."""

    def __init__(self, *calls: tuple[str, str]) -> None:
        self.calls = calls or (("c1", '{"command": "echo hi"}'),)

    async def generate(self, messages, **_):
        if messages[-1].role == "tool":
            return Message.assistant("model read: " + " | ".join(m.content for m in messages if m.role == "tool"))
        return Message.assistant(tool_calls=[ToolCall(id=i, name="execute", arguments=a) for i, a in self.calls])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def _ops(store, expires: float, ran: list, *calls: tuple[str, str], fails: str = ""):
    @tool
    def execute(command: str) -> str:
        """Run a shell command."""
        ran.append(command)
        if command == fails:
            raise RuntimeError("the host is down")
        return f"ran {command}"

    return ChatModelAgent(name="ops", model=_Asks(*calls), tools=[execute],
                          middlewares=[ApprovalMiddleware({"execute"}, expires_after=expires)]).compile(store=store)


async def _ask(app, cid="r1"):
    with pytest.raises(GraphInterrupted) as paused:
        await app.ainvoke("run it", checkpoint_id=cid)
    return paused.value.info.contexts


async def test_an_answer_queued_in_time_is_taken_however_late_a_worker_gets_to_it(tmp_path):
    from waypoint.stores import RunQueue, Worker

    store, ran = SQLiteStore(tmp_path / "q.db"), []
    app = _ops(store, 1.0, ran)
    queue = RunQueue(store)
    await queue.submit(app, "run it", "r1")
    worker = Worker(store, [app], poll=0.05)
    task = asyncio.create_task(worker.run())
    paused = await queue.wait("r1", timeout=30)
    worker.stop()
    await asyncio.gather(task, return_exceptions=True)
    (iid,) = paused.interrupts
    await queue.resume("r1", {iid: ApprovalResult(approved=True)}, expected_version=paused.version)  # in time
    deadline = (await store.history("r1", limit=1))[0].deadline
    await _due(store, deadline)  # ... but no worker runs until after the deadline
    worker = Worker(store, [app], poll=0.05)
    task = asyncio.create_task(worker.run())
    done = await queue.wait("r1", timeout=30)
    worker.stop()
    await asyncio.gather(task, return_exceptions=True)
    assert done.outcome == "completed" and ran == ["echo hi"], done
    assert (await read_run(store, "r1")).state.decisions[0].verb == "approved"
    await store.close()


async def test_a_claim_that_lands_after_the_deadline_it_answers_is_refused_by_the_store(tmp_path):
    class SlowClaims:  # the claim's write reaches the database late (a GC pause, a slow network)
        def __init__(self, inner):
            self.inner, self.slowed = inner, False

        def __getattr__(self, name):
            return getattr(self.inner, name)

        async def put(self, meta, *args, **kwargs):
            if meta.status == "running" and not self.slowed:
                self.slowed = True
                await _due(self.inner, deadline)
            return await self.inner.put(meta, *args, **kwargs)

    store, ran = SQLiteStore(tmp_path / "g.db"), []
    (ctx,) = await _ask(_ops(store, 1.0, ran))
    deadline = ctx.deadline
    before = (await store.history("r1", limit=1))[0].version
    slow = _ops(SlowClaims(store), 1.0, ran)
    with pytest.raises(PauseExpired, match="expired .* before the resume could claim the run"):
        await slow.ainvoke(None, checkpoint_id="r1", resume={ctx.id: ApprovalResult(approved=True)})  # sent in time
    assert (await store.history("r1", limit=1))[0].version == before and ran == []
    await store.close()


async def test_due_runs_this_process_leaves_never_hide_its_own(tmp_path):
    store = SQLiteStore(tmp_path / "g.db")
    other = _asker(deadline=0.2).compile(store=store)
    other.shape.name = "other"  # noqa: SLF001 - another graph on the same database, served elsewhere
    other.shape._structure = None
    for i in range(510):  # more than one page of due runs ahead of ours
        await _paused(other, f"o{i:03d}")
    mine = _asker(deadline=0.5, on_deadline="no").compile(store=store)
    ctx = await _paused(mine, "m1")
    await _due(store, ctx.deadline)
    outcomes = await recover([mine])
    assert [(o.checkpoint_id, o.outcome) for o in outcomes] == [("m1", "expired")]
    await store.close()


async def test_a_failed_runs_due_pause_takes_its_deadlines_answer_when_the_run_is_retried(tmp_path):
    store, ran = SQLiteStore(tmp_path / "g.db"), []
    app = _ops(store, 1.0, ran, ("c1", '{"command": "flaky"}'), ("c2", '{"command": "safe"}'), fails="flaky")
    first, second = await _ask(app)
    with pytest.raises(NodeError):  # c1 approved in time; its tool fails, and so does the run
        await app.ainvoke(None, checkpoint_id="r1", resume={first.id: ApprovalResult(approved=True)})
    await _due(store, second.deadline)
    with pytest.raises(PauseExpired, match="resume the run without answering it"):
        await app.ainvoke(None, checkpoint_id="r1", resume={second.id: ApprovalResult(approved=True)})
    with pytest.raises(GraphInterrupted) as again:  # the retry: c2 expires; c1, answered in time, asks again
        await app.ainvoke(None, checkpoint_id="r1")
    (asked,) = again.value.info.contexts
    assert asked.deadline is None and "flaky" in str(asked.info)
    assert ran == ["flaky"]  # "safe" never ran: its approval expired
    await store.close()


async def test_a_due_pause_resumed_without_an_answer_gets_its_deadlines_answer():
    store = MemoryStore()
    app = _asker(deadline=0.2, on_deadline="no answer").compile(store=store)
    ctx = await _paused(app)
    await _due(store, ctx.deadline)
    assert await app.ainvoke(None, checkpoint_id="g1", resume=[ctx.id]) == {"got": "no answer"}


async def test_a_fork_of_a_pause_whose_deadline_passed_waits_for_a_person(tmp_path):
    store = SQLiteStore(tmp_path / "g.db")
    app = _asker(deadline=0.2, on_deadline="no answer").compile(store=store)
    ctx = await _paused(app)
    await _due(store, ctx.deadline)
    with pytest.raises(GraphInterrupted) as forked:
        await app.ainvoke(None, checkpoint_id="g1", write_to="g2", resume=[])
    (reopened,) = forked.value.info.contexts
    assert reopened.deadline is None and (await store.history("g2", limit=1))[0].deadline is None
    assert await app.ainvoke(None, checkpoint_id="g1", version=(await store.history("g1", limit=1))[0].version,
                             write_to="g3", resume={ctx.id: "yes"}) == {"got": "yes"}  # answering otherwise
    await store.close()


async def test_an_approval_asked_again_after_a_restart_below_still_expires():
    from waypoint.engine import Restart

    ran: list = []

    @tool
    def execute(command: str) -> str:
        """Run a shell command (asks which host first)."""
        if not get_resume_context()[1]:
            raise Interrupt({"which host for": command})
        ran.append(command)
        return f"ran {command}"

    store = MemoryStore()
    app = ChatModelAgent(name="ops", model=_Asks(), tools=[execute],
                         middlewares=[ApprovalMiddleware({"execute"}, expires_after=0.5)]).compile(store=store)
    (approval,) = await _ask(app)
    with pytest.raises(GraphInterrupted) as inner:
        await app.ainvoke(None, checkpoint_id="r1", resume={approval.id: ApprovalResult(approved=True)})
    (question,) = inner.value.info.contexts
    with pytest.raises(GraphInterrupted) as again:
        await app.ainvoke(None, checkpoint_id="r1", resume={question.id: Restart(replace_input={"command": "rm"})})
    (asked,) = again.value.info.contexts
    assert asked.deadline is not None and "rm" in str(asked.info)
    await _due(store, asked.deadline)
    (outcome,) = await recover([app])
    assert outcome.outcome == "expired" and ran == []


def test_a_deadline_too_far_off_is_refused_not_stored():
    with pytest.raises(ValueError, match="100 years"):
        Interrupt("x", deadline=10**400)
    from waypoint.engine import GraphBuildError

    with pytest.raises(GraphBuildError, match="100 years"):
        ApprovalMiddleware({"x"}, expires_after=1e300)
