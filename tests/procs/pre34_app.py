"""The runs of the store fixture made before issue 34's incremental encodings (tests/fixtures/pre34.db, made by
tests/fixtures/make_pre34.py; read back by tests/test_pre34_store.py). Every model answers from the messages it
is given, so the same agents continue the stored runs in any process.

- `sup`: a supervisor whose tool is the agent `helper` (an `AgentTool`); `helper` asks to run `act` with approval.
  Stored paused inside `helper`, on `act`'s approval.
- `chat`: a chat of three completed turns, each with a `note` call.
- `dicts`: a graph of five steps over a dict list without a reducer, paused before its fourth step.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from waypoint.engine import END, START, AgentTool, ChatModelAgent, Graph, Message, ToolCall, tool
from waypoint.engine.codec.serde import register_type
from waypoint.middleware import ApprovalMiddleware


@tool
def act(command: str) -> str:
    """Run a command (this one records it in $PRE34_LOG)."""
    with open(os.environ["PRE34_LOG"], "a") as fh:
        fh.write(command + "\n")
    return f"did {command}"


@tool
def note(text: str) -> str:
    """Note some text."""
    return f"noted {text}"


class Asker:
    """Calls `tool` with the last user message as `arg`, then says what came back."""

    def __init__(self, name: str, tool: str, arg: str) -> None:
        self.name, self.tool, self.arg = name, tool, arg

    async def generate(self, messages, **_):
        last = messages[-1]
        if last.role == "tool":
            return Message.assistant(f"{self.name}: {last.content}")
        calls = sum(1 for m in messages if m.role == "assistant" and m.tool_calls)
        args = json.dumps({self.arg: last.content})
        return Message.assistant("", tool_calls=[ToolCall(id=f"call_{calls}", name=self.tool, arguments=args)])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def helper() -> ChatModelAgent:
    return ChatModelAgent(name="helper", model=Asker("helper", "act", "command"), tools=[act],
                          middlewares=[ApprovalMiddleware(tools={"act"})], description="Runs commands.")


def sup() -> ChatModelAgent:
    return ChatModelAgent(name="sup", model=Asker("sup", "helper", "request"), tools=[AgentTool(helper())])


def chat() -> ChatModelAgent:
    return ChatModelAgent(name="chat", model=Asker("chat", "note", "text"), tools=[note])


@register_type(name="tests.pre34.Items")
@dataclass
class Items:
    items: list[dict] = field(default_factory=list)


def dicts(store):
    g = Graph(name="dicts", state=Items)
    names = [f"n{i}" for i in range(1, 6)]
    for i, name in enumerate(names, 1):
        def step(x, state: Items, i=i):
            state.items.append({"step": i, "text": "x" * 50})
            return x + 1
        g.add_node(name, step)
    for a, b in zip([START, *names], [*names, END]):
        g.add_edge(a, b)
    return g.compile(store=store, interrupt_before=["n4"])
