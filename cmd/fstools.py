"""The chapters' tools: filesystem tools (`ls`, `read_file`, `write_file`, `edit_file`, `glob`, `grep`) and
`execute`, every one confined to a project root (`PROJECT_ROOT`, default the working directory).

A path is resolved — `..` and symlinks followed — before use, and refused unless it lies inside the
root; the refusal goes back to the model as the tool's result (`RetryAgentRun`), so it can correct itself
and the run goes on. `glob` and `grep` skip what resolves outside. `execute` runs a shell command with the
root as its working directory and a timeout; what the command itself does is not confined (guard it with
approval: chapter 7).
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
from pathlib import Path
from typing import Any

from waypoint.engine import RetryAgentRun, Tool, tool

__all__ = ["ProjectRoot", "filesystem_tools", "execute_tool", "CommandFailed"]

MAX_READ = 100_000
MAX_MATCHES = 200


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
