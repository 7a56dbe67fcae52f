"""Chapter 9: crash recovery. Kill the chapter in the middle of a turn; start it again on the same session,
and the turn goes on from where it was: the tool calls that had finished are not run again (their results
come from the run's tool ledger), the call that was cut off runs again with the same idempotency key,
and the ones that had not started run for the first time.

    waypoint chapter 9 --session demo --crash-after 1
    you> process alpha, beta and gamma          (the process kills itself as the 2nd call starts)
    waypoint chapter 9 --session demo           (its process is gone: the turn is taken over and resumed)

`process_item` is a slow tool with a side effect: a `started ...` and a `finished ...` line in
PROJECT_ROOT/batch.log. The calls of one turn run one after another (`sequential_tools=True`), so "after
N calls" names one point: `--crash-after N` SIGKILLs the process at the start of the (N+1)-th call —
after N results were recorded in the ledger (a result is recorded once its tool returned) and after the
(N+1)-th call's start marker was.

The model: "process <items>" is planned by `BatchPlanner`, a small stateless model of this chapter's own
(one `process_item` call per item, decided from the conversation alone), so the crash point is the same
on every run whatever model is configured; anything else goes to `model_from_env()`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from waypoint.engine import Message, Tool, ToolCall, ToolContext, tool
from waypoint.engine.models import model_from_env
from waypoint.engine.tools import ToolEvent
from waypoint.middleware import SafeToolMiddleware

from .session import guarded
from ..console import Console, chapter_model
from ..fstools import ProjectRoot
from .project import parse_project_args, project_agent, project_chat, project_parser

__all__ = ["AGENT_NAME", "build_agent", "BatchPlanner", "RecoveryReport", "main"]

AGENT_NAME = "ch09"
LEASE_SECONDS = 2.0
"""Short, so the next start waits at most this long for a dead process's lease."""
JOURNAL = "batch.log"
WORK_SECONDS = 0.3

_PROCESS = re.compile(r"^\s*(?:please\s+)?process\s+(?:the\s+items\s+)?(?P<items>.+?)\s*[.!]?\s*$", re.I | re.S)


class BatchPlanner:
    """A chat model: "process a, b and c" → one `process_item` call per item (when the tool is offered);
    any other turn → `fallback`. Stateless: the same conversation always gets the same plan."""

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback
        self.name = f"batch-planner+{getattr(fallback, 'name', 'model')}"

    def plan(self, messages: Sequence[Message], tools: Sequence[Any] | None) -> Message | None:
        if not messages or messages[-1].role != "user" or "process_item" not in {t.name for t in tools or ()}:
            return None
        found = _PROCESS.match(messages[-1].content)
        if found is None:
            return None
        items = [i.strip(" '\"`") for i in re.split(r"\s*,\s*(?:and\s+)?|\s+and\s+", found["items"])]
        turn = sum(1 for m in messages if m.role == "assistant") + 1
        calls = [ToolCall(id=f"call_{turn}_{n}", name="process_item", arguments=json.dumps({"item": item}))
                 for n, item in enumerate(i for i in items if i)]
        return Message.assistant(tool_calls=calls) if calls else None

    async def generate(self, messages: Sequence[Message], **options: Any) -> Message:
        planned = self.plan(messages, options.get("tools"))
        return planned if planned is not None else await self.fallback.generate(messages, **options)

    async def stream(self, messages: Sequence[Message], **options: Any) -> AsyncIterator[Message]:
        planned = self.plan(messages, options.get("tools"))
        if planned is not None:
            yield planned
            return
        async for chunk in self.fallback.stream(messages, **options):
            yield chunk


def process_item_tool(root: ProjectRoot, crash_after: int | None = None) -> Tool:
    """`process_item(item)`; with `crash_after=N`, the process SIGKILLs itself when its (N+1)-th call starts."""
    journal = root.root / JOURNAL
    finished = 0  # calls of this process that returned (calls run one after another)

    @tool
    async def process_item(item: str, ctx: ToolContext) -> str:
        """Process one item of a batch (slow; writes a started and a finished line to batch.log).

        Args:
            item: the item to process
        """
        nonlocal finished
        _journal(journal, f"started {item} (call {ctx.call_id}, key {ctx.idempotency_key[:12]}, pid {os.getpid()})")
        if crash_after is not None and finished >= crash_after:
            await asyncio.sleep(0.05)  # only so the console shows the results so far; the ledger has them already
            print(f"[crash] --crash-after {crash_after}: {finished} call(s) finished and were recorded; killing "
                  f"this process (SIGKILL) as call {finished + 1} starts", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        await asyncio.sleep(WORK_SECONDS)  # the work
        _journal(journal, f"finished {item} (pid {os.getpid()})")
        finished += 1
        return f"processed {item}"

    return process_item


def _journal(path: Path, line: str) -> None:
    with path.open("a") as fh:
        fh.write(line + "\n")


class RecoveryReport:
    """A callback handler: what the tools box did with each call of a turn that was resumed after a crash —
    taken from the ledger (its `end` came with no `start`), run again (`start` with `rerun`), or run."""

    def __init__(self) -> None:
        self.calls: dict[str, str] = {}  # call id -> "name(arguments)", in call order
        self.fate: dict[str, str] = {}

    def on_start(self, event: Any) -> None:
        if event.node_path == ("tools",) and isinstance(event.data, Message):
            for call in event.data.tool_calls:
                self.calls[call.id] = f"{call.name}({call.arguments})"

    def on_chunk(self, event: Any) -> None:
        data = event.data
        if isinstance(data, ToolEvent) and data.kind == "start":
            self.fate.setdefault(data.call_id, "rerun" if data.rerun else "ran")
        elif isinstance(data, ToolEvent) and data.kind == "end":
            self.fate.setdefault(data.call_id, "ledger")

    def report(self, console: Console) -> None:
        """Print the fate of each call if the turn was a recovery (something came from the ledger or re-ran)."""
        if any(fate in ("ledger", "rerun") for fate in self.fate.values()):
            console.line("What the recovered turn did with each tool call:", "bold")
            for call_id, call in self.calls.items():
                if call_id in self.fate:
                    console.line(f"  {call}: {_FATES[self.fate[call_id]]}")
        self.calls.clear()
        self.fate.clear()


_FATES = {
    "ledger": "finished before the turn was cut off — its result came from the ledger, it did not run again",
    "rerun": "had started before the turn was cut off — it ran again, with the same idempotency key",
    "ran": "had not started before the turn was cut off — it ran now, for the first time",
}


def build_agent(*, model: Any = None, instruction: str | None = None, root: ProjectRoot | None = None,
                crash_after: int | None = None) -> Any:
    """Chapter 9's agent, from the environment unless told otherwise (`waypoint runs resume` calls it bare)."""
    root = root or ProjectRoot()
    return project_agent(AGENT_NAME, model=BatchPlanner(model or model_from_env()), root=root,
                         instruction=instruction, tools=[process_item_tool(root, crash_after)],
                         middlewares=[SafeToolMiddleware()], sequential_tools=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = project_parser(9, "Chapter 9: kill the chapter mid-turn (--crash-after N), start it again on the same "
                            "session, and the turn resumes; finished tool calls do not run again.")
    parser.add_argument("--crash-after", type=int, default=None, metavar="N",
                        help="SIGKILL this process as its (N+1)-th process_item call starts")
    args = parse_project_args(parser, argv)
    if args.crash_after is not None and args.crash_after < 0:
        parser.error("--crash-after takes a number of calls, 0 or more")
    console = Console()

    def body() -> int:
        model = chapter_model(console)
        console.note('batch planner: "process a, b and c" runs process_item for each item, one after another', "dim")
        report = RecoveryReport()
        session = project_chat(9, args, console, lambda root: build_agent(model=model, instruction=args.instruction,
                                                                          root=root, crash_after=args.crash_after),
                               callbacks=[report], lease_seconds=LEASE_SECONDS,
                               after_turn=lambda: report.report(console))
        return session.main(args.session)

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
