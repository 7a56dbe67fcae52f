"""An agent whose `execute` tool needs approval, traced with OTelTracing into an in-memory exporter, on a
SQLite file. Prints one JSON object: the spans this process finished, and the pending interrupt if any.

    python otel_proc.py DB CHECKPOINT_ID [--approve ID]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/otel_support.py

from otel_support import recording_provider, span_dicts  # noqa: E402

from waypoint.engine import ChatModelAgent, Message, Runner, ToolCall, tool  # noqa: E402
from waypoint.engine.models import Usage  # noqa: E402
from waypoint.middleware import ApprovalMiddleware, ApprovalResult, OTelTracing  # noqa: E402
from waypoint.stores import SQLiteStore  # noqa: E402


class AsksThenAnswers:
    name = "asks-then-answers"

    async def generate(self, messages, **_):
        usage = Usage(prompt_tokens=20, completion_tokens=5, total_tokens=25)
        if messages[-1].role == "tool":
            return Message(role="assistant", content=f"done: {messages[-1].content}", usage=usage,
                           finish_reason="stop")
        call = ToolCall(id="call_1", name="execute", arguments=json.dumps({"command": "rm -rf /tmp/secret-dir"}))
        return Message(role="assistant", tool_calls=(call,), usage=usage, finish_reason="tool_calls")

    async def stream(self, messages, **_):
        yield await self.generate(messages)


@tool
def execute(command: str) -> str:
    """Run a shell command."""
    return f"ran {command}"


async def main(args) -> int:
    provider, exporter = recording_provider()
    tracing = OTelTracing(tracer_provider=provider)
    agent = ChatModelAgent(name="ops", model=AsksThenAnswers(), tools=[execute],
                           middlewares=[tracing, ApprovalMiddleware(tools={"execute"})])
    store = SQLiteStore(args.db)
    runner = Runner(agent, store=store, callbacks=[tracing])
    if args.approve:
        events = runner.resume_with_params(args.checkpoint_id, {args.approve: ApprovalResult(approved=True)})
    else:
        events = runner.run("please clean up", checkpoint_id=args.checkpoint_id)
    pending = None
    try:
        async for event in events:
            if event.error is not None:
                print(f"{type(event.error).__name__}: {event.error}", file=sys.stderr)
                return 4
            if event.action is not None and event.action.interrupted is not None:
                pending = event.action.interrupted.contexts[0].id
    finally:
        await store.close()
    print(json.dumps({"interrupt": pending, "spans": span_dicts(exporter)}))
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("db")
    p.add_argument("checkpoint_id")
    p.add_argument("--approve")
    sys.exit(asyncio.run(main(p.parse_args())))
