"""Agents and graphs the recovery tests serve (`waypoint serve --agents recovery_graphs:...`, `waypoint worker
--graphs recovery_graphs:fleet`), each journaling what really ran to the file named by $RECOVERY_JOURNAL, one
fsynced line per event ending in the process ID:

- `pair` ("pair"): the model asks for two tools at once, `quick` and `slow`; `slow` journals its start, then
  waits until the file $RECOVERY_GATE exists (so a process can be killed inside it), then journals its end.
  Once both results are back the model answers. Lines: "model <run> <messages seen>", "tool <run> <name>
  start|done".
- `asks` ("asks"): one node that pauses for a person ("node <run> asks").
- `suicide` ("suicide"): a graph whose node journals "node <run> suicide" and kills its own process with
  SIGKILL while $RECOVERY_SURVIVE is unset (a run that keeps killing its executor).
- `fleet` ("fleet-r"): three model turns, each asking one `effect` call (journaled start/done around
  $RECOVERY_EFFECT seconds); a run whose input contains "ask" asks a person to approve its first call.
  $RECOVERY_LEASE sets the lease (seconds).
"""

from __future__ import annotations

import asyncio
import os
import signal

from waypoint.engine import END, START, ChatModelAgent, Graph, Interrupt, Message, ToolCall, ToolContext, tool
from waypoint.engine.run.task import current_checkpoint_id
from waypoint.middleware import ApprovalMiddleware


def journal(*words: object) -> None:
    path = os.environ.get("RECOVERY_JOURNAL")
    if path:
        line = " ".join(str(w) for w in words) + f" {os.getpid()}\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def _lease() -> float:
    return float(os.environ.get("RECOVERY_LEASE", "30"))


# --- pair -----------------------------------------------------------------------------------------------

@tool
async def quick(ctx: ToolContext) -> str:
    """Returns at once."""
    journal("tool", ctx.checkpoint_id, "quick", "start")
    journal("tool", ctx.checkpoint_id, "quick", "done")
    return "quick done"


@tool
async def slow(ctx: ToolContext) -> str:
    """Waits for the gate file."""
    journal("tool", ctx.checkpoint_id, "slow", "start")
    while not os.path.exists(os.environ["RECOVERY_GATE"]):
        await asyncio.sleep(0.01)
    journal("tool", ctx.checkpoint_id, "slow", "done")
    return "slow done"


class _AsksBoth:
    name = "asks-both"

    async def generate(self, messages, **_):
        journal("model", current_checkpoint_id(), len(messages))
        if messages[-1].role == "tool":
            return Message.assistant("both done: " + ", ".join(m.content for m in messages if m.role == "tool"))
        return Message.assistant(tool_calls=[ToolCall(id="call_q", name="quick", arguments="{}"),
                                             ToolCall(id="call_s", name="slow", arguments="{}")])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def pair() -> ChatModelAgent:
    return ChatModelAgent(name="pair", model=_AsksBoth(), tools=[quick, slow])


# --- asks / suicide -------------------------------------------------------------------------------------

def asks() -> Graph:
    def ask(x: str) -> str:
        journal("node", current_checkpoint_id(), "asks")
        raise Interrupt({"question": f"may I {x}?"})

    g = Graph(name="asks")
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g


def suicide() -> Graph:
    def first(x: str) -> str:
        journal("node", current_checkpoint_id(), "first")
        return x

    def die(x: str) -> str:
        journal("node", current_checkpoint_id(), "suicide")
        if not os.environ.get("RECOVERY_SURVIVE"):
            os.kill(os.getpid(), signal.SIGKILL)
        return x + " survived"

    g = Graph(name="suicide")
    g.add_node("first", first)
    g.add_node("die", die)
    g.add_edge(START, "first")
    g.add_edge("first", "die")
    g.add_edge("die", END)
    return g


# --- fleet ----------------------------------------------------------------------------------------------

TURNS = 3


@tool
async def effect(turn: int, ctx: ToolContext) -> str:
    """A side effect (journaled)."""
    journal("effect", ctx.checkpoint_id, ctx.call_id, "start")
    await asyncio.sleep(float(os.environ.get("RECOVERY_EFFECT", "0.2")))
    journal("effect", ctx.checkpoint_id, ctx.call_id, "done")
    return f"effect {turn}"


class _Turns:
    name = "turns"

    async def generate(self, messages, **_):
        cid = current_checkpoint_id()
        journal("model", cid, len(messages))
        await asyncio.sleep(0.02)
        done = sum(1 for m in messages if m.role == "tool")
        if done >= TURNS:
            return Message.assistant(f"done after {done} effects")
        return Message.assistant(tool_calls=[ToolCall(id=f"call-{done}", name="effect",
                                                      arguments=f'{{"turn": {done}}}')])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def _needs_approval(name: str, arguments: str) -> bool:
    return '"turn": 0' in arguments and "ask" in (current_checkpoint_id() or "")


def _fleet_agent() -> ChatModelAgent:
    return ChatModelAgent(name="fleet-r", model=_Turns(), tools=[effect],
                          middlewares=[ApprovalMiddleware(tools={"effect"}, when=_needs_approval)])


def fleet(store):
    """For `waypoint worker --graphs recovery_graphs:fleet` (compiled on the worker's store)."""
    return _fleet_agent().compile(store=store, lease_seconds=_lease())


def fleet_runner():
    """For `waypoint serve --agents recovery_graphs:fleet_runner` (the same graph, streaming as the service does)."""
    from waypoint.engine import Runner

    return Runner(_fleet_agent(), streaming=True, lease_seconds=_lease())
