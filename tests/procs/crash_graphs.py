"""Graphs and a command line for the cross-process tests (run as a script in a child process).

    python crash_graphs.py DB|URL CHECKPOINT_ID MODE [--journal PATH] [--trigger any|all] [--lease S]
        [--resume JSON] [--takeover] [--sleep-at NODE] [--barrier PATH] [--durability D] [--block S]

Every node appends "<node> <pid>" to the journal (flushed and fsynced) when it starts and
"<node> done <pid>" when it ends. `--sleep-at NODE` makes that node sleep 60 s after its start line,
so the parent can SIGKILL the process while it is inside that node. Exit codes: 0 completed
(prints the output as JSON), 2 interrupted (prints {"interrupt": [ids]}), 3 CheckpointConflict,
4 any other WaypointError (message on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from waypoint.engine import (
    END,
    START,
    CheckpointConflict,
    Graph,
    GraphInterrupted,
    Interrupt,
    WaypointError,
    get_resume_context,
)
from waypoint.stores import SQLiteStore


def journal(args, line: str) -> None:
    if not args.journal:
        return
    with open(args.journal, "a") as fh:
        fh.write(f"{line} {os.getpid()}\n")
        fh.flush()
        os.fsync(fh.fileno())


def node(args, name: str):
    async def run(x):
        journal(args, name)
        if args.sleep_at == name:
            await asyncio.sleep(60)
        await asyncio.sleep(0.01)
        journal(args, f"{name} done")
        return x + [name] if isinstance(x, list) else {name: True}

    return run


def build(args) -> Graph:
    g = Graph(name=f"crash-{args.mode}")
    if args.mode == "linear":  # START -> n0 -> n1 -> n2 -> n3 -> n4 -> END
        names = [f"n{i}" for i in range(5)]
        for n in names:
            g.add_node(n, node(args, n))
        for a, b in zip([START, *names], [*names, END]):
            g.add_edge(a, b)
    elif args.mode == "fanout":  # START -> fast, slow -> join -> END
        for n in ("fast", "slow"):
            g.add_node(n, node(args, n))
            g.add_edge(START, n)
            g.add_edge(n, "join")
        g.add_node("join", node(args, "join"))
        g.add_edge("join", END)
    elif args.mode == "approval":  # START -> prepare -> approve (interrupts) -> act -> END
        g.add_node("prepare", node(args, "prepare"))

        async def approve(x):
            is_target, has_data, data = get_resume_context()
            if not is_target:
                raise Interrupt({"question": "ship it?"})
            journal(args, f"approve {data}")
            if args.barrier:  # stay inside the node long enough for a rival to try
                await asyncio.sleep(1.5)
            return x + [f"approved={data}"]

        g.add_node("approve", approve)
        g.add_node("act", node(args, "act"))
        g.add_edge(START, "prepare")
        g.add_edge("prepare", "approve")
        g.add_edge("approve", "act")
        g.add_edge("act", END)
    elif args.mode == "blocking":  # START -> block (a sync node holding the event loop) -> after -> END
        def block(x):
            journal(args, "block")
            time.sleep(args.block)
            journal(args, "block done")
            return x + ["block"]

        g.add_node("block", block)
        g.add_node("after", node(args, "after"))
        g.add_edge(START, "block")
        g.add_edge("block", "after")
        g.add_edge("after", END)
    elif args.mode == "chain":  # START -> gate (pauses once) -> c1 -> ... -> c6 -> END, each c* 0.5 s
        async def gate(x):
            if not get_resume_context()[0]:
                raise Interrupt({"question": "go?"})
            return x

        g.add_node("gate", gate)
        names = [f"c{i}" for i in range(1, 7)]
        for n in names:
            g.add_node(n, slow_node(args, n))
        for a, b in zip([START, "gate", *names], ["gate", *names, END]):
            g.add_edge(a, b)
    elif args.mode == "bigstate":  # START -> grow (appends a 1 MB item per step, --steps times) -> check -> END
        g = Graph(name="crash-bigstate", state=lambda: {"blobs": []})

        def grow(x, state):
            journal(args, "grow")
            state["blobs"].append(big_item(len(state["blobs"])))
            return len(state["blobs"])

        def check(n, state):
            return [i for i, b in enumerate(state["blobs"]) if b != big_item(i)] or "intact"

        g.add_node("grow", grow)
        g.add_node("check", check)
        g.add_edge(START, "grow")
        g.add_branch("grow", lambda n: "grow" if n < args.steps else "check", ends=["grow", "check"])
        g.add_edge("check", END)
    elif args.mode == "parallel":  # START -> legal, security (each pauses for approval) -> join -> END
        for name in ("legal", "security"):
            g.add_node(name, approval(args, name), output_key=name)
            g.add_edge(START, name)
            g.add_edge(name, "join")
        g.add_node("join", node(args, "join"))
        g.add_edge("join", END)
    return g


def big_item(i: int) -> bytes:
    import hashlib

    return hashlib.sha256(str(i).encode()).digest() * (1 << 15)  # 1 MiB, different for each index


def slow_node(args, name: str):
    async def run(x):
        journal(args, name)
        await asyncio.sleep(0.5)
        return x + [name]

    return run


def approval(args, name: str):
    async def run(x):
        journal(args, name)
        is_target, has_data, data = get_resume_context()
        if not is_target:
            raise Interrupt({"approve": name})
        return data

    return run


async def main(args) -> int:
    if "://" in args.db:  # a SQLAlchemy URL (Postgres)
        from waypoint.stores import SQLStore

        store = SQLStore(args.db)
    elif args.sqlstore:
        from waypoint.stores import SQLStore

        store = SQLStore(f"sqlite+aiosqlite:///{args.db}")
    else:
        store = SQLiteStore(args.db)
    app = build(args).compile(store=store, trigger=args.trigger, lease_seconds=args.lease,
                              durability=args.durability,
                              max_steps=args.steps + 10 if args.trigger == "any" else None)
    if args.barrier:  # start together with a rival process: say we are ready, wait for the go
        open(f"{args.barrier}.ready.{os.getpid()}", "w").close()
        while not os.path.exists(args.barrier):
            time.sleep(0.001)
    initial = None if args.resume is not None or args.continue_run else ({} if args.mode in ("fanout", "parallel") else [])
    resume = json.loads(args.resume) if args.resume else None
    try:
        out = await app.ainvoke(initial, checkpoint_id=args.checkpoint_id, resume=resume, takeover=args.takeover)
    except GraphInterrupted as err:
        print(json.dumps({"interrupt": [c.id for c in err.info.contexts],
                          "names": [c.info.get("approve") if isinstance(c.info, dict) else None
                                    for c in err.info.contexts]}))
        return 2
    except CheckpointConflict as err:
        print(str(err), file=sys.stderr)
        return 3
    except WaypointError as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 4
    finally:
        await store.close()
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("db")
    p.add_argument("checkpoint_id")
    p.add_argument("mode", choices=["linear", "fanout", "approval", "parallel", "blocking", "chain", "bigstate"])
    p.add_argument("--journal")
    p.add_argument("--trigger", default="any")
    p.add_argument("--lease", type=float, default=30.0)
    p.add_argument("--resume")
    p.add_argument("--continue-run", action="store_true", help="ainvoke(None, ...) without resume=")
    p.add_argument("--takeover", action="store_true")
    p.add_argument("--sleep-at")
    p.add_argument("--barrier")
    p.add_argument("--durability", default="step")
    p.add_argument("--block", type=float, default=2.0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--sqlstore", action="store_true", help="SQLStore (SQLAlchemy, aiosqlite) instead of SQLiteStore")
    sys.exit(asyncio.run(main(p.parse_args())))
