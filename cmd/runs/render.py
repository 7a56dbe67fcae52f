"""How `waypoint runs` prints stored runs: tables and pages for people, plain JSON for scripts.

Stored values are shown, never executed or dumped raw: bytes appear as `<N bytes>`, objects the JSON
conversion does not know as their (clipped) `repr`, and long text is cut with a note saying so.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Sequence
from typing import Any

from waypoint.engine import CheckpointMeta
from waypoint.engine.errors import clip
from waypoint.engine.codec.jsonable import jsonable, message_json, output_json, tool_arguments
from waypoint.engine.keep.owners import OwnerState, describe_owner, owner_state

from ..console import Console, compact, hides, visible
from .read import Pending, StoredRun

__all__ = ["plain", "clock", "iso", "table", "lease_text", "root_text", "needs_root", "meta_json", "run_json",
           "show_run"]

_WARNING = ("    ! this call holds invisible or direction-changing characters, shown as \\u codes: it may not do "
            "what it seems to; read it character by character before approving")
TEXT_LIMIT = 2000
"""Characters of one message or value a page shows (`--json` shows everything)."""


def plain(value: Any) -> Any:
    """`value` as JSON data (engine/codec/jsonable.py)."""
    return jsonable(value, limit=TEXT_LIMIT)


def as_json(value: Any, *, indent: int | None = None) -> str:
    return json.dumps(plain(value), ensure_ascii=False, indent=indent, default=repr)


def cut(text: str, limit: int = TEXT_LIMIT) -> str:
    """`text` up to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters; --json shows all)"


def clock(t: float | None) -> str:
    """A stored time in local time, to the second."""
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def iso(t: float | None) -> str | None:
    """A stored time for scripts: ISO 8601 with the local offset."""
    return None if t is None else dt.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def lease_alive(meta: CheckpointMeta, now: float) -> bool:
    """Whether `meta`'s lease is unexpired at `now`, the store's clock (never this process's)."""
    return meta.lease_expires is not None and meta.lease_expires > now


def lease_text(meta: CheckpointMeta, now: float) -> str | None:
    """What the lease of a running run says at `now` (the store's clock): an owner that may be alive, or one
    that is gone."""
    if meta.status != "running":
        return None
    owner = clip(meta.lease_owner or "an unknown owner", 200)
    if not lease_alive(meta, now):
        return f"expired at {clock(meta.lease_expires)} (owner {owner}): the process that ran it is gone"
    held = f"held by {owner} until {clock(meta.lease_expires)} ({meta.lease_expires - now:.0f}s left)"
    state = owner_state(meta.lease_owner)
    if state is OwnerState.DEAD:  # a PID of this host that is gone: known, not guessed (engine/keep/owners.py)
        return f"{held}; {describe_owner(meta.lease_owner)}: resuming it takes it over at once"
    if state is not OwnerState.UNKNOWN:
        return f"{held}; {describe_owner(meta.lease_owner)}: that process is running it"
    return f"{held}: that process, on another host, is running it, unless it died"


def needs_root(run: StoredRun) -> bool:
    """Whether resuming `run` needs `--project-root`: its tools are confined to a root it cannot name (stored
    before runs kept their root), or to one that is no longer a directory."""
    root = run.project_root
    return run.confined and (root is None or not root.is_dir())


def root_text(run: StoredRun) -> str | None:
    """What `show` says of the project root the run's tools are confined to (None: they are not confined)."""
    root = run.project_root
    if root is None:
        return ("unknown (stored before runs kept their project root): resume with --project-root DIR"
                if run.confined else None)
    if not root.is_dir():
        return f"{root} (no longer a directory: resume with --project-root DIR)"
    return str(root)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in (header, *rows)]


# --- JSON -------------------------------------------------------------------------------------------------

def meta_json(meta: CheckpointMeta, now: float, *, newest: bool = True) -> dict[str, Any]:
    """One version's row, for scripts. `lease_expired` (at `now`, the store's clock) only for a run's newest
    version (the lease of an older one was handed on to the next version)."""
    out = {
        "checkpoint_id": meta.checkpoint_id, "version": meta.version, "status": meta.status, "step": meta.step,
        "created_at": iso(meta.created_at), "updated_at": iso(meta.updated_at), "error": meta.error,
        "origin": meta.origin, "lease_owner": meta.lease_owner, "lease_expires": iso(meta.lease_expires),
        "fingerprint": meta.fingerprint,
    }
    if newest:
        out["lease_expired"] = None if meta.status != "running" else not lease_alive(meta, now)
    return out


def pending_json(p: Pending, now: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": p.id, "kind": p.kind, "address": p.address, "info": plain(p.info)}
    if p.deadline is not None:
        out["deadline"] = p.deadline
        if now is not None:
            out["expires_in"] = max(0.0, round(p.deadline - now, 3))
    if p.tool is not None:
        out["tool"], out["call_id"] = p.tool, p.call_id
    if p.arguments is not None:
        out["arguments"] = tool_arguments(p.arguments)
    return out


def run_json(run: StoredRun) -> dict[str, Any]:
    """A decoded version, for scripts: the row, the pending interrupts, and the conversation or the state."""
    out = {**meta_json(run.meta, run.now), "graph": run.graph, "kind": "agent" if run.is_agent else "graph",
           "newest_version": run.newest, "pending_nodes": list(run.pending_nodes),
           "interrupts": [pending_json(p, run.now) for p in run.pending],
           "project_root": str(run.project_root) if run.project_root is not None else None,
           "cancelled_by": run.cancelled_by.plain() if run.cancelled_by is not None else None}
    if run.is_agent:
        out["messages"] = [message_json(m) for m in run.state.messages]
        out["decisions"] = plain(run.state.decisions)
        out["iterations"] = run.state.iterations
        out["compaction"] = plain(getattr(run.state, "compaction", None))  # what the model is sent for the first ones
    else:
        out["state"] = plain(run.state)
    out["output"] = output_json(run.output, limit=TEXT_LIMIT)
    return out


# --- the page of `show` -------------------------------------------------------------------------------------

def cancelled_text(by: Any) -> str | None:
    """Who cancelled the run, where it stopped and when they asked (None when no person's cancel stopped it)."""
    if by is None:
        return None
    where = {"now": "where it was", "after_step": "after a step"}.get(by.when, f"after {by.when[len('after:'):]}")
    return f"cancelled by {clip(by.by, 80) or 'an unnamed caller'}, {where} (asked {clock(by.at)})"


def show_run(run: StoredRun, console: Console, *, hint: str) -> None:
    """Print a decoded version for a person. `hint` is the `waypoint runs ... ` prefix for suggestions."""
    meta = run.meta
    cid = meta.checkpoint_id
    console.line(f"run {visible(cid, strict=True)}", "bold")
    fields = [("graph", f"{run.graph} ({'agent' if run.is_agent else 'graph'})"),
              ("status", meta.status),
              ("version", f"{meta.version} of {run.newest}" + ("" if meta.version == run.newest else " (an older one)")),
              ("step", str(meta.step)),
              ("shape", meta.fingerprint and f"{meta.fingerprint[:12]} (the version of the graph that wrote it)"),
              ("created", clock(meta.created_at)),
              ("updated", clock(meta.updated_at)),
              ("root", root_text(run)),
              ("lease", lease_text(meta, run.now)),
              ("error", meta.error and clip(" ".join(meta.error.split()), TEXT_LIMIT)),
              ("stopped", cancelled_text(run.cancelled_by)),
              ("origin", meta.origin and f"{meta.origin} " + ("(its state edited from that version)"
                                                               if " update_state" in meta.origin else
                                                               "(forked or resumed from that version)"))]
    for name, value in fields:
        if value:
            console.line(f"  {name:<9} {visible(value, strict=True)}")
    if run.is_agent:
        _show_agent(run, console)
    else:
        _show_graph(run, console)
    _show_pending(run, console, hint)


def _show_agent(run: StoredRun, console: Console) -> None:
    messages = run.state.messages
    console.line()
    console.line(f"messages ({len(messages)}):", "bold")
    for m in messages:
        _show_message(m, console)
    compaction = getattr(run.state, "compaction", None)
    if compaction is not None:  # the messages above are all kept; the model is sent the summary for the first ones
        console.line()
        console.line(f"summary sent for messages 1-{compaction.covers} ({compaction.count} made):", "bold")
        console.line("  " + visible(cut(compaction.summary)).replace("\n", "\n  "))
    if run.state.decisions:
        console.line()
        console.line(f"decisions ({len(run.state.decisions)}):", "bold")
        for d in run.state.decisions:
            reason = f": {d.reason}" if d.reason else ""
            at = f" at version {d.version}" if d.version is not None else ""
            inside = f" in {' > '.join(d.run_path)}" if getattr(d, "run_path", ()) else ""
            console.line(visible(f"  {d.verb} {d.tool} (call {d.call_id}){inside}{at}{reason}", strict=True))


def _show_message(m: Any, console: Console) -> None:
    styles = {"assistant": "cyan", "tool": "dim", "system": "dim"}
    if m.role == "tool":
        console.line(visible(f"  [tool result] {m.name} (call {m.tool_call_id}): {compact(m.content)}", strict=True),
                     "dim")
        return
    if m.content or not m.tool_calls:
        text = visible(cut(m.content)).replace("\n", "\n      ")
        console.line(console.style(f"  [{m.role}] ", styles.get(m.role, "bold")) + text)
    for call in m.tool_calls:
        console.line(visible(f"  [tool call] {call.name}({cut(call.arguments, 500)}) (call {call.id})", strict=True),
                     "yellow")
        if hides(call.name + call.arguments + call.id):
            console.line(_WARNING, "red")


def _show_graph(run: StoredRun, console: Console) -> None:
    console.line()
    console.line(f"pending nodes: {', '.join(run.pending_nodes) or '-'}")
    console.line("state:" if run.state is not None else "state: -")
    if run.state is not None:
        console.line(_indented(cut(as_json(run.state, indent=2)), 2))
    if run.done:
        console.line("output:")
        console.line(_indented(cut(as_json(run.output, indent=2)), 2))


def _show_pending(run: StoredRun, console: Console, hint: str) -> None:
    pending = run.pending
    if pending:
        console.line()
        console.line(f"pending interrupts ({len(pending)}):", "bold")
    for p in pending:
        console.line(visible(f"  {p.id}  {_describe(p)}", strict=True), "yellow")
        console.line(visible(f"    address   {clip(p.address, 400)}", strict=True), "dim")
        if p.deadline is not None:
            console.line(f"    deadline  {_time_left(p, run.now)}", "yellow")
        if p.kind == "approval":
            shown = json.dumps(tool_arguments(p.arguments), ensure_ascii=False, indent=2)
            if hides(shown + (p.tool or "") + run.meta.checkpoint_id):
                console.line(_WARNING, "red")
            console.line("    arguments")
            console.line(_indented(visible(cut(shown)), 6))
        elif p.kind != "pause":
            console.line(visible(f"    info      {cut(as_json(p.info))}"))
    resume = f"{hint} resume {run.meta.checkpoint_id}" + ("" if run.is_agent else " --graph MODULE:ATTR")
    steps = _next_steps(run, resume + (" --project-root DIR" if needs_root(run) else ""))
    if steps:
        console.line()
    for step in steps:
        console.line(visible(step, strict=True))


def _time_left(p: Pending, now: float) -> str:
    """When a pause stops waiting, and how long that is from `now` (the store's clock)."""
    left = p.deadline - now  # type: ignore[operator]
    at = clock(p.deadline)
    if left <= 0:
        happens = "rejected as expired" if p.kind == "approval" else "answered by its deadline"
        return f"{at}: passed {_span(-left)} ago, nobody answered; it is {happens} by whoever recovers runs"
    return f"{at} ({_span(left)} left by the store's clock)"


def _span(seconds: float) -> str:
    s = int(seconds + 0.999)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _next_steps(run: StoredRun, resume: str) -> list[str]:
    """The commands that continue the run from here (only for its newest version)."""
    meta = run.meta
    if meta.version != run.newest or meta.status == "completed":
        return []
    first = next((p for p in run.pending if p.kind != "pause"), None)
    if first is not None and first.kind == "approval":
        steps = [f"approve: {resume} --approve {first.id}", f"reject:  {resume} --reject {first.id} --reason TEXT"]
        return steps + (["(add --graph MODULE:ATTR naming the agent, unless a waypoint command defines it)"]
                        if run.is_agent and not run.confined else [])
    if first is not None:
        return [f"answer:  {resume} --respond {first.id} JSON"]
    if meta.status == "running" and lease_alive(meta, run.now):
        state = owner_state(meta.lease_owner)
        if state is OwnerState.DEAD:
            return [f"take it over (its process is gone): {resume}"]
        if state is not OwnerState.UNKNOWN:
            return ["wait for it to pause or finish: its process is alive"]
        return [f"if its process (on another host) is dead: {resume} --takeover"]
    what = {"failed": "retry the failed step", "running": "continue it"}.get(meta.status, "continue it")
    return [f"{what}: {resume}"]


def _describe(p: Pending) -> str:
    call = f" (call {p.call_id})" if p.call_id else ""
    if p.kind == "approval":
        return f"approval of tool '{p.tool}'{call}"
    if p.kind == "pause":
        info = p.info if isinstance(p.info, dict) else {}
        return f"static pause {info.get('pause', '?')} node {info.get('node', p.node)}"
    if p.tool is not None:
        return f"interrupt in tool '{p.tool}'{call}"
    return f"interrupt at node {p.node or '?'}"


def _indented(text: str, by: int = 4) -> str:
    pad = " " * by
    return "\n".join(pad + line for line in text.splitlines())
