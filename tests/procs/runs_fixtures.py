"""Runs for tests/test_cli_runs.py, made by real runs on a SQLite file.

    python runs_fixtures.py DB                      writes the runs below, then exits
    python runs_fixtures.py DB crash ID SECONDS     starts run ID of `steps` (lease SECONDS) and dies in it
    python runs_fixtures.py DB crash-elsewhere ID SECONDS   the same, its lease owner named for another host
    python runs_fixtures.py DB hold ID GATE         starts run ID of `steps`, prints "holding <pid>" inside its
                                                    node, and finishes once the file GATE exists

`waypoint runs resume --graph runs_fixtures:<attr>` imports this module (its directory on PYTHONPATH):
`build_agent` (a function), `agent` (a ChatModelAgent), `refunds` (a Graph), `refunds_compiled`
(a CompiledGraph without a store), `other` (a graph of another shape), `steps` (the crashing graph:
its node kills the process while $RUNS_CRASH is 1), `typed` (a state of a type only this module
registers), `signed` (a CompiledGraph whose codec signs with a key). The `execute` tool appends a line
to $RUNS_JOURNAL each time it really runs.

| run          | what                                                               | status      |
|--------------|--------------------------------------------------------------------|-------------|
| approve-me   | agent asked to run `echo hello`, paused for approval               | interrupted |
| reject-me    | the same                                                           | interrupted |
| respond-me   | the same                                                           | interrupted |
| two-calls    | agent asked to run `ls` and `pwd` in one message, both paused      | interrupted |
| chat-done    | agent answered "hi" without tools                                  | completed   |
| refund-7     | plain graph paused on Interrupt({"question": "refund 120?"})       | interrupted |
| broken-1     | plain graph whose node raised ValueError                           | failed      |
| typed-1      | plain graph paused, its state a `Ticket` registered only here      | interrupted |
| signed-1     | plain graph paused, written with a signing key                     | interrupted |
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass

from waypoint.engine import (
    END,
    START,
    ChatModelAgent,
    Graph,
    GraphInterrupted,
    Interrupt,
    Message,
    NodeError,
    Runner,
    Serializer,
    ToolCall,
    get_resume_context,
    register_type,
    tool,
)
from waypoint.middleware import ApprovalMiddleware
from waypoint.stores import SQLiteStore


class RunsOrAnswers:
    """Asks for `execute` when the user says "run <command>", repeats a tool's result, else echoes."""

    name = "runs-or-answers"

    async def generate(self, messages, **_):
        last = messages[-1]
        if last.role == "tool":
            results = [m.content for m in messages[messages.index(_last_request(messages)) + 1:]]
            return Message.assistant("the tool said: " + "; ".join(results))
        if last.content.startswith("run "):  # "run a and b": two calls in one message
            commands = last.content[4:].split(" and ")
            return Message.assistant(tool_calls=[
                ToolCall(id=f"call_{i}", name="execute", arguments=json.dumps({"command": c}))
                for i, c in enumerate(commands, 1)])
        return Message.assistant(f"you said: {last.content}")

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def _last_request(messages):
    return next(m for m in reversed(messages) if m.role == "assistant" and m.tool_calls)


@tool
def execute(command: str) -> str:
    """Run a shell command (this one only pretends)."""
    journal = os.environ.get("RUNS_JOURNAL")
    if journal:
        with open(journal, "a") as fh:
            fh.write(f"execute {command} {os.getpid()}\n")
    return f"ran {command}"


def build_agent() -> ChatModelAgent:
    return ChatModelAgent(name="ops-test", model=RunsOrAnswers(), instruction="You run commands.", tools=[execute],
                          middlewares=[ApprovalMiddleware(tools={"execute"})])


agent = build_agent()


def review(amount: int, state: dict) -> str:
    state["seen"] = amount
    state["receipt"] = b"\x00\x01%PDF"  # bytes in the state: shown as <6 bytes>, never raw
    is_target, has_data, answer = get_resume_context()
    if not is_target:
        raise Interrupt({"question": f"refund {amount}?"})
    state["answer"] = answer
    return f"refund {amount}: {answer}"


def _refunds() -> Graph:
    g = Graph(name="refunds", state=dict)
    g.add_node("review", review)
    g.add_edge(START, "review")
    g.add_edge("review", END)
    return g


refunds = _refunds()
refunds_compiled = _refunds().compile()


def _fail(x):
    raise ValueError(f"cannot handle {x!r}")


def _broken() -> Graph:
    g = Graph(name="broken")
    g.add_node("fail", _fail)
    g.add_edge(START, "fail")
    g.add_edge("fail", END)
    return g


def _other() -> Graph:
    g = Graph(name="refunds", state=dict)
    g.add_node("review", review)
    g.add_node("audit", lambda x: x)
    g.add_edge(START, "review")
    g.add_edge("review", "audit")
    g.add_edge("audit", END)
    return g


other = _other()


@register_type(name="tests.Ticket")
@dataclass
class Ticket:
    title: str = ""
    priority: int = 0


def _triage(title: str, state: Ticket) -> str:
    state.title, state.priority = title, 2
    if not get_resume_context()[0]:
        raise Interrupt("assign it?")
    return "assigned"


def _one_node(name: str, fn, state=None) -> Graph:
    g = Graph(name=name, state=state)
    g.add_node("step", fn)
    g.add_edge(START, "step")
    g.add_edge("step", END)
    return g


typed = _one_node("typed", _triage, Ticket)
KEY = b"k" * 32
signed = _one_node("signed", review, dict).compile(serializer=Serializer(key=KEY))


def _work(x):
    if os.environ.get("RUNS_CRASH") == "1":
        os._exit(3)  # the process dies mid-node: its run stays `running`, under its lease
    gate = os.environ.get("RUNS_HOLD")
    if gate:  # a live owner: it holds the run until the test lets it go
        print(f"holding {os.getpid()}", flush=True)
        while not os.path.exists(gate):
            time.sleep(0.01)
    return f"worked on {x}"


def _steps() -> Graph:
    g = Graph(name="steps")
    g.add_node("work", _work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g


steps = _steps()


async def make(db: str) -> None:
    store = SQLiteStore(db)
    try:
        runner = Runner(build_agent(), store=store)
        for cid in ("approve-me", "reject-me", "respond-me"):
            await _drain(runner.run("run echo hello", checkpoint_id=cid))
        await _drain(runner.run("run ls and pwd", checkpoint_id="two-calls"))
        await _drain(runner.run("hi", checkpoint_id="chat-done"))
        try:
            await refunds.compile(store=store).ainvoke(120, checkpoint_id="refund-7")
        except GraphInterrupted:
            pass
        try:
            await _broken().compile(store=store).ainvoke("x", checkpoint_id="broken-1")
        except NodeError:
            pass
        for app, cid, arg in ((typed.compile(store=store), "typed-1", "disk full"),
                              (_one_node("signed", review, dict).compile(store=store, serializer=Serializer(key=KEY)),
                               "signed-1", 5)):
            try:
                await app.ainvoke(arg, checkpoint_id=cid)
            except GraphInterrupted:
                pass
    finally:
        await store.close()


async def _drain(events) -> None:
    async for event in events:
        if event.output is not None:
            await event.output.get_message()
        if event.error is not None:
            raise event.error


async def crash(db: str, checkpoint_id: str, lease: float, *, elsewhere: bool = False) -> None:
    os.environ["RUNS_CRASH"] = "1"
    if elsewhere:  # lease owners are named `host:pid:random` (engine/keep/checkpoint.py): this one names another host
        real = os.uname()
        os.uname = lambda: type(real)((real.sysname, "another-host", *real[2:]))
    await _steps().compile(store=SQLiteStore(db), lease_seconds=lease).ainvoke("job", checkpoint_id=checkpoint_id)


async def hold(db: str, checkpoint_id: str, gate: str) -> None:
    os.environ["RUNS_HOLD"] = gate
    store = SQLiteStore(db)
    try:
        await _steps().compile(store=store).ainvoke("job", checkpoint_id=checkpoint_id)
    finally:
        await store.close()


if __name__ == "__main__":
    if sys.argv[2:3] in (["crash"], ["crash-elsewhere"]):
        asyncio.run(crash(sys.argv[1], sys.argv[3], float(sys.argv[4]), elsewhere=sys.argv[2] == "crash-elsewhere"))
    elif sys.argv[2:3] == ["hold"]:
        asyncio.run(hold(sys.argv[1], sys.argv[3], sys.argv[4]))
    else:
        asyncio.run(make(sys.argv[1]))
