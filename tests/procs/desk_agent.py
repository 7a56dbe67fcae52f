"""The agent the service-with-workers tests serve (`waypoint serve --agents desk_agent:build --queue`) and run
in worker processes (`waypoint worker --graphs desk_agent:compiled`).

`desk` asks to run the user's message as a command with its tool `act` (approval first), then reports the
tool's result. Everything happens in files under $DESK_DIR:

- `acts`: one line "<command> <pid>" each time `act` really runs (appended and fsynced);
- a command starting with "hold": once the tool's result is back, the model writes "model <pid>" to `holding`
  and waits until the file `gate` exists before it answers (so a test can kill the worker inside that step).

$DESK_LEASE sets the runs' lease in the workers (seconds). `many` / `many_compiled`: a plain graph of 200 steps.
"""

from __future__ import annotations

import asyncio
import json
import os

from waypoint.engine import ChatModelAgent, Message, ToolCall, tool
from waypoint.middleware import ApprovalMiddleware


def _path(name: str) -> str:
    return os.path.join(os.environ["DESK_DIR"], name)


def _append(name: str, line: str) -> None:
    fd = os.open(_path(name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line} {os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@tool
def act(command: str) -> str:
    """Run a command (this one only records it)."""
    _append("acts", command)
    return f"did {command}"


class DeskModel:
    """Asks for `act(command=<the user's message>)`, then reports the result (holding first, see above)."""

    name = "desk-model"

    async def generate(self, messages, **_):
        last = messages[-1]
        if last.role == "tool":
            if last.content.startswith("did hold"):
                _append("holding", "model")
                while not os.path.exists(_path("gate")):
                    await asyncio.sleep(0.01)
            return Message.assistant(f"Done: {last.content}")
        call = ToolCall(id="call_1", name="act", arguments=json.dumps({"command": last.content}))
        return Message.assistant("I will do that.", tool_calls=[call])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def build() -> ChatModelAgent:
    return ChatModelAgent(name="desk", model=DeskModel(), tools=[act], middlewares=[ApprovalMiddleware(tools={"act"})])


def compiled(store):
    return build().compile(store=store, lease_seconds=float(os.environ.get("DESK_LEASE", "30")))


def raw(store):
    """tests/procs/service_agent.py's hostile `raw` agent, compiled for a worker (lease $DESK_LEASE)."""
    from service_agent import raw as raw_agent

    return raw_agent().compile(store=store, lease_seconds=float(os.environ.get("DESK_LEASE", "30")))


def many():
    """A plain graph "many" of 200 trivial steps (a run that writes far more versions than one look reads)."""
    from waypoint.engine import END, START, Graph

    g = Graph(name="many")
    names = [f"s{i}" for i in range(200)]
    for name in names:
        g.add_node(name, lambda x: x + 1)
    for a, b in zip([START, *names], [*names, END]):
        g.add_edge(a, b)
    return g


def many_compiled(store):
    return many().compile(store=store, lease_seconds=float(os.environ.get("DESK_LEASE", "30")))


class TalkModel:
    """Streams the tokens its user's message spells: "3-7" streams "w3 " … "w6 ", "@name" waits until the file
    $DESK_DIR/name exists (before the rest), e.g. "0-20 @g1 20-40 @g2 40-45". Its answer is those tokens joined."""

    name = "talk-model"

    def _plan(self, messages):
        return messages[-1].content.split()

    async def generate(self, messages, **_):
        return Message.assistant("".join([c.content async for c in self.stream(messages)]))

    async def stream(self, messages, **_):
        for part in self._plan(messages):
            if part.startswith("@"):
                while not os.path.exists(_path(part[1:])):
                    await asyncio.sleep(0.01)
                continue
            first, _, last = part.partition("-")
            for i in range(int(first), int(last)):
                yield Message.assistant(f"w{i} ")


def talk() -> ChatModelAgent:
    return ChatModelAgent(name="talk", model=TalkModel(), tools=[act])


def talk_compiled(store):
    """`talk`, streaming (its tokens are relayed to the services that follow it)."""
    return talk().compile(store=store, streaming=True, lease_seconds=float(os.environ.get("DESK_LEASE", "30")))
