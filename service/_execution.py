"""Runs started or resumed over HTTP, executed in this process as asyncio tasks.

An `Execution` is one start or resume. Its task drives the agent's `Runner` (or the graph's `aevents`) and
writes what happens to the run's event log: live tokens, messages, tool calls and results, decisions,
retries, checkpoints, the pause (announced once durably saved) and the end. The HTTP request that caused
it waits on `claimed`: resolved by the run's first write (a resume's claim, written by compare-and-set
before any node runs) or by the error that stopped the run before it wrote anything — which is how a
losing resumer gets the engine's `CheckpointConflict`, never a guess made here.

`expected_version` (a client's "I saw version N") goes to the engine, which claims the run only while N is
its newest version — inside that same compare-and-set (docs/resume.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from waypoint.engine import GraphInterrupted, Shutdown, WaypointError
from waypoint.engine.agents.middleware import StoredMessage
from waypoint.engine.agents.turns import keeps_inputs
from waypoint.engine.codec.jsonable import tool_arguments
from waypoint.stores.relay import Relay

from ._events import EventLog, Logs
from ._targets import Target
from ._views import message_view, pending_view, plain
from ._watch import Watcher

log = logging.getLogger("waypoint.service")

__all__ = ["Executor", "Execution", "Outcome"]


@dataclass(frozen=True)
class Outcome:
    """How an execution began: the version it wrote first, or the error that stopped it before (or, for work
    handed to the run queue that no worker has claimed yet, `status` "queued"; for new input to a chat whose turn
    executes, queued in the store to run after it, `status` "queued" with `queued` its `QueuedInput`)."""

    version: int | None = None
    error: BaseException | None = None
    status: str = "running"
    queued: Any = None


class Execution:
    """One start or resume of a run; also the graph callback handler that sees its checkpoints.

    Its events go to `log`: for a resume, the log of the run it resumes (`Logs.current`); for a start, a new
    log, made the run's log once the start's claim is written (`Logs.claim`), so a reader of the previous
    run on the ID never sees the new run's events, nor a reader of the new run the old one's."""

    def __init__(self, checkpoint_id: str, target: Target, log: EventLog, logs: Logs, how: str, store: Any) -> None:
        loop = asyncio.get_running_loop()
        self.checkpoint_id, self.target, self.log, self.logs, self.how = checkpoint_id, target, log, logs, how
        self.hub, self.store = logs.hub, store
        self.first_event = log.last_id
        """The event ID just before this execution's first event (what `last_event_id` answers)."""
        self.created_at: float | None = None
        """The `created_at` of the run it wrote its claim on."""
        self.claimed: asyncio.Future[Outcome] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        """Resolved (with None) once the execution ended."""
        self.version: int | None = None
        self.written_at: float | None = None
        self.task: asyncio.Task | None = None
        self.on_claim: Any = None
        self.relay: Any = None
        """Its live events (tokens) written to the store's relayed log, for readers on other services."""

    @property
    def run(self) -> tuple[str, float | None]:
        return self.checkpoint_id, self.created_at

    async def on_checkpoint(self, event: Any) -> None:
        """A version was written (called inside the run, right after the write)."""
        self.version, self.written_at = event.data, time.time()
        if not self.claimed.done():
            self.created_at = await self._created_at(event.data)
            self.log = self.logs.claim(self.checkpoint_id, self.log, self.created_at)
            self.claimed.set_result(Outcome(version=event.data))
            if self.on_claim is not None:
                self.on_claim(self)
            info = {"checkpoint_id": self.checkpoint_id, "graph": self.target.name, "how": self.how,
                    "version": event.data}
            self.log.append("started", info)
            self.hub.append("started", info, self.run)
        self.log.append("checkpoint", {"version": event.data, "step": event.step})

    async def _created_at(self, version: int) -> float | None:
        """The `created_at` of the run whose version `version` this execution just wrote (None if unreadable)."""
        try:
            found = await self.store.history(self.checkpoint_id, limit=1)
        except Exception:  # noqa: BLE001 - its log is then nobody's: readers get a snapshot, never a replay
            return None
        return found[0].created_at if found and found[0].version == version else None

    def interrupted(self, info: Any) -> None:
        pending = [pending_view(c, self.version, self.written_at) for c in info.contexts]
        data = {"checkpoint_id": self.checkpoint_id, "version": self.version, "interrupts": pending}
        self.log.append("interrupt", data)
        self.hub.append("interrupt", data, self.run)


class Executor:
    """Starts and resumes runs as tasks of this process; `aclose(drain)` stops them for the process's shutdown —
    each at its next step boundary within `drain` seconds, the rest where they are — never as a person's cancel:
    each is left `running` as last saved with its lease ended, so the next process recovers it at once
    (engine/keep/shutdown.py). When an agent's turn it executed ends, the next input queued for the chat
    (`Runner.run(on_busy=)`) runs as an execution of its own (`how="queued"`): one log per turn, as for a start."""

    def __init__(self, store: Any, logs: Logs, watcher: Watcher) -> None:
        self.store = store
        self.logs = logs
        self.watcher = watcher
        self.running: dict[str, Execution] = {}
        self.launched: dict[str, int] = {}
        """Executions per run from launch to end (before their claim too): the watcher leaves these runs alone."""
        self.tasks: set[asyncio.Task] = set()
        self.shutdown = Shutdown()
        logs.busy = lambda cid: cid in self.running
        watcher.executing = lambda cid: cid in self.launched

    def launch(self, target: Target, checkpoint_id: str, how: str, *, input: Any = None, resume: Any = None,
               takeover: bool = False, force_new_run: bool = False, expected_version: int | None = None,
               created_at: float | None = None, on_busy: str = "reject", by: str | None = None) -> Execution:
        """Begin a start (`how="start"`, with `input`; an agent's by `on_busy` while its chat's turn executes), a
        resume (`resume`: None, True or `{id: data}`) of the run created at `created_at` (as the resume's checks read
        it), or the turn of an agent's next queued input (`how="queued"`)."""
        log = EventLog() if how in ("start", "queued") else self.logs.current(checkpoint_id, created_at)
        log.local = True  # its tokens come from this execution, not from the relayed log
        ex = Execution(checkpoint_id, target, log, self.logs, how, self.store)
        ex.on_claim = self._claimed
        ex.relay = Relay(self.store, checkpoint_id, target.app.name)  # its tokens, for readers on other services
        if target.runner is not None:
            events = self._agent_events(ex, input, resume, takeover, force_new_run, expected_version, on_busy, by)
            body = self._drive_agent(ex, events)
        else:
            options: dict[str, Any] = {"checkpoint_id": checkpoint_id, "takeover": takeover}
            if how == "start":
                options["force_new_run"] = force_new_run
            else:
                options.update(resume=resume, expected_version=expected_version)
            body = self._drive_graph(ex, target.app.aevents(input, callbacks=[ex, ex.relay], streaming=True, **options))
        self.launched[checkpoint_id] = self.launched.get(checkpoint_id, 0) + 1
        ex.task = asyncio.create_task(self._run(ex, body), name=f"waypoint-service:{how}:{checkpoint_id}",
                                      context=self.shutdown.context())
        self.tasks.add(ex.task)
        ex.task.add_done_callback(self.tasks.discard)
        return ex

    def _claimed(self, ex: Execution) -> None:
        self.running[ex.checkpoint_id] = ex

    def _agent_events(self, ex: Execution, input: Any, resume: Any, takeover: bool, force_new_run: bool,
                      expected_version: int | None, on_busy: str, by: str | None) -> AsyncIterator[Any]:
        runner, cid = ex.target.runner, ex.checkpoint_id
        # take_queued=False: a queued input's turn is an execution of its own, launched when this one ends (_next)
        callbacks = [ex, ex.relay]
        if ex.how == "start":
            return runner.run(input, checkpoint_id=cid, force_new_run=force_new_run, on_busy=on_busy, by=by,
                              take_queued=False, callbacks=callbacks)
        if ex.how == "queued":
            return runner.drain(cid, turns=1, after=0, callbacks=callbacks)  # after=0: one read when none was queued
        options = {"takeover": takeover, "expected_version": expected_version, "take_queued": False,
                   "callbacks": callbacks}
        if isinstance(resume, dict):
            return runner.resume_with_params(cid, resume, **options)
        return runner.resume(cid, **options)

    async def _run(self, ex: Execution, body: Any) -> None:
        error: BaseException | None = None
        try:
            error = await body
        except asyncio.CancelledError:
            error = asyncio.CancelledError()
            raise
        finally:
            await ex.relay.aclose()
            await self._finish(ex, error)

    async def _finish(self, ex: Execution, error: BaseException | None) -> None:
        try:
            await self._end(ex, error)
        finally:
            cid = ex.checkpoint_id
            self.launched[cid] -= 1
            if not self.launched[cid]:
                del self.launched[cid]
            if not ex.finished.done():
                ex.finished.set_result(None)
            self._next(ex)

    def _next(self, ex: Execution) -> None:
        """After an agent's turn that wrote a version: the chat's next queued input, if one waits (`Runner.drain`
        finds none in one read when none was ever queued). Not while the process stops: a turn left `running`
        is continued by the next process, which takes the inputs after it."""
        outcome = ex.claimed.result() if ex.claimed.done() else None
        if ex.target.runner is None or outcome is None or outcome.version is None or self.shutdown.requested:
            return
        if not keeps_inputs(self.store):
            return
        self.launch(ex.target, ex.checkpoint_id, "queued")

    async def _end(self, ex: Execution, error: BaseException | None) -> None:
        if self.running.get(ex.checkpoint_id) is ex:
            del self.running[ex.checkpoint_id]
        if not ex.claimed.done():  # stopped before it wrote anything: the request gets the error
            ex.claimed.set_result(Outcome(error=error))
            if ex.how == "queued" and error is not None and not isinstance(error, asyncio.CancelledError):
                log.error("run '%s': its next queued input did not start: %s: %s; it waits for the chat's next input "
                          "or end of turn", ex.checkpoint_id, type(error).__name__, error)  # no request waits to say it
        elif error is not None and not isinstance(error, asyncio.CancelledError):
            ex.log.append("error", {"type": type(error).__name__, "message": str(error)})
        if ex.claimed.result().version is not None:
            try:
                found = await self.store.history(ex.checkpoint_id, limit=1)
            except Exception:  # noqa: BLE001 - the end is still announced
                found = []
            if found:  # what it wrote is no news to the watcher (its announcements may come after this)
                self.watcher.wrote(found[0])
            data = {"checkpoint_id": ex.checkpoint_id, "status": found[0].status if found else "deleted",
                    "version": found[0].version if found else None, "error": found[0].error if found else None}
            ex.log.append("end", data)
            ex.hub.append("end", data, ex.run)

    # --- agents: AgentEvents -> log events ---------------------------------------------------------------

    async def _drive_agent(self, ex: Execution, events: AsyncIterator[Any]) -> BaseException | None:
        try:
            async for event in events:
                if event.error is not None:
                    return event.error
                if event.action is not None and event.action.queued is not None and not ex.claimed.done():
                    ex.claimed.set_result(Outcome(status="queued", queued=event.action.queued))
                    continue
                path = list(event.run_path) or [ex.target.runner.agent.name]  # which agent: a composition's differ
                if event.output is not None:
                    await self._output(ex, event.output, path)
                elif event.action is not None:
                    self._action(ex, event.action, path)
        except (WaypointError, ValueError) as err:  # the run did not start (the Runner raises what means "nothing
            return err                                  # ran"; a store refuses bad input with ValueError)
        return None

    async def _output(self, ex: Execution, out: Any, path: list[str]) -> None:
        # what is stored differs from what streamed (call IDs the agent replaced, an after_model rewrite): its
        # text is no new token, and its message restates the one before it
        restated = isinstance(getattr(out.stream, "opened_by", None), StoredMessage)
        if out.stream is not None and out.role == "assistant" and not restated:
            async for chunk in out.stream:  # live: each token as the model produces it
                if chunk.content:
                    ex.log.append("token", {"text": chunk.content, "run_path": path})
        message = await out.get_message()
        if out.role != "assistant":
            result = {"call_id": message.tool_call_id, "name": out.tool_name or message.name,
                      "content": message.content, "run_path": path}
            position = getattr(getattr(out.stream, "opened_by", None), "index", None)  # the engine's ToolEvent
            if isinstance(position, int):  # which call of its message: the model's IDs may repeat
                result["position"] = position
            ex.log.append("tool_result", result)
            return
        ex.log.append("message", {**message_view(message), "run_path": path, **({"restated": True} if restated else {})})
        for call in message.tool_calls:
            ex.log.append("tool_call", {"call_id": call.id, "name": call.name, "arguments": tool_arguments(call.arguments),
                                        "arguments_json": call.arguments, "run_path": path})

    def _action(self, ex: Execution, action: Any, path: list[str]) -> None:
        if action.taken is not None:  # this turn is a queued input's: said to its readers and the service's
            q = action.taken
            data = {"checkpoint_id": ex.checkpoint_id, "n": q.n, "policy": q.policy, "by": q.by, "queued_at": q.queued_at}
            ex.log.append("input", data)
            ex.hub.append("input", data, ex.run)
        elif action.interrupted is not None:
            ex.interrupted(action.interrupted)  # each interrupt in it says where it was raised (`run_path`)
        elif action.decision is not None:
            ex.log.append("decision", _with_path(plain(action.decision), path))
        elif action.retry is not None:
            ex.log.append("retry", _with_path(plain(action.retry), path))
        elif action.rerun is not None:
            ex.log.append("rerun", _with_path(plain(action.rerun), path))

    # --- graphs: engine Events -> log events -------------------------------------------------------------

    async def _drive_graph(self, ex: Execution, events: AsyncIterator[Any]) -> BaseException | None:
        try:
            async for event in events:
                node = "/".join(event.node_path)
                if event.kind == "chunk":
                    ex.log.append("chunk", {"node": node, "data": plain(event.data)})
                elif event.kind in ("start", "end"):
                    ex.log.append("node", {"node": node, "event": event.kind})
                elif event.kind == "interrupt" and not event.node_path:
                    ex.interrupted(event.data)
        except GraphInterrupted:
            return None
        except Exception as err:  # noqa: BLE001 - reported in the log, or to the request
            return err
        return None

    async def aclose(self, drain: float = 0.0) -> None:
        """Stop every run this process executes for its shutdown: each at its next step boundary, waiting up to
        `drain` seconds for them, then the rest where they are (their step is not written). None is stored as
        cancelled: each is left `running`, its lease ended, for the next process to continue."""
        tasks = list(self.tasks)
        self.shutdown.request()
        if tasks:
            log.info("service: stopping %d run(s) in flight at their next step boundary (within %.1f s): %s",
                     len(tasks), drain, ", ".join(sorted(t.get_name().rsplit(":", 1)[-1] for t in tasks)))
        if tasks and drain > 0:
            await asyncio.wait(tasks, timeout=drain)
        left = [t for t in tasks if not t.done()]
        if left:
            log.warning("service: %d run(s) still inside a step after %.1f s of drain are stopped where they are "
                        "(%s); the next process continues each from its last saved step", len(left), drain,
                        ", ".join(sorted(t.get_name().rsplit(":", 1)[-1] for t in left)))
        self.shutdown.cancel(left)
        await asyncio.gather(*tasks, return_exceptions=True)


def _with_path(data: Any, path: list[str]) -> dict[str, Any]:
    return {**data, "run_path": path} if isinstance(data, dict) else {"value": data, "run_path": path}
