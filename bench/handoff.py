"""The cost of handing one sync call to a thread and awaiting it, as `ainvoke` does for sync nodes and tools:
Waypoint's pool (`in_daemon_thread`) against a `ThreadPoolExecutor` and `asyncio.to_thread`, one call at a time
and fifty at once. Figures in µs per call (medians of 5 rounds). Run it pinned to one CPU too
(`taskset -c 0 python -m bench.handoff`) to see what waking a thread on the other CPU costs.

    python -m bench.handoff
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import statistics
import time

from waypoint.engine.run.node_calls import in_daemon_thread


def _noop(x: object = None) -> object:
    return x


async def _main() -> None:
    loop = asyncio.get_running_loop()
    executor = concurrent.futures.ThreadPoolExecutor(4)
    one = {"waypoint pool": lambda: in_daemon_thread(_noop, 1),
           "ThreadPoolExecutor": lambda: loop.run_in_executor(executor, _noop, 1),
           "asyncio.to_thread": lambda: asyncio.to_thread(_noop, 1)}
    for name, call in one.items():
        rounds = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(3000):
                await call()
            rounds.append((time.perf_counter() - t) / 3000 * 1e6)
        print(f"one at a time   {name:20s} {statistics.median(rounds):7.1f} µs/call")
    for name in ("waypoint pool", "ThreadPoolExecutor"):
        call, rounds = one[name], []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(100):
                await asyncio.gather(*(call() for _ in range(50)))
            rounds.append((time.perf_counter() - t) / 5000 * 1e6)
        print(f"fifty at once   {name:20s} {statistics.median(rounds):7.1f} µs/call")


if __name__ == "__main__":
    asyncio.run(_main())
