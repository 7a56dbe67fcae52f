"""One version of an app, as a deploy would ship it, for tests/test_deploys.py: a process pauses a run under one
version and exits; another process builds a later version and resumes it.

    python tests/procs/deploy_app.py DB VERSION pause            # prints {"iid": ..., "call": ...}
    python tests/procs/deploy_app.py DB VERSION resume IID       # prints {"out": ...} or {"error": ..., "kind": ...}
    python tests/procs/deploy_app.py DB VERSION resume           # a plain resume (no answer)
    python tests/procs/deploy_app.py DB VERSION migrate JSON     # update_state(run-1, **JSON): {"origin", "status"}

Versions: graph-v1 (prepare -> ask -> finish, paused at ask), graph-v2-added (an `audit` node after ask),
graph-v2-renamed (ask renamed), agent-v1 (an agent whose `execute` is approved by a person), agent-v2 (a tool
added, the instructions changed), agent-v2-dropped (`execute` removed). `execute` and `prepare` append a line to $EFFECTS.
`graph_v2_renamed` and `agent_v2_dropped` are the later versions for `waypoint runs ... --graph deploy_app:...`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from waypoint.engine import END, START, ChatModelAgent, Graph, GraphInterrupted, Interrupt, WaypointError, \
    get_resume_context, tool
from waypoint.engine.run import segment_of
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


def prepare(x):
    with open(os.environ["EFFECTS"], "a") as f:
        f.write(f"prepare {x}\n")
    return x + 1


def build_graph(version: str) -> Graph:
    g = Graph(name="deploy")
    paused_at = "ask_again" if version == "graph-v2-renamed" else "ask"
    g.add_node("prepare", prepare)
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
    return g


def graph(version: str, store: SQLiteStore):
    return build_graph(version).compile(store=store)


def graph_v2_renamed() -> Graph:
    return build_graph("graph-v2-renamed")


def agent_v2_dropped() -> ChatModelAgent:
    return build_agent("agent-v2-dropped")


def graph_v2_added() -> Graph:
    """v2 of the graph, as `waypoint serve --agents deploy_app:graph_v2_added` serves it."""
    return build_graph("graph-v2-added")


def agent(version: str, store: SQLiteStore):
    return build_agent(version).compile(store=store)


def build_agent(version: str) -> ChatModelAgent:
    tools = {"agent-v1": [execute], "agent-v2": [execute, read_file], "agent-v2-dropped": [read_file]}[version]
    instruction = "You run commands." if version == "agent-v1" else "You run commands and read files, carefully."
    guarded = [t.name for t in tools if t.name == "execute"] or ["read_file"]
    return ChatModelAgent(name="ops", model=OfflineModel(), instruction=instruction, tools=tools,
                          middlewares=[ApprovalMiddleware(guarded)])


async def main(db: str, version: str, phase: str, iid: str | None) -> dict:
    store = SQLiteStore(db)
    app = graph(version, store) if version.startswith("graph") else agent(version, store)
    try:
        if phase == "pause":
            first = 1 if version.startswith("graph") else "please execute echo deployed"
            try:
                await app.ainvoke(first, checkpoint_id="run-1")
            except GraphInterrupted as paused:
                ctx = paused.info.contexts[0]
                return {"iid": ctx.id, "call": (segment_of(ctx.address, "tool") or [None, None])[1]}
            return {"error": "the run did not pause"}
        if phase == "migrate":
            try:
                meta = await app.update_state("run-1", {}, **json.loads(iid))
            except WaypointError as err:
                return {"error": str(err), "kind": type(err).__name__}
            return {"origin": meta.origin, "status": meta.status, "version": meta.version}
        answer = True if version.startswith("graph") else ApprovalResult(approved=True)
        try:
            out = await app.ainvoke(None, checkpoint_id="run-1", resume={iid: answer} if iid else None)
        except GraphInterrupted as paused:
            return {"paused": paused.info.contexts[0].id}
        except WaypointError as err:
            return {"error": str(err), "kind": type(err).__name__}
        return {"out": out if isinstance(out, (str, int)) else str(getattr(out, "content", out))}
    finally:
        await store.close()


if __name__ == "__main__":
    db, version, phase, *rest = sys.argv[1:]
    print(json.dumps(asyncio.run(main(db, version, phase, rest[0] if rest else None))))
