"""The agent the scale-out tests run in worker processes (`waypoint worker --graphs fleet:build`).

Each run asks for one `transfer` call, which needs approval (ApprovalMiddleware); once approved, the
tool's side effect is journaled ("effect <run> <call> start|done <pid>", fsynced) around a short
sleep, so a worker killed mid-run is likely killed inside one. Its result names the process that ran it
("moved 5 by <pid>"), so a test can tell which execution the run went on with. The model journals every call
("model <run> <messages seen> <pid>"): a model step that ran twice shows the same message count twice.
The journal is the file named by $FLEET_JOURNAL; $FLEET_LEASE sets the runs' lease (seconds).
"""

from __future__ import annotations

import asyncio
import os

from waypoint.engine import ChatModelAgent, Message, ToolCall, ToolContext, tool
from waypoint.engine.run.task import current_checkpoint_id
from waypoint.middleware import ApprovalMiddleware

EFFECT_SECONDS = 0.05
MODEL_SECONDS = 0.01


def journal(*words: object) -> None:
    path = os.environ.get("FLEET_JOURNAL")
    if path:
        line = " ".join(str(w) for w in words) + f" {os.getpid()}\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write per line: lines of concurrent processes never mix
            os.fsync(fd)
        finally:
            os.close(fd)


@tool
async def transfer(amount: int, ctx: ToolContext) -> str:
    """Move money (a human approves it first)."""
    journal("effect", ctx.checkpoint_id, ctx.call_id, "start")
    await asyncio.sleep(EFFECT_SECONDS)
    journal("effect", ctx.checkpoint_id, ctx.call_id, "done")
    return f"moved {amount} by {os.getpid()}"  # who ran it: the tests check the journal says the same


class AsksOnce:
    """Asks for one transfer, then reports the tool's result — decided from the conversation alone."""

    name = "asks-once"

    async def generate(self, messages, **_):
        cid = current_checkpoint_id()
        journal("model", cid, len(messages))
        await asyncio.sleep(MODEL_SECONDS)
        if messages[-1].role == "tool":
            return Message.assistant(f"done: {messages[-1].content}")
        return Message.assistant(tool_calls=[ToolCall(id=f"call-{cid}", name="transfer", arguments='{"amount": 5}')])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def build(store):
    agent = ChatModelAgent(name="fleet", model=AsksOnce(), tools=[transfer],
                           middlewares=[ApprovalMiddleware(tools={"transfer"})])
    return agent.compile(store=store, lease_seconds=float(os.environ.get("FLEET_LEASE", "30")))
