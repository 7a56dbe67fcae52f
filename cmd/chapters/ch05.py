"""Chapter 5: tools that fail without ending the run — safe-tool and retry middleware.

    waypoint chapter 5        then:  run exit 3      check the status of api

Chapter 4's agent, with three middlewares (the first is the outermost):

1. `SafeToolMiddleware`: a tool's exception becomes its result, `[tool error] <error>`, and the model
   goes on. This chapter's `execute` raises when a command fails (as a strict shell does), so a failing
   command shows it.
2. `ToolRetryMiddleware`, *inside* the safe one: it sees the raw exception first and tries a transient
   failure (a dropped connection, a timeout) again; only a failure that is final reaches the safe layer.
   The other way round, the safe layer would turn every error into a result and nothing would be retried.
   It retries only tools that are safe to call twice (reads): a command is not retried.
3. `ModelRetryMiddleware`: model calls that fail transiently (HTTP 429, 5xx, a dropped stream) are tried
   again. Each retry prints `[retry] ...` on stderr.

`fetch_status` reads a (simulated) status page whose first request in each process drops its connection,
so the retry shows without a network. The offline model learns one phrasing for it here.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

from waypoint.engine import ChatModelAgent, Message, RetryPolicy, Tool, ToolCall, tool
from waypoint.engine.models import OfflineModel, model_from_env
from waypoint.middleware import ModelRetryMiddleware, SafeToolMiddleware, ToolRetryMiddleware

from ..console import Console, chapter_model
from ..fstools import ProjectRoot, execute_tool
from .project import parse_project_args, project_agent, project_chat, project_parser
from .session import guarded

AGENT_NAME = "ch05"
TOOL_RETRY = RetryPolicy(max_attempts=3, initial_interval=0.5, max_interval=5.0)
MODEL_RETRY = RetryPolicy(max_attempts=5, initial_interval=1.0, max_interval=20.0)
RETRIED_TOOLS = ("ls", "read_file", "glob", "grep", "fetch_status")  # reads: calling one twice is harmless


def strict_execute(root: ProjectRoot, *, timeout: float = 30.0) -> Tool:
    """`execute(command)` in the project root that raises `CommandFailed` when the command fails."""
    return execute_tool(root, timeout=timeout, check=True)


_status_calls = 0


@tool
def fetch_status(service: str) -> str:
    """Read a service's status page (simulated: the first request of each process drops its connection).

    Args:
        service: the service's name, e.g. api
    """
    global _status_calls
    _status_calls += 1
    if _status_calls == 1:
        raise ConnectionError(f"connection to the status page of '{service}' was reset")
    return json.dumps({"service": service, "status": "operational", "checked": "simulated status page"})


_STATUS = re.compile(r"^\s*(?:(?:can|could|would)\s+you\s+)?(?:please\s+)?(?:check|fetch|get)\s+the\s+status\s+of\s+"
                     r"['\"`]?(?P<service>[^'\"`]+?)['\"`]?\s*[.!?]?\s*$", re.I)


class StatusPhrasing:
    """The offline model, plus one phrasing: `check the status of <service>` calls `fetch_status`.

    A real model needs no such help (it reads the tool's description); this only lets the retry be seen
    with no key.
    """

    def __init__(self, model: OfflineModel) -> None:
        self.model = model
        self.name = model.name
        self.banner = model.banner

    def _call(self, messages: Sequence[Message], tools: Any) -> Message | None:
        if not messages or messages[-1].role != "user" or "fetch_status" not in {t.name for t in tools or ()}:
            return None
        found = _STATUS.match(messages[-1].content)
        if found is None:
            return None
        turn = sum(1 for m in messages if m.role == "assistant") + 1
        call = ToolCall(id=f"call_{turn}", name="fetch_status", arguments=json.dumps({"service": found["service"]}),
                        index=0)
        return Message(role="assistant", tool_calls=(call,), finish_reason="tool_calls")

    async def generate(self, messages: Sequence[Message], *, tools: Any = None, tool_choice: Any = "auto") -> Message:
        return self._call(messages, tools) or await self.model.generate(messages, tools=tools, tool_choice=tool_choice)

    async def stream(self, messages: Sequence[Message], *, tools: Any = None, tool_choice: Any = "auto",
                     ) -> AsyncIterator[Message]:
        call = self._call(messages, tools)
        if call is not None:
            yield call
            return
        async for chunk in self.model.stream(messages, tools=tools, tool_choice=tool_choice):
            yield chunk


def build_agent(*, instruction: str | None = None, model: Any = None, root: ProjectRoot | None = None,
                ) -> ChatModelAgent:
    """Chapter 4's agent with a strict `execute`, `fetch_status`, and the safe-tool and retry middlewares."""
    root = root or ProjectRoot()
    model = model or model_from_env()
    if isinstance(model, OfflineModel):
        model = StatusPhrasing(model)
    return project_agent(
        AGENT_NAME, model=model, root=root, instruction=instruction, tools=[fetch_status],
        execute=strict_execute(root),  # this chapter's execute raises when the command fails
        middlewares=[SafeToolMiddleware(),  # outermost: sees only what the retry layer gave up on
                     ToolRetryMiddleware(TOOL_RETRY, tools=RETRIED_TOOLS),
                     ModelRetryMiddleware(MODEL_RETRY)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = project_parser(5, "Chapter 4's agent with safe-tool and retry middleware.")
    args = parse_project_args(parser, argv)
    console = Console()

    def body() -> int:
        model = chapter_model(console)
        return project_chat(5, args, console,
                            lambda root: build_agent(instruction=args.instruction, model=model, root=root),
                            ).main(args.session)

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
