"""Runs for the cancel tests, executed in a child process (tests/test_cancel.py).

    python cancel_app.py DB|URL CHECKPOINT_ID MODE --gates DIR --journal PATH [--continue-run] [--takeover]

MODE "graph": START -> a -> b -> c -> END. MODE "agent": a model that asks for `fast` and `gated` in parallel, then
sums up. MODE "nested": an agent whose only tool is the "agent" agent (an `AgentTool`), under `SafeToolMiddleware`. Every node, model turn and
tool appends "<what> start|done <pid> [<idempotency key>]" to the journal; a step named in `gate_names` waits for the
file DIR/gate-<name> to exist before it is done (the test opens gates as events, never by sleeping). A cancel
request read by this process is journalled as "asked <when> <pid>", and each look for one as "looked requests <pid>". Exit codes: 0 completed (output as JSON), 5
`RunCancelled` (prints {"cancelled": by, "when": when}), 4 another error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from waypoint.engine import (
    END,
    START,
    AgentTool,
    ChatModelAgent,
    Graph,
    Message,
    RunCancelled,
    Runner,
    ToolCall,
    ToolContext,
    tool,
)
from waypoint.middleware import SafeToolMiddleware
from waypoint.stores import SQLiteStore, SQLStore


class Journal:
    def __init__(self, path: str, gates: str) -> None:
        self.path, self.gates = path, Path(gates)

    def write(self, *words: str) -> None:
        with open(self.path, "a") as fh:
            fh.write(" ".join([*words[:2], str(os.getpid()), *words[2:]]) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    async def step(self, name: str, key: str = "") -> None:
        """`name start`, then wait for its gate (if the test made one for it), then `name done`."""
        self.write(name, "start", *([key] if key else []))
        gate = self.gates / f"gate-{name}"
        if (self.gates / f"hold-{name}").exists():
            while not gate.exists():
                await asyncio.sleep(0.01)
        self.write(name, "done", *([key] if key else []))


class Asked(logging.Handler):
    """Journals the moment this process reads a cancel request (engine/keep/lease.py logs it)."""

    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self.journal = journal

    def emit(self, record: logging.LogRecord) -> None:
        if "cancel requested" in record.getMessage():
            self.journal.write("asked", record.args[-1] if record.args else "?")
        elif record.getMessage().startswith("cancel requests of") and record.getMessage().endswith(" read"):
            self.journal.write("looked", "requests")


def graph(j: Journal, store) -> Graph:
    g = Graph(name="cancel-graph")
    names = ["a", "b", "c"]
    for name in names:
        async def node(x, name=name):
            await j.step(name)
            return x + [name]
        g.add_node(name, node)
    for a, b in zip([START, *names], [*names, END]):
        g.add_edge(a, b)
    return g


class Scripted:
    """Asks for `calls` first, then sums up the tool results: from the conversation alone, so another process
    continuing the run gets the same answers. Each turn is a journalled step ("<name>-model<turn>")."""

    def __init__(self, j: Journal, name: str, calls: list[ToolCall]) -> None:
        self.j, self.name, self.calls = j, name, calls

    async def generate(self, messages, **_):
        turn = 1 + sum(m.role == "assistant" for m in messages)
        await self.j.step(f"{self.name}-model{turn}")
        if messages[-1].role == "tool":
            return Message.assistant("; ".join(m.content for m in messages if m.role == "tool"))
        return Message.assistant(tool_calls=self.calls)

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def agent(j: Journal, name: str = "agent") -> ChatModelAgent:
    @tool
    async def fast(ctx: ToolContext) -> str:
        """Fast."""
        await j.step("fast", ctx.idempotency_key)
        return "fast result"

    @tool
    async def gated(ctx: ToolContext) -> str:
        """Waits for its gate."""
        await j.step("gated", ctx.idempotency_key)
        return "gated result"

    calls = [ToolCall(id="c1", name="fast", arguments="{}"), ToolCall(id="c2", name="gated", arguments="{}")]
    return ChatModelAgent(name=name, model=Scripted(j, name, calls), tools=[fast, gated],
                          description="does the work")


def nested(j: Journal) -> ChatModelAgent:
    """The outer agent turns its tools' errors into text for its model (`SafeToolMiddleware`): a cancel stopping the
    inner agent's run is no tool error, and must pass."""
    inner = AgentTool(agent(j, "inner"))
    calls = [ToolCall(id="o1", name="inner", arguments='{"request": "work"}')]
    return ChatModelAgent(name="outer", model=Scripted(j, "outer", calls), tools=[inner],
                          middlewares=[SafeToolMiddleware()])


def open_store(db: str):
    """A SQLite file, or a Postgres URL (its renewals and cancel requests then go over the renewal connection)."""
    return SQLStore(db) if db.startswith("postgresql") else SQLiteStore(db)


def build(mode: str, j: Journal, store) -> tuple[object, str]:
    """The app the mode runs (a CompiledGraph or a Runner) and its kind."""
    if mode == "graph":
        return graph(j, store).compile(store=store), "graph"
    return Runner(agent(j) if mode == "agent" else nested(j), store=store), "agent"


async def main(args) -> int:
    j = Journal(args.journal, args.gates)
    logging.getLogger("waypoint.lease").addHandler(Asked(j))
    logging.getLogger("waypoint.lease").setLevel(logging.DEBUG)
    store = open_store(args.db)
    app, kind = build(args.mode, j, store)
    try:
        if kind == "graph":
            output = await app.ainvoke(None if args.continue_run else [], checkpoint_id=args.checkpoint_id,
                                       takeover=args.takeover)
            print(json.dumps(output))
            return 0
        events = app.resume(args.checkpoint_id) if args.continue_run else app.run("go", checkpoint_id=args.checkpoint_id)
        async for event in events:
            if isinstance(event.error, RunCancelled):
                raise event.error
            if event.error is not None:
                print(f"{type(event.error).__name__}: {event.error}", file=sys.stderr)
                return 4
            if event.output is not None and event.agent_name == app.agent.name:
                message = await event.output.get_message()
                if message.content:
                    print(json.dumps(message.content))
        return 0
    except RunCancelled as err:
        print(json.dumps({"cancelled": err.by, "when": err.when}))
        return 5
    finally:
        await store.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("db")
    p.add_argument("checkpoint_id")
    p.add_argument("mode", choices=["graph", "agent", "nested"])
    p.add_argument("--gates", required=True)
    p.add_argument("--journal", required=True)
    p.add_argument("--continue-run", action="store_true")
    p.add_argument("--takeover", action="store_true")
    sys.exit(asyncio.run(main(p.parse_args())))
