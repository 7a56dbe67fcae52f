"""Chapter 7's flow in a child process: an agent whose `execute` (invokable) or `tail` (streamable) tool
needs approval, on a SQLite file.

    python approval_proc.py DB CHECKPOINT_ID invokable|streamable [--approve ID | --reject ID [--reason R]
        | --show-pending | --approve-pending] [--journal PATH]

`--show-pending` prints what the run waits for (`Runner.pending`: a JSON list) and resumes nothing;
`--approve-pending` approves every call it waits for, found with `Runner.pending` (no ID given).

Exit codes: 0 the run answered (prints its outputs as JSON lines), 2 paused (prints {"interrupt": id,
"prompt": str(ApprovalInfo)}), 4 an error (message on stderr). The tool appends a line to the journal
each time it really runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from waypoint.engine import ChatModelAgent, Message, Runner, ToolCall, tool
from waypoint.middleware import ApprovalMiddleware, ApprovalResult, SafeToolMiddleware
from waypoint.stores import SQLiteStore


class AsksThenSums:
    """Asks for the tool, then repeats what it returned (decided from the conversation alone)."""

    name = "asks-then-sums"

    def __init__(self, call: ToolCall) -> None:
        self.call = call

    async def generate(self, messages, **_):
        if messages[-1].role == "tool":
            return Message.assistant(f"the tool said: {messages[-1].content}")
        return Message.assistant(tool_calls=[self.call])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def build(args) -> ChatModelAgent:
    def journal(line: str) -> None:
        if args.journal:
            with open(args.journal, "a") as fh:
                fh.write(f"{line} {os.getpid()}\n")

    @tool
    def execute(command: str) -> str:
        """Run a shell command."""
        journal(f"execute {command}")
        return f"ran {command}"

    @tool
    async def tail(path: str):
        """Stream the end of a file."""
        journal(f"tail {path}")
        yield f"{path}: 1\n"
        yield f"{path}: 2\n"

    if args.mode == "invokable":
        call = ToolCall(id="call_1", name="execute", arguments=json.dumps({"command": "echo hello"}))
    else:
        call = ToolCall(id="call_1", name="tail", arguments=json.dumps({"path": "app.log"}))
    return ChatModelAgent(name=f"ch07-{args.mode}", model=AsksThenSums(call), tools=[execute, tail],
                          middlewares=[ApprovalMiddleware(tools={"execute", "tail"}), SafeToolMiddleware()])


async def main(args) -> int:
    store = SQLiteStore(args.db)
    runner = Runner(build(args), store=store, streaming=args.mode == "streamable")
    if args.show_pending:
        try:
            calls = await runner.pending(args.checkpoint_id)
        finally:
            await store.close()
        print(json.dumps([{"id": c.id, "kind": c.kind, "tool": c.tool, "call_id": c.call_id, "arguments": c.arguments,
                           "digest": c.digest} for c in calls]))
        return 0
    if args.approve_pending:
        calls = await runner.pending(args.checkpoint_id)
        events = runner.resume_with_params(
            args.checkpoint_id, {c.id: ApprovalResult(approved=True, digest=c.digest) for c in calls})
    elif args.approve:
        events = runner.resume_with_params(args.checkpoint_id, {args.approve: ApprovalResult(approved=True)})
    elif args.reject:
        events = runner.resume_with_params(
            args.checkpoint_id, {args.reject: ApprovalResult(approved=False, reason=args.reason)})
    else:
        events = runner.run("please run it", checkpoint_id=args.checkpoint_id)
    code = 0
    try:
        async for event in events:
            if event.error is not None:
                print(f"{type(event.error).__name__}: {event.error}", file=sys.stderr)
                code = 4
            elif event.action is not None and event.action.interrupted is not None:
                (ctx,) = event.action.interrupted.contexts
                print(json.dumps({"interrupt": ctx.id, "prompt": str(ctx.info)}))
                code = 2
            elif event.action is not None and event.action.decision is not None:
                print(json.dumps({"decision": event.action.decision.verb}))
            elif event.output is not None:
                print(json.dumps({event.output.role: (await event.output.get_message()).content}))
    finally:
        await store.close()
    return code


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("db")
    p.add_argument("checkpoint_id")
    p.add_argument("mode", choices=["invokable", "streamable"])
    p.add_argument("--approve")
    p.add_argument("--reject")
    p.add_argument("--reason")
    p.add_argument("--journal")
    p.add_argument("--show-pending", action="store_true")
    p.add_argument("--approve-pending", action="store_true")
    sys.exit(asyncio.run(main(p.parse_args())))
