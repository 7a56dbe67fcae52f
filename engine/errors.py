"""Every error Waypoint raises, under one root.

    WaypointError
    ├── GraphBuildError            the graph is malformed (raised by the builder or compile())
    ├── GraphRunError              a run went wrong outside any single node's code
    │   ├── MaxStepsExceeded       a Pregel run took more supersteps than max_steps
    │   ├── MaxIterationsExceeded  an agent loop took more model turns than max_iterations
    │   └── GraphMismatch          a checkpoint was written by a different graph
    ├── NodeError                  a node raised; .node_path names it, __cause__ is the original
    ├── GraphInterrupted           the run paused; .checkpoint_id and .info say where and why
    ├── RunCancelled               a person's cancel stopped the run (`cancel(...)`): stored cancelled, resumable
    ├── CheckpointError            something about stored checkpoints
    │   ├── CheckpointConflict     someone else wrote this run first (stale version / live lease)
    │   │   └── LeaseLost          this process lost the run's lease: it starts nothing more
    │   ├── CheckpointExists       new input given to a run that is paused
    │   ├── NotRunning             a cancel named a run no process executes now
    │   ├── CheckpointNotFound     no such checkpoint
    │   ├── CheckpointCorrupted    stored bytes fail their checksum or do not decode
    │   ├── UnknownInterrupt       resume named an interrupt that is not pending
    │   └── StoreUnavailable       the store could not be reached or refused for a passing reason
    ├── SerializationError         a value cannot be written by the codec
    └── ModelError                 a chat model call failed; .status, .retryable

The interrupt signals a node raises (`Interrupt`, …) are *not* errors: they live in
`interrupts.py` and derive from `BaseException` so that `except Exception` in user code
cannot swallow them (see docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "WaypointError",
    "GraphBuildError",
    "GraphRunError",
    "MaxStepsExceeded",
    "MaxIterationsExceeded",
    "GraphMismatch",
    "NodeError",
    "GraphInterrupted",
    "RunCancelled",
    "CheckpointError",
    "CheckpointConflict",
    "LeaseLost",
    "CheckpointExists",
    "NotRunning",
    "CheckpointNotFound",
    "CheckpointCorrupted",
    "UnknownInterrupt",
    "PauseExpired",
    "StoreUnavailable",
    "SerializationError",
    "ModelError",
]


class WaypointError(Exception):
    """Root of every error Waypoint raises."""


class GraphBuildError(WaypointError):
    """The graph cannot be built or compiled as written; the message names the node or edge."""


class GraphRunError(WaypointError):
    """A run failed for a reason that is not one node's exception (routing, merging, limits)."""


class MaxStepsExceeded(GraphRunError):
    """A Pregel run needed more supersteps than `max_steps` allows."""

    def __init__(self, message: str, *, max_steps: int) -> None:
        super().__init__(message)
        self.max_steps = max_steps


class MaxIterationsExceeded(GraphRunError):
    """An agent loop needed more model turns than `max_iterations`; `.last_response` holds the last one."""

    def __init__(self, message: str, *, last_response: Any = None) -> None:
        super().__init__(message)
        self.last_response = last_response


class GraphMismatch(GraphRunError):
    """The stored checkpoint was written by a graph that differs from the compiled one."""


class NodeError(WaypointError):
    """A node failed. `.node_path` is the path of node keys from the root graph; `__cause__` is the error."""

    def __init__(self, node_path: Sequence[str], cause: BaseException, *, attempts: int = 1) -> None:
        self.node_path = list(node_path)
        self.attempts = attempts
        where = "/".join(self.node_path)
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(
            f"node '{where}' failed{tries}: {type(cause).__name__}: {_text(cause)} "
            f"(node path {self.node_path}; the original exception is chained as __cause__)"
        )
        self.__cause__ = cause


class GraphInterrupted(WaypointError):
    """The run paused on one or more interrupts; resume it with `ainvoke(None, checkpoint_id=...)`."""

    def __init__(self, info: Any, *, checkpoint_id: str | None = None) -> None:
        self.info = info
        self.checkpoint_id = checkpoint_id
        where = f"run '{checkpoint_id}'" if checkpoint_id else "run (no checkpoint_id: it cannot be resumed)"
        super().__init__(f"{where} interrupted: {info}")


class CheckpointError(WaypointError):
    """Base for errors about stored checkpoints."""


class CheckpointConflict(CheckpointError):
    """Another writer got there first: a stale version, or a run held under a live lease."""


class LeaseLost(CheckpointConflict):
    """This process may no longer run the run `.checkpoint_id`: its lease ran out unrenewed (the process was
    paused or starved, or the store was unreachable), or another process took the run over. The process
    starts nothing more for that run — no step, no tool call — and writes nothing; the run continues
    wherever it is taken over. Raised by the run loop before a step and by `check_lease()` inside a task;
    it passes through the run unwrapped (never a `NodeError`, never stored as the run's failure)."""

    def __init__(self, message: str, *, checkpoint_id: str | None = None, database: bool = False) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.database = database
        """The lease was lost because the database did not renew it (renewals failed or got no answer), not
        because this process was stopped or took too long: a worker does not count it as a failed attempt."""


class ProcessStopping(WaypointError):
    """The run stopped because its process is shutting down (engine/keep/shutdown.py) — not a decision about the run:
    it is left as it was last saved, `running`, with its lease ended, and the next process continues it."""

    def __init__(self, message: str, *, checkpoint_id: str | None = None) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id


class CheckpointExists(CheckpointError):
    """New input was given for a run that is paused; resume it with input=None or pass force_new_run=True."""


class RunCancelled(WaypointError):
    """A person's cancel (`CompiledGraph.cancel`, `Runner.cancel`, `POST /runs/{id}/cancel`, `waypoint runs cancel`)
    stopped the run `.checkpoint_id` where it asked (`.when`): the run is stored `interrupted` with
    `error="cancelled"` at its last finished step, with who asked (`.by`), and continues from there when resumed or
    given new input. Passes through nested runs and tool calls unwrapped (never a `NodeError`)."""

    def __init__(self, message: str, *, checkpoint_id: str | None = None, by: str = "", when: str = "now") -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.by = by
        self.when = when


class NotRunning(CheckpointError):
    """A cancel named a run that no process executes now (`.status`: its newest version's status, or "running"
    under a lease that ran out: its process is gone): there is nothing to stop."""

    def __init__(self, message: str, *, checkpoint_id: str | None = None, status: str | None = None) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.status = status


class CheckpointNotFound(CheckpointError):
    """No checkpoint with that ID (or version) exists in the store."""


class CheckpointCorrupted(CheckpointError):
    """Stored bytes failed their checksum, signature or structure check; nothing was decoded from them."""


class UnknownInterrupt(CheckpointError):
    """`resume=` named an interrupt ID that is not pending; the message lists the pending ones."""


class PauseExpired(UnknownInterrupt):
    """`resume=` answered a pause whose deadline has passed (on the store's clock): it takes only the answer its
    deadline gives (recovery gives it), or answered one with `Expired` before it was due. Nothing was written."""


class StoreUnavailable(CheckpointError):
    """The store could not do an operation for a reason that may pass: its database is unreachable or
    restarting, it has no connection to spare ("too many clients"), a lock or a transaction was not
    granted in time. Nothing was written by that operation. Try again later; a run that met it while
    saving is left at its last saved step (never stored as failed) and may be resumed or taken over.
    The driver's error is `__cause__`."""


class SerializationError(WaypointError):
    """A value cannot be encoded (an unregistered type, say); raised when writing, never when reading."""


class ModelError(WaypointError):
    """A chat model call failed. `status` is the HTTP status (None without one); `retryable` is True for
    429, 5xx, timeouts, dropped connections and answers that cannot be read — what a retry policy may try
    again. The message names the model and the server, never a key."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False,
                 model: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.model = model


def clip(text: str, limit: int = 200) -> str:
    """`text` cut to `limit` characters: how stored (untrusted) data may appear in an error message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _text(exc: BaseException) -> str:
    """`str(exc)`, or a stand-in when that raises (an exception's own `__str__` may fail): never the error that
    replaces the one being reported."""
    try:
        return str(exc)
    except Exception as err:  # noqa: BLE001
        return f"<its str() raised {type(err).__name__}>"


def describe(exc: BaseException) -> str:
    """`Type: message` of an exception raised while reading stored data, clipped."""
    return f"{type(exc).__name__}: {clip(_text(exc))}"  # str() of a hostile argument may fail (a deep list)
