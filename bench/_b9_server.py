"""B9's server process: `waypoint.service` on uvicorn, serving B5's pause-once graph and an agent whose
model streams tokens stamped with the time they were produced.

    python -m bench._b9_server --db PATH_OR_URL --token T      # prints "READY <port>" once listening

uvicorn runs as `waypoint serve` does, but without its access log (one log line per request is a cost of
the deployment, not of the service).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

N_TOKENS = 200
TOKEN_INTERVAL = 0.01


def graph() -> Any:
    """prepare -> ask (pauses until answered) -> finish, as in B5."""
    from waypoint.engine import END, START, Graph, Interrupt, get_resume_context

    def prepare(x: int) -> int:
        return x

    def ask(x: int) -> int:
        is_target, _, data = get_resume_context()
        if not is_target:
            raise Interrupt({"q": "ok?", "run": x})
        return x if data == "yes" else -1

    def finish(x: int) -> str:
        return f"yes:{x}"

    g = Graph(name="b9")
    g.add_node("prepare", prepare)
    g.add_node("ask", ask)
    g.add_node("finish", finish)
    g.add_edge(START, "prepare")
    g.add_edge("prepare", "ask")
    g.add_edge("ask", "finish")
    g.add_edge("finish", END)
    return g


class Clock:
    """A chat model that streams `N_TOKENS` chunks, each carrying `time.time_ns()` of its production."""

    name = "clock"

    async def generate(self, messages: Any, **_: Any) -> Any:
        from waypoint.engine import Message

        return Message.assistant("tick")

    async def stream(self, messages: Any, **_: Any) -> Any:
        from waypoint.engine import Message

        for _n in range(N_TOKENS):
            await asyncio.sleep(TOKEN_INTERVAL)
            yield Message(role="assistant", content=f"{time.time_ns()} ")


def agent() -> Any:
    from waypoint.engine import ChatModelAgent

    return ChatModelAgent(name="b9chat", model=Clock())


async def amain(db: str, token: str) -> None:
    import uvicorn

    from waypoint.service import create_app, open_store

    store = open_store(db)
    app = create_app({"b9": graph(), "b9chat": agent()}, store, auth=token)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                           lifespan="on", timeout_graceful_shutdown=2))
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    print(f"READY {server.servers[0].sockets[0].getsockname()[1]}", flush=True)
    try:
        await task
    finally:
        await store.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--token", required=True)
    args = p.parse_args()
    asyncio.run(amain(args.db, args.token))


if __name__ == "__main__":
    main()
