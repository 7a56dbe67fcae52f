"""Agent middleware (approval, safe-tool, retry, logging/tracing).

Empty for now: the hook protocol and the middleware arrive together with tools and agents. The
package exists so the distribution's layout is final.
"""

__all__: list[str] = []
