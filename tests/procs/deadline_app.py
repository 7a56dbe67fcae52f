"""An app whose pauses have deadlines, for tests/test_deadlines.py: one process pauses runs and exits; another
recovers (as `waypoint serve`, `waypoint worker` or an embedder's `recover(...)` loop does) or answers them.

    python tests/procs/deadline_app.py DB pause CID... [--expires S]   # prints {"CID": {"iid", "deadline"}, ...}
    python tests/procs/deadline_app.py DB sleep CID --seconds S         # a graph whose node sleeps S seconds
    python tests/procs/deadline_app.py DB recover [--every S]           # recover(watch=True) until killed
    python tests/procs/deadline_app.py DB answer CID IID [--at T]       # approve (at store-clock time T); prints
                                                                        # {"out"} or {"error", "kind"}

The agent `ops` asks to run `execute`, guarded by `ApprovalMiddleware(expires_after=S)`; its model ends the turn
by repeating the tool's answer ("model read: ..."). `execute` appends "<run> <command>" to $EFFECTS; the sleeping graph's
node after the wait appends "woke <store clock>" there too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from datetime import timedelta

from waypoint.engine import (END, START, ChatModelAgent, Graph, GraphInterrupted, Message, ToolCall, WaypointError,
                             recover, sleep_until, tool)
from waypoint.engine.run import current_checkpoint_id
from waypoint.middleware import ApprovalMiddleware, ApprovalResult
from waypoint.stores import SQLiteStore


def _effect(line: str) -> None:
    with open(os.environ["EFFECTS"], "a") as f:
        f.write(line + "\n")


@tool
def execute(command: str) -> str:
    """Run a shell command."""
    _effect(f"{current_checkpoint_id()} {command}")
    return f"ran {command}"


class AsksToExecute:
    """Asks for `execute` once; then says what the tool (or the approval) answered."""

    async def generate(self, messages, **_):
        if messages[-1].role == "tool":
            return Message.assistant(f"model read: {messages[-1].content}")
        return Message.assistant(tool_calls=[ToolCall(id="c1", name="execute", arguments='{"command": "echo hi"}')])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def _ops(expires: float) -> ChatModelAgent:
    return ChatModelAgent(name="ops", model=AsksToExecute(), tools=[execute],
                          middlewares=[ApprovalMiddleware({"execute"}, expires_after=expires)])


ops = _ops(float(os.environ.get("DEADLINE_EXPIRES", "2")))
"""The agent `waypoint serve --agents deadline_app:ops` and `waypoint worker --graphs deadline_app:ops` run."""


def agent(store: SQLiteStore, expires: float):
    return _ops(expires).compile(store=store)


def sleeper(store: SQLiteStore, seconds: float):
    async def wait(x):
        sleep_until(timedelta(seconds=seconds), note="cool down")
        _effect(f"woke {await store.clock()}")
        return x + 1

    g = Graph(name="sleeper")
    g.add_node("wait", wait)
    g.add_node("after", lambda x: x * 10)
    g.add_edge(START, "wait")
    g.add_edge("wait", "after")
    g.add_edge("after", END)
    return g.compile(store=store)


async def main(args: argparse.Namespace) -> dict:
    store = SQLiteStore(args.db)
    apps = [agent(store, args.expires), sleeper(store, args.seconds)]
    try:
        if args.phase == "recover":
            print(json.dumps({"recovering": os.getpid()}), flush=True)
            await recover(apps, watch=True, every=args.every)
        if args.phase in ("pause", "sleep"):
            app, first = (apps[0], "run it") if args.phase == "pause" else (apps[1], 1)
            out = {}
            for cid in args.ids:
                try:
                    await app.ainvoke(first, checkpoint_id=cid)
                except GraphInterrupted as paused:
                    (ctx,) = paused.info.contexts
                    out[cid] = {"iid": ctx.id, "deadline": ctx.deadline}
            return out
        cid, iid = args.ids
        while args.at is not None and await store.clock() < args.at:  # a moment near the deadline, for a race
            await asyncio.sleep(0.001)
        try:
            out = await apps[0].ainvoke(None, checkpoint_id=cid, resume={iid: ApprovalResult(approved=True)})
        except WaypointError as err:
            return {"error": str(err), "kind": type(err).__name__}
        return {"out": out.content}
    finally:
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("phase", choices=["pause", "sleep", "recover", "answer"])
    parser.add_argument("ids", nargs="*")
    parser.add_argument("--expires", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--every", type=float, default=0.2)
    parser.add_argument("--at", type=float, default=None)
    print(json.dumps(asyncio.run(main(parser.parse_args()))), flush=True)
