"""Whether and how a call may start or continue a stored run (engine/keep/lifecycle.py runs it after this):
a new run or a resume, a branch (fork, time travel), the live lease of another process, the graph it was
written by, the answers it was given. Everything here only reads and decides; the claim that follows is the
write (the rules are numbered in engine/keep/lifecycle.py)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

from ..errors import (
    CheckpointConflict,
    CheckpointError,
    CheckpointExists,
    CheckpointNotFound,
    GraphMismatch,
    GraphRunError,
    PauseExpired,
    UnknownInterrupt,
)
from ..run import (
    Expired,
    utc,
    ResumeRequest,
    Run,
    answered_ids,
    awaits_answer,
    paused_records,
    pending_interrupt_ids,
    reissue_ids,
    retire_failed_answers,
    standing_answers,
)
from ..shape import END, START, GraphShape
from .checkpoint import Checkpointer, Loaded
from .content import deploy_conflicts, describe_difference
from .migrate import call_problems, state_message
from .owners import OwnerState, describe_owner, owner_state
from .store import store_clock


class Admission:
    """The deciding half of a run's session (the attributes it reads are declared below)."""

    graph: GraphShape
    opts: Any  # RunOptions (engine/keep/lifecycle.py)
    durability: str
    cp: Checkpointer
    source: str | None
    target: str | None
    claiming: bool
    head_created: float | None
    resumed_from: Loaded | None

    # --- start or resume ---------------------------------------------------------------------------

    async def prepare(self, run: Run, input: Any, request: ResumeRequest | None) -> None:
        """Decide new run vs resume, check everything, and claim the run when resuming."""
        opts = self.opts
        loaded = await self._load_source()
        head = await self._target_head(loaded)
        self.head_created = head.created_at if head is not None else None  # what a new run here replaces
        if head is not None and self.cp.created_at is not None and self.cp.created_at < head.created_at:
            # a branch from a version of a run that a newer run on this ID replaced: written over the newer
            # run, it is a run of its own (the stores refuse an older run's write on a newer one)
            self.cp.replaces, self.cp.created_at = head.created_at, None
        self._check_expected(head if head is not None else loaded.meta if loaded is not None else None)
        if head is not None:  # a branch is judged by the newest version of the run it writes, never the one it read
            await self._check_lease(head)
        carried = await self._carried_input(loaded, head)
        if loaded is None or (loaded.meta.status == "completed" and opts.version is None and not request):
            self._check_new_run(loaded, input, request)
            self._start_new(run, input, fresh=loaded is not None, carried=carried)
            return
        if opts.force_new_run and self.target == self.source:  # with write_to it only allows overwriting
            self._start_new(run, input, fresh=True, carried=carried)
            return
        if input is not None:
            raise CheckpointExists(self._paused_message(loaded))
        if opts.start_state is not None:
            raise CheckpointExists(f"run '{self.source}' exists and this call continues it: start_state= is for a new "
                                   "run only (force_new_run=True starts one on the ID)")
        if loaded.meta.status == "completed" and opts.version is None:
            raise CheckpointError(f"run '{self.source}' has completed; there is nothing to resume")
        self._check_graph(loaded, request)
        branch = self.source != self.target or opts.version is not None
        retire_failed_answers(loaded.position, loaded.meta.status, f"runnable:{self.graph.name}")
        standing = None if branch else standing_answers(loaded.position, loaded.meta.status, loaded.meta.error)
        self._check_resume(loaded, request, standing)
        request, expired = await self._check_deadlines(loaded.position, request, loaded.meta.status, branch)
        if expired:  # the claim says so (`"<id>@<version> expired"`): what notifications and audits read
            self.cp.origin = f"{self.source}@{loaded.meta.version} expired"
        if standing is not None:  # a resume claimed this run and its process stopped: its answers stand
            request = standing.joined(request)
        run.restore(loaded.position, request)
        if branch:  # the inputs the ID's newest run has taken stay taken (a fork to another ID: that ID's)
            run.pos.turn = {"input": carried} if carried else {}
        run.pos.answers = request.to_plain() if request is not None else None
        if run.pos.ledger == 0:  # written before ledger epochs, or in a mode that keeps none
            run.pos.ledger = (self.cp.version or 0) + 1
        if loaded.meta.status == "running" and not branch:
            _count_takeover(run.pos, loaded.meta.version, (self.cp.version or 0) + 1)
        if branch:  # a fork or time travel: a fresh ledger page and idempotency keys of its own
            self.cp.origin = f"{self.source}@{loaded.meta.version}"
            run.pos.ledger = (self.cp.version or 0) + 1
            run.pos.lineage = os.urandom(8).hex()
            # and the pauses it re-opens but does not answer now get new IDs (docs/resume.md)
            reissue_ids(run.pos, answered_ids(run.pos, request, f"runnable:{self.graph.name}"))
        self.resumed_from = loaded
        self.claiming = True  # the claim, with its answers: compare-and-set before any node runs

    async def _carried_input(self, loaded: Loaded | None, head: Any) -> int:
        """The last queued input a run on the target ID has taken (`RunPosition.turn`): the newest version's, so a
        fork or time travel never takes again an input a later turn took (engine/keep/store.py, guarantee 15)."""
        if loaded is not None and self.target == self.source and self.opts.version is None:
            return loaded.position.turn.get("input", 0)
        if head is None:
            return 0
        reader = Checkpointer(store=self.graph.store, serializer=self.cp.serializer, checkpoint_id=self.target,
                              graph_structure=self.graph.structure, state_schema=self.graph.state_schema)
        newest = await reader.load()
        return newest.position.turn.get("input", 0) if newest is not None else 0

    def _start_new(self, run: Run, input: Any, *, fresh: bool, carried: int) -> None:
        run.start(input, start_state(self.graph, self.opts))
        turn = self.opts.turn
        taken = max(carried, (turn or {}).get("input", 0))
        run.pos.turn = {**(turn or {}), "input": taken} if taken or turn else {}
        run.pos.ledger = (self.cp.version or 0) + 1  # the claim's version: this run's first ledger page
        run.pos.lineage = os.urandom(8).hex()  # keys of its own: not another run's on a reused ID or database
        if fresh:  # a new run on an ID that held one: its own created_at (the old versions stay history)
            self.cp.replaces = self.head_created
            self.cp.created_at = None
        self.claiming = self.durability == "step" or self.opts.force_new_run

    def _check_new_run(self, loaded: Loaded | None, input: Any, request: ResumeRequest | None) -> None:
        if request is not None:
            raise CheckpointNotFound(
                f"run '{self.source}' has no paused checkpoint to resume (it does not exist); "
                "start it with an input instead of resume="
            )
        if input is None and not self.opts.force_new_run:
            if loaded is None:
                raise CheckpointNotFound(
                    f"run '{self.source}' does not exist, so there is nothing to resume; start it with an "
                    "input (or pass force_new_run=True to start a run whose input is None)"
                )
            raise CheckpointError(
                f"run '{self.source}' has completed; pass an input to start a new run on this ID "
                "(or force_new_run=True to start one with input None)"
            )

    async def _load_source(self) -> Loaded | None:
        if self.source == self.target:
            loaded = await self.cp.load(self.opts.version)
        else:
            reader = Checkpointer(store=self.graph.store, serializer=self.cp.serializer,
                                  checkpoint_id=self.source, graph_structure=self.graph.structure,
                                  state_schema=self.graph.state_schema)
            loaded = await reader.load(self.opts.version)
            self.cp.version = None
        if loaded is None and self.opts.version is not None:
            raise CheckpointNotFound(f"run '{self.source}' has no version {self.opts.version}")
        return loaded

    async def _target_head(self, loaded: Loaded | None) -> Any:
        """The newest version of the run written to (None: it holds none yet); a fork may not overwrite a run
        that exists."""
        if self.target == self.source and self.opts.version is None:
            return loaded.meta if loaded else None
        found = await self.graph.store.history(self.target, limit=1)
        newest = found[0] if found else None
        self.cp.version = newest.version if newest is not None else None
        if newest is not None and self.target != self.source and not self.opts.force_new_run:
            raise CheckpointExists(
                f"write_to={self.target!r} already holds a run ({newest.status} at version {newest.version}); "
                "fork to another ID, or pass force_new_run=True to write the fork on top of it"
            )
        return newest

    def _check_expected(self, head: Any) -> None:
        expected = self.opts.expected_version
        if expected is None or (head is not None and head.version == expected):
            return  # the claim compare-and-sets on head.version: a write since then still loses there
        now = f"it is at version {head.version}" if head is not None else "it does not exist"
        raise CheckpointConflict(f"run '{self.target}' moved on: {now}, and this call was made for version "
                                 f"{expected}; read the run again and decide on what it holds now")

    async def _check_lease(self, head: Any) -> None:
        """A running run is taken only once its lease expired on the store's clock, or with takeover=True —
        and never from an owner this process can see is alive (itself, or a live PID on this host). A run whose
        owner this process can see is dead (a PID gone from this host) may be abandoned (`force_new_run`) at
        once.

        The store's clock is read first, then the lease again: a renewal that lands after the clock was read
        shows in the lease read after it, and one that comes later still is refused by the store (the lease
        had expired by then), so a live owner is never judged dead."""
        if head.status != "running" or head.lease_expires is None:
            return
        store = self.graph.store
        now = await store_clock(store)
        fresh = await store.history(head.checkpoint_id, limit=1)
        head = fresh[0] if fresh else head
        if head.status != "running" or head.lease_expires is None or head.lease_expires <= now:
            return  # not running, or its lease ran out: anyone may continue it
        held = (f"run '{head.checkpoint_id}' is running (lease held by {head.lease_owner} for another "
                f"{head.lease_expires - now:.1f} s, until {_clock(head.lease_expires)} by the store's clock)")
        state, known = owner_state(head.lease_owner), describe_owner(head.lease_owner)
        if state in (OwnerState.EXECUTING_HERE, OwnerState.ALIVE):
            refused = "takeover is refused while its owner lives; " if self.opts.takeover else ""
            raise CheckpointConflict(f"{held}; {known}: {refused}wait for it to pause or finish")
        if self.opts.takeover:
            self.cp.takeover = True  # the claim's write may take the lease the store still sees live
            return
        if state is OwnerState.DEAD and self.opts.force_new_run:  # its owner cannot write: the caller's asked
            self.cp.takeover = True                                  # to abandon the run, and may now
            return
        if self.opts.force_new_run:
            raise CheckpointConflict(f"{held}; {known}: wait for its lease to run out, or for it to pause or "
                                     "finish, before abandoning it (force_new_run)")
        if state is OwnerState.DEAD:
            raise CheckpointConflict(f"{held}; {known}: pass takeover=True to continue it now")
        raise CheckpointConflict(f"{held}; wait for it, or pass takeover=True if you know that process is dead")

    def _paused_message(self, loaded: Loaded) -> str:
        meta, pos = loaded.meta, loaded.position
        cid = self.source
        if meta.status == "running":
            expired = f" at {_clock(meta.lease_expires)}" if meta.lease_expires else ""
            state = f"was running when its process stopped (its lease expired{expired})"
        else:
            state = f"is {meta.status}"
        where = f"run '{cid}' {state} at version {meta.version} (step {meta.step})"
        if awaits_answer(pos):
            ids = pending_interrupt_ids(pos, f"runnable:{self.graph.name}")
            how = (f"it waits on interrupt(s) {', '.join(ids)}: resume it with ainvoke(None, checkpoint_id={cid!r}, "
                   f"resume={{{ids[0]!r}: <answer>}})")
        else:
            how = f"continue it with ainvoke(None, checkpoint_id={cid!r})"
        return f"{where}; {how}, or pass force_new_run=True to start over on this ID"

    def _check_graph(self, loaded: Loaded, request: ResumeRequest | None = None) -> None:
        """The graph resuming the run may continue it: the one that wrote it, or a later version whose changes
        cannot change what the run already did (docs/resume.md, "Deploys"); its state still fits the state class;
        every pending call's tool still there (or the call answered with a `Respond`). Otherwise `GraphMismatch`
        naming the run, what changed and how to move it (engine/keep/migrate.py); nothing is written."""
        if loaded.state_changes:
            raise GraphMismatch(state_message(self.source, self.graph.name, loaded.state_changes))
        if loaded.meta.fingerprint != self.cp.fingerprint:
            change = describe_difference(loaded.structure, self.graph.structure)
            if self.opts.migrate is None:
                conflicts = deploy_conflicts(loaded.structure, self.graph.structure, loaded.position)
                if conflicts:
                    raise GraphMismatch(
                        f"run '{self.source}' cannot be continued by this version of graph '{self.graph.name}': "
                        f"{'; '.join(conflicts)} (what changed: {change}); move it to a node of this version with "
                        f"update_state({self.source!r}, {{}}, goto=NODE) (`waypoint runs migrate {self.source} "
                        "--graph MODULE:ATTR --goto NODE`), resume it with the version that wrote it, pass migrate= "
                        "to move its position to this graph's nodes, or start a new run (force_new_run=True)")
            else:
                self._migrate(loaded, change)
        standing = standing_answers(loaded.position, loaded.meta.status, loaded.meta.error)
        given = request.joined(standing) if request is not None else standing
        self._check_pending_calls(loaded.position, given.data if given is not None else {})

    def _migrate(self, loaded: Loaded, change: str) -> None:
        migrated = self.opts.migrate(loaded.position, loaded.structure)
        if migrated is not None:
            loaded.position = migrated
        pos, nodes = loaded.position, self.graph.nodes
        unknown = sorted({*pos.pending, *pos.inbox, *pos.interrupts} - set(nodes) - {START, END})
        if unknown:
            raise GraphMismatch(
                f"run '{self.source}': after migrate=, the position still names node(s) {unknown} that the "
                f"graph does not have ({change})"
            )

    def _check_pending_calls(self, pos: Any, answers: dict[str, Any]) -> None:
        """Each pause of the run is asked of the node it sits in (a tools node: is the call's tool still there, or
        does `answers` — interrupt ID -> data — respond to it on its behalf?)."""
        problems = call_problems(self.graph, pos, answers)
        if problems:
            cid = self.source
            raise GraphMismatch(
                f"run '{cid}' cannot be resumed by this version of graph '{self.graph.name}': "
                f"{'; '.join(problems)}; answer the call on its behalf with update_state({cid!r}, {{}}, "
                f"answer={{CALL_ID: <its result>}}) (`waypoint runs migrate {cid} --graph MODULE:ATTR --answer CALL_ID "
                "JSON`) or resume={INTERRUPT_ID: Respond(<its result>)}, resume it with a version that has it, or "
                "start a new run (force_new_run=True)")

    def _check_resume(self, loaded: Loaded, request: ResumeRequest | None, standing: ResumeRequest | None) -> None:
        pos, address = loaded.position, f"runnable:{self.graph.name}"
        answered = answered_ids(pos, standing, address)
        pending = pending_interrupt_ids(pos, address, answered)
        if request is not None and request.ids:
            already = sorted(request.ids & answered)
            if already:
                raise UnknownInterrupt(
                    f"run '{self.source}': interrupt {', '.join(already)} was already answered by the resume that "
                    f"claimed version {loaded.meta.version}, and that answer stands; "
                    f"pending: {', '.join(pending) or 'none'}"
                )
            unknown = sorted(request.ids - set(pending))
            if unknown:
                raise UnknownInterrupt(
                    f"run '{self.source}': no pending interrupt has ID {', '.join(unknown)} (an answer to a pause "
                    f"that is over, or to another run); pending: {', '.join(pending) or 'none'}"
                )
        stopped_midway = loaded.meta.status != "interrupted" or loaded.meta.error == "cancelled"
        if request is None and awaits_answer(pos) and not stopped_midway:  # a clean pause needs an answer
            raise UnknownInterrupt(
                f"run '{self.source}' is paused on interrupts {', '.join(pending)}; say which to resume: "
                "resume={id: data}, resume=[ids] or resume=True"
            )

    async def _check_deadlines(self, pos: Any, request: ResumeRequest | None, status: str,
                               branch: bool) -> tuple[ResumeRequest | None, bool]:
        """A pause whose deadline has passed on the store's clock takes only the answer its deadline gives
        (docs/resume.md, "Deadlines"); an `Expired` only a pause that is due, as what the pause said happens then.
        A resume of a failed run gives its due pauses their deadline's answer; a branch's pauses wait without a
        deadline. Otherwise `PauseExpired`, and nothing is written. The claim that follows is refused by the
        store if a deadline of a pause it answers passes before it commits (`Checkpointer.answer_by`). Returns the
        request and whether a pause takes its deadline's answer."""
        timed = {r.id: r for r in paused_records(pos) if r.deadline is not None}
        if branch:  # a fork or time travel is a person's deliberate act: what it re-opens waits for them
            for record in timed.values():
                record.deadline, record.has_on_deadline, record.on_deadline = None, False, None
            timed = {}
        given = {i: d for i, d in (request.data if request is not None else {}).items() if d is not None}
        expiring = {i for i, d in given.items() if isinstance(d, Expired)}
        untimed = sorted(expiring - timed.keys())
        if untimed:
            raise PauseExpired(f"run '{self.source}': interrupt {', '.join(untimed)} has no deadline, so it cannot be "
                               "answered with Expired; answer it as it asks")
        if not timed:
            return request, False
        now = await store_clock(self.graph.store)
        answered_at = now if self.opts.answered_at is None else min(now, self.opts.answered_at)
        data = dict(request.data) if request is not None else {}
        targeted = (lambda i: request.everything or i in request.ids) if request is not None else (lambda i: False)
        answer_by, expired = None, False
        for iid, record in sorted(timed.items()):
            due, deadline_answer = record.deadline <= now, record.on_deadline if record.has_on_deadline \
                else Expired(record.deadline)
            if iid in expiring:
                if not due:
                    raise PauseExpired(
                        f"run '{self.source}': interrupt {iid} is not due until {utc(record.deadline)} (by the "
                        f"store's clock, {record.deadline - now:.1f} s from now); it expires then, not before")
                data[iid], expired = deadline_answer, True
            elif iid in given:
                if record.deadline <= answered_at:
                    raise PauseExpired(self._late(iid, record.deadline, now, status))
                answer_by = record.deadline if answer_by is None else min(answer_by, record.deadline)
            elif due and (status == "failed" or targeted(iid)):  # nobody answers it now: its deadline does
                data[iid], expired = deadline_answer, True
        if self.opts.answered_at is None:
            self.cp.answer_by = answer_by
        if request is None and not data:
            return None, False
        base = request or ResumeRequest()
        return replace(base, data=data, ids=base.ids | frozenset(data)), expired

    def _late(self, iid: str, deadline: float, now: float, status: str) -> str:
        how = ("resume the run without answering it (that retries its failed step), and it takes its deadline's "
               "answer" if status == "failed" else "it takes the answer its deadline gives, which whoever recovers "
               "runs (waypoint serve, waypoint worker, recover(...)) gives it within its interval")
        return (f"run '{self.source}': interrupt {iid} expired at {utc(deadline)} (by the store's clock, "
                f"{now - deadline:.1f} s ago) without an answer, so this answer was not taken and nothing was "
                f"written; {how}")

    # --- running and saving ------------------------------------------------------------------------


def _count_takeover(pos: Any, loaded_version: int, claim_version: int) -> None:
    """The run is continued from a `running` version (its process stopped): one more takeover in a row if
    nothing was written since the last takeover's claim, else the first (rule 11)."""
    pos.takeovers = pos.takeovers + 1 if pos.taken_at == loaded_version else 1
    pos.taken_at = claim_version


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def start_state(graph: GraphShape, opts: Any) -> Any:
    """The state a new run starts from: `opts.start_state` once checked against the graph, or None (the factory's)."""
    state = opts.start_state
    if state is None:
        return None
    factory = graph.state_factory
    if factory is None:
        raise GraphRunError(f"graph '{graph.name}' has no run-local state: start_state= is only for a graph with one")
    fresh = factory()
    if type(state) is not type(fresh):
        raise GraphRunError(f"graph '{graph.name}': start_state= is a {type(state).__name__}, but its state is a "
                            f"{type(fresh).__name__}; pass one of those")
    return state

