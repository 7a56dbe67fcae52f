"""Chapter 6: callbacks. Chapter 4's agent (project files + `execute`) with a callback handler on the runner
that times every node of the agent's graph; after each turn the trace is printed on stderr:

    [trace] prompt 0.04 ms
    [trace] model 12.10 ms
    [trace] tools 3.20 ms
    [trace] model 5.02 ms
    [trace] 4 checkpoints written (versions 2-5)

`--log` adds `LoggingMiddleware`: one structured record per model call and per tool call (and at the start
and end of a run), printed on stderr as `[log] {json}`.

    waypoint chapter 6 [--log] [--session ID]     (or python -m waypoint.cmd.chapters.ch06)
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from waypoint.engine.models import model_from_env
from waypoint.middleware import LoggingMiddleware

from .session import guarded
from ..console import Console, chapter_model
from ..fstools import ProjectRoot
from .project import parse_project_args, project_agent, project_chat, project_parser

__all__ = ["AGENT_NAME", "build_agent", "NodeTrace", "main"]

AGENT_NAME = "ch06"
LEASE_SECONDS = 10.0
LOG_FIELDS = ("agent", "checkpoint_id", "node", "model", "tool", "call_id", "duration_ms", "outcome", "messages")


class NodeTrace:
    """A callback handler (`Runner(callbacks=[...])`): how long each node ran, in the order they started."""

    def __init__(self) -> None:
        self._open: dict[tuple[tuple[str, ...], int], float] = {}
        self._spans: list[tuple[float, str, float, str]] = []  # (started, node, ms, note)
        self._versions: list[int] = []

    def on_start(self, event: Any) -> None:
        if event.node_path:  # a node; the run itself has an empty path
            self._open[(event.node_path, event.step)] = time.perf_counter()

    def on_end(self, event: Any) -> None:
        self._close(event, "")

    def on_error(self, event: Any) -> None:
        self._close(event, " (failed)")

    def on_interrupt(self, event: Any) -> None:
        self._close(event, " (paused)")

    def on_checkpoint(self, event: Any) -> None:
        self._versions.append(event.data)

    def _close(self, event: Any, note: str) -> None:
        started = self._open.pop((event.node_path, event.step), None)
        if started is not None:
            ms = (time.perf_counter() - started) * 1000
            self._spans.append((started, "/".join(event.node_path), ms, note))

    def report(self, console: Console) -> None:
        """Print the spans gathered since the last report (on stderr), then forget them."""
        for _, node, ms, note in sorted(self._spans):
            console.note(f"[trace] {node} {ms:.2f} ms{note}", "dim")
        if self._versions:
            console.note(f"[trace] {len(self._versions)} checkpoints written (versions {self._versions[0]}-"
                         f"{self._versions[-1]})", "dim")
        self._spans.clear()
        self._versions.clear()
        self._open.clear()


class StructuredFormatter(logging.Formatter):
    """`[log] {"msg": ..., "node": ..., "duration_ms": ...}`: a `LoggingMiddleware` record as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {name: getattr(record, name) for name in LOG_FIELDS if hasattr(record, name)}
        return "[log] " + json.dumps({"msg": record.getMessage(), **fields}, default=str)


def structured_logger() -> logging.Logger:
    logger = logging.getLogger("waypoint.cmd.ch06")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StructuredFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def build_agent(*, model: Any = None, instruction: str | None = None, root: ProjectRoot | None = None,
                log: bool = False) -> Any:
    """Chapter 6's agent, from the environment unless told otherwise (`waypoint runs resume` calls it bare)."""
    root = root or ProjectRoot()
    middlewares = [LoggingMiddleware(structured_logger())] if log else []
    return project_agent(AGENT_NAME, model=model or model_from_env(), root=root, instruction=instruction,
                         middlewares=middlewares)


def main(argv: Sequence[str] | None = None) -> int:
    parser = project_parser(6, "Chapter 6: a callback handler traces the agent's nodes; --log adds structured logs.")
    parser.add_argument("--log", action="store_true", help="log every model and tool call as JSON on stderr")
    args = parse_project_args(parser, argv)
    console = Console()

    def body() -> int:
        model = chapter_model(console)
        console.note("Tracing: node timings after each turn ([trace] on stderr); structured logs "
                     + ("on ([log] on stderr)" if args.log else "off (pass --log)"), "dim")
        trace = NodeTrace()
        session = project_chat(6, args, console, lambda root: build_agent(model=model, instruction=args.instruction,
                                                                          root=root, log=args.log),
                               callbacks=[trace], lease_seconds=LEASE_SECONDS, after_turn=lambda: trace.report(console))
        return session.main(args.session)

    return guarded(console, body)


if __name__ == "__main__":
    sys.exit(main())
