"""`waypoint worker` as the tests start it, with two knobs the command line does not have:

    python worker_proc.py <waypoint worker options...>

- $WAYPOINT_TEST_SKEW (seconds): this process's wall clock (`time.time()`) runs that far ahead (negative:
  behind) of the machine's, as on a machine whose clock is off;
- $WAYPOINT_TEST_CLAIM_SECONDS: how long the worker's claims last unrenewed (`Worker(lease_seconds=)`).
"""

from __future__ import annotations

import os
import sys
import time

skew = float(os.environ.get("WAYPOINT_TEST_SKEW", "0"))
if skew:
    _real = time.time
    time.time = lambda: _real() + skew  # before anything imports it by name

claim = os.environ.get("WAYPOINT_TEST_CLAIM_SECONDS")
if claim:
    from waypoint.stores import worker as _worker

    _init = _worker.Worker.__init__

    def _with_claim_seconds(self, *args, **kwargs):
        kwargs.setdefault("lease_seconds", float(claim))
        _init(self, *args, **kwargs)

    _worker.Worker.__init__ = _with_claim_seconds

import signal  # noqa: E402


def _dump_tasks(*_):  # SIGUSR1: every asyncio task's stack on stderr (the tests ask for it before killing a hung worker)
    import asyncio
    import traceback

    try:
        tasks = asyncio.all_tasks(asyncio.get_running_loop())
    except RuntimeError:
        tasks = set()
    for task in tasks:
        print(f"--- task {task.get_name()}", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    traceback.print_stack(file=sys.stderr)
    sys.stderr.flush()


signal.signal(signal.SIGUSR1, _dump_tasks)

from waypoint.cmd.worker import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
