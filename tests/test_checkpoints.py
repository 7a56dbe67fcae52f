"""Runs with a store: what is recorded, when (durability), how it grows, and bad bytes on disk."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

import pytest

from waypoint.engine import (
    END,
    START,
    CheckpointCorrupted,
    Graph,
    GraphInterrupted,
    Interrupt,
    NodeError,
    SerializationError,
)
from waypoint.engine.codec.serde import register_type
from waypoint.stores import MemoryStore, SQLiteStore


@register_type(name="tests.Chat")
@dataclass
class Chat:
    messages: list[dict] = field(default_factory=list)
    turns: int = 0


def chat_loop(store, iterations: int, **compile_opts):
    """B2's shape: model and tool nodes each append a ~500-byte message, `iterations` times."""
    g = Graph(name="chat", state=Chat)

    def model(x, state: Chat):
        state.turns += 1
        state.messages.append({"role": "assistant", "content": "m" * 480, "turn": state.turns})
        return state.turns

    def tool(x, state: Chat):
        state.messages.append({"role": "tool", "content": "t" * 480, "turn": state.turns})
        return x

    g.add_node("model", model)
    g.add_node("tool", tool)
    g.add_edge(START, "model")
    g.add_edge("model", "tool")
    g.add_branch("tool", lambda t: "model" if t < iterations else END, ends=["model", END])
    return g.compile(store=store, max_steps=2 * iterations + 5, **compile_opts)


class CountingStore(MemoryStore):
    """A MemoryStore that remembers how many bytes each put wrote."""

    def __init__(self):
        super().__init__()
        self.writes: list[int] = []

    async def put(self, meta, header, parts, blobs, *, expected_version, **fence):
        self.writes.append(len(header) + sum(len(b.data) for b in blobs))
        return await super().put(meta, header, parts, blobs, expected_version=expected_version, **fence)


async def test_step_durability_records_every_step_with_status_and_output(tmp_path):
    store = SQLiteStore(tmp_path / "runs.db")
    app = chat_loop(store, 3)
    assert await app.ainvoke("hi", checkpoint_id="c1") == 3
    history = await store.history("c1")
    assert [m.version for m in history] == list(range(7, 0, -1))  # claim + 6 supersteps
    assert history[0].status == "completed" and all(m.status == "running" for m in history[1:])
    assert history[0].lease_owner is None and history[1].lease_owner and history[1].lease_expires
    assert history[0].step == 6 and history[-1].step == 0
    assert len({m.fingerprint for m in history}) == 1 and history[0].created_at <= history[0].updated_at
    snap = await app.get_run("c1")
    assert snap.output == 3 and snap.state.turns == 3 and len(snap.state.messages) == 6
    assert snap.state.messages[-1]["role"] == "tool"
    older = await app.get_run("c1", version=3)
    assert older.output is None and len(older.state.messages) == 2
    await store.close()


async def test_interrupt_and_exit_durability_write_only_when_they_should():
    store = CountingStore()
    assert await chat_loop(store, 3, durability="interrupt").ainvoke(0, checkpoint_id="quiet") == 3
    assert store.writes == [] and await store.get("quiet") is None
    assert await chat_loop(store, 3, durability="exit").ainvoke(0, checkpoint_id="exit") == 3
    assert [m.status for m in await store.history("exit")] == ["completed"]

    def explode(x):
        raise RuntimeError("disk full")

    g = Graph(name="boom")
    g.add_node("ok", lambda x: x)
    g.add_node("explode", explode)
    g.add_edge(START, "ok")
    g.add_edge("ok", "explode")
    g.add_edge("explode", END)
    app = g.compile(store=store, durability="exit")
    with pytest.raises(NodeError):
        await app.ainvoke(1, checkpoint_id="failed")
    (meta,) = await store.history("failed")
    assert meta.status == "failed" and "disk full" in meta.error
    assert (await app.get_run("failed")).pending == ("explode",)  # the failed step can be retried

    def pause(x):
        raise Interrupt("wait")

    g2 = Graph(name="pause")
    g2.add_node("pause", pause)
    g2.add_edge(START, "pause")
    g2.add_edge("pause", END)
    with pytest.raises(GraphInterrupted):
        await g2.compile(store=store, durability="interrupt").ainvoke(1, checkpoint_id="paused")
    assert [m.status for m in await store.history("paused")] == ["interrupted"]


async def test_bytes_written_per_step_stay_flat_as_the_conversation_grows():
    store = CountingStore()
    await chat_loop(store, 150).ainvoke(0, checkpoint_id="long")
    writes = store.writes[1:-1]  # steps only
    early, late = sum(writes[5:25]) / 20, sum(writes[-20:]) / 20
    assert late < early * 1.3, (early, late)
    assert late < 2000  # one ~500-byte message plus the small position per step


async def test_state_survives_a_new_store_object_on_the_same_file(tmp_path):
    path = tmp_path / "runs.db"

    def pause_once(x, state: Chat):
        state.messages.append({"role": "user", "content": "hello"})
        raise Interrupt("approve?")

    g = Graph(name="g", state=Chat)
    g.add_node("pause", pause_once)
    g.add_edge(START, "pause")
    g.add_edge("pause", END)
    store = SQLiteStore(path)
    with pytest.raises(GraphInterrupted):
        await g.compile(store=store).ainvoke(1, checkpoint_id="p")
    await store.close()
    snap = await g.compile(store=SQLiteStore(path)).get_run("p")
    assert snap.meta.status == "interrupted"
    assert snap.state == Chat(messages=[{"role": "user", "content": "hello"}])
    assert snap.interrupts.contexts[0].info == "approve?"


async def test_unregistered_type_fails_at_write_time_and_keeps_the_stored_run(tmp_path):
    class Secret:
        pass

    store = SQLiteStore(tmp_path / "runs.db")
    g = Graph(name="g", state=dict)
    g.add_node("ok", lambda x: x)
    g.add_node("bad", lambda x, state: state.update(obj=Secret()) or x)
    g.add_edge(START, "ok")
    g.add_edge("ok", "bad")
    g.add_edge("bad", END)
    with pytest.raises(SerializationError, match="Secret") as info:
        await g.compile(store=store).ainvoke(1, checkpoint_id="s")
    assert "register_type" in str(info.value) and "obj" in str(info.value)
    history = await store.history("s")
    assert history[0].status == "failed" and "Secret" in history[0].error
    snap = await g.compile(store=store).get_run("s", version=2)
    assert snap.pending == ("bad",)  # the last good version is intact and readable
    await store.close()


@pytest.mark.parametrize("target", ["blob", "header"])
async def test_corrupted_bytes_in_a_real_database_file(tmp_path, target):
    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    app = chat_loop(store, 2)
    await app.ainvoke(0, checkpoint_id="c")
    await store.close()
    db = sqlite3.connect(path)
    if target == "blob":
        (data,) = db.execute("SELECT data FROM waypoint_blobs ORDER BY length(data) DESC LIMIT 1").fetchone()
        flipped = bytearray(data)
        flipped[len(flipped) // 2] ^= 0x40
        db.execute("UPDATE waypoint_blobs SET data = ? WHERE data = ?", (bytes(flipped), data))
    else:
        db.execute("UPDATE waypoint_checkpoints SET header = substr(header, 1, length(header) - 3)")
    db.commit()
    db.close()
    with pytest.raises(CheckpointCorrupted):
        await chat_loop(SQLiteStore(path), 2).get_run("c")


async def test_streaming_run_positions_round_trip(tmp_path):
    async def words(text):
        for w in text.split():
            yield w + " "

    def pause(text):
        raise Interrupt(text)

    g = Graph(name="s")
    g.add_node("words", words)
    g.add_node("pause", pause)
    g.add_edge(START, "words")
    g.add_edge("words", "pause")
    g.add_edge("pause", END)
    store = SQLiteStore(tmp_path / "s.db")
    app = g.compile(store=store)
    with pytest.raises(GraphInterrupted):
        async for _ in app.astream("a b c", checkpoint_id="s"):
            pass
    snap = await app.get_run("s")
    assert snap.interrupts.contexts[0].info == "a b c "
    await store.close()


async def test_signed_and_encrypted_checkpoints_refuse_the_wrong_key(tmp_path):
    from waypoint.engine.codec.serde import Serializer

    def flip(data: bytes) -> bytes:  # a stand-in cipher: enough to prove the hook is applied both ways
        return bytes(b ^ 0x5A for b in data)

    path = tmp_path / "signed.db"
    good = Serializer(key=b"k" * 32, encrypt=flip, decrypt=flip)
    await chat_loop(SQLiteStore(path), 2, serializer=good).ainvoke(0, checkpoint_id="s")
    snap = await chat_loop(SQLiteStore(path), 2, serializer=good).get_run("s")
    assert snap.output == 2 and len(snap.state.messages) == 4
    raw = sqlite3.connect(path).execute("SELECT group_concat(hex(data)) FROM waypoint_blobs").fetchone()[0]
    assert "6D6D6D6D" not in raw  # "mmmm" of the messages is not on disk in the clear
    wrong = Serializer(key=b"x" * 32, encrypt=flip, decrypt=flip)
    with pytest.raises(CheckpointCorrupted, match="signature"):
        await chat_loop(SQLiteStore(path), 2, serializer=wrong).get_run("s")


def test_sync_invoke_pauses_and_resumes_with_a_sqlite_store(tmp_path):
    """invoke() runs each call on a fresh event loop; the store must not care."""
    from waypoint.engine import get_resume_context

    def ask(x):
        if not get_resume_context()[0]:
            raise Interrupt("?")
        return x * 10

    g = Graph(name="sync")
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    app = g.compile(store=SQLiteStore(tmp_path / "sync.db"))
    with pytest.raises(GraphInterrupted) as info:
        app.invoke(4, checkpoint_id="s")
    assert app.invoke(None, checkpoint_id="s", resume=True) == 40
    assert info.value.checkpoint_id == "s"


@pytest.mark.parametrize("edit", ["replace an immutable item", "change a mutable item in place"])
async def test_a_conversation_of_messages_is_stored_by_appending_and_edits_still_land(tmp_path, edit):
    """Identity proves unchanged immutable items (no re-encoding); a replaced item, or a mutable one
    changed in place, is still caught."""
    from dataclasses import dataclass, field

    from waypoint.engine import Message
    from waypoint.engine.codec.serde import register_type

    @register_type(name=f"tests.checkpoints.Convo.{edit.split()[0]}")
    @dataclass
    class Convo:
        messages: list = field(default_factory=list)

    written: list[int] = []
    mutable = edit.startswith("change")

    class Measuring(SQLiteStore):
        async def put(self, meta, header, parts, blobs, *, expected_version, **fence):
            written.append(sum(len(b.data) for b in blobs))
            return await super().put(meta, header, parts, blobs, expected_version=expected_version, **fence)

    def grow(n, state):
        item = {"mutable": ["a"]} if mutable and n == 0 else Message.user(f"{n:04d}" + "x" * 400)
        state.messages.append(item)
        return n + 1

    def change(n, state):
        if mutable:
            state.messages[0]["mutable"].append("b")  # written long ago, changed in place
        else:
            state.messages[0] = Message.user("replaced")  # a new object where an old one was
        return n

    g = Graph(name="convo", state=Convo)
    g.add_node("grow", grow)
    g.add_node("change", change)
    g.add_edge(START, "grow")
    g.add_branch("grow", lambda n: "grow" if n < 60 else "change", ends=["grow", "change"])
    g.add_edge("change", END)
    db = tmp_path / "c.db"
    app = g.compile(store=Measuring(db), max_steps=100)
    assert await app.ainvoke(0, checkpoint_id="c") == 60
    if not mutable:
        growing = written[3:60]
        assert max(growing) - min(growing) < 50  # each step writes one message, not the conversation
    snap = await g.compile(store=SQLiteStore(db), max_steps=100).get_run("c")
    first = snap.state.messages[0]
    assert first == ({"mutable": ["a", "b"]} if mutable else Message.user("replaced"))
    assert [m.content[:4] for m in snap.state.messages[1:]] == [f"{i:04d}" for i in range(1, 60)]
