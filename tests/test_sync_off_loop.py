"""Sync node and tool code runs off the event loop under `ainvoke` / `aevents` (a server's loop, a worker's),
and on the run's own loop under `invoke()`, where nothing else waits for it."""

from __future__ import annotations

import asyncio
import threading
import time

from waypoint.engine import END, START, ChatModelAgent, Graph, Message, Runner, ToolCall, tool
from waypoint.engine.models import ScriptedChatModel


def sleeper_graph(seen: list) -> Graph:
    def nap(x: int) -> int:
        seen.append(threading.current_thread() is threading.main_thread())
        time.sleep(0.5)
        return x + 1

    g = Graph(name="nap")
    g.add_node("nap", nap)
    g.add_edge(START, "nap")
    g.add_edge("nap", END)
    return g


async def ticks_while(work) -> tuple[object, int]:
    """Run `work` and count how often a 10 ms ticker on the same loop got to run meanwhile."""
    count = 0

    async def ticker():
        nonlocal count
        while True:
            await asyncio.sleep(0.01)
            count += 1

    task = asyncio.ensure_future(ticker())
    try:
        result = await work
    finally:
        task.cancel()
    return result, count


async def test_a_blocking_sync_node_does_not_stall_the_event_loop():
    seen: list = []
    app = sleeper_graph(seen).compile()
    result, ticks = await ticks_while(app.ainvoke(1))
    assert result == 2 and seen == [False]
    assert ticks >= 20  # the loop kept serving others for the whole half second


async def test_a_blocking_sync_tool_does_not_stall_the_event_loop():
    @tool
    def slow_lookup(key: str) -> str:
        """Look something up, slowly."""
        time.sleep(0.5)
        return f"value of {key}"

    model = ScriptedChatModel([Message.assistant(tool_calls=[ToolCall(id="c", name="slow_lookup",
                                                                      arguments='{"key": "k"}')]), "ok"])
    runner = Runner(ChatModelAgent(name="s", model=model, tools=[slow_lookup]))

    async def run():
        return [e async for e in runner.run("go")]

    events, ticks = await ticks_while(run())
    assert events[-1].action.exit and ticks >= 20


def test_invoke_runs_sync_nodes_on_its_own_loop():
    seen: list = []
    assert sleeper_graph(seen).compile().invoke(1) == 2
    assert seen == [True]  # no thread hop: the run's loop is its own


def fan_out(name: str, n: int, fn) -> Graph:
    """START -> n parallel nodes `fn` -> END."""
    g = Graph(name=name)
    for i in range(n):
        g.add_node(f"w{i}", fn, output_key=f"w{i}")
        g.add_edge(START, f"w{i}")
        g.add_edge(f"w{i}", END)
    return g


async def test_more_blocking_sync_nodes_than_the_pool_keeps_all_run_at_once():
    """Sync calls share a few threads, but a call whose threads are all blocked gets one of its own: 24 parallel
    nodes that each wait until all 24 are running (a barrier) finish — none waited behind another."""
    from waypoint.engine.run.node_calls import _POOL

    n = 3 * _POOL._core
    barrier = threading.Barrier(n, timeout=60)

    def meet(x):
        barrier.wait()  # BrokenBarrierError unless every one of the n runs at the same time
        return x

    await fan_out("meet", n, meet).compile().ainvoke(1)
    assert barrier.n_waiting == 0 and not barrier.broken


async def test_sync_calls_reuse_their_threads():
    """A thousand quick sync calls, fifty at a time, run on a few dozen threads at most (a thread per call costs
    ~100 µs: it used to start 18 threads per step of this graph)."""
    threads: set[threading.Thread] = set()

    def quick(x):
        threads.add(threading.current_thread())  # the objects, kept: no id of an ended thread is reused
        return x

    app = fan_out("quick", 50, quick).compile()
    for _ in range(20):
        await app.ainvoke(1)
    assert 1 <= len(threads) <= 100, len(threads)


async def test_a_forked_child_runs_sync_nodes_on_threads_of_its_own():
    """A child forked after the pool's threads started has none of them: it starts its own (given the parent's
    idle threads, it would wait for ever)."""
    import os
    import signal

    app = fan_out("forked", 4, lambda x: x + 1).compile()
    await app.ainvoke(1)  # the parent's threads exist, idle
    pid = os.fork()
    if pid == 0:  # the child: a fresh loop, the parent's pool state; it never returns into pytest
        code = 1
        try:
            code = 0 if asyncio.run(asyncio.wait_for(app.ainvoke(1), 60)) == {f"w{i}": 2 for i in range(4)} else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 90
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child's sync nodes never ran")
        await asyncio.sleep(0.02)
    assert os.waitstatus_to_exitcode(done[1]) == 0


# --- the pool under faults: no call waits for ever, none starts for a caller that left -----------------------


def small_pool(monkeypatch, *, core: int = 1, starved: float = 0.005):
    """A pool of its own for one test (the process's pool is shared by every test on this worker)."""
    from waypoint.engine.run import node_calls

    pool = node_calls._DaemonPool(core=core, idle=4, starved=starved)
    monkeypatch.setattr(node_calls, "_POOL", pool)
    return pool


def block_threads(pool, gate: threading.Event) -> None:
    """Occupy every core thread of `pool` with a call that waits for `gate`, from a loop of its own."""
    from waypoint.engine.run.node_calls import in_daemon_thread

    running = threading.Barrier(pool._core + 1, timeout=30)

    def hold():
        running.wait()
        gate.wait(60)

    async def occupy():
        await asyncio.gather(*(in_daemon_thread(hold) for _ in range(pool._core)))

    threading.Thread(target=asyncio.run, args=(occupy(),), daemon=True).start()
    running.wait()


def test_a_waiting_call_is_rescued_by_its_own_timer_though_an_older_one_waits_on_a_busy_loop(monkeypatch):
    """Loop 1 queues a call while every thread is blocked, then stays busy; loop 2 queues a quick call. Loop 2's
    rescue starts a thread for loop 2's call — never loop 1's, whose own rescue is late: the quick call ran in
    milliseconds, not when loop 1 woke (it used to wait for that, or for ever with a closed loop)."""
    from waypoint.engine.run.node_calls import in_daemon_thread

    pool, gate, quick_done, queued = small_pool(monkeypatch), threading.Event(), threading.Event(), threading.Event()
    block_threads(pool, gate)

    async def first_loop():
        waiting = asyncio.ensure_future(in_daemon_thread(gate.wait, 60))
        await asyncio.sleep(0)  # submitted: in line behind the blocked threads
        queued.set()
        quick_done.wait(30)  # this loop is busy (blocked) until the quick call on the other loop is done
        gate.set()
        await waiting

    other = threading.Thread(target=asyncio.run, args=(first_loop(),), daemon=True)
    other.start()
    assert queued.wait(30)
    try:
        assert asyncio.run(asyncio.wait_for(in_daemon_thread(lambda: "quick"), 10)) == "quick"
    finally:
        quick_done.set()
        gate.set()
    other.join(30)


async def test_a_sync_node_that_raises_stop_iteration_fails_its_run_instead_of_hanging_it():
    """`next()` on an empty iterator in a sync node: a Future refuses StopIteration, so the run would wait for ever;
    it fails with a NodeError whose cause chain holds the StopIteration, as under `invoke()`."""
    import pytest

    from waypoint.engine import NodeError

    app = fan_out("empty", 1, lambda x: next(iter([]))).compile()
    with pytest.raises(NodeError) as caught:
        await asyncio.wait_for(app.ainvoke(1), 30)
    assert isinstance(caught.value.__cause__.__cause__, StopIteration)
    assert "StopIteration" in str(caught.value)


async def test_a_thread_that_cannot_be_started_fails_the_call_at_once(monkeypatch):
    """Out of threads (every thread blocked, the process at its limit): the call that needed a new thread fails
    with an error that says so — not a call lost from the line, its caller waiting for ever — and the pool's
    count of threads stays true, so the next call still gets one."""
    import pytest

    from waypoint.engine.run import node_calls
    from waypoint.engine.run.node_calls import in_daemon_thread

    pool, gate = small_pool(monkeypatch), threading.Event()
    block_threads(pool, gate)
    real = node_calls._Thread

    def refused(_pool):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(node_calls, "_Thread", refused)
    try:
        with pytest.raises(RuntimeError, match="could not start a thread for this sync call"):
            await asyncio.wait_for(in_daemon_thread(lambda: "never"), 10)
        assert pool._threads == pool._core and not pool._waiting
    finally:
        monkeypatch.setattr(node_calls, "_Thread", real)
        gate.set()
    assert await asyncio.wait_for(in_daemon_thread(lambda: "again"), 10) == "again"


async def test_a_call_whose_caller_was_cancelled_while_it_waited_never_starts(monkeypatch):
    """A queued call's run was cancelled (or lost its lease) before a thread was free: the call never starts —
    no side effect for a run that is over."""
    from waypoint.engine.run.node_calls import in_daemon_thread

    pool, gate, ran = small_pool(monkeypatch, starved=600.0), threading.Event(), []
    block_threads(pool, gate)
    queued = asyncio.ensure_future(in_daemon_thread(ran.append, "side effect"))
    await asyncio.sleep(0)
    assert len(pool._waiting) == 1
    queued.cancel()
    gate.set()  # the thread is free: it takes the cancelled call first, then this one
    assert await asyncio.wait_for(in_daemon_thread(lambda: "after"), 10) == "after"
    assert ran == []


def test_a_node_that_forks_on_a_pool_thread_leaves_a_child_that_ends_and_a_parent_whose_calls_go_on(monkeypatch):
    """The child of a fork made inside a sync node ends when the node returns, as a thread of its own would
    (it used to wait on the parent's thread's pipe for ever, eating the parent's wake-ups)."""
    import os
    import signal

    from waypoint.engine.run.node_calls import in_daemon_thread

    small_pool(monkeypatch, core=1)
    children: list[int] = []

    def forks():
        pid = os.fork()  # the child returns from the node, on the pool thread: nothing must run after that
        if pid:
            children.append(pid)

    async def calls():
        await in_daemon_thread(forks)
        return [await in_daemon_thread(lambda i=i: i) for i in range(50)]

    try:
        assert asyncio.run(asyncio.wait_for(calls(), 30)) == list(range(50))
        deadline = time.monotonic() + 30
        while os.waitpid(children[0], os.WNOHANG)[0] == 0:
            assert time.monotonic() < deadline, "the child forked inside a sync node never ended"
            time.sleep(0.02)
        children.clear()
    finally:
        for pid in children:  # a child left behind would hold pytest's output open
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
