"""Who holds a run's lease, as far as this process can know: itself, a live process on this host, a
process on this host that is gone, or a process elsewhere.

A lease owner is `host:pid:random` (`checkpoint.new_owner`, one per start or resume). A caller that asks
for `takeover=True` says "I know that process is dead"; this module is how the engine checks the claim
where it can instead of trusting it:

1. An owner that is this process and whose run is still executing here (`executing` is entered around
   every start or resume with a store) is alive: a takeover is refused.
2. An owner on this host (same host name) whose PID is alive — `kill(pid, 0)` succeeds and the process
   is not a zombie — is alive: a takeover is refused. A PID that was reused by another process reads as
   alive too: the takeover waits for the lease to expire, which is the safe side.
3. An owner on this host whose PID is gone (or this process, no longer executing that run) is dead: a
   takeover may go ahead before the lease expires.
4. An owner on another host is unknown: the caller's word decides (the lease expiry otherwise).

Hosts are told apart by their host name: machines (or containers) that share one and share a database
should not share a PID namespace, or rule 3 could call a live process elsewhere dead.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from enum import Enum

__all__ = ["OwnerState", "owner_state", "executing", "describe_owner"]


class OwnerState(Enum):
    EXECUTING_HERE = "executing in this process"
    ALIVE = "alive on this host"
    DEAD = "gone from this host"
    UNKNOWN = "on another host"


_EXECUTING: set[str] = set()
_LOCK = threading.Lock()


@contextlib.contextmanager
def executing(owner: str) -> Iterator[None]:
    """Mark `owner` (a lease owner of this process) as executing its run for the duration."""
    with _LOCK:
        _EXECUTING.add(owner)
    try:
        yield
    finally:
        with _LOCK:
            _EXECUTING.discard(owner)


def _parse(owner: str | None) -> tuple[str, int] | None:
    if not owner:
        return None
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def owner_state(owner: str | None) -> OwnerState:
    """What this process can tell about the lease owner `owner` (rules 1-4 above)."""
    parsed = _parse(owner)
    if parsed is None or parsed[0] != os.uname().nodename:
        return OwnerState.UNKNOWN
    pid = parsed[1]
    if pid == os.getpid():
        with _LOCK:
            here = owner in _EXECUTING
        return OwnerState.EXECUTING_HERE if here else OwnerState.DEAD
    return OwnerState.ALIVE if _pid_alive(pid) else OwnerState.DEAD


def describe_owner(owner: str | None) -> str:
    """What this process knows of `owner`, for a message ("" when it knows nothing)."""
    state, parsed = owner_state(owner), _parse(owner)
    if parsed is None or state is OwnerState.UNKNOWN:
        return ""
    if state is OwnerState.EXECUTING_HERE:
        return "that is this very process, executing it right now"
    if parsed[1] == os.getpid():
        return "that is this very process, which no longer executes it (its run here stopped before its end was written)"
    return f"that is process {parsed[1]} on this host, and it is {'alive' if state is OwnerState.ALIVE else 'gone'}"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    except OSError:
        return True  # cannot tell: the safe answer
    try:  # a killed child nobody reaped yet is a zombie: dead for our purpose
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")
