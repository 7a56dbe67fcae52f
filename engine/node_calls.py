"""Small pieces of running one node that the run loop (engine/runner.py) uses: calling a timed sync node on
a daemon thread, telling the engine's errors from a node's own, awaiting what may be awaitable, and
cancelling a batch of tasks so no node outlives its run."""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

from .errors import GraphRunError, NodeError
from .shape import CNode

__all__ = ["raised_for", "in_daemon_thread", "take_key", "maybe_await", "cancel_all"]


def raised_for(path: tuple[str, ...], err: BaseException) -> bool:
    """True for an error the engine raised for this task (routing, fan-in, a nested node's error).
    Anything else a node's code raised — a `WaypointError` from a run it called, say — is its error."""
    if isinstance(err, NodeError):
        return tuple(err.node_path[:len(path)]) == path
    return isinstance(err, GraphRunError)


class _DaemonPool:
    """Daemon threads for sync node and tool code, reused: a thread per call costs ~100 µs more, and
    daemon threads mean neither `invoke()` nor the interpreter's exit waits for one that is stuck."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1  # claimed by this job
        if start:
            threading.Thread(target=self._work, name="waypoint-sync", daemon=True).start()
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                if self._idle >= _IDLE_THREADS:
                    return
                self._idle += 1


_IDLE_THREADS = 32
"""Threads kept waiting for sync work; more start when all are busy (a blocked node never waits for another)."""
_POOL = _DaemonPool()


async def in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn(*args)` on a daemon thread and await it, so sync code never blocks the event loop (other
    runs, a server's requests, the run's own cancellation). Cancelling the caller does not stop the thread
    (it cannot be killed): it finishes in the background, and its result is dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()
    context = contextvars.copy_context()  # the node still sees its task (resume context, tools)

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def work() -> None:
        try:
            result, ok = context.run(fn, *args), True
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting task
            result, ok = err, False
        try:
            loop.call_soon_threadsafe(settle, ok, result)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    _POOL.submit(work)
    return await future


def take_key(node: CNode, value: Any) -> Any:
    try:
        return value[node.input_key]
    except (KeyError, TypeError, IndexError) as err:
        raise GraphRunError(
            f"node '{node.key}' has input_key={node.input_key!r} but its input "
            f"({type(value).__name__}) has no such key; send it a dict with that key"
        ) from err


async def maybe_await(value: Any) -> Any:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value


async def cancel_all(tasks: Any) -> None:
    """Cancel tasks still running and wait for them, so no node outlives its run."""
    alive = [t for t in tasks if not t.done()]
    for task in alive:
        task.cancel()
    if alive:
        await asyncio.gather(*alive, return_exceptions=True)
