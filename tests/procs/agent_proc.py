"""An agent in a child process, for the cross-process agent tests.

    python agent_proc.py DB CHECKPOINT_ID MODE [--resume JSON] [--continue-run] [--takeover]
        [--journal PATH] [--slow-sleep S] [--abandon-with TEXT] [--lease SECONDS]

MODE "pause": the model asks for `transfer` (pauses until resumed with "yes"/"no") and `balance`.
MODE "crash": the model asks for `fast` and `slow` in parallel; `slow` sleeps --slow-sleep seconds.
`--abandon-with TEXT` starts a new turn with TEXT over the stored run (`force_new_run=True`), abandoning the
unfinished one. Every tool appends "<tool> <what> <pid> <idempotency key>" to the journal (fsynced). Exit codes: 0 the
run ended (prints its events as JSON lines), 2 paused (prints {"interrupt": [ids]}), 4 an error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from waypoint.engine import (
    ChatModelAgent,
    Interrupt,
    Message,
    Runner,
    ToolCall,
    ToolContext,
    get_resume_context,
    tool,
)
from waypoint.stores import SQLiteStore


def journal(args, *words: str) -> None:
    if args.journal:
        with open(args.journal, "a") as fh:
            fh.write(" ".join(words) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def build(args) -> ChatModelAgent:
    @tool
    def transfer(amount: int, ctx: ToolContext) -> str:
        """Transfer money after a human confirms."""
        journal(args, "transfer", "start", str(os.getpid()), ctx.idempotency_key)
        is_target, _, answer = get_resume_context()
        if not is_target:
            raise Interrupt({"confirm": amount})
        return f"transferred {amount}" if answer == "yes" else "not transferred"

    @tool
    def balance(ctx: ToolContext) -> str:
        """The balance."""
        journal(args, "balance", "start", str(os.getpid()), ctx.idempotency_key)
        return "100"

    @tool
    async def fast(ctx: ToolContext) -> str:
        """Fast."""
        journal(args, "fast", "start", str(os.getpid()), ctx.idempotency_key)
        return "fast result"

    @tool
    async def slow(ctx: ToolContext) -> str:
        """Slow."""
        journal(args, "slow", "start", str(os.getpid()), ctx.idempotency_key)
        await asyncio.sleep(args.slow_sleep)
        return "slow result"

    if args.mode == "pause":
        calls = [ToolCall(id="call_1", name="transfer", arguments='{"amount": 5}'),
                 ToolCall(id="call_2", name="balance", arguments="{}")]
        tools = [transfer, balance]
    else:
        calls = [ToolCall(id="call_1", name="fast", arguments="{}"), ToolCall(id="call_2", name="slow", arguments="{}")]
        tools = [fast, slow]
    return ChatModelAgent(name=f"agent-{args.mode}", model=Stateless(calls), tools=tools)


class Stateless:
    """Asks for the tools first, then sums up their results — from the conversation alone, so a new
    process resuming the run gets the answer the first one would have."""

    name = "stateless"

    def __init__(self, calls):
        self.calls = calls

    async def generate(self, messages, **_):
        if messages[-1].role == "tool":
            return Message.assistant("; ".join(m.content for m in messages if m.role == "tool"))
        return Message.assistant(tool_calls=self.calls)

    async def stream(self, messages, **_):
        yield await self.generate(messages)


async def main(args) -> int:
    store = SQLiteStore(args.db)
    runner = Runner(build(args), store=store, lease_seconds=args.lease)
    if args.resume:
        events = runner.resume_with_params(args.checkpoint_id, json.loads(args.resume), takeover=args.takeover)
    elif args.continue_run:
        events = runner.resume(args.checkpoint_id, takeover=args.takeover)
    elif args.abandon_with:
        events = runner.run(args.abandon_with, checkpoint_id=args.checkpoint_id, force_new_run=True)
    else:
        events = runner.run("go", checkpoint_id=args.checkpoint_id)
    code = 0
    try:
        async for event in events:
            if event.error is not None:
                print(f"{type(event.error).__name__}: {event.error}", file=sys.stderr)
                code = 4
            elif event.action is not None and event.action.interrupted is not None:
                print(json.dumps({"interrupt": [c.id for c in event.action.interrupted.contexts]}))
                code = 2
            elif event.action is not None and event.action.rerun is not None:
                print(json.dumps({"rerun": event.action.rerun.name, "key": event.action.rerun.idempotency_key}))
            elif event.output is not None:
                message = await event.output.get_message()
                print(json.dumps({"role": event.output.role, "content": message.content}))
    finally:
        await store.close()
    return code


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("db")
    p.add_argument("checkpoint_id")
    p.add_argument("mode", choices=["pause", "crash"])
    p.add_argument("--resume")
    p.add_argument("--continue-run", action="store_true")
    p.add_argument("--takeover", action="store_true")
    p.add_argument("--journal")
    p.add_argument("--slow-sleep", type=float, default=0.0)
    p.add_argument("--abandon-with")
    p.add_argument("--lease", type=float, default=30.0)
    sys.exit(asyncio.run(main(p.parse_args())))
