"""Agent middleware: approval, safe tools, retries, logging, compaction of long conversations. The hook protocol (`AgentMiddleware`) is the
engine's; these implementations import the engine, never the reverse. In an agent's list of
middlewares the first is the outermost (chapter 7's order: `[ApprovalMiddleware(...),
SafeToolMiddleware()]`, so the safe-tool wrapper never turns an approval into an error result).

`OTelTracing` (OpenTelemetry, the `[otel]` extra) is loaded when first named, never by importing this package."""

from waypoint.engine import AgentMiddleware

from .approval import ApprovalError, ApprovalInfo, ApprovalMiddleware, ApprovalResult
from .compaction import CompactionMiddleware
from .log import LoggingMiddleware
from .pending import Pending, classify_interrupt
from .retry import ModelRetryMiddleware, ToolRetryMiddleware, transient
from .safe import SafeToolMiddleware


def __getattr__(name: str):
    if name == "OTelTracing":
        from .otel import OTelTracing

        return OTelTracing
    raise AttributeError(f"module 'waypoint.middleware' has no attribute {name!r}")


__all__ = [
    "AgentMiddleware",
    "OTelTracing",
    "ApprovalMiddleware",
    "ApprovalInfo",
    "ApprovalResult",
    "ApprovalError",
    "SafeToolMiddleware",
    "ToolRetryMiddleware",
    "ModelRetryMiddleware",
    "transient",
    "LoggingMiddleware",
    "CompactionMiddleware",
    "Pending",
    "classify_interrupt",
]
