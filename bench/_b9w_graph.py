"""B9w's agent: B9's `b9chat` (a model streaming `N_TOKENS` tokens stamped with the time they were produced),
served by `waypoint serve --queue --agents bench._b9w_graph:agent` and executed by `waypoint worker --graphs
bench._b9w_graph:compiled` (compiled streaming, so the worker relays its tokens)."""

from __future__ import annotations

from typing import Any

from bench._b9_server import agent


def compiled(store: Any) -> Any:
    return agent().compile(store=store, streaming=True)


__all__ = ["agent", "compiled"]
