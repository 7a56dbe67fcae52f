"""An agent whose tools come from the test MCP server (tests/procs/mcp_server.py, over stdio), with
`delete_file` behind ApprovalMiddleware, on a SQLite file.

    python mcp_agent_proc.py DB CHECKPOINT_ID JOURNAL [--approve ID]

Exit codes: 0 answered (prints {"answer": ...}), 2 paused (prints {"interrupt": id, "prompt": ...}),
4 an error (message on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from waypoint.engine import ChatModelAgent, Message, Runner, ToolCall
from waypoint.engine.tools import MCPServerStdio
from waypoint.middleware import ApprovalMiddleware, ApprovalResult, SafeToolMiddleware
from waypoint.stores import SQLiteStore

SERVER = Path(__file__).with_name("mcp_server.py")


class AsksToDelete:
    name = "asks-to-delete"

    async def generate(self, messages, **_):
        if messages[-1].role == "tool":
            return Message.assistant(f"the server said: {messages[-1].content}")
        return Message.assistant(tool_calls=[ToolCall(id="call_1", name="delete_file",
                                                      arguments=json.dumps({"path": "/srv/app.log"}))])

    async def stream(self, messages, **_):
        yield await self.generate(messages)


async def main(args) -> int:
    server = MCPServerStdio(sys.executable, [str(SERVER), args.journal], name="files")
    store = SQLiteStore(args.db)
    try:
        tools = await server.list_tools()
        agent = ChatModelAgent(name="cleaner", model=AsksToDelete(), tools=tools,
                               middlewares=[ApprovalMiddleware(tools={"delete_file"}), SafeToolMiddleware()])
        runner = Runner(agent, store=store)
        if args.approve:
            events = runner.resume_with_params(args.checkpoint_id, {args.approve: ApprovalResult(approved=True)})
        else:
            events = runner.run("clean up the logs", checkpoint_id=args.checkpoint_id)
        async for event in events:
            if event.error is not None:
                print(f"{type(event.error).__name__}: {event.error}", file=sys.stderr)
                return 4
            if event.action is not None and event.action.interrupted is not None:
                (ctx,) = event.action.interrupted.contexts
                print(json.dumps({"interrupt": ctx.id, "prompt": str(ctx.info)}))
                return 2
            if event.output is not None and event.output.role == "assistant":
                message = await event.output.get_message()
                if message.content:
                    print(json.dumps({"answer": message.content}))
        return 0
    finally:
        await server.aclose()
        await store.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("db")
    p.add_argument("checkpoint_id")
    p.add_argument("journal")
    p.add_argument("--approve")
    sys.exit(asyncio.run(main(p.parse_args())))
