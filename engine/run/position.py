"""Where a run is: the plain value the run loop updates after every task and a store persists.

Everything needed to continue a run lives here and nowhere else, so that writing this value
after a step and reading it back in another process is all a resume needs:

- `pending`: tasks that must still run, with their inputs. In Pregel mode these are the tasks of
  the current superstep that have not finished; in DAG mode, the nodes that are ready (or running).
- `inbox`: values already delivered to nodes that have not consumed them yet
  (`{node: {source: value}}`): the next superstep's inputs (Pregel) or the values a node has
  received while it still waits for other predecessors (DAG).
- `skipped`: DAG only, `{node: [sources]}` that will send nothing (branch not taken).
- `state`: the run-local state object; `step`: completed supersteps (Pregel) or tasks (DAG).
- `interrupts`: `{node: InterruptRecord}` for tasks that paused; their inputs stay in `pending`.
- `paused_before` / `paused_after`: nodes a static `interrupt_before` / `interrupt_after` stopped at.
- `released`: nodes whose `interrupt_before` pause a resume has passed; they start without pausing
  again until they finish (stored, so a crash inside a released node does not ask again).
- `ledger`: the root run's ledger epoch — the version at which the current step began (engine/run/task.py).
- `lineage`: a random token minted when a run starts, and again when a fork (`write_to=`) or time travel
  (`version=`) starts a branch: part of every idempotency key, so no other run (a reused checkpoint ID, the
  same ID in another database, another turn of a chat) and no abandoned branch shares a key.
- `answers`: the resume request that claimed this version (plain: `{"data", "ids", "everything"}`),
  stored with the claim so that a crash after it continues with the same answers (cleared at the next
  pause and at the end).
- `static_ids`: the interrupt ID of each static pause (`"before:<node>"` / `"after:<node>"`).
- `nested`: the root run only — the progress of runs nested in tasks that are still running (a subgraph
  node, an agent used as a tool: `engine/compose/nested.py`), by the nested run's address, each encoded at its
  last finished step. A task run again after a crash continues its nested run from there; an entry
  leaves when its run ends or pauses (a paused nested run lives in its task's `InterruptRecord.child`).
- `writers`: DAG only, `{state field: node}` — the last node that wrote each state field without a
  reducer, so a later writer that may have run in parallel with it is refused (engine/shape/reducers.py).
- `takeovers`, `taken_at`: how many times in a row the run was continued from a `running` version (its
  process stopped without saving where the run came to rest) without writing anything after that takeover's
  claim, and the version that claim wrote. A version written after the claim (a step, a nested run's step)
  resets the count at the next takeover. Automatic recovery gives a run up once it reaches its
  `max_attempts` (engine/keep/recovery.py).
- `turn`: the root run only — `{"input": n}`, the last queued input (engine/keep/store.py, guarantee 15) a turn on
  this checkpoint ID has taken, carried from run to run on the ID so none is taken twice; and, for an agent's turn,
  `"kept"`: how many messages of its conversation came before this turn (what a rollback goes back to).
- `output` and `done` once the run has reached END.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunPosition", "InterruptRecord"]


@dataclass(kw_only=True)
class InterruptRecord:
    """A paused task: its interrupt's address and ID, what it said, its saved state, and a nested child run.

    `child` is the position of a run nested at this point — a subgraph node's, or a graph run inside the
    task (an agent used as a tool, engine/compose/nested.py) — which paused: its own records are the root causes.
    `above` holds the pause points above this one that an answer already passed in the same pass (an
    approval, say, whose call then paused inside): each with the `answer` it consumed, handed back when
    the pass runs again so nobody is asked twice and nothing below reuses that answer.
    """

    address: str
    id: str = ""
    """Unique to this pause of this run (minted when it first paused; kept while it is re-shown)."""
    info: Any = None
    state: Any = None
    has_state: bool = False
    child: RunPosition | None = None
    subs: list[InterruptRecord] = field(default_factory=list)
    above: list[InterruptRecord] = field(default_factory=list)
    answer: Any = None
    answered: bool = False
    """True for an `above` record: `answer` is what was consumed there."""
    deadline: float | None = None
    """When the pause stops waiting: seconds since the epoch on the store's clock (engine/keep/checkpoint.py turns
    `expires_in` into it when the pause is first stored)."""
    expires_in: float | None = None
    """Seconds from when the pause is stored, until it is (then `deadline`; never stored)."""
    on_deadline: Any = None
    has_on_deadline: bool = False
    """`on_deadline` is the answer the pause gets at its deadline (else an `Expired`)."""


@dataclass(kw_only=True)
class RunPosition:
    """The position of one (sub)graph run; see the module docstring."""

    step: int = 0
    pending: dict[str, Any] = field(default_factory=dict)
    inbox: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, list[str]] = field(default_factory=dict)
    state: Any = None
    interrupts: dict[str, InterruptRecord] = field(default_factory=dict)
    paused_before: list[str] = field(default_factory=list)
    paused_after: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    static_ids: dict[str, str] = field(default_factory=dict)
    ledger: int = 0
    lineage: str = ""
    answers: dict[str, Any] | None = None
    nested: dict[str, bytes] = field(default_factory=dict)
    writers: dict[str, str] = field(default_factory=dict)
    takeovers: int = 0
    taken_at: int = 0
    turn: dict[str, int] = field(default_factory=dict)
    done: bool = False
    output: Any = None
