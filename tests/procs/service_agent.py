"""An agent for `waypoint serve` in a child process (the browser test): the offline model asks to run
the command the user names, `ApprovalMiddleware` pauses it, and the tool appends the command to the file
named by $SERVICE_TOOL_LOG each time it really runs."""

from __future__ import annotations

import os

from waypoint.engine import ChatModelAgent, tool
from waypoint.engine.models import OfflineModel
from waypoint.middleware import ApprovalMiddleware


@tool
def execute(command: str) -> str:
    """Run a shell command (this one only records it)."""
    with open(os.environ["SERVICE_TOOL_LOG"], "a", encoding="utf-8") as f:
        f.write(command + "\n")
    return f"ran {command}"


def build() -> ChatModelAgent:
    return ChatModelAgent(name="ops", model=OfflineModel(), instruction="You run commands.", tools=[execute],
                          middlewares=[ApprovalMiddleware(tools={"execute"})])
