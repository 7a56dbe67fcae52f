"""B7: a ReAct agent, 20 iterations, a scripted model asking for 2 tools in parallel each turn, SQLite,
per-step durable. Figure: ms per iteration (one model call plus its two tool calls), model and tool
time negligible (both answer at once), so what is measured is the engine, its agent layer and the store.

- Waypoint: `ChatModelAgent` with `ScriptedChatModel` (19 turns of two tool calls, then an answer) and
  two `@tool`s; `SQLiteStore(file)`, `durability="step"` (with the tool ledger); `await app.ainvoke`.
- LangGraph: `langgraph.prebuilt.create_react_agent` with a scripted `BaseChatModel` giving the same
  turns and two `@tool`s; `SqliteSaver(file)`, `durability="sync"`; sync `app.invoke`.

    python -m bench.b7_react --impl waypoint --case sqlite
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from bench._harness import Target, child_main
from bench._stores import SQLITE_CASES, langgraph_saver, waypoint_store

ITERATIONS = 20
CASES = SQLITE_CASES


def _check(calls: int) -> Any:
    def check(count: int) -> None:
        if count != calls:
            raise AssertionError(f"wrong result: {count} tool results, expected {calls}")
    return check


def make_waypoint(case: str, api: str, middlewares: Sequence[Any] = ()) -> Target:
    """`middlewares`: the agent's (bench/ecosystem.py times B7 with tracing on)."""
    store, close = waypoint_store(case)
    from waypoint.engine import ChatModelAgent, Message, ToolCall, tool
    from waypoint.engine.models import ScriptedChatModel

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    @tool
    def compute(x: int) -> int:
        """Compute something."""
        return x * 2

    def script() -> list[Any]:
        turns: list[Any] = [Message.assistant(tool_calls=[
            ToolCall(id=f"call_{i}_a", name="lookup", arguments=f'{{"key": "k{i}"}}'),
            ToolCall(id=f"call_{i}_b", name="compute", arguments=f'{{"x": {i}}}'),
        ]) for i in range(ITERATIONS - 1)]
        return turns + ["done"]

    async def call(i: int) -> int:
        model = ScriptedChatModel(script())
        agent = ChatModelAgent(name="b7", model=model, tools=[lookup, compute], max_iterations=ITERATIONS + 1,
                               middlewares=list(middlewares))
        out = await agent.compile(store=store, durability="step").ainvoke("go", checkpoint_id=f"b7-{i}")
        if out.content != "done":
            raise AssertionError(f"wrong answer {out.content!r}")
        return sum(1 for m in model.calls[-1].messages if m.role == "tool")  # what the last call saw

    if api != "async":
        raise ValueError("Waypoint's agent runs on the async API")
    return Target(call=call, divisor=ITERATIONS * 1000, check=_check(2 * (ITERATIONS - 1)), close=close)


def make_langgraph(case: str, api: str) -> Target:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool as lc_tool
    from langgraph.prebuilt import create_react_agent

    @lc_tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    @lc_tool
    def compute(x: int) -> int:
        """Compute something."""
        return x * 2

    class Scripted(BaseChatModel):
        """Answers from the number of AI messages so far: 19 turns of two tool calls, then 'done'."""

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            turn = sum(1 for m in messages if m.type == "ai")
            if turn >= ITERATIONS - 1:
                msg = AIMessage(content="done")
            else:
                msg = AIMessage(content="", tool_calls=[
                    {"id": f"call_{turn}_a", "name": "lookup", "args": {"key": f"k{turn}"}},
                    {"id": f"call_{turn}_b", "name": "compute", "args": {"x": turn}},
                ])
            return ChatResult(generations=[ChatGeneration(message=msg)])

    saver, close = langgraph_saver(case, api)
    with warnings.catch_warnings():  # "moved to langchain.agents": the prebuilt agent is still langgraph's
        warnings.simplefilter("ignore")
        app = create_react_agent(Scripted(), [lookup, compute], checkpointer=saver)

    def call(i: int) -> int:
        out = app.invoke({"messages": [("user", "go")]},
                         {"recursion_limit": 200, "configurable": {"thread_id": f"b7-{i}"}}, durability="sync")
        if out["messages"][-1].content != "done":
            raise AssertionError("wrong answer")
        return sum(1 for m in out["messages"] if m.type == "tool")

    if api != "sync":
        raise ValueError("the LangGraph side runs its sync API")
    return Target(call=call, divisor=ITERATIONS * 1000, check=_check(2 * (ITERATIONS - 1)), close=close)


def make(impl: str, case: str, api: str) -> Target:
    return make_waypoint(case, api) if impl == "waypoint" else make_langgraph(case, api)


if __name__ == "__main__":
    child_main(make, CASES, "ms_per_iteration", __doc__, waypoint_api="async")
