"""Agents made of agents, in a child process, for the composition tests (tests/test_composition_cross_process.py).

    python composition_proc.py DB CHECKPOINT_ID SCENARIO ACTION [VALUE] [options]

SCENARIO:
- `three`: a supervisor → `AgentTool(researcher)` → the researcher's tool, under `ApprovalMiddleware`. The
  researcher first calls `lookup` (not guarded; `--rounds` times, one call a model call), then the tool named by
  `--tool` (`search`, or `slow`: writes its side effect, then sleeps `--sleep` seconds), both guarded unless
  `--unguarded`.
- `sequential`: `SequentialAgent(a, b, c)`; b's tool `publish` needs approval; each stores its answer under
  `output_key` and reads the ones before it in its instruction.
- `parallel`: `ParallelAgent(a, b, c)`; b's tool `publish` needs approval.

ACTION: `run TEXT`, `answer JSON` ({interrupt_id: "approve" | "reject"}), `continue` (Runner.resume), `show`.

Every model call appends "model <agent> <pid>" and every real tool execution "tool <name> <arguments> <pid>
<idempotency key> <rerun>" to `--journal` (fsynced). Printed, one JSON line per event: {"interrupt": [[id,
kind, tool, arguments, address]...]}, {"rerun": [run_path, call_id, key]}, {"output": [run_path, role,
content]}, {"decisions": [[tool, verb, run_path]...]} (the run's, at the end), {"runs": [checkpoint IDs in the
store]}; exit codes: 0 ended, 2 paused, 3 refused before anything
ran, 4 an error event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from waypoint.engine import (
    AgentTool,
    ChatModelAgent,
    Message,
    ParallelAgent,
    Runner,
    SequentialAgent,
    ToolCall,
    ToolContext,
    WaypointError,
    tool,
)
from waypoint.middleware import ApprovalMiddleware, ApprovalResult, classify_interrupt
from waypoint.stores import SQLiteStore


def write(journal: str | None, line: str) -> None:
    if journal:
        with open(journal, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())


class Scripted:
    """Agent `agent`'s model: asks for `steps[n]` (a list of [name, arguments]) after n tool rounds; when the
    steps are done it answers "<agent>: <instruction> | <the last tool results>"."""

    def __init__(self, agent: str, steps: list[list[list]], journal: str | None) -> None:
        self.name = f"model-{agent}"
        self.agent, self.steps, self.journal = agent, steps, journal

    async def generate(self, messages, **_):
        write(self.journal, f"model {self.agent} {os.getpid()}")
        rounds = sum(1 for m in messages if m.role == "assistant" and m.tool_calls)
        if rounds < len(self.steps):
            calls = [ToolCall(id=f"call_{rounds}", name=n, arguments=json.dumps(a)) for n, a in self.steps[rounds]]
            return Message.assistant(tool_calls=calls)
        system = next((m.content for m in messages if m.role == "system"), "")
        results = [m.content for m in messages if m.role == "tool"][-len(self.steps[-1]):] if self.steps else []
        return Message.assistant(f"{self.agent}: {system} | " + "; ".join(results))

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def tools(args):
    def journaled(name: str, text: str, ctx: ToolContext) -> None:
        write(args.journal, f"tool {name} {json.dumps(text)} {os.getpid()} {ctx.idempotency_key} {ctx.rerun}")

    @tool
    def lookup(topic: str, ctx: ToolContext) -> str:
        """Look a topic up."""
        journaled("lookup", topic, ctx)
        return f"notes on {topic}"

    @tool
    def search(query: str, ctx: ToolContext) -> str:
        """Search."""
        journaled("search", query, ctx)
        return f"found {query}"

    @tool
    async def slow(query: str, ctx: ToolContext) -> str:
        """Search, slowly (after its side effect)."""
        journaled("slow", query, ctx)
        await asyncio.sleep(args.sleep)
        return f"slowly found {query}"

    @tool
    def publish(text: str, ctx: ToolContext) -> str:
        """Publish."""
        journaled("publish", text, ctx)
        return f"published {text}"

    return {"lookup": lookup, "search": search, "slow": slow, "publish": publish}


def build(args):
    t = tools(args)
    def guard(*names: str) -> list:  # each agent's guard names the guarded tools it has (else: refused at build)
        return [] if args.unguarded else [ApprovalMiddleware(tools=set(names))]

    if args.scenario == "three":
        researcher = ChatModelAgent(
            name="researcher", description="Finds things out.", tools=[t["lookup"], t["search"], t["slow"]],
            model=Scripted("researcher", [*([["lookup", {"topic": f"backups {i}" if i else "backups"}]]
                                              for i in range(args.rounds)), [[args.tool, {"query": "backups"}]]],
                           args.journal),
            middlewares=guard("search", "slow"), max_iterations=args.rounds + 5)
        calls = [["researcher", {"request": f"find out about backups ({i})"}] for i in range(args.calls)]
        return ChatModelAgent(name="supervisor", instruction="You delegate.", tools=[AgentTool(researcher)],
                              model=Scripted("supervisor", [calls], args.journal))
    a = ChatModelAgent(name="a", instruction="You outline.", output_key="outline",
                       model=Scripted("a", [], args.journal))
    b = ChatModelAgent(name="b", instruction="You draft from {outline}.", output_key="draft", tools=[t["publish"]],
                       model=Scripted("b", [[["publish", {"text": "the draft"}]]], args.journal),
                       middlewares=guard("publish"))
    c = ChatModelAgent(name="c", instruction="You review {draft}.", output_key="review",
                       model=Scripted("c", [], args.journal))
    if args.scenario == "sequential":
        return SequentialAgent("pipeline", [a, b, c])
    return ParallelAgent("fanout", [a, b, c])


async def main(args) -> int:
    store = SQLiteStore(args.db)
    runner = Runner(build(args), store=store, streaming=args.streaming)
    try:
        if args.action == "show":
            snap = await runner.app.get_run(args.checkpoint_id)
            print(json.dumps({"interrupt": pending(snap.interrupts.contexts)}))
            return 0
        if args.action == "run":
            events = runner.run(args.value, checkpoint_id=args.checkpoint_id)
        elif args.action == "continue":
            events = runner.resume(args.checkpoint_id, takeover=args.takeover)
        else:
            snap = await runner.app.get_run(args.checkpoint_id)
            shown = {c.id: c.info for c in snap.interrupts.contexts}
            targets = {i: ApprovalResult(approved=v == "approve", digest=getattr(shown.get(i), "digest", None))
                       for i, v in json.loads(args.value).items()}
            events = runner.resume_with_params(args.checkpoint_id, targets, takeover=args.takeover)
        code = await report(events)
        snap = await runner.app.get_run(args.checkpoint_id)
        decided = getattr(snap.state, "decisions", []) if snap is not None else []  # a workflow's Session has none
        print(json.dumps({"decisions": [[d.tool, d.verb, list(d.run_path)] for d in decided]}))
        print(json.dumps({"runs": sorted(m.checkpoint_id for m in await store.list(limit=100))}))
        return code
    finally:
        await store.close()


def pending(contexts) -> list[list]:
    found = [classify_interrupt(c) for c in contexts]
    return [[p.id, p.kind, p.tool, p.arguments, p.address] for p in found]


async def report(events) -> int:
    code = 0
    try:
        async for event in events:
            action = event.action
            if event.error is not None:
                print(f"{type(event.error).__name__}: {event.error}", file=sys.stderr)
                code = 4
            elif action is not None and action.interrupted is not None:
                print(json.dumps({"interrupt": pending(action.interrupted.contexts)}))
                code = 2
            elif action is not None and action.rerun is not None:
                print(json.dumps({"rerun": [event.run_path, action.rerun.call_id, action.rerun.idempotency_key]}))
            elif event.output is not None:
                message = await event.output.get_message()
                print(json.dumps({"output": [event.run_path, event.output.role, message.content]}))
    except WaypointError as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 3
    return code


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("db")
    p.add_argument("checkpoint_id")
    p.add_argument("scenario", choices=["three", "sequential", "parallel"])
    p.add_argument("action", choices=["run", "answer", "continue", "show"])
    p.add_argument("value", nargs="?")
    p.add_argument("--journal")
    p.add_argument("--tool", default="search", choices=["search", "slow"])
    p.add_argument("--calls", type=int, default=1)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--unguarded", action="store_true")
    p.add_argument("--streaming", action="store_true")
    p.add_argument("--takeover", action="store_true")
    p.add_argument("--rounds", type=int, default=1)
    sys.exit(asyncio.run(main(p.parse_args())))
