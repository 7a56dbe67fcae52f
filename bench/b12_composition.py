"""B12: a 2-level composition — a supervisor agent whose tool is another agent, which calls 2 tools in
parallel per turn for 10 iterations — SQLite, per-step durable at both levels. Figure: ms per inner
iteration (one model call of the inner agent plus its two tool calls), model and tool time negligible.

One run: the supervisor's model calls the inner agent once; the inner agent makes 10 model calls (9 turns of
two tool calls, then its answer); the supervisor answers. The models answer from the conversation (no
script to rebuild), so each side compiles once.

- Waypoint: `ChatModelAgent` supervisor with `AgentTool(researcher)`; the researcher's run is nested in the
  supervisor's tool call and each of its steps is recorded in the supervisor's checkpoint;
  `SQLiteStore(file)`, `durability="step"`; `await app.ainvoke`.
- LangGraph: its tool-calling supervisor pattern with the bench extra's packages (no `langgraph-supervisor`):
  `create_react_agent` supervisor whose tool invokes the researcher (`create_react_agent`, no checkpointer of
  its own) with the tool's `RunnableConfig`, so the researcher runs as a subgraph checkpointed in the
  supervisor's thread under its own namespace; `SqliteSaver(file)`, `durability="sync"`; sync `app.invoke`.
  (`notes.subgraph_checkpoints` counts the researcher's checkpoints, proving it is checkpointed per step.)

    python -m bench.b12_composition --impl waypoint --case sqlite
"""

from __future__ import annotations

import warnings
from typing import Any

from bench._harness import Target, child_main
from bench._stores import SQLITE_CASES, langgraph_saver, waypoint_store

ITERATIONS = 10
CASES = SQLITE_CASES


def _check(result: Any) -> None:
    if result != f"done after {ITERATIONS - 1} turns":
        raise AssertionError(f"wrong answer {result!r}")


def make_waypoint(case: str, api: str) -> Target:
    store, close = waypoint_store(case)
    from waypoint.engine import AgentTool, ChatModelAgent, Message, ToolCall, tool

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    @tool
    def compute(x: int) -> int:
        """Compute something."""
        return x * 2

    class Researcher:
        name = "researcher-model"

        async def generate(self, messages: Any, **_: Any) -> Message:
            turn = sum(1 for m in messages if m.role == "assistant")
            if turn >= ITERATIONS - 1:
                return Message.assistant(f"done after {turn} turns")
            return Message.assistant(tool_calls=[
                ToolCall(id=f"call_{turn}_a", name="lookup", arguments=f'{{"key": "k{turn}"}}'),
                ToolCall(id=f"call_{turn}_b", name="compute", arguments=f'{{"x": {turn}}}')])

    class Supervisor:
        name = "supervisor-model"

        async def generate(self, messages: Any, **_: Any) -> Message:
            if messages[-1].role == "tool":
                return Message.assistant(messages[-1].content)
            return Message.assistant(tool_calls=[ToolCall(id="call_r", name="researcher",
                                                          arguments='{"request": "look it up"}')])

    researcher = ChatModelAgent(name="researcher", model=Researcher(), tools=[lookup, compute],
                                max_iterations=ITERATIONS + 1)
    supervisor = ChatModelAgent(name="supervisor", model=Supervisor(), tools=[AgentTool(researcher)])
    app = supervisor.compile(store=store, durability="step")

    async def call(i: int) -> str:
        return (await app.ainvoke("go", checkpoint_id=f"b12-{i}")).content

    if api != "async":
        raise ValueError("Waypoint's agent runs on the async API")
    return Target(call=call, divisor=ITERATIONS * 1000, check=_check, close=close)


def _langgraph_models() -> tuple[Any, Any]:
    """The scripted researcher and supervisor models, as LangChain chat models."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class Scripted(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            return ChatResult(generations=[ChatGeneration(message=self.answer(messages, AIMessage))])

    class Researcher(Scripted):
        def answer(self, messages: Any, AIMessage: Any) -> Any:
            turn = sum(1 for m in messages if m.type == "ai")
            if turn >= ITERATIONS - 1:
                return AIMessage(content=f"done after {turn} turns")
            return AIMessage(content="", tool_calls=[
                {"id": f"call_{turn}_a", "name": "lookup", "args": {"key": f"k{turn}"}},
                {"id": f"call_{turn}_b", "name": "compute", "args": {"x": turn}}])

    class Supervisor(Scripted):
        def answer(self, messages: Any, AIMessage: Any) -> Any:
            if messages[-1].type == "tool":
                return AIMessage(content=messages[-1].content)
            return AIMessage(content="", tool_calls=[{"id": "call_r", "name": "researcher",
                                                      "args": {"request": "look it up"}}])

    return Researcher(), Supervisor()


def make_langgraph(case: str, api: str) -> Target:
    from langchain_core.runnables import RunnableConfig
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

    researcher_model, supervisor_model = _langgraph_models()
    globals()["RunnableConfig"] = RunnableConfig  # the tool's annotations are strings, read in this module
    saver, close = langgraph_saver(case, api)
    with warnings.catch_warnings():  # "moved to langchain.agents": the prebuilt agent is still langgraph's
        warnings.simplefilter("ignore")
        inner = create_react_agent(researcher_model, [lookup, compute], name="researcher")

        @lc_tool
        def researcher(request: str, config: RunnableConfig) -> str:
            """Ask the researcher."""
            out = inner.invoke({"messages": [("user", request)]}, config)  # a subgraph of the supervisor's run
            return out["messages"][-1].content

        app = create_react_agent(supervisor_model, [researcher], checkpointer=saver, name="supervisor")
    notes: dict[str, Any] = {}

    def call(i: int) -> str:
        config = {"recursion_limit": 200, "configurable": {"thread_id": f"b12-{i}"}}
        out = app.invoke({"messages": [("user", "go")]}, config, durability="sync")
        if i == 0 and saver is not None:
            nested = [c for c in saver.list(None) if c.config["configurable"].get("checkpoint_ns")]
            notes["subgraph_checkpoints"] = len(nested)
            if not nested:
                raise AssertionError("the researcher was not checkpointed in the supervisor's thread")
        return out["messages"][-1].content

    if api != "sync":
        raise ValueError("the LangGraph side runs its sync API")
    return Target(call=call, divisor=ITERATIONS * 1000, check=_check, close=close, notes=notes)


def make(impl: str, case: str, api: str) -> Target:
    return make_waypoint(case, api) if impl == "waypoint" else make_langgraph(case, api)


if __name__ == "__main__":
    child_main(make, CASES, "ms_per_iteration", __doc__, waypoint_api="async")
