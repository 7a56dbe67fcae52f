"""Stored runs that someone bent: tampered cells, blob cycles, content moved between runs and versions.

An attacker who can write to the checkpoint database (or to a backup that gets restored) is in the
threat model. Every test writes the damage straight into a real SQLite file with `sqlite3` (or into a
`MemoryStore` through its public methods) and reads it back the way a user does: `get_run`, a resume
with `ainvoke(None, checkpoint_id=..., resume=True)`, or the store's own methods. The only error that
may come out is `CheckpointCorrupted`, with a short message naming the run.
"""

from __future__ import annotations

import hashlib
import json
import resource
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from waypoint.engine import END, START, CheckpointCorrupted, Graph, GraphInterrupted, Interrupt, get_resume_context
from waypoint.engine.codec.serde import Serializer
from waypoint.stores import MemoryStore, SQLiteStore, SQLStore

KEY = b"k" * 32
MANY = 40_000  # more parts than a version may have, and more than SQLite's 32,766 bound parameters


def build(store, serializer=None):
    """START -> a -> b -> c -> ask -> END; a, b and c each append a message; ask pauses once."""

    def talk(x, state):
        state.setdefault("messages", []).append({"from": x, "n": len(state["messages"]), "text": "hi " * 20})
        return x

    def ask(x):
        if not get_resume_context()[0]:
            raise Interrupt("approve?")
        return f"done {x}"

    g = Graph(name="tamper", state=dict)
    for name in "abc":
        g.add_node(name, talk)
    g.add_node("ask", ask)
    for a, b in [(START, "a"), ("a", "b"), ("b", "c"), ("c", "ask"), ("ask", END)]:
        g.add_edge(a, b)
    return g.compile(store=store, serializer=serializer)


def open_store(kind: str, path: Path):
    return SQLiteStore(path) if kind == "sqlite" else SQLStore(f"sqlite+aiosqlite:///{path}")


async def paused_runs(kind: str, path: Path, *ids: str, serializer=None) -> None:
    store = open_store(kind, path)
    app = build(store, serializer)
    for cid in ids:
        with pytest.raises(GraphInterrupted):
            await app.ainvoke(cid, checkpoint_id=cid)
    await store.close()


def newest(db: sqlite3.Connection, cid: str) -> tuple[int, bytes, dict[str, str]]:
    version, header, parts = db.execute(
        "SELECT version, header, parts FROM waypoint_checkpoints WHERE checkpoint_id = ? "
        "ORDER BY version DESC LIMIT 1", (cid,)).fetchone()
    return version, header, json.loads(parts)


async def read_back(kind: str, path: Path, cid: str, serializer=None) -> list[str]:
    """get_run and a resume must both fail with CheckpointCorrupted; returns their messages."""
    store = open_store(kind, path)
    app = build(store, serializer)
    messages = []
    try:
        with pytest.raises(CheckpointCorrupted) as caught:
            await app.get_run(cid)
        messages.append(str(caught.value))
        with pytest.raises(CheckpointCorrupted) as caught:
            await app.ainvoke(None, checkpoint_id=cid, resume=True)
        messages.append(str(caught.value))
    finally:
        await store.close()
    for message in messages:
        assert f"'{cid}'" in message and len(message) < 600, message
    return messages


STORES = ["sqlite", "sqlalchemy"]


# --- 1. blob-parent cycles --------------------------------------------------------------------

CYCLE_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sqlite3, sys, time
    sys.path.insert(0, sys.argv[3])
    from test_store_integrity import build, open_store
    from waypoint.engine import CheckpointCorrupted, GraphInterrupted
    from dataclasses import replace
    from waypoint.engine.keep.store import Blob
    from waypoint.stores import MemoryStore

    kind, path = sys.argv[1], sys.argv[2]

    def sql_cycles(db, cid, case):
        version, _, parts = db.execute("SELECT version, header, parts FROM waypoint_checkpoints WHERE "
                                       "checkpoint_id = ? ORDER BY version DESC LIMIT 1", (cid,)).fetchone()
        parts = json.loads(parts)
        head = parts["s:messages"]
        (root,) = db.execute("SELECT hash FROM waypoint_blobs WHERE checkpoint_id = ? AND parent IS NULL "
                             "AND hash IN (SELECT parent FROM waypoint_blobs WHERE checkpoint_id = ?)",
                             (cid, cid)).fetchone()
        if case == "root-to-itself":      # head -> ... -> root -> root -> ...
            db.execute("UPDATE waypoint_blobs SET parent = hash WHERE checkpoint_id = ? AND hash = ?", (cid, root))
        elif case == "root-to-head":      # head -> ... -> root -> head -> ...
            db.execute("UPDATE waypoint_blobs SET parent = ? WHERE checkpoint_id = ? AND hash = ?", (head, cid, root))
        else:                             # the run part's head: a -> b -> a
            db.executemany("INSERT INTO waypoint_blobs (checkpoint_id, hash, parent, data) VALUES (?, ?, ?, ?)",
                           [(cid, "a" * 32, "b" * 32, b"x"), (cid, "b" * 32, "a" * 32, b"y")])
            parts["run"] = "a" * 32
            db.execute("UPDATE waypoint_checkpoints SET parts = ? WHERE checkpoint_id = ? AND version = ?",
                       (json.dumps(parts), cid, version))

    async def outcome(store, cid):
        app = build(store)
        result = {}
        started = time.perf_counter()
        for what, call in (("get", lambda: store.get(cid)), ("get_run", lambda: app.get_run(cid))):
            try:
                await call()
                result[what] = "returned"
            except CheckpointCorrupted as err:
                result[what] = "CheckpointCorrupted: " + str(err)
        result["prune"] = await store.prune(cid, keep_last=1)
        result["seconds"] = time.perf_counter() - started
        return result

    async def main():
        cases = ["root-to-itself", "root-to-head", "a-b-a"]
        results = {}
        if kind == "memory":
            store = MemoryStore()
            app = build(store)
            with_loop = {"root-to-itself": [Blob(hash="a", data=b"x", parent="a")],
                         "root-to-head": [Blob(hash="a", data=b"x", parent="b"), Blob(hash="b", data=b"y", parent="a")],
                         "a-b-a": [Blob(hash="a", data=b"x", parent="b"), Blob(hash="b", data=b"y", parent="c"),
                                   Blob(hash="c", data=b"z", parent="b")]}
            for case in cases:
                try:
                    await app.ainvoke(case, checkpoint_id=case)
                except GraphInterrupted:
                    pass
                record = await store.get(case)
                meta = replace(record.meta, version=record.meta.version + 1)
                await store.put(meta, record.header, {**record.parts, "run": "a"}, with_loop[case],
                                expected_version=record.meta.version)
                results[case] = await outcome(store, case)
        else:
            store = open_store(kind, path)
            app = build(store)
            for case in cases:
                try:
                    await app.ainvoke(case, checkpoint_id=case)
                except GraphInterrupted:
                    pass
            await store.close()
            db = sqlite3.connect(path)
            for case in cases:
                sql_cycles(db, case, case)
            db.commit()
            db.close()
            store = open_store(kind, path)
            for case in cases:
                results[case] = await outcome(store, case)
            await store.close()
        print(json.dumps(results))

    asyncio.run(main())
    """
)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a regression fails instead of eating the box


@pytest.mark.parametrize("kind", ["memory", *STORES])
def test_a_blob_parent_cycle_is_reported_promptly_and_prune_terminates(kind, tmp_path):
    """Before: the chain query (or MemoryStore's walk) followed the cycle forever, holding all it read."""
    args = [sys.executable, "-c", CYCLE_SCRIPT, kind, str(tmp_path / "runs.db"), str(Path(__file__).parent)]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{kind}: reading a run whose blobs form a cycle did not finish in 30 s")
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)
    for case, result in results.items():
        for what in ("get", "get_run"):
            assert result[what].startswith("CheckpointCorrupted:"), (case, result)
            assert f"'{case}'" in result[what] and "version" in result[what] and "cycle" in result[what], result
        assert isinstance(result["prune"], int) and result["seconds"] < 5, (case, result)


# --- 3. cells of the wrong type or size ---------------------------------------------------------

NEWEST = "checkpoint_id = 't' AND version = (SELECT MAX(version) FROM waypoint_checkpoints WHERE checkpoint_id = 't')"
ROW_DAMAGE = {
    "parts-not-json": ("parts", "not json{"),
    "parts-a-list": ("parts", "[1, 2]"),
    "parts-hash-an-int": ("parts", '{"run": 5, "graph": "x"}'),
    "parts-deeply-nested": ("parts", "[" * 200_000 + "]" * 200_000),
    "parts-an-integer": ("parts", 10**14),
    "parts-too-many": ("parts", json.dumps({f"s:{i}": f"{i:032x}" for i in range(MANY)})),
    "parts-a-huge-name": ("parts", json.dumps({"s:" + "n" * 100_000: "0" * 32})),
    "header-an-integer": ("header", 10**14),  # bytes(10**14) would try to allocate 100 TB
    "header-text": ("header", "WPT not bytes"),
    "header-empty": ("header", b""),
    "status-unknown": ("status", "bogus"),
    "step-text": ("step", "abc"),
    "lease-text": ("lease_expires", "soon"),
    "created-a-blob": ("created_at", b"\x00"),
    "error-an-int": ("error", 7),
    "fingerprint-null-text": ("fingerprint", b"fp"),
}


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("case", sorted(ROW_DAMAGE))
async def test_a_tampered_checkpoint_cell_is_corrupted_not_a_crash(kind, case, tmp_path):
    path = tmp_path / "runs.db"
    await paused_runs(kind, path, "t")
    column, value = ROW_DAMAGE[case]
    with sqlite3.connect(path) as db:
        db.execute(f"UPDATE waypoint_checkpoints SET {column} = ? WHERE {NEWEST}", (value,))
    await read_back(kind, path, "t")


BLOB_DAMAGE = {"data-an-integer": ("data", 10**14), "data-text": ("data", "text"), "parent-an-int": ("parent", 5),
               "hash-an-int": ("hash", 12)}


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("case", sorted(BLOB_DAMAGE))
async def test_a_tampered_blob_cell_is_corrupted_not_a_crash(kind, case, tmp_path):
    path = tmp_path / "runs.db"
    await paused_runs(kind, path, "t")
    column, value = BLOB_DAMAGE[case]
    with sqlite3.connect(path) as db:
        _, _, parts = newest(db, "t")
        db.execute(f"UPDATE waypoint_blobs SET {column} = ? WHERE checkpoint_id = 't' AND hash = ?",
                   (value, parts["s:messages"]))
    await read_back(kind, path, "t")


@pytest.mark.parametrize("kind", STORES)
async def test_history_list_prune_and_the_ledger_refuse_tampered_rows(kind, tmp_path):
    path = tmp_path / "runs.db"
    await paused_runs(kind, path, "t")
    with sqlite3.connect(path) as db:
        db.execute(f"UPDATE waypoint_checkpoints SET status = 'bogus', parts = '[[[' WHERE {NEWEST}")
        db.execute("INSERT INTO waypoint_ledger (checkpoint_id, version, call_id, result, created_at) "
                   "VALUES ('t', 1, 'call-1', ?, 0)", (10**14,))
    store = open_store(kind, path)
    try:
        for call in (lambda: store.history("t"), lambda: store.list(), lambda: store.prune("t"),
                     lambda: store.recorded_calls("t", 1)):
            with pytest.raises(CheckpointCorrupted, match="'t'"):
                await call()
    finally:
        await store.close()


# --- 5. hostile content behind a valid (unsigned) checksum ------------------------------------


def forge(path: Path, cid: str, *, part: str | None = None, data: bytes = b"", header_changes=None) -> None:
    """What anyone with write access can do to an unsigned store: replace a part's newest segment (with
    the right BLAKE2b address) or the header's fields, and re-checksum the header."""
    serializer = Serializer()
    with sqlite3.connect(path) as db:
        version, header, parts = newest(db, cid)
        if part is not None:
            (parent,) = db.execute("SELECT parent FROM waypoint_blobs WHERE checkpoint_id = ? AND hash = ?",
                                   (cid, parts[part])).fetchone()
            digest = hashlib.blake2b((parent or "").encode() + data, digest_size=16).hexdigest()
            db.execute("INSERT INTO waypoint_blobs (checkpoint_id, hash, parent, data) VALUES (?, ?, ?, ?)",
                       (cid, digest, parent, data))
            parts[part] = digest
        content = serializer.loads(header)
        content["parts"] = parts
        content.update(header_changes or {})
        db.execute("UPDATE waypoint_checkpoints SET header = ?, parts = ? WHERE checkpoint_id = ? AND version = ?",
                   (serializer.dumps(content), json.dumps(parts), cid, version))


SEGMENTS = {
    "count-over-4-bytes": [2**40, b"\x01"],
    "counts-adding-past-4-bytes": [2**32 - 1, b"\x01" * 10],
    "count-above-its-bytes": [5, b"\x01"],
    "count-negative": [-1, b""],
    "count-a-bool": [True, b"\x01"],
    "not-a-pair": "segment",
}


@pytest.mark.parametrize("case", sorted(SEGMENTS))
async def test_a_list_segment_with_an_impossible_count_is_corrupted(case, tmp_path):
    path = tmp_path / "runs.db"
    await paused_runs("sqlite", path, "t")
    forge(path, "t", part="s:messages", data=Serializer().encode_value(SEGMENTS[case]))
    await read_back("sqlite", path, "t")


HEADERS = {
    "lists-unhashable": {"lists": [[1]]},
    "lists-an-int": {"lists": 5},
    "state-a-list-of-junk": {"state": [[1], 2, 3]},
    "state-unknown-kind": {"state": "nonsense"},
    "format-missing": {"format": None},
    "format-newer": {"format": 99},
    "meta-missing": {"meta": None},
    "meta-a-list": {"meta": [1, 2]},
}


@pytest.mark.parametrize("case", sorted(HEADERS))
async def test_a_header_with_fields_of_the_wrong_shape_is_corrupted(case, tmp_path):
    path = tmp_path / "runs.db"
    await paused_runs("sqlite", path, "t")
    forge(path, "t", header_changes=HEADERS[case])
    await read_back("sqlite", path, "t")


# --- 4. signed content stays with its run and version -----------------------------------------


@pytest.mark.parametrize("key", [KEY, None], ids=["signed", "unsigned"])
@pytest.mark.parametrize("kind", STORES)
async def test_one_runs_content_is_not_accepted_as_another_runs(kind, key, tmp_path):
    path = tmp_path / "runs.db"
    serializer = Serializer(key=key)
    await paused_runs(kind, path, "alice", "mallory", serializer=serializer)
    with sqlite3.connect(path) as db:
        _, header, parts = newest(db, "mallory")
        version, _, _ = newest(db, "alice")
        db.execute("INSERT OR IGNORE INTO waypoint_blobs SELECT 'alice', hash, parent, data FROM waypoint_blobs "
                   "WHERE checkpoint_id = 'mallory'")
        db.execute("UPDATE waypoint_checkpoints SET header = ?, parts = ? WHERE checkpoint_id = 'alice' AND version = ?",
                   (header, json.dumps(parts), version))
    messages = await read_back(kind, path, "alice", serializer)
    assert all(f"version {version}" in m and "mallory" not in m for m in messages), messages


@pytest.mark.parametrize("key", [KEY, None], ids=["signed", "unsigned"])
@pytest.mark.parametrize("kind", STORES)
async def test_an_old_version_is_not_accepted_as_a_newer_one_with_a_forged_status_and_step(kind, key, tmp_path):
    path = tmp_path / "runs.db"
    serializer = Serializer(key=key)
    await paused_runs(kind, path, "t", serializer=serializer)
    with sqlite3.connect(path) as db:
        version, _, _ = newest(db, "t")
        db.execute("INSERT INTO waypoint_checkpoints (checkpoint_id, version, status, step, fingerprint, "
                   "created_at, updated_at, lease_owner, lease_expires, error, header, parts) "
                   "SELECT checkpoint_id, ?, 'interrupted', 7, fingerprint, "
                   "created_at, updated_at, NULL, NULL, NULL, header, parts FROM waypoint_checkpoints "
                   "WHERE checkpoint_id = 't' AND version = 2", (version + 1,))
    messages = await read_back(kind, path, "t", serializer)
    assert all(f"version {version + 1}" in m for m in messages), messages


async def test_a_failure_recorded_on_the_last_good_content_is_bound_to_its_own_version(tmp_path):
    """`mark()` re-uses the last parts under a new status: it must sign a header for the new version."""

    class Unwritable:
        pass

    serializer = Serializer(key=KEY)
    store = SQLiteStore(tmp_path / "runs.db")
    g = Graph(name="g", state=dict)
    g.add_node("ok", lambda x, state: state.update(n=1) or x)
    g.add_node("bad", lambda x, state: state.update(obj=Unwritable()) or x)
    g.add_edge(START, "ok")
    g.add_edge("ok", "bad")
    g.add_edge("bad", END)
    app = g.compile(store=store, serializer=serializer)
    with pytest.raises(Exception, match="Unwritable"):
        await app.ainvoke(1, checkpoint_id="m")
    snap = await app.get_run("m")
    assert snap.meta.status == "failed" and snap.meta.version == 3 and snap.state == {"n": 1}
    assert "Unwritable" in snap.meta.error
    await store.close()


@pytest.mark.parametrize("key", [None, KEY], ids=["unsigned", "signed"])
async def test_headers_written_before_versions_were_bound_are_read_only_without_a_key(key, tmp_path):
    path = tmp_path / "runs.db"
    serializer = Serializer(key=key)
    await paused_runs("sqlite", path, "old", serializer=serializer)
    with sqlite3.connect(path) as db:
        version, header, _ = newest(db, "old")
        content = serializer.loads(header)
        del content["meta"]
        content["format"] = 1
        db.execute("UPDATE waypoint_checkpoints SET header = ? WHERE checkpoint_id = 'old' AND version = ?",
                   (serializer.dumps(content), version))
    store = SQLiteStore(path)
    app = build(store, serializer)
    try:
        if key is None:
            assert (await app.get_run("old")).state["messages"][-1]["from"] == "old"
            assert await app.ainvoke(None, checkpoint_id="old", resume=True) == "done old"
        else:
            with pytest.raises(CheckpointCorrupted, match="format 1"):
                await app.get_run("old")
    finally:
        await store.close()


# --- what the writer does so that it never writes what the reader refuses ---------------------


async def test_a_state_with_more_fields_than_a_version_may_have_parts_is_stored_whole(tmp_path):
    """Before: each field was a part, and reading 40,000 parts overflowed SQLite's bound parameters."""
    store = SQLiteStore(tmp_path / "runs.db")
    g = Graph(name="wide", state=dict)
    g.add_node("fill", lambda x, state: state.update({f"k{i}": i for i in range(MANY)}) or x)
    g.add_node("name", lambda x, state: state.update({"n" * 5000: 1}) or x)
    g.add_edge(START, "fill")
    g.add_edge("fill", "name")
    g.add_edge("name", END)
    app = g.compile(store=store)
    await app.ainvoke(0, checkpoint_id="w")
    snap = await app.get_run("w")
    assert snap.state["k0"] == 0 and len(snap.state) == MANY + 1
    await store.close()


async def test_long_list_chains_are_restarted_so_reads_stay_bounded(monkeypatch):
    from waypoint.engine.keep import checkpoint

    monkeypatch.setattr(checkpoint, "MAX_CHAIN", 4)
    store = MemoryStore()
    g = Graph(name="long", state=dict)
    g.add_node("add", lambda x, state: state.setdefault("items", []).append(x) or x + 1)
    g.add_edge(START, "add")
    g.add_branch("add", lambda x: "add" if x < 30 else END, ends=["add", END])
    app = g.compile(store=store, max_steps=100)
    await app.ainvoke(0, checkpoint_id="l")
    for meta in await store.history("l"):
        record = await store.get("l", meta.version)
        assert all(len(chain) <= 4 for chain in record.chains.values())
    assert (await app.get_run("l")).state["items"] == list(range(30))
