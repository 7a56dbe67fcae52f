"""Keeping a run: the store contract (`store`), a position as store content (`content`) and its encoding into
versions (`checkpoint`; read back and verified by `reading`), the checks before a run is claimed (`admission`),
a run's life against a store — claim, steps, pause, end (`lifecycle`), its lease and
the processes that own runs (`lease`, `owners`), recovery of runs nobody resumes (`recovery`), edits of a
stored run (`state_update`), a process stopping (`shutdown`) and a person's cancel (`cancel`)."""

from .cancel import AGENT_POINTS, cancel_point, default_by, request_cancel
from .checkpoint import Checkpointer, fingerprint
from .lifecycle import RunOptions, run_graph
from .recovery import Recovered, recover
from .shutdown import Shutdown
from .state_update import update_state
from .store import ON_BUSY, Checkpoint, CheckpointMeta, CheckPointStore, QueuedInput, store_clock

__all__ = [
    "CheckPointStore", "Checkpoint", "CheckpointMeta", "Checkpointer", "QueuedInput", "Recovered", "RunOptions", "Shutdown",
    "ON_BUSY", "store_clock",
    "AGENT_POINTS", "cancel_point", "default_by", "fingerprint", "recover", "request_cancel", "run_graph", "update_state"
]
