"""The project agent chapters 4–10 build on: filesystem tools and `execute`, confined to a project root, plus
whatever tools and middlewares a chapter adds; and the chat those chapters share, whose sessions keep their
root.

Which root a session's tools are confined to:

- a new session: `--project-root`, else `PROJECT_ROOT`, else the working directory (made absolute);
- a stored one: the root stored with it (`RecordRoot`, cmd/fstools.py), whatever the working directory —
  refused, in one line, when `PROJECT_ROOT` names another directory, and when the root cannot be known (a
  session stored before sessions kept their root, a root that is no longer a directory) until
  `--project-root DIR` names it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from waypoint.engine import ChatModelAgent, Runner

from ..console import Console, chapter_parser, open_store
from ..fstools import ProjectRoot, RecordRoot, execute_tool, filesystem_tools, root_problem, run_root, stored_root
from .session import ChapterError, ChatSession, PauseHandler, add_session_options

__all__ = ["project_instruction", "project_agent", "check_root", "project_parser", "parse_project_args",
           "project_chat", "session_root", "MAX_ITERATIONS"]

MAX_ITERATIONS = 50
"""A coding task takes many tool rounds; the bound only stops a model that loops."""


def check_root(root: ProjectRoot, given: Path | None = None) -> None:
    """A new session's root (`given`, the `--project-root`; else `PROJECT_ROOT`, default: the working directory,
    made absolute) must be a directory short enough to be stored with the session."""
    problem = root_problem(root)
    if problem is not None and given is not None:
        raise ChapterError(f"--project-root {given}: {problem}; pass your project's directory, or leave it out to "
                           "use PROJECT_ROOT or the working directory")
    if problem is not None:
        raise ChapterError(f"the project root {problem}; set PROJECT_ROOT to your project's directory (or unset it "
                           "to use the working directory)")


def project_instruction(root: ProjectRoot) -> str:
    """The default `--instruction` from chapter 4 on: where the project is and how to name paths."""
    return (f"You are a helpful coding assistant working in the project at {root.root}. Use the tools to list, "
            "read, write and search its files and to run commands there; give paths relative to that directory "
            "(or absolute paths inside it). Answer briefly.")


def project_agent(name: str, *, model: Any, root: ProjectRoot, instruction: str | None = None,
                  tools: Sequence[Any] = (), middlewares: Sequence[Any] = (), execute: Any = None,
                  **options: Any) -> ChatModelAgent:
    """A `ChatModelAgent` named `name` with the project tools (`ls`, `read_file`, `write_file`, `edit_file`,
    `glob`, `grep`, and `execute` — or the `execute` tool given) and `tools`; `options` go to `ChatModelAgent`."""
    options.setdefault("max_iterations", MAX_ITERATIONS)
    return ChatModelAgent(name=name, model=model, instruction=instruction or project_instruction(root),
                          tools=[*filesystem_tools(root), execute or execute_tool(root), *tools],
                          middlewares=middlewares, **options)


# --- the chat of chapters 4–10 ------------------------------------------------------------------------------

def project_parser(number: int, description: str, *, instruction: str | None = None) -> argparse.ArgumentParser:
    """`chapter_parser` with a session, `--project-root` and `--takeover`; the default instruction is
    chapter 4's (`instruction` for another)."""
    parser = chapter_parser(number, description, session=True,
                            instruction=instruction or project_instruction(ProjectRoot()))
    parser.add_argument("--project-root", type=Path, metavar="DIR", default=None,
                        help="the directory the tools are confined to (default: $PROJECT_ROOT, else the working "
                             "directory); a stored session keeps its own, so this is only for one stored before "
                             "sessions kept their root, or whose directory moved")
    return add_session_options(parser)


def parse_project_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The options; `instruction` is None unless given (the default names the root, known once the session
    is open)."""
    args = parser.parse_args(argv)
    if args.instruction == parser.get_default("instruction"):
        args.instruction = None
    return args


def project_chat(number: int, args: argparse.Namespace, console: Console, agent: Callable[[ProjectRoot], Any], *,
                 callbacks: Sequence[Any] = (), lease_seconds: float | None = None,
                 on_pause: PauseHandler | None = None, after_turn: Callable[[], None] | None = None) -> ChatSession:
    """Chapter `number`'s chat on `args.session`, the agent (`agent(root)`) confined to the session's root; every
    run stores that root (`RecordRoot`)."""
    store = open_store(args.db)
    options = {} if lease_seconds is None else {"lease_seconds": lease_seconds}

    def runner_for(root: ProjectRoot) -> Runner:
        return Runner(agent(root), store=store, streaming=True, callbacks=[*callbacks, RecordRoot(root)], **options)

    start = ProjectRoot(args.project_root)

    def confine(session: ChatSession, snap: Any) -> None:
        root = session_root(session.session_id, snap, args.project_root)
        if root.root != start.root:
            session.runner = runner_for(root)
        # a root given for a session that could not name one is stored once a turn runs; until then it is needed
        session.again = lambda stored: () if stored_root(stored.trace) == root.root else (
            "--project-root", str(root.root))
        session.banners = (f"Project root: {root.root}", *session.banners)

    return ChatSession(number=number, runner=runner_for(start), console=console, on_pause=on_pause,
                       after_turn=after_turn, takeover=args.takeover, db=args.db, prepare=confine)


def session_root(session_id: str, snap: Any, given: Path | None) -> ProjectRoot:
    """The root session `session_id` (`snap`: its stored run, None for a new session) confines its tools to;
    `ChapterError` when it cannot be known or the environment names another (see the module's docstring)."""
    if snap is None:
        root = ProjectRoot(given)
        check_root(root, given)
        return root
    name = f"session {session_id}"
    root = run_root(name, snap.trace, given=given, error=ChapterError)
    named = os.environ.get("PROJECT_ROOT")
    if given is None and named and ProjectRoot(named).root != root.root:
        raise ChapterError(f"the tools of {name} are confined to {root.root}; PROJECT_ROOT names "
                           f"{ProjectRoot(named).root}: unset PROJECT_ROOT to continue the session, or leave out "
                           "--session to start a new one there")
    return root
