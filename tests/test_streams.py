"""Stream mode: automatic conversion between streaming and value-only nodes, concatenation rules."""

from __future__ import annotations

import asyncio

import pytest

from conftest import linear
from waypoint.engine import END, START, Graph, GraphRunError, Lambda, register_concat
from waypoint.engine.shape.streams import concat


async def words(text):
    for w in text.split():
        yield w + " "


async def test_streaming_node_output_reaches_caller_chunk_by_chunk():
    app = linear("s", lambda x: x.upper(), words)
    assert [c async for c in app.astream("a b c")] == ["A ", "B ", "C "]
    assert await app.ainvoke("a b c") == "A B C "


async def test_chunks_arrive_while_the_node_is_still_running():
    release = asyncio.Event()
    seen = []

    async def gated(x):
        yield "first"
        await release.wait()
        yield "second"

    app = linear("live", gated)

    async def consume():
        async for chunk in app.astream(None):
            seen.append(chunk)
            release.set()

    await asyncio.wait_for(consume(), 2)
    assert seen == ["first", "second"]


async def test_value_node_after_stream_gets_concatenation():
    got = []

    def value_only(text):
        got.append(text)
        return len(text)

    app = linear("conv", words, value_only)
    assert [c async for c in app.astream("x y")] == [4]   # a value becomes a one-chunk stream
    assert got == ["x y "]


async def test_transform_node_receives_upstream_chunks():
    async def upper(chunks):
        async for c in chunks:
            yield c.upper()

    app = linear("tr", words, Lambda(transform=upper))
    assert [c async for c in app.astream("p q")] == ["P ", "Q "]


async def test_dict_chunks_merge_per_key_and_output_key_wraps_chunks():
    async def parts(x):
        yield {"text": "he", "n": 1}
        yield {"text": "llo", "n": 2}

    assert concat([{"text": "he", "n": 1}, {"text": "llo", "n": 2}]) == {"text": "hello", "n": 2}
    g = Graph(name="keyed")
    g.add_node("p", parts, output_key="out")
    g.add_node("read", lambda d: d["out"]["text"])
    g.add_edge(START, "p")
    g.add_edge("p", "read")
    g.add_edge("read", END)
    app = g.compile()
    assert await app.ainvoke(0) == "hello"
    assert [c async for c in app.astream(0)] == ["hello"]


def test_concat_rules():
    assert concat(["a", "b"]) == "ab"
    assert concat([b"a", b"b"]) == b"ab"
    assert concat([1, 2, 3]) == 3                      # others keep the last value
    assert concat([{"a": "x"}, {"b": 1}, {"a": "y"}]) == {"a": "xy", "b": 1}
    with pytest.raises(GraphRunError, match="empty stream"):
        concat([], where="node 'n'")


def test_register_concat_wins():
    class Tokens(list):
        pass

    register_concat(Tokens, lambda chunks: Tokens(t for c in chunks for t in c))
    assert concat([Tokens([1]), Tokens([2, 3])]) == [1, 2, 3]


async def test_empty_stream_where_value_needed_is_an_error():
    async def nothing(x):
        return
        yield  # pragma: no cover

    app = linear("empty", nothing, lambda v: v)
    with pytest.raises(GraphRunError, match="empty stream"):
        await app.ainvoke(1)


async def test_stream_through_subgraph_and_branch():
    inner = Graph(name="inner")
    inner.add_node("w", words)
    inner.add_edge(START, "w")
    inner.add_edge("w", END)
    outer = Graph(name="outer")
    outer.add_node("sub", inner)
    outer.add_node("loud", lambda s: s.upper())
    outer.add_edge(START, "sub")
    outer.add_branch("sub", lambda s: "loud" if "!" in s else END, ends=["loud", END])
    outer.add_edge("loud", END)
    app = outer.compile()
    assert "".join([c async for c in app.astream("hi !")]) == "HI ! "
    assert "".join([c async for c in app.astream("calm")]) == "calm "


async def test_early_exit_from_astream_cancels_the_run():
    finished = []

    async def endless(x):
        try:
            i = 0
            while True:
                yield i
                i += 1
                await asyncio.sleep(0)
        finally:
            finished.append(True)

    app = linear("endless", endless)
    agen = app.astream(None)
    async for chunk in agen:
        if chunk == 3:
            break
    await agen.aclose()
    await asyncio.sleep(0.01)
    assert finished == [True]


async def test_a_subgraph_at_the_end_streams_its_chunks_to_the_caller():
    inner = Graph(name="inner")
    inner.add_node("w", words)
    inner.add_edge(START, "w")
    inner.add_edge("w", END)
    outer = Graph(name="outer")
    outer.add_node("sub", inner)
    outer.add_edge(START, "sub")
    outer.add_edge("sub", END)
    app = outer.compile()
    assert [c async for c in app.astream("x y z")] == ["x ", "y ", "z "]
    assert await app.ainvoke("x y") == "x y "
