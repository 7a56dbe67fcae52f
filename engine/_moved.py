"""Old import paths of modules that moved in 0.2 (issue 31: the engine's rooms), kept for one release.

`import waypoint.engine.checkpoint` (or `from waypoint.engine.runner import Run`) still works: it warns with a
`DeprecationWarning` naming the new path and gives the module itself, so the names it holds are the very same
objects. Installed on the import system by `waypoint/engine/__init__.py`; the old paths go in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "waypoint.engine.jsonable": "waypoint.engine.codec.jsonable",
    "waypoint.engine.loading": "waypoint.engine.codec.loading",
    "waypoint.engine.base": "waypoint.engine.shape.spec",
    "waypoint.engine.nodes": "waypoint.engine.shape.nodes",
    "waypoint.engine.field_mapping": "waypoint.engine.shape.field_mapping",
    "waypoint.engine.reducers": "waypoint.engine.shape.reducers",
    "waypoint.engine.retry": "waypoint.engine.shape.retry",
    "waypoint.engine.streams": "waypoint.engine.shape.streams",
    "waypoint.engine.runner": "waypoint.engine.run.loop",
    "waypoint.engine.node_calls": "waypoint.engine.run.node_calls",
    "waypoint.engine.merge": "waypoint.engine.run.merge",
    "waypoint.engine.scope": "waypoint.engine.run.scope",
    "waypoint.engine.task": "waypoint.engine.run.task",
    "waypoint.engine.interrupts": "waypoint.engine.run.interrupts",
    "waypoint.engine.resume": "waypoint.engine.run.resume",
    "waypoint.engine.pending": "waypoint.engine.run.pending",
    "waypoint.engine.position": "waypoint.engine.run.position",
    "waypoint.engine.store": "waypoint.engine.keep.store",
    "waypoint.engine.checkpoint_content": "waypoint.engine.keep.content",
    "waypoint.engine.checkpoint": "waypoint.engine.keep.checkpoint",
    "waypoint.engine.lease": "waypoint.engine.keep.lease",
    "waypoint.engine.owners": "waypoint.engine.keep.owners",
    "waypoint.engine.recovery": "waypoint.engine.keep.recovery",
    "waypoint.engine.lifecycle": "waypoint.engine.keep.lifecycle",
    "waypoint.engine.state_update": "waypoint.engine.keep.state_update",
    "waypoint.engine.shutdown": "waypoint.engine.keep.shutdown",
    "waypoint.engine.graph": "waypoint.engine.compose.graph",
    "waypoint.engine.workflow": "waypoint.engine.compose.workflow",
    "waypoint.engine.compiled": "waypoint.engine.compose.compiled",
    "waypoint.engine.compile_checks": "waypoint.engine.compose.compile_checks",
    "waypoint.engine.mermaid": "waypoint.engine.compose.mermaid",
    "waypoint.engine.nested": "waypoint.engine.compose.nested",
    "waypoint.engine.models.openai": "waypoint.adapters.openai_chat",
    "waypoint.engine.models.anthropic": "waypoint.adapters.anthropic_chat",
    "waypoint.engine.tools.mcp": "waypoint.adapters.mcp_tools",
}


ALIASES = {"waypoint.engine.serde": "waypoint.engine.codec.serde"}
"""Old paths that stay, without a warning: DESIGN.md names `waypoint.engine.serde` as the codec's public path."""


class _Moved:
    """Finds an old path in `MOVED` (or `ALIASES`) and loads it as the module at its new path: the very module,
    which keeps its own name and spec (a reload, and the relative imports inside its functions, still work)."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED and fullname not in ALIASES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED.get(spec.name)
        if new is not None:
            # stacklevel 2 is the importing line: the warnings module skips the import system's own frames
            warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path goes in Waypoint 0.3)",
                          DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new or ALIASES[spec.name])
        spec.loader_state = module.__spec__  # the import system sets the old spec on it next; exec_module undoes that
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new path's, already executed: it gets its own spec back."""
        real = getattr(module.__spec__, "loader_state", None)
        if isinstance(real, importlib.machinery.ModuleSpec):
            module.__spec__ = real


def old_path(package: str, name: str) -> ModuleType | None:
    """`package.name` when it is an old path of a module that moved (importing it warns), else None: a package's
    `__getattr__` gives `waypoint.engine.graph` as the attribute it was before."""
    full = f"{package}.{name}"
    if full in MOVED or full in ALIASES:
        return importlib.import_module(full)
    return None


def install() -> None:
    if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
        sys.meta_path.append(_Moved())
