"""Small pieces of running one node that the run loop (engine/run/loop.py) uses: calling a timed sync node on
a daemon thread, telling the engine's errors from a node's own, awaiting what may be awaitable, and
cancelling a batch of tasks so no node outlives its run."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import os
import threading
from collections.abc import Callable
from typing import Any

from ..errors import GraphRunError, NodeError
from ..shape import CNode

__all__ = ["raised_for", "in_daemon_thread", "take_key", "maybe_await", "cancel_all"]


def raised_for(path: tuple[str, ...], err: BaseException) -> bool:
    """True for an error the engine raised for this task (routing, fan-in, a nested node's error).
    Anything else a node's code raised — a `WaypointError` from a run it called, say — is its error."""
    if isinstance(err, NodeError):
        return tuple(err.node_path[:len(path)]) == path
    return isinstance(err, GraphRunError)


class _DaemonPool:
    """Daemon threads for sync node and tool code, reused — a thread started per call costs ~100 µs — and daemon
    threads, so neither `invoke()` nor the interpreter's exit waits for one that is stuck.

    A few threads (`core`) take the calls in turn; calls that come while all of them are busy wait in line, and a
    thread that finishes takes the next one without sleeping. A call still waiting after `starved` seconds — its
    threads are blocked (a node waits on I/O, or never returns) — gets a thread of its own: a blocked node never
    keeps another waiting longer than that. Threads beyond `core` end once more than `idle` of them wait.

    Each thread sleeps on a pipe of its own, woken by a byte written to it: Linux then wakes it on the waking
    thread's CPU, which is about to wait for the result — on a 2-vCPU VM a round trip of 62–88 µs, against 73–99 for
    a `ThreadPoolExecutor`, whose futex wake-up may cross CPUs (`python -m bench.handoff`; docs/decisions.md).
    """

    def __init__(self, core: int, idle: int, starved: float) -> None:
        self._core, self._keep, self.starved = core, idle, starved
        self._reset()
        if hasattr(os, "register_at_fork"):  # a forked child has none of these threads: it starts its own
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Thread] = []  # waiting for a job, the most recently busy last (its caches warm)
        self._waiting: collections.deque[_Job] = collections.deque()  # jobs no thread has taken yet
        self._threads = 0

    def submit(self, job: _Job, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            start = worker is None and self._threads < self._core
            if worker is None and not start:
                self._waiting.append(job)
            elif start:
                self._threads += 1
        if worker is not None:
            worker.give(job)
        elif start:
            self._start(job)
        else:  # every thread is busy: if they stay busy, this call gets one of its own
            loop.call_later(self.starved, self._rescue, job)

    def _rescue(self, job: _Job) -> None:
        """`job` still waits: it gets a thread of its own. Each waiting job is rescued by its own timer, on its own
        loop — never another's, whose loop may be busy or closed, so that its timer fires late or never."""
        with self._lock:
            try:
                self._waiting.remove(job)
            except ValueError:  # a thread took it meanwhile
                return
            self._threads += 1
        self._start(job)

    def _start(self, job: _Job) -> None:
        """A new thread for `job` (counted already). A thread that cannot be started — the process is out of
        threads, memory or file descriptors — fails the call at once: never a call that waits for ever."""
        try:
            worker = _Thread(self)
        except Exception as err:  # noqa: BLE001 - handed to the call's caller
            with self._lock:
                self._threads -= 1
            failure = RuntimeError(
                f"Waypoint could not start a thread for this sync call ({type(err).__name__}: {err}): the process "
                "is out of threads, memory or file descriptors (are many sync nodes or tools blocked?)")
            failure.__cause__ = err
            job.fail(failure)
            return
        worker.give(job)

    def next_job(self, worker: _Thread) -> _Job | None:
        """The job a thread that finished one takes next, or None: it waits (or ends, if enough others wait)."""
        with self._lock:
            if self._waiting:
                return self._waiting.popleft()
            if len(self._idle) >= self._keep and self._threads > self._core:
                self._threads -= 1
                worker.ending = True
                return None
            self._idle.append(worker)
            return None


class _Thread:
    """One thread of the pool, sleeping on its own pipe until it is given a job."""

    def __init__(self, pool: _DaemonPool) -> None:
        self.pool = pool
        self.job: _Job | None = None
        self.ending = False
        self._wake_r, self._wake_w = os.pipe()
        try:
            threading.Thread(target=self._main, name="waypoint-sync", daemon=True).start()
        except BaseException:
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise

    def give(self, job: _Job) -> None:
        self.job = job
        os.write(self._wake_w, b"\0")

    def _main(self) -> None:
        try:
            while True:
                os.read(self._wake_r, 1)
                job, self.job = self.job, None
                while job is not None:
                    job.taken = True
                    if not job.run():  # the job forked and this is the child: end here, as a thread of its own
                        return  # would (the pipe and the pool are the parent's)
                    job = self.pool.next_job(self)
                if self.ending:
                    return
        finally:
            os.close(self._wake_r)
            os.close(self._wake_w)


class _Job:
    """One sync call for the pool: `fn(*args)` in `context`; its outcome handed to `future` on `loop`."""

    __slots__ = ("fn", "args", "context", "loop", "future", "taken")

    def __init__(self, fn: Callable[..., Any], args: tuple, loop: asyncio.AbstractEventLoop,
                 future: asyncio.Future) -> None:
        self.fn, self.args, self.loop, self.future = fn, args, loop, future
        self.context = contextvars.copy_context()  # the node still sees its task (resume context, tools)
        self.taken = False

    def run(self) -> bool:
        """Call it and hand its outcome on; False in the child of a fork the call made (nobody there waits)."""
        if self.future.done() or self.loop.is_closed():  # its caller stopped waiting (cancelled, or its run over)
            return True  # before it started: it never starts
        pid = os.getpid()
        try:
            result, ok = self.context.run(self.fn, *self.args), True
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting task
            result, ok = err, False
        if os.getpid() != pid:
            return False
        self._hand(ok, result)
        return True

    def fail(self, err: BaseException) -> None:
        self._hand(False, err)

    def _hand(self, ok: bool, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, ok, value)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass


def _settle(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():  # the caller may have been cancelled meanwhile
        return
    if ok:
        future.set_result(value)
    elif isinstance(value, StopIteration):  # a Future refuses it (it would end a generator): hand it on wrapped
        err = RuntimeError(f"sync code raised StopIteration ({value!r}), which cannot cross into async code; "
                           "catch it where `next()` is called")
        err.__cause__ = value
        future.set_exception(err)
    else:
        future.set_exception(value)


_POOL = _DaemonPool(core=min(8, (os.cpu_count() or 1) + 2), idle=32, starved=0.005)
"""`core`: enough to keep the cores busy when sync calls hold the GIL in turns, few enough that calls in line reuse
warm threads; `starved`: 5 ms, a hundred times a typical call's handoff, far below any wait a person notices."""


async def in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Call `fn(*args)` on a daemon thread and await it, so sync code never blocks the event loop (other
    runs, a server's requests, the run's own cancellation). Cancelling the caller does not stop the thread
    (it cannot be killed): it finishes in the background, and its result is dropped."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    _POOL.submit(_Job(fn, args, loop, future), loop)
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
