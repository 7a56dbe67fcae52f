"""Agents and a graph for `waypoint serve` in a child process (the service tests):

- `build` ("ops"): the offline model asks to run the command the user names, `ApprovalMiddleware` pauses it,
  and the tool appends the command to the file named by $SERVICE_TOOL_LOG each time it really runs.
- `raw` ("raw"): a hostile model — it asks for exactly the calls the user's message spells as JSON,
  `{"calls": [{"name": ..., "arguments": <the arguments' JSON text, as the model writes it>}]}`, so a test
  can send what a model could emit (lone surrogates, bidi controls). Every call needs approval. Its
  `execute` records like ops' (a command starting with "hold" first writes "<command>" to
  $SERVICE_TOOL_LOG.started and waits until the file $SERVICE_GATE exists; "fail" raises); its tool
  "exe\\u200bcute" has a zero-width space in its name; `transfer(account: int, amount: int)` records
  "transfer account=<account> amount=<amount>" (exact integers, however long).
- `boss` ("boss"): a composition — it asks the agent tool `researcher` the user's message, and the
  researcher asks `execute` (raw's, under approval) to run it; both name their call "call_0".
- `steps` ("steps"): a graph that loops `n` times, writing a version per step (long histories), each step
  taking `pause` seconds.
- `sleepy` ("sleepy"): a graph whose one node is a plain `def` that creates the file `marker` and then sleeps
  `seconds` with `time.sleep` (a sync node that blocks).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

from waypoint.engine import END, START, AgentTool, ChatModelAgent, Graph, Message, ToolCall, tool
from waypoint.engine.models import OfflineModel, ScriptedChatModel
from waypoint.middleware import ApprovalMiddleware


def _record(command: str) -> None:
    with open(os.environ["SERVICE_TOOL_LOG"], "a", encoding="utf-8", errors="surrogateescape") as f:
        f.write(command.encode("utf-8", "backslashreplace").decode() + "\n")


@tool
def execute(command: str) -> str:
    """Run a shell command (this one only records it)."""
    _record(command)
    return f"ran {command}"


def build() -> ChatModelAgent:
    return ChatModelAgent(name="ops", model=OfflineModel(), instruction="You run commands.", tools=[execute],
                          middlewares=[ApprovalMiddleware(tools={"execute"})])


@tool(name="execute")
async def raw_execute(command: str) -> str:
    """Run a shell command (this one only records it; see the module docstring)."""
    if command.startswith("hold"):
        with open(os.environ["SERVICE_TOOL_LOG"] + ".started", "a", encoding="utf-8") as f:
            f.write(command + "\n")
        while not os.path.exists(os.environ["SERVICE_GATE"]):
            await asyncio.sleep(0.01)
    if command == "fail":
        raise RuntimeError("the disk is full")
    _record(command)
    return f"ran {command}"


@tool(name="exe\u200bcute")
def odd_execute(command: str) -> str:
    """A tool whose name holds a zero-width space."""
    _record(f"odd {command}")
    return "odd"


@tool
def transfer(account: int, amount: int) -> str:
    """Transfer money (this one only records it)."""
    _record(f"transfer account={account} amount={amount}")
    return f"sent {amount} to {account}"


def _spelled(messages: list, tools: list) -> Message:
    last = messages[-1]
    if last.role == "tool":
        return Message.assistant(f"The tool said: {last.content}")
    calls = json.loads(last.content)["calls"]
    return Message.assistant("As you say.", tool_calls=[
        ToolCall(id=f"call_{i}", name=c["name"], arguments=c["arguments"]) for i, c in enumerate(calls)])


def raw() -> ChatModelAgent:
    model = ScriptedChatModel([_spelled] * 100_000)
    return ChatModelAgent(name="raw", model=model, tools=[raw_execute, odd_execute, transfer],
                          middlewares=[ApprovalMiddleware(tools=lambda name: True)])


def _asks(tool_name: str, key: str, agent: str):
    def reply(messages: list, tools: list) -> Message:
        last = messages[-1]
        if last.role == "tool":
            return Message.assistant(f"{agent}: {last.content}")
        return Message.assistant(tool_calls=[ToolCall(id="call_0", name=tool_name,
                                                      arguments=json.dumps({key: last.content}))])
    return reply


def boss() -> ChatModelAgent:
    researcher = ChatModelAgent(name="researcher", model=ScriptedChatModel([_asks("execute", "command", "researcher")]
                                                                           * 10_000),
                                tools=[raw_execute], middlewares=[ApprovalMiddleware(tools={"execute"})])
    return ChatModelAgent(name="boss", model=ScriptedChatModel([_asks("researcher", "request", "boss")] * 10_000),
                          tools=[AgentTool(researcher)])


def steps():
    """{"n": N, "pause": S} -> loops N times, one version per step, each step taking S seconds (default 0)."""
    async def step(x: dict) -> dict:
        await asyncio.sleep(x.get("pause", 0))
        return {**x, "i": x.get("i", 0) + 1}

    g = Graph(name="steps")
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_branch("step", lambda x: "step" if x["i"] < x["n"] else END, ends=["step", END])
    return g.compile(max_steps=10_000)


def sleepy():
    """{"marker": path, "seconds": S} -> creates the file at `marker`, then blocks S seconds in a plain def."""
    def nap(x: dict) -> dict:
        open(x["marker"], "w").close()
        time.sleep(x["seconds"])
        return x

    g = Graph(name="sleepy")
    g.add_node("nap", nap)
    g.add_edge(START, "nap")
    g.add_edge("nap", END)
    return g.compile()
