"""Agent middleware (approval, safe-tool, retry, logging/tracing).

Empty for now: the hook protocol and the middleware arrive with the tools and agents issues
(shared/DESIGN.md §8). The package exists so the distribution's layout is final.
"""

__all__: list[str] = []
