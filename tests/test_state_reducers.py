"""Per-field reducers: nodes write state with `Update`, parallel branches merge field by field (in graph order,
whatever order they finished in), a field without a reducer takes one write per step, and the merge survives
a pause and a resume in another process. Also: append-owned fields are stored by appending whatever the items
are, and an in-place change of one is still stored when the run stops."""

from __future__ import annotations

import asyncio
import json
import operator
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypedDict

import pytest

from waypoint.engine import (
    END,
    START,
    Graph,
    GraphBuildError,
    GraphRunError,
    NodeError,
    RetryPolicy,
    Update,
    add_messages,
    append,
)
from waypoint.engine.codec.serde import Serializer, register_type
from waypoint.stores import MemoryStore, SQLiteStore

from measuring import Measuring

SCRIPT = Path(__file__).parent / "procs" / "state_graphs.py"


@register_type(name="tests.reducers.Research")
@dataclass
class Research:
    messages: Annotated[list, add_messages] = field(default_factory=list)
    notes: Annotated[list[str], append] = field(default_factory=list)
    best: Annotated[int, max] = 0
    summary: str = ""


def fan_out(nodes: dict, *, state=Research, join=None, trigger="any", **opts):
    """START -> every node -> join -> END. The edges are added in the reverse order of the nodes, so the
    tasks start (and are listed) in an order other than the graph's."""
    g = Graph(name="fan", state=state)
    for key, fn in nodes.items():
        g.add_node(key, fn)
    g.add_node("join", join or (lambda parts, state: sorted(parts)))
    for key in reversed(nodes):
        g.add_edge(START, key)
        g.add_edge(key, "join")
    g.add_edge("join", END)
    return g.compile(trigger=trigger, **opts)


async def test_parallel_branches_merge_field_by_field_in_graph_order_whatever_finished_first():
    a_done, c_done = asyncio.Event(), asyncio.Event()
    finished: list[str] = []

    async def a(x):
        await c_done.wait()  # c finishes first, then a, then b
        finished.append("a")
        a_done.set()
        return Update({"notes": ["a"], "best": 3, "messages": [{"id": "m1", "text": "draft"}]}, output={"a": 1})

    async def b(x):
        await a_done.wait()
        finished.append("b")
        return Update({"notes": ["b"], "best": 7, "messages": [{"id": "m1", "text": "final"}, {"id": "m2"}]},
                      output={"b": 2})

    async def c(x):
        finished.append("c")
        c_done.set()
        return Update({"notes": ["c"], "best": 5, "summary": "c was here"}, output={"c": 3})

    seen = {}

    def join(parts, state):
        seen.update(notes=list(state.notes), best=state.best, messages=list(state.messages), summary=state.summary)
        return sorted(parts)

    app = fan_out({"a": a, "b": b, "c": c}, join=join)
    assert await app.ainvoke(0) == ["a", "b", "c"]  # the outputs still flow along the edges
    assert finished == ["c", "a", "b"]
    assert seen == {
        "notes": ["a", "b", "c"],  # append, in the order the nodes were added, not the order they finished
        "best": 7,  # max
        "messages": [{"id": "m1", "text": "final"}, {"id": "m2"}],  # add_messages: b's m1 replaced a's
        "summary": "c was here",  # no reducer, one writer: replaced
    }


async def test_a_dag_applies_each_batch_as_it_finishes_in_graph_order_within_the_batch():
    """docs/state.md: Pregel waits for the superstep and applies in graph order; a DAG applies eagerly, so
    tasks that finished apart are applied in the order they finished, and one batch in graph order."""
    slow_may_go = asyncio.Event()

    def writer(name, wait=None):
        async def node(x):
            if wait is not None:
                await wait.wait()
                await asyncio.sleep(0.02)  # the others' batch is applied first
            elif name == "fast":
                slow_may_go.set()
            return Update({"notes": [name]}, output={name: 1})
        return node

    nodes = {"slow": writer("slow", slow_may_go), "fast": writer("fast"), "x": writer("x"), "y": writer("y")}
    seen = []
    join = lambda parts, state: seen.append(list(state.notes)) or "done"  # noqa: E731
    assert await fan_out(nodes, join=join).ainvoke(0) == "done"
    assert await fan_out(nodes, join=join, trigger="all").ainvoke(0) == "done"
    # Pregel: graph order. DAG: fast, x and y finish together (their batch in graph order), slow after them.
    assert seen == [["slow", "fast", "x", "y"], ["fast", "x", "y", "slow"]]


async def test_a_field_without_a_reducer_written_by_two_branches_in_one_step_is_an_error_naming_both():
    app = fan_out({"a": lambda x: Update({"summary": "a"}, output={"a": 1}),
                   "b": lambda x: Update({"summary": "b"}, output={"b": 1})}, store=MemoryStore())
    with pytest.raises(GraphRunError, match=r"field 'summary' is written by both 'a' and 'b'.*declare one"):
        await app.ainvoke(0, checkpoint_id="r")
    snap = await app.get_run("r")
    assert snap.meta.status == "failed" and snap.state.summary == ""  # the failed step changed nothing


async def test_in_a_dag_two_writers_that_may_run_in_parallel_are_refused_one_after_the_other_is_not():
    # a and b are parallel branches; d comes after b: b then d may both write `summary`, a and b may not.
    def node(name):
        return lambda x: Update({"summary": name}, output={name: 1})

    g = Graph(name="dag", state=Research)
    for key in "abd":
        g.add_node(key, node(key))
    g.add_edge(START, "a")
    g.add_edge(START, "b")
    g.add_edge("b", "d")
    g.add_edge("a", END)
    g.add_edge("d", END)
    app = g.compile(trigger="all")
    with pytest.raises(GraphRunError, match="'summary' is written by '(a|b)' and by '(a|b)', which may run in parallel"):
        await app.ainvoke(0)

    g = Graph(name="dag2", state=Research)
    for key in "bd":
        g.add_node(key, node(key))
    g.add_node("show", lambda x, state: state.summary)
    g.add_edge(START, "b")
    g.add_edge("b", "d")
    g.add_edge("d", "show")
    g.add_edge("show", END)
    assert await g.compile(trigger="all").ainvoke(0) == "d"


async def test_writes_to_unknown_fields_or_to_a_state_without_fields_name_the_field():
    app = fan_out({"a": lambda x: Update({"sumary": "typo"}, output={"a": 1})})
    with pytest.raises(GraphRunError, match=r"'a' writes state field 'sumary'.*\(its fields: best, messages, notes, summary\)"):
        await app.ainvoke(0)
    g = Graph(name="plain")
    g.add_node("a", lambda x: Update({"notes": ["x"]}))
    g.add_edge(START, "a")
    g.add_edge("a", END)
    with pytest.raises(GraphRunError, match="state has no fields"):
        await g.compile().ainvoke(0)


async def test_typed_dict_state_with_operator_add_starts_from_an_empty_list_as_in_langgraph():
    class S(TypedDict, total=False):
        log: Annotated[list, operator.add]
        last: str

    class T(TypedDict, total=False):  # the built-ins, on fields the dict does not hold yet
        notes: Annotated[list, append]
        messages: Annotated[list, add_messages]

    seen = []
    app = fan_out({"a": lambda x: Update({"log": ["a"]}, output={"a": 1}),
                   "b": lambda x: Update({"log": ["b"], "last": "b"}, output={"b": 1})},
                  state=S, join=lambda parts, state: seen.append(dict(state)) or "done")
    assert await app.ainvoke(0) == "done"
    app = fan_out({"a": lambda x: Update({"notes": ["a"], "messages": [{"id": 1}]}, output={"a": 1}),
                   "b": lambda x: Update({"notes": ["b"], "messages": [{"id": 1, "v": 2}]}, output={"b": 1})},
                  state=T, join=lambda parts, state: seen.append(dict(state)) or "done")
    assert await app.ainvoke(0) == "done"
    assert seen == [{"log": ["a", "b"], "last": "b"}, {"notes": ["a", "b"], "messages": [{"id": 1, "v": 2}]}]


async def test_a_post_handler_may_write_too_after_a_retried_node():
    attempts = []

    def flaky(x):
        attempts.append(x)
        if len(attempts) < 3:
            raise ConnectionError("try again")
        return Update({"notes": ["node"]}, output=x + 1)

    g = Graph(name="post", state=Research)
    g.add_node("n", flaky, post=lambda out, state: Update({"notes": ["post"], "best": out}, output=out * 10),
               retry=RetryPolicy(max_attempts=3, initial_interval=0, jitter=False))
    g.add_node("show", lambda x, state: (x, list(state.notes), state.best))
    g.add_edge(START, "n")
    g.add_edge("n", "show")
    g.add_edge("show", END)
    assert await g.compile().ainvoke(1) == (20, ["node", "post"], 2)


async def test_a_reducer_that_fails_is_a_run_error_naming_field_and_node():
    app = fan_out({"a": lambda x: Update({"notes": "not a list"}, output={"a": 1})})
    with pytest.raises(GraphRunError, match="reducer of state field 'notes' failed on the write of node 'a'"):
        await app.ainvoke(0)


def extend_in_place(current, update):
    """A reducer of one's own that grows the list it was given (as `operator.iadd` does)."""
    current.extend(update)
    return current


def picky(current, update):
    if "bad" in update:
        raise ValueError("refuses 'bad'")
    return current + update


@register_type(name="tests.reducers.Tagged")
@dataclass
class Tagged:
    tags: Annotated[list, append] = field(default_factory=list)
    notes: Annotated[list, append] = field(default_factory=list)


@register_type(name="tests.reducers.TaggedOwn")
@dataclass
class TaggedOwn:
    tags: Annotated[list, extend_in_place] = field(default_factory=list)
    notes: Annotated[list, picky] = field(default_factory=list)


@pytest.mark.parametrize("state, bad", [(Tagged, "a model's text, not a list"), (TaggedOwn, ["bad"])],
                         ids=["append-given-a-str", "own-reducers-one-in-place"])
async def test_a_dag_task_whose_write_fails_writes_nothing_and_its_resume_applies_it_once(state, bad):
    """A task's writes are applied all or nothing: b's `tags` is not applied when its `notes` fails, the failed
    version does not hold it, and the resume (b runs again) applies each write once."""
    runs: list[str] = []
    broken = [True]

    async def a(x):
        runs.append("a")
        return Update({"tags": ["a"], "notes": ["a"]}, output={"a": 1})

    async def b(x):
        runs.append("b")
        await asyncio.sleep(0.01)  # a's batch is checkpointed first; b fails in a batch of its own
        return Update({"tags": ["b"], "notes": bad if broken[0] else ["b"]}, output={"b": 2})

    g = Graph(name="tagged", state=state)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_node("join", lambda parts, state: (list(state.tags), list(state.notes)))
    for key in ("a", "b"):
        g.add_edge(START, key)
        g.add_edge(key, "join")
    g.add_edge("join", END)
    app = g.compile(trigger="all", store=MemoryStore())
    with pytest.raises(GraphRunError, match="reducer of state field 'notes' failed on the write of node 'b'"):
        await app.ainvoke(0, checkpoint_id="r")
    snap = await app.get_run("r")
    assert snap.meta.status == "failed" and snap.state.tags == ["a"] and snap.state.notes == ["a"]
    for meta in await app.store.history("r"):  # no version ever held half of b's writes
        assert "b" not in (await app.get_run("r", version=meta.version)).state.tags
    broken[0] = False
    assert await app.ainvoke(None, checkpoint_id="r") == (["a", "b"], ["a", "b"])
    assert runs == ["a", "b", "b"]


def test_a_state_that_refuses_a_value_keeps_every_field_of_that_write_as_it_was():
    from pydantic import BaseModel, ConfigDict

    from waypoint.engine.shape.reducers import apply_writes, reducers_of

    class Checked(BaseModel):
        model_config = ConfigDict(validate_assignment=True)
        tags: Annotated[list, operator.add] = []
        log: Annotated[list, append] = []
        count: int = 0

    state = Checked(tags=["a"], log=["a"])
    reducers = reducers_of(Checked, "g")
    with pytest.raises(GraphRunError, match="refused the new value of field 'count'"):
        apply_writes(state, [("b", {"tags": ["b"], "log": ["b"], "count": "many"})], reducers, None, "g")
    assert (state.tags, state.log, state.count) == (["a"], ["a"], 0)


def test_two_reducers_on_one_field_is_a_build_error():
    @dataclass
    class Bad:
        x: Annotated[list, append, operator.add] = field(default_factory=list)

    g = Graph(name="bad", state=Bad)
    g.add_node("a", lambda x: x)
    g.add_edge(START, "a")
    g.add_edge("a", END)
    with pytest.raises(GraphBuildError, match="field 'x' declares 2 reducers"):
        g.compile()


async def test_a_subgraph_sharing_its_parents_state_writes_through_the_parents_reducers():
    inner = Graph(name="inner")
    inner.add_node("x", lambda v: Update({"notes": ["inner"]}, output=v))
    inner.add_edge(START, "x")
    inner.add_edge("x", END)
    app = fan_out({"sub": inner, "a": lambda v: Update({"notes": ["a"]}, output={"a": 1})},
                  join=lambda parts, state: list(state.notes))
    assert await app.ainvoke({"sub": 0}) == ["inner", "a"]


def test_add_messages_replaces_by_id_and_appends_the_rest():
    class Msg:
        def __init__(self, id, text):
            self.id, self.text = id, text

        def __repr__(self):
            return f"{self.id}:{self.text}"

    msgs = add_messages(None, [Msg("1", "a"), Msg(None, "b"), {"id": "2", "text": "c"}])
    msgs = add_messages(msgs, [{"id": "1", "text": "A"}, Msg(None, "d"), Msg("2", "C")])
    assert [(getattr(m, "text", None) or m["text"]) for m in msgs] == ["A", "b", "C", "d"]
    with pytest.raises(TypeError, match="list or tuple"):
        add_messages(msgs, Msg("3", "x"))


# --- across processes -----------------------------------------------------------------------------------

def proc(*args: str) -> dict:
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_reducers_merge_parallel_branches_across_a_pause_and_a_resume_in_another_process(tmp_path):
    db = str(tmp_path / "runs.db")
    paused = proc(db, "reduce-pause", "r1")  # a and c finish and write; b pauses
    done = proc(db, "reduce-resume", "r1", paused["interrupt"])  # another process: b runs and writes
    assert done["output"] == ["a", "b", "c"]
    assert done["state"] == {
        "messages": [{"id": "m1", "text": "final"}, {"id": "m2", "text": "b"}],  # b replaced a's draft by ID
        "notes": ["a", "c", "b"],  # a and c merged in the first step (graph order), b when it ran
        "best": 7,
        "summary": "a,c,b",
    }


# --- checkpoints of append-owned fields --------------------------------------------------------------------

@register_type(name="tests.reducers.Log")
@dataclass
class Log:
    entries: Annotated[list, append] = field(default_factory=list)
    n: int = 0


class Counting(Serializer):
    """Records how many bytes each step's checkpoint encoded for list items (what a step costs)."""

    def __init__(self):
        super().__init__()
        self.packed: list[int] = []

    def pack(self, value, *, root="value"):
        data = super().pack(value, root=root)
        self.packed.append(len(data))
        return data


def log_loop(store, steps: int, *, edit_at: int | None = None, serializer=None):
    def step(n, state):
        if n == edit_at:
            state.entries[0]["seen"] = True  # in place: breaks the append-owned contract
        return Update({"entries": [{"n": n, "text": "x" * 300}], "n": n + 1}, output=n + 1)

    g = Graph(name="log", state=Log)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_branch("step", lambda n: "step" if n < steps else END, ends=["step", END])
    return g.compile(store=store, max_steps=steps + 5, serializer=serializer)


async def test_an_append_owned_list_of_dicts_costs_each_step_only_what_it_appended(tmp_path):
    store, codec = Measuring(tmp_path / "log.db"), Counting()
    await log_loop(store, 80, serializer=codec).ainvoke(0, checkpoint_id="l")
    growing = store.written[3:79]
    assert max(growing) - min(growing) < 60  # each step writes one entry, not the list of dicts
    assert max(codec.packed[5:-5]) < 400  # and encodes only it: the old entries are not looked at
    snap = await log_loop(SQLiteStore(tmp_path / "log.db"), 80).get_run("l")
    assert [e["n"] for e in snap.state.entries] == list(range(80))


async def test_an_in_place_change_of_an_append_owned_item_is_stored_when_the_run_stops_and_warned(tmp_path):
    store = SQLiteStore(tmp_path / "edit.db")
    with pytest.warns(RuntimeWarning, match="state field 'entries' has an append reducer.*changed in place"):
        await log_loop(store, 20, edit_at=10).ainvoke(0, checkpoint_id="e")
    snap = await log_loop(SQLiteStore(tmp_path / "edit.db"), 20).get_run("e")
    assert snap.state.entries[0] == {"n": 0, "text": "x" * 300, "seen": True}  # the final version is exact
    assert len(snap.state.entries) == 20


async def test_a_reducer_write_that_replaces_an_item_is_stored_exactly_at_every_step(tmp_path):
    @register_type(name="tests.reducers.Chat")
    @dataclass
    class Chat:
        messages: Annotated[list, add_messages] = field(default_factory=list)

    def talk(n):
        if n == 5:
            return Update({"messages": [{"id": "m0", "text": "edited"}]}, output=n + 1)
        return Update({"messages": [{"id": f"m{n}", "text": "t"}]}, output=n + 1)

    g = Graph(name="chat", state=Chat)
    g.add_node("talk", talk)
    g.add_edge(START, "talk")
    g.add_branch("talk", lambda n: "talk" if n < 8 else END, ends=["talk", END])
    store = MemoryStore()
    app = g.compile(store=store, max_steps=20)
    await app.ainvoke(0, checkpoint_id="c")
    history = await store.history("c")
    # the version written right after the replacing step (step 6) holds it, not only the final one
    after = next(m for m in history if m.step == 6)
    snap = await app.get_run("c", version=after.version)
    assert snap.state.messages[0] == {"id": "m0", "text": "edited"} and len(snap.state.messages) == 5


async def test_a_conversation_of_messages_costs_each_step_only_what_it_appended(tmp_path):
    """No reducer: the list is compared with our copy of it at C speed, and only the new message is encoded."""
    from waypoint.engine import Message

    @register_type(name="tests.reducers.Convo")
    @dataclass
    class Convo:
        messages: list = field(default_factory=list)

    def talk(n, state):
        state.messages.append(Message.user(f"{n:04d}" + "x" * 300))
        return n + 1

    g = Graph(name="convo", state=Convo)
    g.add_node("talk", talk)
    g.add_edge(START, "talk")
    g.add_branch("talk", lambda n: "talk" if n < 80 else END, ends=["talk", END])
    codec = Counting()
    app = g.compile(store=SQLiteStore(tmp_path / "c.db"), max_steps=100, serializer=codec)
    await app.ainvoke(0, checkpoint_id="c")
    assert max(codec.packed[5:-5]) < 1000  # one message (~400 bytes), not the conversation (up to 32 KB)
    assert len((await app.get_run("c")).state.messages) == 80


@pytest.mark.parametrize("durability, first_item", [("step", "orig"), ("exit", "changed in place")])
async def test_a_failure_stores_the_last_finished_step_as_written_so_an_unseen_in_place_change_is_lost(durability,
                                                                                                   first_item):
    """docs/state.md: a pause or an end stores an append-owned list exactly; a failure stores the last finished
    step — in durability="step" as that step's version was written (the change was never looked at), in "exit"
    as it was kept in memory (whole)."""
    def second(x, state):
        state.entries[0]["v"] = "changed in place"  # breaks the append-owned contract
        return Update({"entries": [{"v": "second"}]}, output=x)

    def third(x, state):
        raise RuntimeError("boom")

    g = Graph(name="stop", state=Log)
    g.add_node("first", lambda x: Update({"entries": [{"v": "orig"}]}, output=x))
    g.add_node("second", second)
    g.add_node("third", third)
    g.add_edge(START, "first")
    g.add_edge("first", "second")
    g.add_edge("second", "third")
    g.add_edge("third", END)
    app = g.compile(store=MemoryStore(), durability=durability)
    with pytest.raises(NodeError):
        await app.ainvoke(0, checkpoint_id="s")
    snap = await app.get_run("s")
    assert snap.meta.status == "failed" and [e["v"] for e in snap.state.entries] == [first_item, "second"]
