"""`Workflow`: a DAG whose nodes take named fields of their predecessors' outputs (nested paths, the whole
value, static values), data-only and control-only dependencies, and mappings checked at `compile()` against
the nodes' annotations — a wrong one fails there, naming the field."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel, ConfigDict

from waypoint.engine import (
    END,
    START,
    Graph,
    GraphBuildError,
    GraphInterrupted,
    GraphMismatch,
    GraphRunError,
    Interrupt,
    Workflow,
    from_field,
    get_resume_context,
    map_fields,
    to_field,
)
from waypoint.stores import MemoryStore


@dataclass
class Meta:
    title: str
    pages: int


@dataclass
class Doc:
    meta: Meta
    chunks: list[str]


@dataclass
class ScoreRequest:
    chunks: list[str]
    question: str
    top_k: int = 1
    source: dict = field(default_factory=dict)


@dataclass
class Scored:
    best: str
    ranked: list[str]


class Answer(BaseModel):
    text: str
    title: str


def load(path: str) -> Doc:
    return Doc(meta=Meta(title=path.upper(), pages=3), chunks=["alpha beta", "gamma", "beta beta"])


def score(req: ScoreRequest) -> Scored:
    word = req.question.split()[-1]
    ranked = sorted(req.chunks, key=lambda c: -c.count(word))[:req.top_k]
    return Scored(best=ranked[0], ranked=ranked)


def answer(a: Answer) -> str:
    return f"{a.title}: {a.text}"


def rag(**compile_opts):
    wf = Workflow(name="rag")
    wf.add_node("load", load).add_input(START, from_field("path"))  # a field -> the whole input
    wf.add_node("score", score) \
        .add_input("load", map_fields("chunks", "chunks")) \
        .add_input(START, {"question": "question"}, data_only=True) \
        .set_static_value("top_k", 2) \
        .set_static_value(("source", "kind"), "file")
    wf.add_node("answer", answer) \
        .add_input("score", map_fields("best", "text")) \
        .add_input("load", map_fields("meta.title", "title"))  # a nested field
    wf.end().add_input("answer", to_field("reply")).add_input("load", map_fields("meta.pages", "stats.pages"))
    return wf.compile(**compile_opts)


async def test_fields_flow_by_name_into_built_inputs_and_the_end_assembles_the_result():
    out = await rag().ainvoke({"path": "notes.txt", "question": "what about beta"})
    assert out == {"reply": "NOTES.TXT: beta beta", "stats": {"pages": 3}}


async def test_a_stream_of_a_workflow_yields_what_end_assembled():
    chunks = [c async for c in rag().astream({"path": "n", "question": "beta"})]
    assert chunks == [{"reply": "N: beta beta", "stats": {"pages": 3}}]


async def test_control_only_and_data_only_dependencies():
    order: list[str] = []

    def audit(x):
        order.append("audit")
        return "audit-log"

    def report(d: dict) -> dict:
        order.append("report")
        return d

    wf = Workflow(name="deps")
    wf.add_node("audit", audit).add_input(START)
    wf.add_node("report", report).add_input(START, to_field("request")).add_dependency("audit")
    wf.end().add_input("report")
    assert await wf.compile().ainvoke("q") == {"request": "q"}  # audit's output is not part of its input
    assert order == ["audit", "report"]  # but it ran after audit

    # a node waiting on a dependency does not keep its output: nothing about it is stored with the run
    release = asyncio.Event()

    class AfterACheckpoint:
        seen = 0

        def on_checkpoint(self, event):  # the claim, then the step in which `handle` finished
            self.seen += 1
            if self.seen == 2:
                release.set()

    async def slow(x):
        await release.wait()  # finishes only after a checkpoint was written while `use` waited on it
        return {"n": x}

    async def handle(x):
        return object()  # not something a checkpoint can store

    wf = Workflow(name="stored")
    wf.add_node("handle", handle).add_input(START)
    wf.add_node("slow", slow).add_input(START)
    wf.add_node("use", lambda d: d["n"]).add_input("slow", map_fields("n", "n")).add_dependency("handle")
    wf.end().add_input("use")
    app = wf.compile(store=MemoryStore())
    assert await app.ainvoke(7, checkpoint_id="s", callbacks=[AfterACheckpoint()]) == 7

    # data_only: fields come from START, yet the node is skipped when the branch that starts it is not taken
    wf = Workflow(name="branchy")
    wf.add_node("route", lambda x: x).add_input(START)
    wf.add_node("big", lambda d: f"big {d['n']}").add_input(START, map_fields("n", "n"), data_only=True)
    wf.add_node("small", lambda d: f"small {d['n']}").add_input(START, map_fields("n", "n"), data_only=True)
    wf.add_branch("route", lambda x: "big" if x["n"] > 10 else "small", ends=["big", "small"])
    wf.end().add_input("big", to_field("big")).add_input("small", to_field("small"))
    app = wf.compile()
    assert await app.ainvoke({"n": 50}) == {"big": "big 50"}
    assert await app.ainvoke({"n": 5}) == {"small": "small 5"}


async def test_a_missing_field_at_run_time_is_named():
    wf = Workflow(name="loose")
    wf.add_node("a", lambda x: {"found": 1}).add_input(START)
    wf.add_node("b", lambda d: d).add_input("a", map_fields("fuond", "x"))
    wf.end().add_input("b")
    with pytest.raises(GraphRunError, match="node 'b' maps field 'fuond' of the output of 'a', which the output does "
                                            "not have"):
        await wf.compile().ainvoke(0)


async def test_a_paused_workflow_resumes_with_its_mapped_inputs_in_a_fresh_compile():
    def check(d: dict) -> str:
        is_target, _, ok = get_resume_context()
        if not is_target:
            raise Interrupt(f"send {d['title']}?")
        return f"sent {d['title']}" if ok else "held"

    def build(store):
        wf = Workflow(name="send")
        wf.add_node("load", load).add_input(START)
        wf.add_node("check", check).add_input("load", map_fields("meta.title", "title"))
        wf.end().add_input("check")
        return wf.compile(store=store)

    store = MemoryStore()
    with pytest.raises(GraphInterrupted) as paused:
        await build(store).ainvoke("a.txt", checkpoint_id="w")
    (ctx,) = paused.value.info.contexts
    assert ctx.info == "send A.TXT?"
    assert await build(store).ainvoke(None, checkpoint_id="w", resume={ctx.id: True}) == "sent A.TXT"


async def test_a_workflow_is_a_subgraph_like_any_graph_and_its_mappings_are_part_of_its_fingerprint():
    g = Graph(name="outer")
    g.add_node("rag", rag_workflow())
    g.add_edge(START, "rag")
    g.add_edge("rag", END)
    assert await g.compile().ainvoke({"path": "x", "question": "beta"}) == {"reply": "X: beta beta",
                                                                           "stats": {"pages": 3}}
    assert "flow" not in g.compile().structure  # a plain graph's fingerprint is what it always was

    def asks(d: dict) -> str:
        if not get_resume_context()[0]:
            raise Interrupt("?")
        return "ok"

    def build(target):
        wf = Workflow(name="fp")
        wf.add_node("ask", asks).add_input(START, map_fields("a", target))
        wf.end().add_input("ask")
        return wf.compile(store=store)

    store = MemoryStore()
    with pytest.raises(GraphInterrupted):
        await build("x").ainvoke({"a": 1}, checkpoint_id="f")
    with pytest.raises(GraphMismatch, match="field mappings"):
        await build("y").ainvoke(None, checkpoint_id="f", resume=True)


def rag_workflow():
    wf = Workflow(name="rag")
    wf.add_node("load", load).add_input(START, from_field("path"))
    wf.add_node("score", score).add_input("load", map_fields("chunks", "chunks")) \
        .add_input(START, map_fields("question", "question"), data_only=True)
    wf.add_node("answer", answer).add_input("score", map_fields("best", "text")) \
        .add_input("load", map_fields("meta.title", "title"))
    wf.end().add_input("answer", to_field("reply")).add_input("load", map_fields("meta.pages", "stats.pages"))
    return wf


# --- compile-time checks: a wrong mapping fails at compile(), naming the field ----------------------------

def broken(wire):
    wf = Workflow(name="rag")
    wf.add_node("load", load).add_input(START)
    node = wf.add_node("score", score)
    wire(wf, node)
    wf.end().add_input("score")
    return wf


@pytest.mark.parametrize("wire, message", [
    (lambda wf, n: n.add_input("load", map_fields("chunkz", "chunks")).add_input(START, map_fields("q", "question")),
     r"node 'score' input from 'load': the output of 'load' is Doc, which has no field 'chunkz' \(its fields: "
     r"chunks, meta\)"),
    (lambda wf, n: n.add_input("load", map_fields("chunks", "chunks")).add_input(START, map_fields("q", "questoin")),
     r"node 'score' input from '__start__': the input of 'score' is ScoreRequest, which has no field 'questoin'"),
    (lambda wf, n: n.add_input("load", {"meta.titel": "question", "chunks": "chunks"}),
     r"field 'meta' of the output of 'load' is Meta, which has no field 'titel' \(its fields: pages, title\)"),
    (lambda wf, n: n.add_input("load", {"chunks": "chunks", "meta.title": "question.deep"}),
     r"input from 'load': field 'question' of the input of 'score' is str, which has no field 'deep'"),
    (lambda wf, n: n.add_input("load", {"chunks": "chunks", "meta.title": "question"}).set_static_value("top_kk", 2),
     r"node 'score' set_static_value\('top_kk'\): the input of 'score' is ScoreRequest, which has no field "
     r"'top_kk' \(its fields: chunks, question, source, top_k\)"),
    (lambda wf, n: n.add_input("load", {"chunks": "chunks", "meta.title": "question"})
     .set_static_value("top_k.n", 2),
     r"set_static_value\('top_k.n'\): field 'top_k' of the input of 'score' is int, which has no field 'n'"),
    (lambda wf, n: n.add_input("load", {"meta.pages": "question", "chunks": "chunks"}),
     r"field meta.pages \(int\) cannot feed field question \(str\)"),
    (lambda wf, n: n.add_input("load", map_fields("chunks", "chunks")),
     r"node 'score' takes a ScoreRequest, whose required field\(s\) 'question' no input maps"),
    (lambda wf, n: n.add_input("load", {"chunks": "chunks", "meta.title": "question"})
     .add_input(START, map_fields("q", "question"), data_only=True),
     r"field 'question' of its input is mapped twice \(from 'load' and from '__start__'\)"),
    (lambda wf, n: n.add_input("load", {"chunks": "chunks", "meta.title": "question"})
     .set_static_value("source.kind", "x").add_input(START, to_field("source"), data_only=True),
     r"source \(from '__start__'\) and source.kind \(from set_static_value\) overlap"),
    (lambda wf, n: n.add_input("load").add_input(START, to_field("question"), data_only=True),
     r"\(the whole value\) \(from 'load'\) and question \(from '__start__'\) overlap"),
    (lambda wf, n: n.add_input("lode", map_fields("chunks", "chunks")),
     r"node 'score' takes input from 'lode', which is not a node of the workflow"),
    (lambda wf, n: n.add_input("load", {"chunks": "chunks", "meta.title": "question"}, data_only=True),
     r"node 'score' never runs: it has only data_only inputs"),
])
def test_a_wrong_mapping_fails_at_compile_naming_the_field(wire, message):
    with pytest.raises(GraphBuildError, match=message):
        broken(wire).compile()


def test_what_a_workflow_refuses_to_build():
    wf = Workflow(name="w")
    node = wf.add_node("a", lambda x: x).add_input(START)
    with pytest.raises(GraphBuildError, match="already takes input from '__start__'; give all the mappings"):
        node.add_input(START, to_field("x"))
    with pytest.raises(GraphBuildError, match=r"use add_node\('b', \.\.\.\)\.add_input\('a'\)"):
        wf.add_edge("a", "b")
    with pytest.raises(GraphBuildError, match="mapping must be None, from_field"):
        node.add_input("b", "x")
    wf.end().add_input("a")
    with pytest.raises(GraphBuildError, match="always runs as a DAG"):
        wf.compile(trigger="any")
    wf.compile()
    with pytest.raises(GraphBuildError, match="already compiled"):
        node.add_dependency(START)



class Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    question: str = ""


def ask_open(req: Open) -> dict:
    return req.model_dump()


def test_a_static_value_or_mapping_into_a_model_that_allows_extra_fields_is_not_refused():
    wf = Workflow(name="open")
    wf.add_node("ask", ask_open).add_input(START, map_fields("q", "question")).set_static_value("top_kk", 2)
    wf.end().add_input("ask")
    assert asyncio.run(wf.compile().ainvoke({"q": "why"})) == {"question": "why", "top_kk": 2}
