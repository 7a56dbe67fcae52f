"""An agent with `CompactionMiddleware` in a child process, for tests/test_compaction_cross_process.py.

    python compaction_proc.py DB CHECKPOINT_ID --journal PATH [--block-after-summary] [--continue-run]

The model asks for `look` twice (each result is 1,000 characters), then answers; past the second result the
conversation is over the budget (1,500 characters) and the summarizer is asked once. Every call appends a line
to the journal (fsynced): "look <n> <pid>", "summary <pid> <messages it folded>", "model <pid> <what it was sent:
roles, and the summary's text if there is one>". `--block-after-summary`: the model, once sent a summary, writes
its line and then waits forever (the test SIGKILLs the process there). `--continue-run` resumes the run
(`takeover=True`: the first process died holding the lease). Prints the answer; exit 0 when the run ended.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from waypoint.engine import ChatModelAgent, Message, Runner, ToolCall, tool
from waypoint.engine.agents.summary import SUMMARY_HEADER as HEADER
from waypoint.middleware import CompactionMiddleware
from waypoint.stores import SQLiteStore


def journal(path: str, *words: str) -> None:
    with open(path, "a") as fh:
        fh.write(" ".join(words) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class Model:
    """Answers from the last message alone, so another process continuing the run answers as this one would."""

    name = "proc-model"

    def __init__(self, args) -> None:
        self.args = args

    async def generate(self, messages, **_):
        summary = next((m.content[len(HEADER):] for m in messages if m.content.startswith(HEADER)), "-")
        journal(self.args.journal, "model", str(os.getpid()), ",".join(m.role for m in messages), summary)
        if summary != "-" and self.args.block_after_summary:
            await asyncio.Event().wait()  # the test kills the process here: after the summary's step was stored
        last = messages[-1]
        n = int(last.content.split()[1]) + 1 if last.role == "tool" else 0
        if n < 2:
            return Message.assistant(tool_calls=[ToolCall(id=f"c{n}", name="look", arguments=json.dumps({"n": n}))])
        return Message.assistant("done after 2 looks")

    async def stream(self, messages, **kw):
        yield await self.generate(messages, **kw)


class Summarizer:
    name = "proc-summarizer"

    def __init__(self, args) -> None:
        self.args = args

    async def generate(self, messages, **_):
        folded = messages[-1].content.count("\n\n[") + 1
        journal(self.args.journal, "summary", str(os.getpid()), str(folded))
        return Message.assistant(f"SUMMARY-BY-{os.getpid()}")

    async def stream(self, messages, **kw):
        yield await self.generate(messages, **kw)


def build(args) -> ChatModelAgent:
    @tool
    def look(n: int) -> str:
        """Look at item n."""
        journal(args.journal, "look", str(n), str(os.getpid()))
        return f"item {n} " + "x" * 993

    return ChatModelAgent(name="compacting", model=Model(args), instruction="sys", tools=[look],
                          middlewares=[CompactionMiddleware(Summarizer(args), max_chars=1500, keep_last=2)])


async def main(args) -> int:
    store = SQLiteStore(args.db)
    runner = Runner(build(args), store=store)
    if args.continue_run:
        events = runner.resume(args.checkpoint_id, takeover=True)
    else:
        events = runner.run("go", checkpoint_id=args.checkpoint_id)
    code = 0
    try:
        async for event in events:
            if event.error is not None:
                print(f"{type(event.error).__name__}: {event.error}", file=sys.stderr)
                code = 4
            elif event.output is not None and event.output.role == "assistant":
                print(json.dumps({"content": (await event.output.get_message()).content}))
    finally:
        await store.close()
    return code


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("db")
    p.add_argument("checkpoint_id")
    p.add_argument("--journal", required=True)
    p.add_argument("--block-after-summary", action="store_true")
    p.add_argument("--continue-run", action="store_true")
    sys.exit(asyncio.run(main(p.parse_args())))
