"""Moving a stored run onto a later version of its graph, which would refuse to resume it (docs/resume.md,
"Deploys"): the pieces `update_state` puts together when the version editing a run is not the one that wrote it.

- `goto="n"`: the node the run is at that this version no longer has (or has as another kind) is replaced by
  node n of this version: n gets its pending input and inbox, the pause there is over, and n runs at the resume.
- `answer={call: output}`: a pending tool call whose tool this version removed is answered on its behalf, as a
  resume's `Respond(output)`: stored with the version as the answers of a claim whose process let go, so the
  next resume (any process, automatic recovery too) continues with it — the tool never runs, the call is
  recorded as responded, the model reads `output`.
- a changed state (`StateChange`): each field whose type changed, or that was added without a default, takes
  the value `values` gives it (checked against its new type); a field that is gone is dropped.

What is written must be a run this version can continue: after the moves, the same checks a resume makes (the
nodes it is at, the pending calls' tools, the state) must pass, or `GraphMismatch` says what is left, and nothing
is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..errors import GraphMismatch, UnknownInterrupt, WaypointError
from ..run import InterruptRecord, ResumeRequest, RunPosition, paused_records, segment_of, standing_answers
from ..shape import END, START, GraphShape, StateChange, validate_field
from .content import deploy_conflicts
from .reading import Loaded

__all__ = ["state_fitter", "move_run", "call_problems", "state_message", "pending_calls", "standing_data"]

CLI = "waypoint runs migrate {cid} --graph MODULE:ATTR"


def state_message(cid: str, graph: str, changes: list[StateChange]) -> str:
    """`GraphMismatch`'s text for a run whose state this version's state class no longer fits."""
    given = [c.field for c in changes if c.kind != "removed"]
    fix = ", ".join(f"{c.field!r}: <a {c.new}>" for c in changes if c.kind != "removed")
    how = (f"give {'each such field' if len(given) > 1 else 'it'} a value of its new type with "
           f"update_state({cid!r}, {{{fix}}}) (`{CLI.format(cid=cid)} --values JSON`)" if given else
           f"drop it with update_state({cid!r}, {{}}) (`{CLI.format(cid=cid)}`)")
    gone = "; a field that is gone is dropped" if given and len(given) < len(changes) else ""
    return (f"run '{cid}' cannot be continued by this version of graph '{graph}': "
            f"{'; '.join(map(str, changes))}; {how}{gone}, resume it with the version that wrote it, or start a "
            "new run (force_new_run=True)")


def state_fitter(graph: GraphShape, cid: str, values: Mapping[str, Any], notes: list[str],
                 fixed: set[str]) -> Callable[..., Any]:
    """`fit(changes, fields)` for `Checkpointer.fit_state`: the stored fields with each changed field given its
    value from `values` (checked against its new type) and each gone field dropped; what it did goes to `notes`,
    the fields it set to `fixed`.
    A changed field `values` does not give is `GraphMismatch`; a value of the wrong type a `WaypointError`."""

    def fit(changes: list[StateChange], fields: dict[str, Any]) -> dict[str, Any]:
        missing = [c for c in changes if c.kind != "removed" and c.field not in values]
        if missing:
            raise GraphMismatch(state_message(cid, graph.name, missing))
        fields = dict(fields)
        for change in changes:
            if change.kind == "removed":
                fields.pop(change.field, None)
                notes.append(f"drop {change.field}")
                continue
            try:
                fields[change.field] = validate_field(graph.state_factory, change.field, values[change.field])
                fixed.add(change.field)
            except ValueError as err:
                raise WaypointError(f"run '{cid}': the value given for state field '{change.field}' does not fit "
                                    f"its new type ({err}); nothing was written") from None
            notes.append(f"state {change.field} ({change.old or '?'} -> {change.new})"
                         if change.kind == "type" else f"state {change.field} (new)")
        return fields

    return fit


# --- pending calls -------------------------------------------------------------------------------------

def pending_calls(graph: GraphShape, pos: RunPosition) -> Iterator[tuple[InterruptRecord, str, str, Any]]:
    """`(record, node, address below the node, node's source)` for each pause in this graph's own nodes (a tools
    node's calls among them; not runs nested in them)."""
    prefix = f"runnable:{graph.name};node:"
    records = list(pos.interrupts.values())
    while records:
        record = records.pop()
        records.extend(record.subs)
        if not record.address.startswith(prefix):
            continue
        key, _, below = record.address[len(prefix):].partition(";")
        runnable = getattr(graph.nodes.get(key), "runnable", None)
        yield record, key, below, getattr(runnable, "source", None)


def call_problems(graph: GraphShape, pos: RunPosition, answers: Mapping[str, Any]) -> list[str]:
    """Why this version cannot continue the run's pending calls (a tools node's `resume_problem`: its tool is gone),
    each once, sorted; a call `answers` (interrupt ID -> resume data) responds to on its behalf has none."""
    problems: list[str] = []
    prefix = f"runnable:{graph.name};node:{{}};"
    for record, key, below, source in pending_calls(graph, pos):
        ask = getattr(source, "resume_problem", None)
        if ask is None or not below:
            continue
        asked = [(record, below)]
        if record.child is not None:  # a run nested in the call (an agent as a tool): its pauses, by full address
            start = prefix.format(key)
            asked = [(r, r.address[len(start):]) for r in paused_records(record.child) if r.address.startswith(start)]
        for paused, under in asked:
            problem = ask(under, answers.get(paused.id))
            if problem is not None and f"node '{key}': {problem}" not in problems:
                problems.append(f"node '{key}': {problem}")
    return sorted(problems)


# --- moving the position ---------------------------------------------------------------------------------

def move_run(graph: GraphShape, loaded: Loaded, cid: str, *, goto: str | None, answer: Mapping[str, Any] | None,
             notes: list[str]) -> bool:
    """Move the loaded run onto `graph` (module docstring); what it did goes to `notes`. Returns whether answers were
    given (the version is then written as a claim that let go). Raises `GraphMismatch` when this version still
    could not continue it, `WaypointError` for a request that does not fit the run; nothing is written either way."""
    pos = loaded.position
    if goto is not None:
        notes.append(_goto(graph, loaded, goto, cid))
    answered = bool(answer)
    if answer:
        notes.extend(_answer(graph, loaded, dict(answer), cid))
    if loaded.meta.fingerprint != _fingerprint(graph):
        conflicts = deploy_conflicts(loaded.structure, graph.structure, pos)
        if conflicts:
            hint = (" (goto= moves only the node the run is at, in a graph with trigger='any')"
                    if goto is not None else f"; name the node of this version it goes on at: goto=NODE "
                    f"(`{CLI.format(cid=cid)} --goto NODE`)")
            raise GraphMismatch(f"run '{cid}' cannot be moved onto this version of graph '{graph.name}': "
                                f"{'; '.join(conflicts)}{hint}; nothing was written")
    answers = ResumeRequest.from_plain(pos.answers).data if answered else standing_data(loaded)  # type: ignore[union-attr]
    problems = call_problems(graph, pos, answers)
    if problems:
        raise GraphMismatch(
            f"run '{cid}' cannot be moved onto this version of graph '{graph.name}': {'; '.join(problems)}; answer "
            f"each such call on its behalf: answer={{CALL_ID: <its result>}} (`{CLI.format(cid=cid)} --answer "
            "CALL_ID JSON`); nothing was written")
    return answered


def _fingerprint(graph: GraphShape) -> str:
    from .checkpoint import fingerprint

    return fingerprint(graph.structure)


def standing_data(loaded: Loaded) -> dict[str, Any]:
    """The answers a claim stored in the loaded version that still stand (interrupt ID -> data)."""
    meta = loaded.meta
    standing = standing_answers(loaded.position, meta.status, meta.error)
    return dict(standing.data) if standing is not None else {}


def _goto(graph: GraphShape, loaded: Loaded, goto: str, cid: str) -> str:
    """Put node `goto` where the run is at a node this version does not have; the note for the origin."""
    pos, name = loaded.position, graph.name
    if graph.trigger == "all" or graph.plan is not None:
        raise WaypointError(f"run '{cid}': goto= moves a run of a graph with trigger='any' (an agent's, say); graph "
                            f"'{name}' is a DAG or a workflow, which resumes only under the structure that wrote it")
    if goto not in graph.nodes:
        raise WaypointError(f"run '{cid}': goto={goto!r} is not a node of this version of graph '{name}' (nodes: "
                            f"{', '.join(graph.nodes)}); nothing was written")
    old_nodes = loaded.structure.get("nodes") if isinstance(loaded.structure.get("nodes"), dict) else {}
    at = sorted({*pos.pending, *pos.inbox, *pos.interrupts} - {START, END})
    moved = [k for k in at if k not in graph.nodes
             or isinstance(old_nodes.get(k), dict) != (graph.nodes[k].subgraph is not None)]
    if not moved:
        raise WaypointError(f"run '{cid}': every node it is at ({', '.join(at) or 'none'}) is in this version of graph "
                            f"'{name}', so goto= has nothing to replace; resume it, or use as_node= to stand in for "
                            "one of them; nothing was written")
    if len(moved) > 1:
        raise WaypointError(f"run '{cid}' is at {len(moved)} nodes this version does not have ({', '.join(moved)}); "
                            "goto= replaces one: resume it with the version that wrote it, or start a new run")
    old = moved[0]
    if goto in pos.pending or goto in pos.interrupts:
        raise WaypointError(f"run '{cid}': node '{goto}' is pending already, so it cannot also take the place of "
                            f"'{old}'; name another node; nothing was written")
    _check_nothing_ran(pos, old, goto, cid)
    if old in pos.pending:
        pos.pending[goto] = pos.pending.pop(old)
    pos.interrupts.pop(old, None)
    if old in pos.inbox:
        box, into = pos.inbox.pop(old), pos.inbox.setdefault(goto, {})
        if set(box) & set(into):
            raise WaypointError(f"run '{cid}': node '{goto}' already holds input from {sorted(set(box) & set(into))} "
                                f"for its next step, and so does '{old}'; name another node; nothing was written")
        into.update(box)
    for kept in (pos.paused_before, pos.released):
        if old in kept:
            kept.remove(old)
    pos.static_ids.pop(f"before:{old}", None)
    address = f"runnable:{name};node:{old}"
    pos.nested = {a: v for a, v in pos.nested.items() if a != address and not a.startswith(address + ";")}
    return f"goto {goto} (from {old})"


def _check_nothing_ran(pos: Any, old: str, goto: str, cid: str) -> None:
    """goto= starts `goto` afresh: refused when `old` paused part-way through a step that already did something
    (a tools node's finished calls, kept with its pause), which `goto` would do again."""
    record = pos.interrupts.get(old)
    state = record.state if record is not None and isinstance(record.state, dict) else {}
    done = state.get("done") if isinstance(state.get("done"), dict) else {}
    if done or (record is not None and record.child is not None):
        what = f"{len(done)} of its calls already ran" if done else "a run nested in it is under way"
        raise WaypointError(
            f"run '{cid}': node '{old}' paused part-way through its step ({what}), and node '{goto}' would start that "
            f"step afresh and do it again; resume the run with the version that wrote it until that step is over "
            "(answer its pending calls there), then move it; nothing was written")


def _answer(graph: GraphShape, loaded: Loaded, answer: dict[str, Any], cid: str) -> list[str]:
    """Answer pending calls whose tool this version removed, on their behalf (stored as the claim's answers)."""
    pos = loaded.position
    calls = []
    for record, key, below, source in pending_calls(graph, pos):
        tool = segment_of(record.address, "tool")
        if tool is not None and len(tool) >= 2 and not record.subs:
            calls.append((record, key, below, source, tool[0], tool[1]))
    meta = loaded.meta
    standing = standing_answers(pos, meta.status, meta.error)
    listed = ", ".join(f"{c[5]} (tool {c[4]}, interrupt {c[0].id})" for c in calls) or "none"
    data, notes = {}, []
    for given, output in answer.items():
        found = [c for c in calls if c[0].id == given] or [c for c in calls if c[5] == given]
        if not found:
            raise WaypointError(f"run '{cid}' has no pending tool call {given!r} (pending calls: {listed}); name a "
                                "call ID or interrupt ID from `waypoint runs show`; nothing was written")
        if len(found) > 1:
            raise WaypointError(f"run '{cid}' has {len(found)} pending calls with ID {given!r} (a model repeated it); "
                                f"name one by its interrupt ID ({', '.join(c[0].id for c in found)})")
        record, key, below, source, tool, call_id = found[0]
        if standing is not None and record.id in standing.data:
            raise UnknownInterrupt(f"run '{cid}': call {call_id!r} was already answered by version {meta.version} "
                                   "(the claim or migration that wrote it), and that answer stands; resume the run")
        respond = getattr(source, "answer_removed", None)
        try:
            if respond is None:
                raise ValueError(f"node '{key}' is not a tools node")
            data[record.id] = respond(below, output)
        except ValueError as err:
            raise WaypointError(f"run '{cid}': call {call_id!r} cannot be answered on its behalf: {err}; answer it by "
                                f"resuming the run (resume={{{record.id!r}: Respond(...)}}, `waypoint runs resume {cid} "
                                f"--respond {record.id} JSON`); nothing was written") from None
        notes.append(f"answer {call_id} ({tool})")
    request = ResumeRequest(data=data, ids=frozenset(data)).joined(standing)
    pos.answers = request.to_plain()
    return notes
