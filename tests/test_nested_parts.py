"""A run nested in a task (an agent used as a tool) records its steps as parts of its own in the root's versions
(issue 34 §1, engine/keep/nested_parts.py): a step writes what it appended, not the inner conversation; a crash,
a fork to another ID and a store that lost blobs all continue the inner run from its last finished step; parts
moved to another nested run are refused."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from waypoint.engine import AgentTool, ChatModelAgent, CheckpointCorrupted, Message, ToolCall, tool
from waypoint.engine.codec import Serializer
from waypoint.stores import SQLiteStore

from measuring import Measuring

MESSAGE = 500  # characters of text in each inner message


class Crash(BaseException):
    """Stands for the process dying inside a call: nothing after it is written."""


def supervisor(rounds: int, journal: list[str], crash_at: int | None = None, calls: int = 1) -> ChatModelAgent:
    """A supervisor that calls `calls` researchers (an agent tool) at once; each researcher makes `rounds` tool
    calls, one per model call, and counts them from its conversation (a lost message shows as a call made again).
    Its tool raises `Crash` on the call numbered `crash_at`, the first time for each topic, once every researcher is
    there (a sibling that went on after another's crash would record steps no dead process could)."""
    crashed: set[str] = set()
    everyone = asyncio.Event()  # the researchers "die" together: none goes on past another's crash

    @tool
    async def work(topic: str, i: int) -> str:
        """Do step i of a topic."""
        journal.append(f"{topic}:{i}")
        if i == crash_at and topic not in crashed:
            crashed.add(topic)
            if len(crashed) == calls:
                everyone.set()
            await everyone.wait()
            raise Crash
        return f"{topic} {i} " + "r" * MESSAGE

    class Researcher:
        async def generate(self, messages, **_):
            done = sum(1 for m in messages if m.role == "tool")
            topic = next(m.content for m in messages if m.role == "user")
            if done < rounds:
                return Message.assistant("t" * MESSAGE, tool_calls=[ToolCall(
                    id=f"c{done}", name="work", arguments=json.dumps({"topic": topic, "i": done}))])
            return Message.assistant(f"{topic}: finished {done}")

        async def stream(self, messages, **kw):
            yield await self.generate(messages, **kw)

    class Boss:
        async def generate(self, messages, **_):
            if messages[-1].role == "tool":
                return Message.assistant("boss: " + " / ".join(m.content for m in messages if m.role == "tool"))
            return Message.assistant(tool_calls=[ToolCall(id=f"b{i}", name="researcher",
                                                          arguments=json.dumps({"request": f"topic{i}"}))
                                                 for i in range(calls)])

        async def stream(self, messages, **kw):
            yield await self.generate(messages, **kw)

    researcher = ChatModelAgent(name="researcher", model=Researcher(), tools=[work], max_iterations=rounds + 2)
    return ChatModelAgent(name="boss", model=Boss(), tools=[AgentTool(researcher)])


async def test_an_inner_step_writes_what_it_appended_not_the_inner_conversation(tmp_path):
    store = Measuring(tmp_path / "flat.db")
    journal: list[str] = []
    app = supervisor(40, journal).compile(store=store)
    out = await app.ainvoke("go", checkpoint_id="f")
    assert out.content.startswith("boss: topic0: finished 40")
    inner = store.written[4:-3]  # the researcher's steps, two a round
    assert len(inner) >= 78
    first, last = sum(inner[:10]) / 10, sum(inner[-10:]) / 10
    # a round appends two messages (~1.1 KB); the inner conversation grows to ~45 KB: encoded whole, the last
    # steps would write ~40 KB more than the first
    assert last - first < 1500, (first, last)
    await store.close()


async def test_a_crash_inside_the_inner_run_continues_it_from_its_last_finished_step(tmp_path):
    db = tmp_path / "crash.db"
    journal: list[str] = []
    store = SQLiteStore(db)
    with pytest.raises(Crash):
        await supervisor(30, journal, crash_at=25).compile(store=store).ainvoke("go", checkpoint_id="c")
    assert journal == [f"topic0:{i}" for i in range(26)]
    out = await supervisor(30, journal).compile(store=store).ainvoke(None, checkpoint_id="c", takeover=True)
    assert journal[26:] == [f"topic0:{i}" for i in range(25, 30)]  # only the call the crash cut off runs again
    assert out.content.startswith("boss: topic0: finished 30")
    await store.close()


async def test_two_inner_runs_in_flight_at_a_crash_each_continue_with_their_own_conversation(tmp_path):
    store = SQLiteStore(tmp_path / "two.db")
    journal: list[str] = []
    with pytest.raises(Crash):
        await supervisor(12, journal, crash_at=9, calls=2).compile(store=store).ainvoke("go", checkpoint_id="t")
    assert sorted(journal) == sorted(f"topic{t}:{i}" for t in (0, 1) for i in range(10))
    out = await supervisor(12, journal, calls=2).compile(store=store).ainvoke(None, checkpoint_id="t", takeover=True)
    for topic in ("topic0", "topic1"):  # each goes on from its own call the crash cut off: nothing else again
        assert [j for j in journal[20:] if j.startswith(topic)] == [f"{topic}:{i}" for i in range(9, 12)]
    assert "topic0: finished 12" in out.content and "topic1: finished 12" in out.content
    await store.close()


async def test_a_fork_of_a_version_with_an_inner_run_in_flight_continues_it_under_the_new_id(tmp_path):
    store = SQLiteStore(tmp_path / "fork.db")
    journal: list[str] = []
    with pytest.raises(Crash):
        await supervisor(10, journal, crash_at=7).compile(store=store).ainvoke("go", checkpoint_id="a")
    app = supervisor(10, journal).compile(store=store)
    out = await app.ainvoke(None, checkpoint_id="a", write_to="b")
    assert journal[8:] == [f"topic0:{i}" for i in range(7, 10)]
    assert out.content.startswith("boss: topic0: finished 10")
    assert (await app.get_run("b")).meta.status == "completed"
    await store.close()


class Pruning(SQLiteStore):
    """Deletes, once, the blobs a version's new segments hang on, just before it is written: a prune that raced the
    run. The store then refuses the version (`MissingBlobs`), and the writer must write it whole."""

    def __init__(self, path, after: int) -> None:
        super().__init__(path)
        self.after, self.puts, self.pruned = after, 0, 0

    async def put(self, meta, header, parts, blobs, **kw):
        self.puts += 1
        parents = {b.parent for b in blobs if b.parent}
        if self.puts > self.after and not self.pruned and any(n.startswith("n:") for n in parts) and parents:
            with sqlite3.connect(self.path) as conn:
                conn.executemany("DELETE FROM waypoint_blobs WHERE checkpoint_id = ? AND hash = ?",
                                 [(meta.checkpoint_id, h) for h in parents])
            self.pruned = len(parents)
        return await super().put(meta, header, parts, blobs, **kw)


async def test_a_prune_that_raced_the_run_makes_it_write_the_inner_run_anew_and_it_reads_back_whole(tmp_path):
    db = tmp_path / "prune.db"
    store = Pruning(db, after=12)
    journal: list[str] = []
    with pytest.raises(Crash):
        await supervisor(16, journal, crash_at=12).compile(store=store).ainvoke("go", checkpoint_id="p")
    assert store.pruned
    fresh = SQLiteStore(db)
    out = await supervisor(16, journal).compile(store=fresh).ainvoke(None, checkpoint_id="p", takeover=True)
    assert journal[13:] == [f"topic0:{i}" for i in range(12, 16)]
    assert out.content.startswith("boss: topic0: finished 16")
    await store.close()
    await fresh.close()


async def test_parts_of_one_inner_run_moved_to_another_are_refused(tmp_path):
    db = tmp_path / "moved.db"
    store = SQLiteStore(db)
    journal: list[str] = []
    with pytest.raises(Crash):
        await supervisor(6, journal, crash_at=4, calls=2).compile(store=store).ainvoke("go", checkpoint_id="m")
    await store.close()
    codec = Serializer()
    with sqlite3.connect(db) as conn:  # a version with two inner runs, their key parts swapped in header and row
        rows = conn.execute("SELECT version, header, parts FROM waypoint_checkpoints WHERE checkpoint_id = 'm' "
                            "ORDER BY version DESC").fetchall()
        version, header, parts = next(r for r in rows if len(_keys(json.loads(r[2]))) == 2)
        parts, record = json.loads(parts), codec.loads(header)
        one, other = _keys(parts)
        parts[one], parts[other] = parts[other], parts[one]
        record["parts"] = parts
        conn.execute("UPDATE waypoint_checkpoints SET parts = ?, header = ? WHERE checkpoint_id = 'm' AND version = ?",
                     (json.dumps(parts), codec.dumps(record), version))
    store = SQLiteStore(db)
    with pytest.raises(CheckpointCorrupted, match=r"run 'm'.*nested run at .* names parts that are not its own"):
        await supervisor(6, journal, calls=2).compile(store=store).get_run("m", version=version)
    await store.close()


def _keys(parts: dict[str, str]) -> list[str]:
    """The key parts of the nested runs a version holds."""
    return sorted(n for n in parts if n.startswith("n:") and ":" not in n[2:])



async def test_inner_runs_that_would_take_a_version_past_max_parts_are_stored_whole_and_still_continue(tmp_path,
                                                                                                     monkeypatch):
    import waypoint.engine.keep.nested_writer as writer

    monkeypatch.setattr(writer, "MAX_PARTS", 12)  # room for the root's parts and one inner run's, not three
    store = SQLiteStore(tmp_path / "many.db")
    journal: list[str] = []
    with pytest.raises(Crash):
        await supervisor(8, journal, crash_at=5, calls=3).compile(store=store).ainvoke("go", checkpoint_id="x")
    (head,) = await store.history("x", limit=1)
    parts = (await store.get("x", head.version)).parts
    assert sum(1 for n in parts if n.startswith("n:") and ":" not in n[2:]) == 1  # one with parts, two whole
    out = await supervisor(8, journal, calls=3).compile(store=store).ainvoke(None, checkpoint_id="x", takeover=True)
    for t in range(3):  # each goes on from the call the crash cut off, whichever way it was stored
        assert [j for j in journal[18:] if j.startswith(f"topic{t}:")] == [f"topic{t}:{i}" for i in range(5, 8)]
        assert f"topic{t}: finished 8" in out.content
    await store.close()
