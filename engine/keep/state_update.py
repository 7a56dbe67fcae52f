"""`update_state`: edit a stored run's state, written as a new version — the time-travel pair to `version=`
(go back) and `write_to=` (branch off). The rules (docs/resume.md, "Editing a run's state"):

1. The edit is the run's next version, written by compare-and-set on the newest version it read: a writer in
   between (a resume, another edit) makes it `CheckpointConflict`, and nothing is written. Its `origin` says
   what was edited: `"<id>@<version> update_state"` (`" as <node>"` with `as_node`).
2. A run running under a live lease is refused (`CheckpointConflict` naming the owner and the expiry): the
   run's newest version's lease, whichever version is edited, judged on the store's clock — by the store
   itself, in the edit's own transaction (engine/keep/store.py, guarantee 11), so an editor whose clock is off
   never edits a live run. A run whose process died (its lease expired) may have its state edited: it stays
   `running`, under its owner's name with a lease that has run out, so resuming it takes it over as before.
   An edit of an older `running` version (a branch) is `running` under no lease: no process executes it,
   and a plain resume continues it.
3. `values` go into the state through the fields' reducers, as a node's `Update` would write them.
4. `as_node=None`: only the state changes. Pending tasks, pauses and their interrupt IDs stay as they were,
   so a resume answers the same IDs and its nodes see the edited state.
5. `as_node="n"`: the edit is node n's result. n does not run (a pause of n is over); `values` is taken as
   what n returned and sent on as that return value would be (`Run.stand_in`: n's `post` handler, its
   `output_key`, its edges and branches); `values.output` is None when `values` is a mapping. n must be
   pending (paused, or waiting to run) — or, in a Pregel graph, nothing may be pending (a completed run
   continues after n). The version is `completed` if that reaches END, else `interrupted`: continue it with
   `ainvoke(None, checkpoint_id=...)`.
6. `version=N` edits an older version; the edit is written on top of the newest, as a branch with its own
   tool-ledger page and idempotency keys (like a resume with `version=`), and every pause of version N it
   re-opens gets a new ID (`reissue_ids`): an answer replayed to the old ID is `UnknownInterrupt`.
7. An edit by another version of the graph than the one that wrote the newest version is a **migration**
   (engine/keep/migrate.py): `goto=` puts a node of this version where the run is at a node it no longer has,
   `answer=` answers a pending call whose tool it removed, and `values` gives each state field that changed type
   (or was added without a default) its value; a field that is gone is dropped. What is written must be a run
   this version can continue (the checks of a resume pass), else `GraphMismatch` says what is left. The origin is
   `"<id>@<version> migrate <what was done>"`; with `answer=` the version is a claim that let go (`running`, its
   lease run out, the answers stored), which the next resume — or automatic recovery — continues.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

from ..errors import CheckpointConflict, CheckpointNotFound, GraphMismatch, WaypointError, describe
from ..events import Emitter
from ..run import Run, reissue_ids
from ..shape import START, GraphShape, Update, apply_writes
from .checkpoint import Checkpointer
from .content import describe_difference, join_state, split_state
from .migrate import call_problems, move_run, standing_data, state_fitter
from .owners import describe_owner
from .store import CheckpointMeta, store_clock

__all__ = ["update_state"]


async def update_state(graph: GraphShape, checkpoint_id: str, values: Any, as_node: str | None = None, *,
                       version: int | None = None, expected_version: int | None = None, goto: str | None = None,
                       answer: Mapping[str, Any] | None = None, dry_run: bool = False) -> CheckpointMeta:
    """Write `values` into the stored run's state as its next version (rules in the module docstring). With
    `dry_run=True` nothing is written: the version that would be is returned (its origin says what it does)."""
    if graph.store is None:
        raise WaypointError(f"graph '{graph.name}': update_state() needs a graph compiled with a store")
    update = values if isinstance(values, Update) else Update(values)
    if as_node is None and update.output is not None:
        raise WaypointError(f"graph '{graph.name}': update_state() got Update(output=...) without as_node; the "
                            "output is what node as_node sends on, so name the node")
    if (goto is not None or answer) and (as_node is not None or version is not None):
        raise WaypointError(f"run '{checkpoint_id}': goto= and answer= move the run's newest version onto this "
                            "graph; they do not go with as_node= or version=")
    notes: list[str] = []
    fixed: set[str] = set()
    cp = Checkpointer(store=graph.store, serializer=graph.get_serializer(), checkpoint_id=checkpoint_id,
                      graph_structure=graph.structure, lease_seconds=graph.lease_seconds,
                      state_schema=graph.state_schema,
                      fit_state=state_fitter(graph, checkpoint_id, update.values, notes, fixed))
    head = await _head(graph, checkpoint_id, expected_version)
    loaded = await cp.load(version)
    if loaded is None:
        raise CheckpointNotFound(f"run '{checkpoint_id}' has no version {version}")
    cp.version = head.version  # the compare-and-set is on the newest version, whichever one is edited
    migrating = (loaded.meta.fingerprint != cp.fingerprint or bool(notes) or goto is not None or bool(answer)
                 or bool(call_problems(graph, loaded.position, standing_data(loaded))))  # a deploy removed a tool
    if migrating and version is not None and version != head.version:
        raise GraphMismatch(f"run '{checkpoint_id}' version {version} was written by a different graph: "
                            f"{describe_difference(loaded.structure, graph.structure)}; a migration moves the "
                            "newest version onto this graph (leave out version=)")
    answered = migrating and move_run(graph, loaded, checkpoint_id, goto=goto, answer=answer, notes=notes)
    pos, meta = loaded.position, loaded.meta
    branch = version is not None and version != head.version
    if branch:  # a branch from an older version: keys of its own, and the pauses it re-opens new IDs
        pos.lineage, pos.ledger, pos.answers = os.urandom(8).hex(), head.version + 1, None
        reissue_ids(pos)
    status, error = meta.status, meta.error
    lease = None
    if status == "running":  # nobody executes the edited version: a crashed run's lease run out, a branch none
        lease = (None, None) if branch else (meta.lease_owner, 0.0)
    writes = {k: v for k, v in update.values.items() if k not in fixed}  # a changed field took its value whole
    if as_node is None:
        apply_writes(pos.state, [("update_state", writes)], graph.reducers, None, graph.name)
    else:
        if status == "running":
            raise WaypointError(f"run '{checkpoint_id}' was running when its process stopped; resume it (or edit "
                                "its state without as_node) before naming a node with as_node")
        update = Update(writes, output=update.output) if fixed else update
        status, error = await _as_node(graph, pos, as_node, update, checkpoint_id), None
    if answered:  # a claim with these answers that let go: the next resume continues with them
        status, error, lease = "running", None, (meta.lease_owner if meta.status == "running" else cp.owner, 0.0)
    _check_readable(cp, pos, checkpoint_id)
    what = ("migrate" + (" " + "; ".join(notes) if notes else "")) if migrating else "update_state"
    cp.origin = f"{checkpoint_id}@{meta.version} {what}" + (f" as {as_node}" if as_node else "")
    if dry_run:
        return dataclasses.replace(head, version=head.version + 1, status=status, step=pos.step, error=error,
                                   fingerprint=cp.fingerprint, origin=cp.origin)
    return await cp.save(pos, status, error=error, lease=lease)


def _check_readable(cp: Checkpointer, pos: Any, checkpoint_id: str) -> None:
    """The edited state reads back as the state class (a value of the wrong type for a field is refused here,
    not found by the next load of the run): `WaypointError`, nothing written."""
    kind, fields = split_state(pos.state, cp.serializer)
    try:
        codec = cp.serializer
        join_state(kind, {k: codec.decode_value(codec.encode_value(v, root=k)) for k, v in fields.items()}, codec)
    except WaypointError:
        raise
    except Exception as err:  # noqa: BLE001 - what the state class says of the values, in the message
        raise WaypointError(f"run '{checkpoint_id}': the edited state does not fit its class ({describe(err)}); give "
                            "each field a value of its type. Nothing was written") from None


async def _head(graph: GraphShape, checkpoint_id: str, expected_version: int | None) -> CheckpointMeta:
    """The run's newest version, checked: it exists, is what the caller saw, and no process holds it."""
    found = await graph.store.history(checkpoint_id, limit=1)
    if not found:
        raise CheckpointNotFound(f"run '{checkpoint_id}' does not exist, so there is no state to edit")
    head = found[0]
    if expected_version is not None and head.version != expected_version:
        raise CheckpointConflict(f"run '{checkpoint_id}' moved on: it is at version {head.version}, and this edit "
                                 f"was made for version {expected_version}; read the run again and decide on what "
                                 "it holds now")
    if head.status == "running" and head.lease_expires is not None:  # the store refuses it too, in the edit
        left = head.lease_expires - await store_clock(graph.store)
        if left > 0:
            known = describe_owner(head.lease_owner)
            until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(head.lease_expires))
            raise CheckpointConflict(
                f"run '{checkpoint_id}' is running (lease held by {head.lease_owner} until {until}, another "
                f"{left:.1f} s by the store's clock{'; ' + known if known else ''}); edit its state once it has "
                "paused or finished")
    return head


async def _as_node(graph: GraphShape, pos: Any, key: str, update: Update, checkpoint_id: str) -> str:
    """Make the edit node `key`'s result: its writes, its output routed on. Returns the version's status."""
    if key not in graph.nodes:
        raise WaypointError(f"graph '{graph.name}': as_node='{key}' is not a node of the graph "
                            f"(nodes: {', '.join(graph.nodes)})")
    pending = [k for k in pos.pending if k != START]
    if key not in pos.pending and (pending or graph.trigger == "all" or START in pos.pending):
        where = f"pending: {', '.join(pending)}" if pending else "a DAG continues only from a pending node"
        raise WaypointError(f"run '{checkpoint_id}': as_node='{key}' is not pending ({where}); name a pending "
                            "node, or edit the state only (as_node=None)")
    run = Run(graph, emitter=Emitter())
    run.pos = pos
    done = await run.stand_in(key, update)  # as if the node had returned the Update: post, output_key, branches
    run._write([done])
    if key in pos.paused_before:  # a static pause before it is over too
        pos.paused_before.remove(key)
        pos.static_ids.pop(f"before:{key}", None)
    pos.done, pos.output = False, None
    run._apply(done)
    if graph.trigger == "all":
        pos.step += 1
    elif not pos.pending:  # the superstep is over: its outputs become the next one's tasks (or END)
        pos.step += 1
        run._advance()
    return "completed" if pos.done else "interrupted"
