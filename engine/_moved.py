"""Old import paths of modules that moved in 0.2 (issue 31: the engine's rooms), kept for one release.

`import waypoint.engine.checkpoint` (or `from waypoint.engine.runner import Run`) still works: it warns with a
`DeprecationWarning` naming the new path and gives the module itself, so the names it holds are the very same
objects. Installed on the import system by `waypoint/engine/__init__.py`; the old paths go in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

MOVED = {
    "waypoint.engine.serde": "waypoint.engine.codec.serde",
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


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path in `MOVED` and loads it as the module at its new path."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path goes in Waypoint 0.3)",
                      DeprecationWarning, stacklevel=_caller_level())
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new path's, already executed."""


def _caller_level() -> int:
    """The stack level of the first frame outside the import system (so the warning names the importing line)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__):
        frame, level = frame.f_back, level + 1
    return level


def install() -> None:
    if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
        sys.meta_path.append(_Moved())
