"""What a service serves: agents and graphs by name, each recording to the service's store.

A stored run is matched to the agent or graph that wrote it by the fingerprint of its newest version
(the graph's name and shape), so resuming never needs the run decoded first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from waypoint.engine import CompiledGraph, Graph, WaypointError

__all__ = ["ServiceError", "Target", "prepare_targets", "load_targets"]


class ServiceError(WaypointError):
    """The service cannot be set up as asked (an unknown agent, two agents with one name, a bad --db)."""


@dataclass(frozen=True, kw_only=True)
class Target:
    """One agent (with its `Runner`) or graph the service runs."""

    name: str
    kind: str
    """"agent" or "graph"."""
    app: CompiledGraph
    runner: Any = None
    description: str = ""

    @property
    def fingerprint(self) -> str:
        from waypoint.engine.keep.checkpoint import fingerprint

        return fingerprint(self.app.structure)


def _target(name: str | None, obj: Any, store: Any) -> Target:
    from waypoint.engine import ChatModelAgent, Runner

    if isinstance(obj, Runner):
        runner = obj if obj.store is store else obj.with_store(store)
        agent = runner.agent
        return Target(name=name or agent.name, kind="agent", app=runner.app, runner=runner,
                      description=agent.description)
    if isinstance(obj, ChatModelAgent):
        runner = Runner(obj, store=store, streaming=True)
        return Target(name=name or obj.name, kind="agent", app=runner.app, runner=runner, description=obj.description)
    if isinstance(obj, Graph):
        app = obj.compile(store=store)
        return Target(name=name or app.name, kind="graph", app=app)
    if isinstance(obj, CompiledGraph):
        app = obj if obj.store is store else obj.with_store(store)
        return Target(name=name or app.name, kind="graph", app=app)
    raise ServiceError(f"cannot serve a {type(obj).__name__}: give a Runner, a ChatModelAgent, a Graph or a "
                       "CompiledGraph")


def prepare_targets(runners_or_graphs: Any, store: Any) -> dict[str, Target]:
    """`{name: Target}` from a mapping name -> agent/graph, a list of them, or one."""
    if isinstance(runners_or_graphs, Mapping):
        items: Iterable[tuple[str | None, Any]] = runners_or_graphs.items()
    elif isinstance(runners_or_graphs, (list, tuple)):
        items = [(None, obj) for obj in runners_or_graphs]
    else:
        items = [(None, runners_or_graphs)]
    targets: dict[str, Target] = {}
    for name, obj in items:
        target = _target(name, obj, store)
        if target.name in targets:
            raise ServiceError(f"two agents or graphs are named {target.name!r}; serve them under different names "
                               "(pass a mapping name -> agent)")
        if "/" in target.name or not target.name:
            raise ServiceError(f"cannot serve {target.name!r}: a name must be non-empty and contain no '/'")
        targets[target.name] = target
    if not targets:
        raise ServiceError("nothing to serve: pass at least one agent, Runner or graph")
    fingerprints = [t.fingerprint for t in targets.values()]
    if len(set(fingerprints)) != len(fingerprints):
        raise ServiceError("two of the served graphs have the same name and shape, so their runs cannot be told "
                           "apart; give them different names")
    return targets


def load_targets(spec: str) -> list[Any]:
    """The agents and graphs `module:attr[,module:attr...]` names (a zero-argument callable is called)."""
    from waypoint.engine.codec.loading import load_object
    from waypoint.engine import ChatModelAgent, Runner

    kinds = (ChatModelAgent, Runner, Graph, CompiledGraph)
    return [load_object(item.strip(), option="--agents", kinds=kinds, error=ServiceError) for item in spec.split(",")]
