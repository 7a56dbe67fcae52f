"""`waypoint runs resume`: continue a stored run in this process, with answers for what it waits on.

What each answer becomes (docs/cli.md):

| option                    | a run of an agent (`ChatModelAgent`)        | a run of a plain graph             |
|---------------------------|---------------------------------------------|------------------------------------|
| `--approve IID`           | `ApprovalResult(approved=True)`             | `{"approved": True}`               |
| `--reject IID --reason R` | `ApprovalResult(approved=False, reason=R)`  | `{"approved": False, "reason": R}` |
| `--respond IID JSON`      | `Respond(<the JSON>)`: the tool does not run | the parsed JSON                    |
| none                      | continue (a crash, a failure, a static pause); refused while an interrupt waits for an answer |

The graph comes from `--graph module:attr` (a `ChatModelAgent`, a `Graph`, a `CompiledGraph`, or a
zero-argument callable returning one) or, for an agent, from the command that defines the agent the run
was written by (`find_agent`). Everything the engine would refuse (unknown interrupt ID, a completed run,
a live lease, another graph) is checked first, so it is refused as one line before anything runs.

A chapter session's tools (chapters 4–10) are confined to the project root stored with the run, whatever
this process's working directory: the agent is built confined to it, and the resumed run stores it again
(`RecordRoot`, cmd/fstools.py). A root the run cannot name (stored before runs kept it, or no longer a
directory) is refused until `--project-root DIR` names it; `--graph`, whose agent waypoint cannot confine,
is refused for a run that stores a root.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from waypoint.engine import CompiledGraph, Graph, GraphInterrupted, WaypointError
from waypoint.engine.errors import clip, describe
from waypoint.engine.codec.loading import load_object
from waypoint.engine.keep.owners import OwnerState, describe_owner, owner_state

from .. import agents as _agents
from ..console import Console, print_events, visible
from ..fstools import ProjectRoot, RecordRoot, run_root
from .read import RunsError, StoredRun, opened_store, read_run, read_version
from .render import as_json, clock, lease_alive, pending_json, plain, run_json

__all__ = ["resume_command", "parse_answers", "load_target", "build_app"]


def parse_answers(args: Any) -> dict[str, tuple[str, Any]]:
    """`{interrupt_id: (verb, value)}` from `--approve`, `--reject`/`--reason` and `--respond`."""
    answers: dict[str, tuple[str, Any]] = {}

    def add(iid: str, verb: str, value: Any) -> None:
        if iid in answers:
            raise RunsError(f"interrupt {iid} is answered twice; give one answer per interrupt ID")
        answers[iid] = (verb, value)

    for iid in args.approve or ():
        add(iid, "approve", None)
    for iid in args.reject or ():
        add(iid, "reject", args.reason)
    for iid, text in args.respond or ():
        try:
            value = json.loads(text)
        except ValueError:
            raise RunsError(f"--respond {iid}: {clip(text, 80)!r} is not JSON; quote text as a JSON string, "
                            "e.g. --respond ID '\"done\"'") from None
        add(iid, "respond", value)
    if args.reason is not None and not args.reject:
        raise RunsError("--reason goes with --reject IID")
    return answers


def _targets(answers: dict[str, tuple[str, Any]], agent: bool, run: StoredRun) -> dict[str, Any]:
    """The resume data; an approval names the digest of the call this command read (and checked)."""
    from waypoint.engine import Respond
    from waypoint.middleware import ApprovalResult

    shown = {p.id: p.digest for p in run.pending}
    out: dict[str, Any] = {}
    for iid, (verb, value) in answers.items():
        if verb == "respond":
            out[iid] = Respond(value) if agent else value
        elif agent:
            out[iid] = ApprovalResult(approved=verb == "approve", reason=value,
                                      digest=shown.get(iid))
        elif verb == "approve":
            out[iid] = {"approved": True}
        else:
            out[iid] = {"approved": False, "reason": value} if value else {"approved": False}
    return out


def load_target(spec: str) -> Any:
    """The agent or graph `module:attr` names (a zero-argument callable is called)."""
    from waypoint.engine import ChatModelAgent

    return load_object(spec, option="--graph", kinds=(ChatModelAgent, Graph, CompiledGraph), error=RunsError)


def _find_agent(run: StoredRun, given: Path | None) -> tuple[Any, ProjectRoot | None]:
    """The agent a waypoint command defines under the run's graph name, and the project root its tools are
    confined to (None: they are not); refuses a plain graph's run, and a root that cannot be known."""
    from waypoint.engine import ChatModelAgent

    cid = run.meta.checkpoint_id
    if not run.is_agent:
        raise RunsError(f"run {cid!r} was written by graph {run.graph!r}, not by an agent: pass --graph "
                        "module:attr naming that graph (a Graph, a CompiledGraph, or a function returning one)")
    try:
        confined = _agents.confines_tools(run.graph)
    except Exception as err:
        raise RunsError(f"looking for agent {run.graph!r} among the waypoint commands failed: {describe(err)}; "
                        "pass --graph module:attr naming it") from None
    root = run_root(f"run {cid!r}", run.trace, given=given, error=RunsError) if confined else None
    if root is None and given is not None:
        raise RunsError(f"run {cid!r} was written by agent {run.graph!r}, whose tools are not confined to a project "
                        "root: leave out --project-root (it is for the sessions of chapters 4-10)")
    try:
        agent = _agents.find_agent(run.graph) if root is None else _agents.find_agent(run.graph, root=root)
    except Exception as err:
        raise RunsError(f"looking for agent {run.graph!r} among the waypoint commands failed: {describe(err)}; "
                        "pass --graph module:attr naming it") from None
    if not isinstance(agent, ChatModelAgent):
        raise RunsError(f"run {cid!r} was written by agent {run.graph!r}, which no waypoint command defines; "
                        "pass --graph module:attr naming that ChatModelAgent (or a function returning one)")
    return agent, root


def _check_target(run: StoredRun, args: Any) -> None:
    """`--graph` builds tools waypoint cannot confine: refused for a run whose tools are confined to a root."""
    cid = run.meta.checkpoint_id
    if args.project_root is not None:
        raise RunsError(f"--project-root is for a chapter session resumed without --graph (run {cid!r}): leave "
                        "out one of them")
    if run.project_root is not None:
        raise RunsError(f"the tools of run {cid!r} are confined to the project root {run.project_root}, and the agent "
                        "--graph builds is not confined by waypoint: leave out --graph (the agent of the waypoint "
                        f"command that wrote it, {run.graph!r}, is confined to that root)")


def build_app(target: Any, store: Any, *, root: ProjectRoot | None = None) -> tuple[Any, Any]:
    """`(runner or None, compiled graph)` for `target`, writing to `store`; with `root`, every version the run
    writes stores the project root its tools are confined to."""
    from waypoint.engine import ChatModelAgent, Runner

    if isinstance(target, ChatModelAgent):
        runner = Runner(target, store=store, streaming=True, callbacks=[RecordRoot(root)] if root else ())
        return runner, runner.app
    if isinstance(target, Graph):
        return None, target.compile(store=store)
    return None, target.with_store(store)  # the same graph and codec, writing to this database


def _check(run: StoredRun, answers: dict[str, tuple[str, Any]], takeover: bool, hint: str) -> bool:
    """Refuse, before anything runs, what the engine would refuse; whether the resume takes the run over."""
    meta, cid = run.meta, run.meta.checkpoint_id
    if meta.status == "completed":
        raise RunsError(f"run {cid!r} has completed (version {meta.version}); there is nothing to resume "
                        f"(`{hint} show {cid}` shows its output)")
    live = meta.status == "running" and lease_alive(meta, run.now)
    if live:
        takeover = _may_take_over(run, takeover)
    _check_answers(run, answers, hint)
    return live and takeover


def _may_take_over(run: StoredRun, takeover: bool) -> bool:
    """A run under a live lease: taken over when its owner is a process of this host that is gone (known, not
    guessed: engine/keep/owners.py) or when `--takeover` vouches for an owner on another host; refused in one line
    while its owner is alive."""
    meta, cid = run.meta, run.meta.checkpoint_id
    state = owner_state(meta.lease_owner)
    held = f"lease held by {clip(str(meta.lease_owner))} until {clock(meta.lease_expires)}"
    if state is OwnerState.DEAD:
        return True
    if state is not OwnerState.UNKNOWN:
        refused = "; --takeover takes over only a process that is gone" if takeover else ""
        raise RunsError(f"run {cid!r} is running ({held}; {describe_owner(meta.lease_owner)}): wait for it to "
                        f"pause or finish{refused}")
    if not takeover:
        raise RunsError(f"run {cid!r} is running in a process on another host ({held}); wait for it, or pass "
                        "--takeover if you know that process is dead")
    return True


def _check_answers(run: StoredRun, answers: dict[str, tuple[str, Any]], hint: str) -> None:
    cid = run.meta.checkpoint_id
    pending = {p.id: p for p in run.pending}
    listed = ", ".join(f"{p.id} ({p.kind}{' of ' + p.tool if p.tool else ''})" for p in pending.values()) or "none"
    unknown = sorted(set(answers) - set(pending))
    if unknown:
        raise RunsError(f"run {cid!r} has no pending interrupt {', '.join(unknown)}; pending: {listed} "
                        f"(`{hint} show {cid}`)")
    if not answers and run.awaits_answer:
        raise RunsError(f"run {cid!r} waits on interrupt(s) {listed}: answer with --approve IID, "
                        "--reject IID --reason TEXT or --respond IID JSON")


def _check_graph(run: StoredRun, app: Any, what: str) -> None:
    from waypoint.engine.keep.checkpoint import fingerprint
    from waypoint.engine.keep.content import describe_difference

    if fingerprint(app.structure) != run.meta.fingerprint and run.structure.get("name") != app.structure.get("name"):
        # another version of the same graph is for the engine to judge (docs/resume.md, "Deploys"): a change that
        # cannot change what the run did resumes; one that can is refused there, naming what and how to move it
        change = describe_difference(run.structure, app.structure)
        cid = run.meta.checkpoint_id
        raise RunsError(f"run {cid!r} was written by another graph than {what}: {change}; pass --graph naming the "
                        f"graph that wrote it, or move the run onto this one first: `waypoint runs migrate {cid} "
                        "--graph MODULE:ATTR` (with --goto NODE, --answer CALL_ID JSON or --values JSON if it says so)")


async def resume_command(args: Any, console: Console, hint: str) -> int:
    """Resume one run; 0 when it completed or paused again, 1 when it was refused or failed."""
    answers = parse_answers(args)
    cid = args.id
    async with opened_store(args.db) as store:
        target = load_target(args.graph) if args.graph else None
        runner, app = build_app(target, store) if target is not None else (None, None)
        run = await read_run(store, cid, serializer=app.get_serializer() if app is not None else None, hint=hint)
        takeover = _check(run, answers, args.takeover, hint)
        root = None
        if target is None:
            agent, root = _find_agent(run, args.project_root)
            runner, app = build_app(agent, store, root=root)
        else:
            _check_target(run, args)
        _check_graph(run, app, f"--graph {args.graph}" if args.graph else f"agent {run.graph!r} of the waypoint commands")
        out = Console(io.StringIO(), console.err, color=False) if args.json else console
        if not args.json:
            confined = f", project root {root.root}" if root is not None else ""
            over = f", taking it over from {visible(str(run.meta.lease_owner), strict=True)}" if takeover else ""
            out.line(f"resuming run {visible(cid, strict=True)} ({'agent' if runner else 'graph'} "
                     f"{visible(run.graph, strict=True)}{visible(confined, strict=True)}) in this process{over}" +
                     "".join(f"; {verb} {iid}" for iid, (verb, _) in answers.items()), "dim")
        # bound to what was read and checked above: the version (nothing changed since) and the digests
        bound = {"takeover": takeover, "expected_version": run.meta.version}
        if runner is not None:
            error, decisions = await _resume_agent(runner, cid, _targets(answers, True, run), bound, out)
        else:
            error, decisions = await _resume_graph(app, cid, _targets(answers, False, run), bound, out), []
        after = await read_version(store, cid, serializer=app.get_serializer())
    return _report(after, error, decisions, console, args.json, hint, run.meta.version)


async def _resume_agent(runner: Any, cid: str, targets: dict[str, Any], bound: dict[str, Any],
                        out: Console) -> tuple[BaseException | None, list[Any]]:
    events = runner.resume_with_params(cid, targets, **bound) if targets else runner.resume(cid, **bound)
    summary = await print_events(_with_decisions(events, out), out)
    return summary.error, summary.decisions


async def _with_decisions(events: AsyncIterator[Any], out: Console) -> AsyncIterator[Any]:
    """The events, each decision printed where it happens (print_events only collects them)."""
    async for event in events:
        decision = event.action.decision if event.action is not None else None
        if decision is not None:
            reason = f": {decision.reason}" if decision.reason else ""
            out.line(f"[decision] {decision.verb} {visible(decision.tool, strict=True)} "
                     f"(call {visible(decision.call_id, strict=True)}){visible(reason)}", "green")
        yield event


async def _resume_graph(app: Any, cid: str, targets: dict[str, Any], bound: dict[str, Any],
                        out: Console) -> BaseException | None:
    try:
        output = await app.ainvoke(None, checkpoint_id=cid, resume=targets or None, **bound)
    except GraphInterrupted:
        return None
    except WaypointError as err:
        out.note(f"[error] {type(err).__name__}: {visible(str(err))}", "red")
        return err
    out.line("[output] " + visible(clip(as_json(output), 2000)), "cyan")
    return None


def _report(after: StoredRun | None, error: BaseException | None, decisions: list[Any], console: Console,
            as_script: bool, hint: str, read: int | None = None) -> int:
    if after is None:
        raise RunsError("the run was deleted while it was being resumed")
    meta, cid = after.meta, after.meta.checkpoint_id
    code = 1 if error is not None or meta.status == "failed" else 0
    if as_script:
        found = run_json(after)
        console.line(json.dumps({
            "checkpoint_id": cid, "status": meta.status, "version": meta.version, "step": meta.step,
            "error": (f"{type(error).__name__}: {error}" if error is not None else meta.error),
            "output": found["output"], "interrupts": [pending_json(p) for p in after.pending],
            "decisions": plain(decisions), "project_root": found["project_root"]}, ensure_ascii=True))
        return code
    if error is not None and meta.version == read:  # refused before the claim: nothing was written
        console.line(f"run {visible(cid, strict=True)} was not resumed: it is still {meta.status} at version "
                     f"{meta.version}, as it was", "red")
    elif meta.status == "interrupted" and after.pending:
        ids = ", ".join(p.id for p in after.pending)
        shown = visible(cid, strict=True)
        console.line(f"run {shown} paused again at version {meta.version}: it waits on {ids} (`{hint} show {shown}`)",
                     "yellow")
    else:
        console.line(f"run {visible(cid, strict=True)} {meta.status} at version {meta.version}", "red" if code else "green")
    return code
