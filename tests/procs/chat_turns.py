"""The chat the double-texting process tests serve (`waypoint serve --agents chat_turns:build`) and run in workers
(`waypoint worker --graphs chat_turns:build`).

`chat` answers a user's message "hold K" by calling its tool `note(text="K")`, then "answered K" once the result is
back; any other message T it answers "answered T" at once. `note` waits for the file $CHAT_DIR/gate-K before it
returns "noted K", so a test holds a turn inside its tool step and releases it as an event. Files under $CHAT_DIR:

- `journal`: "note K start <pid>", "note K done <pid>", "model <last message> <pid>" (each model call),
  "asked <when> <pid>" when this process reads a person's cancel request, "stopping <pid>" when its service
  begins its shutdown's drain (appended and fsynced);
- `hold-answer-K`: if it exists, the answer after "noted K" (the turn's last step) waits for `gate-answer-K`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

from waypoint.engine import ChatModelAgent, Message, ToolCall, tool


def _path(name: str) -> str:
    return os.path.join(os.environ["CHAT_DIR"], name)


def journal(*words: str) -> None:
    fd = os.open(_path("journal"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (" ".join([*words, str(os.getpid())]) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class _Asked(logging.Handler):
    """Journals the moment this process reads a cancel request (engine/keep/lease.py logs it), and the moment its
    service begins to stop the runs it executes."""

    def emit(self, record: logging.LogRecord) -> None:
        if "cancel requested" in record.getMessage():
            journal("asked", str(record.args[-1]) if record.args else "?")
        elif record.getMessage().startswith("service: stopping"):
            journal("stopping")


for _name in ("waypoint.lease", "waypoint.service"):
    logging.getLogger(_name).addHandler(_Asked(level=logging.INFO))
    logging.getLogger(_name).setLevel(logging.INFO)


@tool
async def note(text: str) -> str:
    """Note the text (waits for its gate)."""
    journal("note", text, "start")
    while not os.path.exists(_path(f"gate-{text}")):
        await asyncio.sleep(0.01)
    journal("note", text, "done")
    return f"noted {text}"


class TurnModel:
    name = "turn-model"

    async def generate(self, messages, **_):
        last = messages[-1]
        journal("model", json.dumps(last.content))
        if last.role == "tool":
            key = last.content.removeprefix("noted ")
            if os.path.exists(_path(f"hold-answer-{key}")):  # the turn's last step holds until its gate opens
                journal("answering", key)
                while not os.path.exists(_path(f"gate-answer-{key}")):
                    await asyncio.sleep(0.01)
            return Message.assistant(f"answered {key}")
        if last.content.startswith("hold "):
            key = last.content.removeprefix("hold ")
            return Message.assistant("", tool_calls=[ToolCall(id=f"call_{key}", name="note",
                                                              arguments=json.dumps({"text": key}))])
        return Message.assistant(f"answered {last.content}")

    async def stream(self, messages, **_):
        yield await self.generate(messages)


def build(store=None) -> ChatModelAgent:
    """The agent (`waypoint serve` calls it with no argument, `waypoint worker` with its store)."""
    return ChatModelAgent(name="chat", model=TurnModel(), tools=[note])
