"""Running a graph: the loop over supersteps and the DAG (`loop`: `Run`), one node's call with its policy,
stream and subgraph (`calls`), sync code on the thread pool (`node_calls`), fan-in merges (`merge`), the task a
node runs in (`scope`, `task`: ledger, chunks, lease checks), interrupts and resumes (`interrupts`, `resume`,
`pending`), and where a run is (`position`). Nothing here knows a store."""

from .interrupts import (
    CompositeInterrupt,
    Expired,
    Interrupt,
    InterruptCtx,
    InterruptInfo,
    StatefulInterrupt,
    legacy_interrupt_id,
    utc,
)
from .loop import Run, RunInterrupted
from .merge import register_merge
from .node_calls import in_daemon_thread
from .pending import Pending, pending_of
from .position import InterruptRecord, RunPosition
from .resume import (
    ResumeRequest,
    address_segment,
    answered_ids,
    answers_below,
    awaits_answer,
    due_answers,
    escape_part,
    get_interrupt_id,
    get_interrupt_info,
    get_interrupt_state,
    get_resume_context,
    interrupt_info,
    pause_again,
    paused_records,
    pending_interrupt_ids,
    reissue_ids,
    retire_failed_answers,
    segment_of,
    standing_answers,
    unescape_part,
)
from .scope import current_task
from .sleep import Sleeping, sleep_until
from .task import (
    TaskLedger,
    check_lease,
    collecting_attempts,
    current_checkpoint_id,
    current_version,
    emit_chunk,
    enclosing_state,
    idempotency_key,
    ledger_epoch,
    takes_keyword,
    task_ledger,
)

__all__ = [
    "CompositeInterrupt", "Expired", "Interrupt", "InterruptCtx", "InterruptInfo", "InterruptRecord", "Pending", "ResumeRequest",
    "Run", "RunInterrupted", "RunPosition", "Sleeping", "StatefulInterrupt", "TaskLedger", "address_segment", "answered_ids",
    "answers_below", "awaits_answer", "check_lease", "collecting_attempts", "current_checkpoint_id", "current_task",
    "current_version", "due_answers", "emit_chunk", "enclosing_state", "escape_part", "get_interrupt_id", "get_interrupt_info",
    "get_interrupt_state", "get_resume_context", "idempotency_key", "in_daemon_thread", "interrupt_info",
    "ledger_epoch", "legacy_interrupt_id", "pause_again", "paused_records", "pending_interrupt_ids", "pending_of", "register_merge",
    "reissue_ids", "retire_failed_answers", "segment_of", "sleep_until", "standing_answers", "takes_keyword", "task_ledger", "unescape_part", "utc"
]
