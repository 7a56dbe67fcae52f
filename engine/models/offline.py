"""`OfflineModel`, a deterministic rule-based chat model so every demo runs with no API key (`model_from_env()`,
which picks a real model when a key is set, is with the providers: waypoint/adapters/env.py).

Rules read the last user message (case-insensitive); each calls its tool only when that tool is offered:

    (can you) (please) execute|run (the command) <cmd>   → execute(command=<cmd>)
    (please) read (the file) <path>                       → read_file(path=<path>)
    (please) list (the files in | the directory) <dir>    → ls(path=<dir>)
    (please) ask <doc> about <question>                   → answer_from_document(document=<doc>, question=<question>)
    (please) ask the <agent> to <request>                 → <agent>(request=<request>)  (an agent used as a tool)

Called after tools ran, it summarises their results; anything else gets a plain reply echoing the request.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ._chunks import split_message
from .base import ToolChoice
from .schema import Message, ToolCall, ToolInfo

__all__ = ["OfflineModel", "BANNER"]

BANNER = "offline model: deterministic rules, no network — set OPENAI_API_KEY to use a real model"

_LEAD = r"^\s*(?:(?:can|could|would)\s+you\s+)?(?:please\s+)?"
_RULES: list[tuple[str, re.Pattern[str], tuple[str, ...]]] = [
    ("execute", re.compile(_LEAD + r"(?:execute|run)\s+(?:the\s+command\s+)?(?P<command>.+)", re.I | re.S),
     ("command",)),
    ("read_file", re.compile(_LEAD + r"read\s+(?:the\s+file\s+)?(?P<path>.+)", re.I | re.S), ("path",)),
    ("ls", re.compile(_LEAD + r"list\s+(?:the\s+files\s+in\s+|the\s+directory\s+)?(?P<path>.+)", re.I | re.S),
     ("path",)),
    ("answer_from_document", re.compile(_LEAD + r"ask\s+(?P<document>.+?)\s+about\s+(?P<question>.+)", re.I | re.S),
     ("document", "question")),
]
_DELEGATE = re.compile(_LEAD + r"ask\s+the\s+(?P<agent>[\w-]+)\s+to\s+(?P<request>.+)", re.I | re.S)
_QUOTES = ("`", "'", '"')
_SUMMARY_LIMIT = 200


def _clean(field: str, value: str) -> str:
    """An argument as the user meant it: surrounding quotes/backticks removed, else the sentence's final
    . ! or ? (a question keeps its question mark)."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in _QUOTES:
        return value[1:-1].strip()
    if field != "question" and len(value) >= 2 and value[-1] in ".!?" and not value[-2].isspace() \
            and value[-2] != ".":  # "..", "../": a path, not the end of a sentence
        return value[:-1]
    return value


def _match(text: str, offered: set[str] = frozenset()) -> tuple[str, dict[str, str]] | None:
    delegate = _DELEGATE.match(text)
    if delegate and delegate["agent"] in offered:  # only when such an agent tool is offered: else the other rules
        return delegate["agent"], {"request": _clean("question", delegate["request"])}
    for tool, pattern, fields in _RULES:
        found = pattern.match(text)
        if found:
            return tool, {f: _clean(f, found[f]) for f in fields}
    return None


def _allowed(tools: Sequence[ToolInfo] | None, tool_choice: ToolChoice) -> set[str]:
    names = {t.name for t in tools or ()}
    if tool_choice == "none":
        return set()
    if tool_choice in ("auto", "required"):
        return names
    return names & {tool_choice}


def _truncate(text: str, limit: int = _SUMMARY_LIMIT) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _summary(messages: Sequence[Message]) -> str:
    """A short report of the tool results after the last assistant turn."""
    results = []
    for message in reversed(messages):
        if message.role != "tool":
            break
        results.append(message)
    lines = [f"- {m.name or 'a tool'} returned: {_truncate(m.content) or '(nothing)'}" for m in reversed(results)]
    head = "Here is what the tool returned:" if len(lines) == 1 else f"Here is what the {len(lines)} tools returned:"
    return "\n".join([head, *lines])


def _plain(request: str | None, tool: str | None = None) -> str:
    if request is None:
        return "Hello! I am the offline model. Ask me to run a command, read a file, list a directory, or ask a document."
    said = _truncate(request, 120)
    if tool is not None:
        return (f"You asked: \"{said}\". I would use the '{tool}' tool for that, but it is not available to me "
                "here, so I cannot do it.")
    return (f"You said: \"{said}\". I am the offline model and follow fixed rules: try \"run <command>\", "
            "\"read <path>\", \"list <dir>\" or \"ask <document> about <question>\".")


class OfflineModel:
    """A deterministic, rule-based chat model: no key, no network. See the module docstring for its phrasings.

    Tool-call IDs are `call_<n>`, `n` counting the assistant turns so far, so they are the same on every
    run and unique within a conversation. `banner` says what this model is; show it to users.
    `word_delay` (seconds) paces `stream()` word by word, so streaming can be seen (0: all at once).
    """

    banner = BANNER

    def __init__(self, *, name: str = "offline", word_delay: float = 0.0) -> None:
        if not word_delay >= 0:
            raise ValueError(f"OfflineModel: word_delay must be 0 or more seconds, got {word_delay!r}")
        self.name = name
        self.word_delay = word_delay

    def __repr__(self) -> str:
        return f"OfflineModel(name={self.name!r})"

    def reply(self, messages: Sequence[Message], tools: Sequence[ToolInfo] | None = None,
              tool_choice: ToolChoice = "auto") -> Message:
        """The answer to `messages`, computed synchronously."""
        if messages and messages[-1].role == "tool":
            return Message(role="assistant", content=_summary(messages), finish_reason="stop")
        request = next((m.content for m in reversed(messages) if m.role == "user"), None)
        found = _match(request, _allowed(tools, tool_choice)) if request is not None else None
        if found is None:
            return Message(role="assistant", content=_plain(request), finish_reason="stop")
        tool, arguments = found
        if tool not in _allowed(tools, tool_choice):
            return Message(role="assistant", content=_plain(request, tool), finish_reason="stop")
        turn = sum(1 for m in messages if m.role == "assistant") + 1
        call = ToolCall(id=f"call_{turn}", name=tool, arguments=json.dumps(arguments), index=0)
        return Message(role="assistant", tool_calls=(call,), finish_reason="tool_calls")

    async def generate(self, messages: Sequence[Message], *, tools: Sequence[ToolInfo] | None = None,
                       tool_choice: ToolChoice = "auto") -> Message:
        """The whole answer."""
        return self.reply(messages, tools, tool_choice)

    async def stream(self, messages: Sequence[Message], *, tools: Sequence[ToolInfo] | None = None,
                     tool_choice: ToolChoice = "auto") -> AsyncIterator[Message]:
        """The answer in word chunks (a tool call as a first fragment, then its arguments in pieces), each
        `word_delay` seconds after the last."""
        for i, chunk in enumerate(split_message(self.reply(messages, tools, tool_choice), chunk_size=None)):
            if i and self.word_delay:
                await asyncio.sleep(self.word_delay)
            yield chunk


def __getattr__(name: str) -> Any:
    if name == "model_from_env":  # it lived here before 0.2: the old import still works, for one release
        import warnings
        from importlib import import_module

        warnings.warn("waypoint.engine.models.offline.model_from_env moved to waypoint.adapters.env (or import it "
                      "from waypoint.engine.models); the old path goes in Waypoint 0.3", DeprecationWarning, stacklevel=2)
        return import_module("waypoint.adapters.env").model_from_env
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
