"""Compile-time checks: every malformed graph fails with a GraphBuildError naming the culprit."""

from __future__ import annotations

import pytest

from waypoint.engine import END, START, Graph, GraphBuildError


def ident(x):
    return x


def two_node_graph() -> Graph:
    g = Graph(name="g")
    g.add_node("a", ident)
    g.add_node("b", ident)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


def test_valid_graph_compiles_and_runs():
    assert two_node_graph().compile().invoke(5) == 5


def test_no_edge_from_start():
    g = Graph(name="g")
    g.add_node("a", ident)
    g.add_edge("a", END)
    with pytest.raises(GraphBuildError, match="nothing leaves START"):
        g.compile()


def test_no_path_to_end():
    g = Graph(name="g")
    g.add_node("a", ident)
    g.add_node("b", ident)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "a")
    with pytest.raises(GraphBuildError, match="no path from START reaches END"):
        g.compile()


def test_unknown_node_in_edge_is_named():
    g = Graph(name="g")
    g.add_node("a", ident)
    g.add_edge(START, "a")
    g.add_edge("a", "ghost")
    with pytest.raises(GraphBuildError, match="unknown node 'ghost'"):
        g.compile()


def test_unknown_branch_end_is_named():
    g = Graph(name="g")
    g.add_node("a", ident)
    g.add_edge(START, "a")
    g.add_branch("a", lambda x: "nowhere", ends=["nowhere", END])
    with pytest.raises(GraphBuildError, match="routes to unknown node 'nowhere'"):
        g.compile()


def test_duplicate_node_and_edge():
    g = Graph(name="g")
    g.add_node("a", ident)
    with pytest.raises(GraphBuildError, match="node 'a' is added twice"):
        g.add_node("a", ident)
    g.add_edge(START, "a")
    with pytest.raises(GraphBuildError, match="edge '__start__' -> 'a' is added twice"):
        g.add_edge(START, "a")


@pytest.mark.parametrize("key", [START, END, "a:b", "a;b", "", " lead"])
def test_reserved_and_invalid_names(key):
    g = Graph(name="g")
    with pytest.raises(GraphBuildError, match="reserved|must be a non-empty string"):
        g.add_node(key, ident)


def test_edges_out_of_end_or_into_start():
    g = Graph(name="g")
    with pytest.raises(GraphBuildError, match="cannot start at END"):
        g.add_edge(END, "a")
    with pytest.raises(GraphBuildError, match="cannot end at START"):
        g.add_edge("a", START)


def test_cycle_rejected_in_dag_mode_with_the_cycle_named():
    g = Graph(name="g")
    g.add_node("a", ident)
    g.add_node("b", ident)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_branch("b", lambda x: END if x else "a", ends=["a", END])
    g.compile()  # Pregel accepts the loop
    g2 = Graph(name="g")
    g2.add_node("a", ident)
    g2.add_node("b", ident)
    g2.add_edge(START, "a")
    g2.add_edge("a", "b")
    g2.add_branch("b", lambda x: END, ends=["a", END])
    with pytest.raises(GraphBuildError, match="cycle a -> b -> a"):
        g2.compile(trigger="all")


def test_max_steps_forbidden_in_dag_mode():
    with pytest.raises(GraphBuildError, match="max_steps applies to trigger='any' only"):
        two_node_graph().compile(trigger="all", max_steps=5)


def test_node_without_outgoing_edge():
    g = Graph(name="g")
    g.add_node("a", ident)
    g.add_node("orphan_out", ident)
    g.add_edge(START, "a")
    g.add_edge("a", "orphan_out")
    g.add_edge("a", END)
    with pytest.raises(GraphBuildError, match="node 'orphan_out' has no outgoing edge"):
        g.compile()


def test_unreachable_node():
    g = Graph(name="g")
    g.add_node("a", ident)
    g.add_node("island", ident)
    g.add_edge(START, "a")
    g.add_edge("a", END)
    g.add_edge("island", END)
    with pytest.raises(GraphBuildError, match=r"\['island'\] cannot be reached from START"):
        g.compile()


def test_type_mismatch_across_edge():
    def produce(x) -> int:
        return 1

    def consume(text: str) -> str:
        return text

    g = Graph(name="g")
    g.add_node("produce", produce)
    g.add_node("consume", consume)
    g.add_edge(START, "produce")
    g.add_edge("produce", "consume")
    g.add_edge("consume", END)
    with pytest.raises(GraphBuildError, match="edge 'produce' -> 'consume' connects output type int to input type str"):
        g.compile()


def test_compatible_and_unannotated_types_pass():
    class Base: ...

    class Derived(Base): ...

    def produce(x) -> Base:
        return Derived()

    def consume(obj: Derived) -> str:  # may match at run time: Base might be a Derived
        return type(obj).__name__

    def anything(x: int | str) -> list[int]:
        return [1]

    def takes_list(x: list) -> int:
        return len(x)

    g = Graph(name="g")
    g.add_node("produce", produce)
    g.add_node("consume", consume)
    g.add_node("anything", anything)
    g.add_node("takes_list", takes_list)
    g.add_edge(START, "produce")
    g.add_edge("produce", "consume")
    g.add_edge("consume", "anything")
    g.add_edge("anything", "takes_list")
    g.add_edge("takes_list", END)
    assert g.compile().invoke(0) == 1


def test_graph_cannot_be_modified_after_compile():
    g = two_node_graph()
    g.compile()
    with pytest.raises(GraphBuildError, match="already compiled"):
        g.add_node("c", ident)
    with pytest.raises(GraphBuildError, match="already compiled"):
        g.add_edge("a", END)


def test_interrupt_before_unknown_node():
    with pytest.raises(GraphBuildError, match="interrupt_before names unknown node 'zz'"):
        two_node_graph().compile(interrupt_before=["zz"])


def test_bad_options():
    with pytest.raises(GraphBuildError, match="trigger must be"):
        two_node_graph().compile(trigger="some")
    with pytest.raises(GraphBuildError, match="durability must be"):
        two_node_graph().compile(durability="sometimes")
    g = Graph(name="g")
    with pytest.raises(GraphBuildError, match="timeout must be > 0"):
        g.add_node("a", ident, timeout=0)
    with pytest.raises(GraphBuildError, match="not a node"):
        g.add_node("b", 42)
        g.add_edge(START, "b")
        g.add_edge("b", END)
        g.compile()


def test_subgraph_build_error_names_parent_node():
    inner = Graph(name="inner")
    inner.add_node("x", ident)
    inner.add_edge("x", END)  # nothing leaves START
    outer = Graph(name="outer")
    outer.add_node("sub", inner)
    outer.add_edge(START, "sub")
    outer.add_edge("sub", END)
    with pytest.raises(GraphBuildError, match="subgraph node 'sub'.*nothing leaves START"):
        outer.compile()


def test_mermaid_shows_nodes_edges_and_branches():
    g = Graph(name="g")
    g.add_node("classify", ident)
    g.add_node("answer", ident)
    g.add_edge(START, "classify")
    g.add_branch("classify", lambda x: "yes", ends={"yes": "answer", "no": END})
    g.add_edge("answer", END)
    draft = g.to_mermaid()  # the builder draws too, and does not freeze the graph
    g.add_node("audit", ident)
    g.add_edge("answer", "audit")
    g.add_edge("audit", END)
    text = g.compile().to_mermaid()
    for picture in (draft, text):
        assert picture.startswith("flowchart TD\n")
        assert "n0[classify]" in picture and "n1[answer]" in picture
        assert "__start__ --> n0" in picture
        assert 'n0 -. "yes" .-> n1' in picture and 'n0 -. "no" .-> __end__' in picture
        assert "n1 --> __end__" in picture
    assert "audit" not in draft and "n2[audit]" in text and "n1 --> n2" in text


def test_options_given_to_graph_say_where_they_belong():
    """A newcomer's first mistake: `Graph(trigger="all")`; trigger is a compile() option."""
    with pytest.raises(TypeError, match=r"'trigger' is an option of compile\(\)"):
        Graph(name="g", trigger="all")
    with pytest.raises(TypeError, match=r"'checkpoint_id' is an option of each run: app\.ainvoke"):
        Graph(name="g", checkpoint_id="x")
    with pytest.raises(TypeError, match=r"'colour' is not an option of Graph\(\)"):
        Graph(name="g", colour="red")
