"""One version of an app, as a deploy would ship it, for tests/test_deploys.py: a process pauses a run under one
version and exits; another process builds a later version and resumes it.

    python tests/procs/deploy_app.py DB VERSION pause            # prints {"iid": ...}
    python tests/procs/deploy_app.py DB VERSION resume IID       # prints {"out": ...} or {"error": ..., "kind": ...}

Versions: graph-v1 (prepare -> ask -> finish, paused at ask), graph-v2-added (an `audit` node after ask),
graph-v2-renamed (ask renamed), agent-v1 (an agent whose `execute` is approved by a person), agent-v2 (a tool
added, the instructions changed), agent-v2-dropped (`execute` removed). `execute` appends a line to $EFFECTS.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from waypoint.engine import END, START, ChatModelAgent, Graph, GraphInterrupted, Interrupt, WaypointError, \
    get_resume_context, tool
from waypoint.engine.models import OfflineModel
from waypoint.middleware import ApprovalMiddleware, ApprovalResult
from waypoint.stores import SQLiteStore


@tool
def execute(command: str) -> str:
    """Run a shell command."""
    with open(os.environ["EFFECTS"], "a") as f:
        f.write(command + "\n")
    return f"ran {command}"


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


def ask(x):
    if not get_resume_context()[0]:
        raise Interrupt({"question": "go on?"})
    return x + 1


def graph(version: str, store: SQLiteStore):
    g = Graph(name="deploy")
    paused_at = "ask_again" if version == "graph-v2-renamed" else "ask"
    g.add_node("prepare", lambda x: x + 1)
    g.add_node(paused_at, ask)
    g.add_node("finish", lambda x: f"done {x}")
    g.add_edge(START, "prepare")
    g.add_edge("prepare", paused_at)
    if version == "graph-v2-added":
        g.add_node("audit", lambda x: x * 10)
        g.add_edge(paused_at, "audit")
        g.add_edge("audit", "finish")
    else:
        g.add_edge(paused_at, "finish")
    g.add_edge("finish", END)
    return g.compile(store=store)


def agent(version: str, store: SQLiteStore):
    tools = {"agent-v1": [execute], "agent-v2": [execute, read_file], "agent-v2-dropped": [read_file]}[version]
    instruction = "You run commands." if version == "agent-v1" else "You run commands and read files, carefully."
    guarded = [t.name for t in tools if t.name == "execute"] or ["read_file"]
    return ChatModelAgent(name="ops", model=OfflineModel(), instruction=instruction, tools=tools,
                          middlewares=[ApprovalMiddleware(guarded)]).compile(store=store)


async def main(db: str, version: str, phase: str, iid: str | None) -> dict:
    store = SQLiteStore(db)
    app = graph(version, store) if version.startswith("graph") else agent(version, store)
    try:
        if phase == "pause":
            first = 1 if version.startswith("graph") else "please execute echo deployed"
            try:
                await app.ainvoke(first, checkpoint_id="run-1")
            except GraphInterrupted as paused:
                return {"iid": paused.info.contexts[0].id}
            return {"error": "the run did not pause"}
        answer = True if version.startswith("graph") else ApprovalResult(approved=True)
        try:
            out = await app.ainvoke(None, checkpoint_id="run-1", resume={iid: answer})
        except WaypointError as err:
            return {"error": str(err), "kind": type(err).__name__}
        return {"out": out if isinstance(out, (str, int)) else str(getattr(out, "content", out))}
    finally:
        await store.close()


if __name__ == "__main__":
    db, version, phase, *rest = sys.argv[1:]
    print(json.dumps(asyncio.run(main(db, version, phase, rest[0] if rest else None))))
