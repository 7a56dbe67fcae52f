"""The chapters' tools: filesystem tools (`ls`, `read_file`, `write_file`, `edit_file`, `glob`, `grep`) and
`execute`, every one confined to a project root (`PROJECT_ROOT`, default the working directory).

A path is resolved — `..` and symlinks followed — before use, and refused unless it lies inside the
root; the refusal goes back to the model as the tool's result (`RetryAgentRun`), so it can correct itself
and the run goes on. `glob` and `grep` skip what resolves outside. `execute` runs a shell command with the
root as its working directory and a timeout; what the command itself does is not confined (guard it with
approval: chapter 7).

The root a run's tools were confined to is part of the run: `RecordRoot` stores it with every version the
run writes (under `ROOT_KEY` in the run's stored string map, `RunInfo.trace`), and whoever continues the run
— `waypoint runs resume`, `waypoint chapter N --session` — confines the tools to `run_root(...)`, the root
stored with it, whatever its own working directory is (docs/decisions.md, "A session's project root travels
with its run").
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from waypoint.engine import RetryAgentRun, Tool, tool
from waypoint.engine.events import TRACE_LIMITS

__all__ = ["ProjectRoot", "filesystem_tools", "execute_tool", "CommandFailed", "ROOT_KEY", "RecordRoot",
           "stored_root", "root_problem", "run_root"]

MAX_READ = 100_000
MAX_MATCHES = 200
ROOT_KEY = "waypoint.project_root"
"""The key of a run's stored string map (`RunInfo.trace`) under which it keeps its project root."""
MAX_ROOT = TRACE_LIMITS[2]
"""The longest root (in characters) a run can store: the map drops longer values."""


class ProjectRoot:
    """The directory tools may touch, and the check that keeps them inside it."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root or os.environ.get("PROJECT_ROOT") or ".").resolve()

    def path(self, relative: str) -> Path:
        """`relative` (or absolute) resolved inside the root, or `RetryAgentRun` saying why not."""
        candidate = Path(relative).expanduser()
        if not candidate.is_absolute():
            candidate = self.root / candidate
        resolved = candidate.resolve()
        if not self.contains(resolved):
            raise RetryAgentRun(f"path '{relative}' is outside the project root {self.root}; "
                                "use a path inside it (relative paths start there)")
        return resolved

    def contains(self, resolved: Path) -> bool:
        return resolved == self.root or self.root in resolved.parents

    def shown(self, path: Path) -> str:
        return str(path.relative_to(self.root)) if path != self.root else "."


class RecordRoot:
    """A run hook (`Runner(callbacks=[RecordRoot(root)])`): every version the run writes — its start, a resume,
    a continue — stores the root its tools are confined to."""

    def __init__(self, root: ProjectRoot) -> None:
        self.root = root

    def on_run_start(self, info: Any) -> None:
        info.trace[ROOT_KEY] = str(self.root.root)


def stored_root(trace: Mapping[str, str]) -> Path | None:
    """The project root a run stored with a version (`RunSnapshot.trace`); None if it stored none."""
    text = trace.get(ROOT_KEY)
    return Path(text) if text else None


def root_problem(root: ProjectRoot) -> str | None:
    """Why `root` cannot confine a run's tools (not a directory; too long to be stored with the run), or None."""
    if not root.root.is_dir():
        return f"{root.root} is not a directory"
    if len(str(root.root)) > MAX_ROOT:
        return f"{str(root.root)[:60]}... is {len(str(root.root))} characters long, and a run stores at most {MAX_ROOT}"
    return None


def run_root(name: str, trace: Mapping[str, str], *, given: str | os.PathLike[str] | None,
             error: type[Exception]) -> ProjectRoot:
    """The root the tools of a stored run (`name`: "run 'ID'", "session ID") are confined to: the one stored
    with it, or `given` (`--project-root`) when that one is unknown (stored before runs kept their root) or no
    longer a directory. Raises `error`, one line naming the run and what to do, when it cannot be known, when
    `given` names another root than an existing stored one (a run keeps its root), or when `given` is not a
    directory."""
    stored = stored_root(trace)
    if stored is not None and given is not None and ProjectRoot(given).root != stored and stored.is_dir():
        raise error(f"the tools of {name} are confined to {stored}; --project-root {given} names another directory: "
                    "leave it out (it is only for a run whose root is unknown or no longer a directory)")
    if given is None:
        if stored is None:
            raise error(f"{name} does not say which project root its tools are confined to (it was stored before "
                        "runs kept their root); pass --project-root DIR naming the directory it worked in")
        if not stored.is_dir():
            raise error(f"the tools of {name} are confined to {stored}, which is no longer a directory; restore it, or "
                        "pass --project-root DIR naming the directory the project is in now")
        return ProjectRoot(stored)
    root = ProjectRoot(given)
    problem = root_problem(root)
    if problem is not None:
        raise error(f"--project-root {given}: {problem}; pass the directory the tools of {name} worked in")
    return root


def filesystem_tools(root: ProjectRoot) -> list[Tool]:
    """`ls`, `read_file`, `write_file`, `edit_file`, `glob`, `grep`, confined to `root`."""

    @tool
    def ls(path: str = ".") -> str:
        """List a directory of the project.

        Args:
            path: the directory, relative to the project root
        """
        where = root.path(path)
        if not where.is_dir():
            raise RetryAgentRun(f"'{path}' is not a directory")
        entries = sorted(where.iterdir(), key=lambda p: p.name)
        return "\n".join(p.name + ("/" if p.is_dir() else "") for p in entries) or "(empty)"

    @tool
    def read_file(path: str) -> str:
        """Read a text file of the project.

        Args:
            path: the file, relative to the project root
        """
        where = root.path(path)
        if not where.is_file():
            raise RetryAgentRun(f"'{path}' is not a file")
        text = where.read_text(errors="replace")
        return text if len(text) <= MAX_READ else text[:MAX_READ] + f"\n... ({len(text) - MAX_READ} more characters)"

    @tool
    def write_file(path: str, content: str) -> str:
        """Write (create or replace) a text file in the project.

        Args:
            path: the file, relative to the project root
            content: the whole new content
        """
        where = root.path(path)
        root.path(str(where.parent))  # the directory too (a symlinked parent could point outside)
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(content)
        return f"wrote {len(content)} characters to {root.shown(where)}"

    @tool
    def edit_file(path: str, old_string: str, new_string: str, replace_all: bool = False) -> str:
        """Replace exact text in a file of the project.

        Args:
            path: the file, relative to the project root
            old_string: the text to replace (must occur exactly once unless replace_all)
            new_string: what to put instead
            replace_all: replace every occurrence
        """
        return _edit(root, path, old_string, new_string, replace_all)

    @tool(name="glob")
    def glob_files(pattern: str, path: str = ".") -> str:
        """Find files of the project whose path matches a glob pattern (e.g. **/*.py).

        Args:
            pattern: the glob pattern
            path: the directory to search from, relative to the project root
        """
        found = [root.shown(p) for p in _inside(root, root.path(path).glob(pattern))]
        return "\n".join(sorted(found)[:MAX_MATCHES]) or "(no match)"

    @tool
    def grep(pattern: str, path: str = ".", include: str = "*") -> str:
        """Search the project's text files for a regular expression; lines as file:line: text.

        Args:
            pattern: the regular expression
            path: a file or directory, relative to the project root
            include: only files whose name matches this glob
        """
        return _grep(root, pattern, path, include)

    return [ls, read_file, write_file, edit_file, glob_files, grep]


class CommandFailed(Exception):
    """A command exited with a non-zero code, or ran out of time (`execute_tool(check=True)`)."""


def execute_tool(root: ProjectRoot, *, timeout: float = 30.0, check: bool = False) -> Tool:
    """`execute(command)`: a shell command run in the project root, with a timeout. With `check=True` a
    failing command is an error (`CommandFailed`) rather than a result that reports the exit code."""

    @tool
    async def execute(command: str) -> str:
        """Run a shell command in the project root and return its exit code and output.

        Args:
            command: the command line
        """
        proc = await asyncio.create_subprocess_shell(
            command, cwd=root.root, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            if check:  # not a TimeoutError: a retry layer takes that as transient, and the command may have acted
                raise CommandFailed(f"command timed out after {timeout:g} s") from None
            return f"timed out after {timeout:g} s"
        text = out.decode(errors="replace")
        if len(text) > MAX_READ:
            text = text[:MAX_READ] + "\n... (output cut)"
        if proc.returncode == 0:
            return text or ("(no output)" if check else text)
        if check:
            raise CommandFailed(f"command exited with code {proc.returncode}" + (f": {text.strip()}" if text.strip()
                                                                                  else ""))
        return f"exit code {proc.returncode}\n{text}"

    return execute


def _edit(root: ProjectRoot, path: str, old_string: str, new_string: str, replace_all: bool) -> str:
    where = root.path(path)
    if not where.is_file():
        raise RetryAgentRun(f"'{path}' is not a file")
    text = where.read_text()
    count = text.count(old_string)
    if count == 0:
        raise RetryAgentRun(f"the text to replace does not occur in {path}")
    if count > 1 and not replace_all:
        raise RetryAgentRun(f"the text to replace occurs {count} times in {path}; give more context or "
                            "replace_all=true")
    where.write_text(text.replace(old_string, new_string) if replace_all else text.replace(old_string, new_string, 1))
    return f"replaced {count if replace_all else 1} occurrence(s) in {root.shown(where)}"


def _grep(root: ProjectRoot, pattern: str, path: str, include: str) -> str:
    try:
        regex = re.compile(pattern)
    except re.error as err:
        raise RetryAgentRun(f"'{pattern}' is not a valid regular expression: {err}") from None
    start = root.path(path)
    files = [start] if start.is_file() else _inside(root, start.rglob("*"))
    hits: list[str] = []
    for file in files:
        if not file.is_file() or not fnmatch.fnmatch(file.name, include):
            continue
        hits.extend(_grep_file(root, file, regex, MAX_MATCHES - len(hits)))
        if len(hits) >= MAX_MATCHES:
            break
    return "\n".join(hits) or "(no match)"


def _inside(root: ProjectRoot, paths: Any) -> list[Path]:
    """The paths that, resolved, are inside the root (a symlink may point anywhere)."""
    kept = []
    for p in paths:
        try:
            resolved = p.resolve()
        except OSError:
            continue
        if root.contains(resolved):
            kept.append(resolved)
    return kept


def _grep_file(root: ProjectRoot, file: Path, regex: re.Pattern[str], room: int) -> list[str]:
    try:
        text = file.read_text()
    except (UnicodeDecodeError, OSError):
        return []  # binary or unreadable
    hits = []
    for number, line in enumerate(text.splitlines(), start=1):
        if regex.search(line):
            hits.append(f"{root.shown(file)}:{number}: {line.strip()[:200]}")
            if len(hits) >= room:
                break
    return hits
