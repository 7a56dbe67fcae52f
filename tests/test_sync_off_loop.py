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
