"""Graphs the lease and takeover tests run in worker processes (`--graphs lease_graphs:<name>`).

Every side effect is journaled to $FLEET_JOURNAL as "<what> <run> <detail...> <pid>" (one fsynced write
per line, so lines of concurrent processes never mix); $FLEET_LEASE sets the runs' lease (seconds).

- `sequential`: an agent whose model asks for two tool calls, run one after the other; the tool journals
  "effect <run> <call> start|done"; call 1 takes $EFFECT_SECONDS (default 0.05), call 2 0.05 s; each returns
  "effect <n> done by <pid>".
- `slow`: START -> work -> END; `work` journals "work <run> start", sleeps $WORK_SECONDS (default 60), or
  until the file $WORK_UNTIL exists when that is set, and journals "work <run> done".
- `stateful`: `slow` with a run-local state (a dict), for `update_state`.
- `three_calls`: an agent whose model asks for three calls of `slow_effect` at once, run one after the other,
  each taking $EFFECT_SECONDS (default 0.05) — calls longer than the lease when the test says so.
"""

from __future__ import annotations

import asyncio
import os

from waypoint.engine import END, START, ChatModelAgent, Graph, Message, ToolCall, ToolContext, tool
from waypoint.engine.run.task import current_checkpoint_id


def journal(*words: object) -> None:
    path = os.environ.get("FLEET_JOURNAL")
    if path:
        line = " ".join(str(w) for w in words) + f" {os.getpid()}\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def _lease() -> float:
    return float(os.environ.get("FLEET_LEASE", "30"))


@tool
async def effect(n: int, ctx: ToolContext) -> str:
    """A side effect that must not run twice."""
    journal("effect", ctx.checkpoint_id, ctx.call_id, "start", "rerun" if ctx.rerun else "first")
    await asyncio.sleep(float(os.environ.get("EFFECT_SECONDS", "0.05")) if n == 1 else 0.05)
    journal("effect", ctx.checkpoint_id, ctx.call_id, "done")
    return f"effect {n} done by {os.getpid()}"


class AsksTwice:
    """Asks for `calls` calls at once (two), then reports — decided from the conversation alone."""

    name = "asks-twice"
    calls = (1, 2)
    tool = "effect"

    async def generate(self, messages, **_):
        cid = current_checkpoint_id()
        journal("model", cid, len(messages))
        if messages[-1].role == "tool":
            return Message.assistant("done: " + ", ".join(m.content for m in messages if m.role == "tool"))
        return Message.assistant(tool_calls=[ToolCall(id=f"call-{n}", name=self.tool, arguments=f'{{"n": {n}}}')
                                             for n in self.calls])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def sequential(store):
    agent = ChatModelAgent(name="sequential", model=AsksTwice(), tools=[effect], sequential_tools=True)
    return agent.compile(store=store, lease_seconds=_lease())


async def _work(x):
    """Takes $WORK_SECONDS, or — with $WORK_UNTIL set — until that file exists (the test says when)."""
    cid = current_checkpoint_id()
    journal("work", cid, "start")
    until = os.environ.get("WORK_UNTIL")
    if until:
        while not os.path.exists(until):
            await asyncio.sleep(0.02)
    else:
        await asyncio.sleep(float(os.environ.get("WORK_SECONDS", "60")))
    journal("work", cid, "done")
    return x


def slow(store):
    return _one_node("slow", store)


def stateful(store):
    return _one_node("stateful", store, state=dict)


def _one_node(name, store, **options):
    g = Graph(name=name, **options)
    g.add_node("work", _work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile(store=store, lease_seconds=_lease())


@tool
async def slow_effect(n: int, ctx: ToolContext) -> str:
    """A side effect that must not run twice, every call $EFFECT_SECONDS long."""
    journal("effect", ctx.checkpoint_id, ctx.call_id, "start", "rerun" if ctx.rerun else "first")
    await asyncio.sleep(float(os.environ.get("EFFECT_SECONDS", "0.05")))
    journal("effect", ctx.checkpoint_id, ctx.call_id, "done")
    return f"effect {n} done by {os.getpid()}"


class AsksThrice(AsksTwice):
    name = "asks-thrice"
    calls = (1, 2, 3)
    tool = "slow_effect"


def three_calls(store):
    agent = ChatModelAgent(name="three_calls", model=AsksThrice(), tools=[slow_effect], sequential_tools=True)
    return agent.compile(store=store, lease_seconds=_lease())
