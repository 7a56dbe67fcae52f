"""Tools: `@tool` turns a typed function into a `Tool` (name, description, JSON schema, validation).

A plain or `async def` function is *invokable* (`invoke(args_json) -> str`); an async generator is
*streamable* (`stream(args_json)` yields text chunks). A parameter annotated `ToolContext` (or named
`ctx`) receives the call's context and is not part of the schema. Arguments arrive as the JSON text the
model wrote: `parse()` checks it against the signature (pydantic) and raises `ToolArgumentError` with
a message the model can act on — the tools node turns that into the call's result, never a crash.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from ..models.schema import ToolInfo
from ..run import current_task, in_daemon_thread

__all__ = ["tool", "Tool", "ToolContext", "ToolArgumentError", "RetryAgentRun", "StopAgentRun", "BreakLoop", "ToolInfo"]


class RetryAgentRun(Exception):
    """Raised by a tool: `message` goes back to the model as this call's result and the loop goes on."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class StopAgentRun(Exception):
    """Raised by a tool: the batch of calls finishes, then the agent ends (status completed) with
    `message` as this call's result."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message


class BreakLoop(StopAgentRun):
    """Raised by a tool: like `StopAgentRun` (the batch finishes, the agent ends with `message` as this call's
    result), and the `LoopAgent` running the agent ends its loop after it — the agents after this one in the
    iteration do not run, nor do further iterations (Eino's BreakLoop action). Outside a loop agent it is a
    `StopAgentRun`."""


class HandOff(StopAgentRun):
    """Raised by the handoff tool (`transfer_to_agent`, engine/agents/handoff.py) when it hands the conversation to
    `agent`: `message` is the call's result, the batch finishes, then `agent` answers from there. What ran
    decides: a call answered without running — a `Respond`, a rejected approval — hands nothing over, whatever
    its text says."""

    def __init__(self, agent: str, message: str = "") -> None:
        super().__init__(message)
        self.agent = agent


class ToolArgumentError(Exception):
    """The model's arguments for a call do not fit the tool; the message is meant for the model."""


@dataclass(kw_only=True)
class ToolContext:
    """What a tool may know about the call it serves (inject it by declaring a `ToolContext` parameter).

    `idempotency_key` is the same for this call across retries, crashes and resumes: hand it to any
    external system that must not apply the call twice.
    """

    name: str
    call_id: str
    checkpoint_id: str | None
    idempotency_key: str
    arguments: str = ""
    resumed: bool = False
    resumed_metadata: Any = None
    original_input: Any = None
    rerun: bool = False
    """True when this call had started before a crash without finishing: it runs again."""
    position: int = 0
    """The call's position in its assistant message (calls are told apart by it, whatever IDs the model wrote)."""
    decision: Any = None
    """A `Decision` a middleware recorded about this call (`decide`), kept in the run's history."""
    nested_decisions: list[Any] = field(default_factory=list)
    """The `Decision`s made inside an agent this call ran (an `AgentTool`), with their `run_path`: kept with the
    call's result, so the run's `decisions` show every approval given anywhere in it."""
    extra: dict[str, Any] = field(default_factory=dict)

    def is_resumed(self) -> bool:
        """True when this call paused and is now run again by a resume that targeted it."""
        return self.resumed

    def decide(self, verb: str, reason: str | None = None) -> None:
        """Record what was decided about this paused call ("approved", "rejected", ...)."""
        from ..run import current_version
        from .verbs import Decision

        self.decision = Decision(call_id=self.call_id, tool=self.name, verb=verb, reason=reason,  # type: ignore[arg-type]
                                 version=current_version())


class Tool:
    """A callable the model may ask for. Build one with `@tool`, or `Tool(fn, info=ToolInfo(...))`
    for a hand-written schema (then the arguments are passed as they are, unvalidated)."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                 info: ToolInfo | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"a tool needs a function, got {fn!r}")
        if inspect.isgeneratorfunction(fn):
            raise TypeError(f"tool {name or getattr(fn, '__name__', fn)!r}: a plain generator cannot stream; make it "
                            "`async def` with `yield` (a streaming tool), or return the whole result")
        self.fn = fn
        self.streams = inspect.isasyncgenfunction(fn)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.ctx_param = _context_parameter(fn)
        self._model: type[BaseModel] | None = None
        if info is None:
            tool_name = name or fn.__name__
            summary, params = _docstring(fn)
            self._model = _arguments_model(fn, tool_name, self.ctx_param, params)
            schema = _clean_schema(self._model.model_json_schema())
            info = ToolInfo(name=tool_name, description=description if description is not None else summary,
                            parameters=schema)
        self.info = info
        self.name = info.name

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    def parse(self, args_json: str) -> dict[str, Any]:
        """The keyword arguments for the function, checked; `ToolArgumentError` tells the model what is wrong."""
        try:
            data = json.loads(args_json) if args_json and args_json.strip() else {}
        except json.JSONDecodeError as err:
            raise ToolArgumentError(f"the arguments are not valid JSON ({err.msg} at position {err.pos}); "
                                    "send a JSON object") from None
        except ValueError:  # an integer longer than Python parses (sys.get_int_max_str_digits())
            raise ToolArgumentError("the arguments hold a number too long to read; send shorter numbers") from None
        except RecursionError:  # nested deeper than the parser goes
            raise ToolArgumentError("the arguments are nested too deeply to read; send a flatter JSON object") from None
        if not isinstance(data, dict):
            raise ToolArgumentError(f"the arguments must be a JSON object, not {type(data).__name__}")
        if self._model is None:
            return data
        try:
            checked = self._model.model_validate(data)
        except RecursionError:
            raise ToolArgumentError("the arguments are nested too deeply to check; send a flatter JSON object") from None
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in err.errors())
            raise ToolArgumentError(f"the arguments do not fit the tool: {problems}") from None
        return {name: getattr(checked, name) for name in type(checked).model_fields}

    async def invoke(self, args_json: str, ctx: ToolContext) -> str:
        """Run the tool on the model's arguments and return its result as text."""
        kwargs = self._kwargs(args_json, ctx)
        if self.streams:
            return "".join([_text(c) async for c in self.fn(**kwargs)])
        if not self.is_async and _off_the_loop():  # a sync tool may block: never on the run's event loop
            result = await in_daemon_thread(functools.partial(self.fn, **kwargs))
        else:
            result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return _text(result)

    async def stream(self, args_json: str, ctx: ToolContext) -> AsyncIterator[str]:
        """Run the tool and yield its result as text chunks (one chunk for an invokable tool)."""
        if not self.streams:
            yield await self.invoke(args_json, ctx)
            return
        async for chunk in self.fn(**self._kwargs(args_json, ctx)):
            yield _text(chunk)

    def _kwargs(self, args_json: str, ctx: ToolContext) -> dict[str, Any]:
        kwargs = self.parse(args_json)
        if self.ctx_param is not None:
            kwargs[self.ctx_param] = ctx
        return kwargs


def tool(fn: Callable[..., Any] | None = None, *, name: str | None = None,
         description: str | None = None) -> Any:
    """Make a `Tool` of a typed function: `@tool` or `@tool(name=..., description=...)`.

    The description defaults to the docstring's first paragraph; an `Args:` section describes the
    parameters. The JSON schema comes from the signature (pydantic).
    """
    if fn is None:
        return lambda f: Tool(f, name=name, description=description)
    return Tool(fn, name=name, description=description)


def _off_the_loop() -> bool:
    scope = current_task()
    return scope is not None and getattr(scope.run, "offload_sync", False)


def as_tool(obj: Any) -> Tool:
    """A `Tool` from a `Tool` or a plain function."""
    return obj if isinstance(obj, Tool) else Tool(obj)


def _context_parameter(fn: Callable[..., Any]) -> str | None:
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to the parameter name
        hints = {}
    for name in inspect.signature(fn).parameters:
        if hints.get(name) is ToolContext or name == "ctx":
            return name
    return None


def _arguments_model(fn: Callable[..., Any], tool_name: str, ctx_param: str | None,
                     descriptions: dict[str, str]) -> type[BaseModel]:
    try:
        hints = get_type_hints(fn)
    except Exception:
        hints = {}
    fields: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if name == ctx_param or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(name, Any)
        default = ... if param.default is param.empty else param.default
        fields[name] = (annotation, Field(default, description=descriptions.get(name)))
    model_name = re.sub(r"\W", "_", tool_name) + "_arguments"
    return create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema a model reads: no pydantic titles, `additionalProperties: false` kept."""
    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    cleaned = strip(schema)
    cleaned.setdefault("properties", {})
    return cleaned


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """(first paragraph, {parameter: description}) from a Google-style docstring."""
    doc = inspect.getdoc(fn) or ""
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.M)
    if match:
        for line in match.group(1).splitlines():
            m = re.match(r"\s*(\w+)(?:\s*\([^)]*\))?\s*:\s*(.+)", line)
            if m:
                params[m.group(1)] = m.group(2).strip()
    return summary, params


def _text(value: Any) -> str:
    """A tool's result as the text the model reads."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)
