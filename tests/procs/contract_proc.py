"""An agent under `ApprovalMiddleware` in a child process, for the approval-contract tests.

    python contract_proc.py DB CHECKPOINT_ID ACTION [options]

ACTION: `run TEXT` (a new turn), `answer JSON` ({interrupt_id: "approve" | "reject" | any JSON answer}),
`continue` (Runner.resume: a crashed run continues), `show` (print the pending interrupts).

The model asks, on the n-th user message, for the calls in `--calls` (a JSON list, one list of
[id, name, arguments] per turn); after tool results it answers "done: <results>". Tools: `execute`,
`pay` (records its idempotency key), `confirmed` (asks its own question with `get_resume_context`
before it runs), `slow` (writes its side effect, then sleeps `--sleep` seconds before returning).
`--approvers 2` stacks two ApprovalMiddlewares (a two-person rule); `--takeover` passes takeover=True.

Each real tool execution appends "<tool> <arguments> <pid> <idempotency key> <rerun>" to `--journal`
(fsynced). Printed: one JSON line per event ({"interrupt": [[id, tool, call_id, arguments]...]},
{"decision": verb}, {"rerun": call_id, "key": key}, {"tool": text}, {"assistant": text}); exit codes:
0 ended, 2 paused, 3 refused before anything ran (raised from the iterator), 4 an error event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from waypoint.engine import (
    ChatModelAgent,
    Interrupt,
    Message,
    Respond,
    Restart,
    Runner,
    ToolCall,
    ToolContext,
    WaypointError,
    get_resume_context,
    tool,
)
from waypoint.middleware import ApprovalMiddleware, ApprovalResult, classify_interrupt
from waypoint.stores import SQLiteStore


class Scripted:
    """Asks for turn n's calls on the n-th user message; answers with the tool results after them."""

    name = "contract-model"

    def __init__(self, turns: list[list[list[str]]]) -> None:
        self.turns = turns

    async def generate(self, messages, **_):
        if messages[-1].role == "tool":
            results = [m.content for m in messages if m.role == "tool"][-len(self._last(messages)):]
            return Message.assistant("done: " + "; ".join(results))
        turn = sum(1 for m in messages if m.role == "user") - 1
        calls = [ToolCall(id=i, name=n, arguments=a) for i, n, a in self.turns[turn]]
        return Message.assistant(tool_calls=calls)

    @staticmethod
    def _last(messages):
        return next(m for m in reversed(messages) if m.role == "assistant" and m.tool_calls).tool_calls

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def build(args) -> ChatModelAgent:
    def journal(name: str, text: str, ctx: ToolContext) -> None:
        if args.journal:
            with open(args.journal, "a") as fh:
                fh.write(f"{name} {json.dumps(text)} {os.getpid()} {ctx.idempotency_key} {ctx.rerun}\n")
                fh.flush()
                os.fsync(fh.fileno())

    @tool
    def execute(command: str, ctx: ToolContext) -> str:
        """Run a shell command."""
        journal("execute", command, ctx)
        return f"ran {command}"

    @tool
    def pay(amount: int, ctx: ToolContext) -> str:
        """Pay."""
        journal("pay", str(amount), ctx)
        return f"paid {amount} key {ctx.idempotency_key}"

    @tool
    def confirmed(command: str, ctx: ToolContext) -> str:
        """Run a command after its own confirmation step."""
        is_target, has_data, answer = get_resume_context()
        if not (is_target and has_data):
            raise Interrupt({"confirm": command})
        if answer != "yes":
            return f"not confirmed: {answer}"
        journal("confirmed", command, ctx)
        return f"ran {command} (confirmed)"

    @tool
    def slow(command: str, ctx: ToolContext) -> str:
        """Do something with a side effect, slowly."""
        journal("slow", command, ctx)
        time.sleep(args.sleep)
        return f"slow {command}"

    turns = json.loads(args.calls)
    middlewares = [ApprovalMiddleware(tools={"execute", "pay", "confirmed", "slow"}) for _ in range(args.approvers)]
    return ChatModelAgent(name="contract", model=Scripted(turns), tools=[execute, pay, confirmed, slow],
                          middlewares=middlewares)


def answer(value, info):
    """"approve" / "reject"; {"respond": output}; {"restart": new arguments}; anything else as it is."""
    if value in ("approve", "reject"):
        return ApprovalResult(approved=value == "approve", digest=getattr(info, "digest", None))
    if isinstance(value, dict) and value.keys() == {"respond"}:
        return Respond(value["respond"])
    if isinstance(value, dict) and value.keys() == {"restart"}:
        return Restart(replace_input=value["restart"])
    return value


async def main(args) -> int:
    store = SQLiteStore(args.db)
    runner = Runner(build(args), store=store)
    try:
        snap = await runner.app.get_run(args.checkpoint_id)
        if args.action == "show":
            for ctx in snap.interrupts.contexts:
                p = classify_interrupt(ctx)
                print(json.dumps([p.id, p.kind, p.tool, p.call_id, p.arguments]))
            return 0
        if args.action == "run":
            events = runner.run(args.value, checkpoint_id=args.checkpoint_id)
        elif args.action == "continue":
            events = runner.resume(args.checkpoint_id, takeover=args.takeover)
        else:
            shown = {c.id: c.info for c in snap.interrupts.contexts} if snap is not None else {}
            targets = {iid: answer(v, shown.get(iid)) for iid, v in json.loads(args.value).items()}
            events = runner.resume_with_params(args.checkpoint_id, targets, takeover=args.takeover)
        return await report(events)
    finally:
        await store.close()


async def report(events) -> int:
    code = 0
    try:
        async for event in events:
            action = event.action
            if event.error is not None:
                print(f"{type(event.error).__name__}: {event.error}", file=sys.stderr)
                code = 4
            elif action is not None and action.interrupted is not None:
                pending = [classify_interrupt(c) for c in action.interrupted.contexts]
                print(json.dumps({"interrupt": [[p.id, p.tool, p.call_id, p.arguments] for p in pending]}))
                code = 2
            elif action is not None and action.decision is not None:
                print(json.dumps({"decision": action.decision.verb}))
            elif action is not None and action.rerun is not None:
                print(json.dumps({"rerun": action.rerun.call_id, "key": action.rerun.idempotency_key}))
            elif event.output is not None:
                print(json.dumps({event.output.role: (await event.output.get_message()).content}))
    except WaypointError as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 3
    return code


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("db")
    p.add_argument("checkpoint_id")
    p.add_argument("action", choices=["run", "answer", "continue", "show"])
    p.add_argument("value", nargs="?")
    p.add_argument("--calls", default="[]")
    p.add_argument("--approvers", type=int, default=1)
    p.add_argument("--journal")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--takeover", action="store_true")
    sys.exit(asyncio.run(main(p.parse_args())))
