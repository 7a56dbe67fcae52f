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
    from waypoint.engine.node_calls import _POOL

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
