"""Chapter 8's RAG workflow: a DAG that answers a question from one document of the project, and the tool
`answer_from_document(document, question)` that runs it.

    START ─▶ load ─▶ chunk ──▶ score ─▶ filter ─▶ answer ─▶ END
      │       └────────────────────────────────────▲
      └────▶ terms ─────────────▲

- load: the document, read inside PROJECT_ROOT (a path outside it is refused, and the refusal goes back
  to the model as the tool's result);
- chunk: its paragraphs (blank-line separated; a long one cut at sentence ends);
- terms: the question's keywords (lowercase words of 3+ letters, common words dropped, a plural's s too);
- score: per chunk, how many of the keywords it contains — offline and deterministic;
- filter: the best TOP_K chunks among those with at least MIN_SCORE keywords and at least half the best;
- answer: the chunks, best first, quoted with where they are. The agent's model phrases the final reply.

`compile(trigger="all")`: a node runs once all its predecessors finished; `score` and `answer` are fan-ins
whose input is one dict built from their predecessors' `output_key`s.
"""

from __future__ import annotations

import re
from typing import Any

from waypoint.engine import END, START, Graph, NodeError, RetryAgentRun, Tool, tool

from ..fstools import ProjectRoot

__all__ = ["build_rag", "answer_from_document_tool", "TOP_K", "MIN_SCORE"]

TOP_K = 3
MIN_SCORE = 1
CHUNK_CHARS = 600
STOPWORDS = frozenset("""
    the and for are but not you all any can had her was one our out has have his how its may new now old see
    two way who did get let say she too use what when where which while with that this there their them then
    they these those from into about does doing done than been being were will would could should shall
    some such only own same very just also more most other over under again once here why each few both
    tell know much many
""".split())


def build_rag(root: ProjectRoot) -> Graph:
    """The workflow's builder (compile it with `trigger="all"`). Input `{"document", "question"}`; output text."""
    g = Graph(name="rag")
    g.add_node("load", lambda document: _load(root, document), input_key="document", output_key="doc")
    g.add_node("chunk", lambda doc: _chunks(doc["text"]), input_key="doc", output_key="chunks")
    g.add_node("terms", _terms, input_key="question", output_key="terms")
    g.add_node("score", lambda x: [[_score(c, x["terms"]), i, c] for i, c in enumerate(x["chunks"])])
    g.add_node("filter", _best, output_key="best")
    g.add_node("answer", lambda x: _answer(x["doc"], x["best"]))
    g.add_edge(START, "load")
    g.add_edge(START, "terms")
    g.add_edge("load", "chunk")
    g.add_edge("chunk", "score")
    g.add_edge("terms", "score")
    g.add_edge("score", "filter")
    g.add_edge("filter", "answer")
    g.add_edge("load", "answer")
    g.add_edge("answer", END)
    return g


def answer_from_document_tool(root: ProjectRoot) -> Tool:
    """The workflow as a tool: compiled once, run on every call (no store of its own: the agent's run
    records the call, and a call cut off by a crash runs the whole workflow again)."""
    rag = build_rag(root).compile(trigger="all")

    @tool
    async def answer_from_document(document: str, question: str) -> str:
        """Answer a question from one document of the project: its passages that best match the question.

        Args:
            document: the document's path, relative to the project root
            question: the question to answer from it
        """
        try:
            return await rag.ainvoke({"document": document, "question": question})
        except NodeError as err:
            if isinstance(err.__cause__, RetryAgentRun):  # the model should hear why, and may correct itself
                raise err.__cause__ from None
            raise

    return answer_from_document


def _load(root: ProjectRoot, document: str) -> dict[str, str]:
    path = root.path(document)
    if not path.is_file():
        raise RetryAgentRun(f"'{document}' is not a file of the project; list the project to find the document")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise RetryAgentRun(f"'{document}' is not a text file") from None
    return {"name": root.shown(path), "text": text}


def _chunks(text: str) -> list[str]:
    chunks: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        while len(paragraph) > CHUNK_CHARS:
            cut = _cut(paragraph)
            chunks.append(paragraph[:cut].strip())
            paragraph = paragraph[cut:].strip()
        if paragraph:
            chunks.append(paragraph)
    return chunks


def _cut(paragraph: str) -> int:
    """Where to cut a long paragraph: after its last sentence that fits, else at a space, else anywhere."""
    sentence_end = paragraph.rfind(". ", 0, CHUNK_CHARS)
    if sentence_end > 0:
        return sentence_end + 1
    space = paragraph.rfind(" ", 0, CHUNK_CHARS)
    return space if space > 0 else CHUNK_CHARS


def _words(text: str) -> set[str]:
    words = set()
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]  # backups -> backup, so a question and a passage meet halfway
        if len(word) >= 3 and word not in STOPWORDS:
            words.add(word)
    return words


def _terms(question: str) -> list[str]:
    return sorted(_words(question))


def _score(chunk: str, terms: list[str]) -> int:
    return len(_words(chunk) & set(terms))


def _best(scored: list[list[Any]]) -> list[list[Any]]:
    top = max((score for score, _, _ in scored), default=0)
    kept = [s for s in scored if s[0] >= MIN_SCORE and 2 * s[0] >= top]
    return sorted(kept, key=lambda s: (-s[0], s[1]))[:TOP_K]


def _answer(doc: dict[str, str], best: list[list[Any]]) -> str:
    if not best:
        return (f"{doc['name']} does not answer that: none of its passages shares a keyword with the question. "
                "Try other words, or another document.")
    lines = [f"{doc['name']}, passage {index + 1} ({score} keyword{'s' if score != 1 else ''}): \"{chunk}\""
             for score, index, chunk in best]
    return "\n".join(lines)
