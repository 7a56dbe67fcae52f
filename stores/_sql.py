"""The SQL behind every SQL store: one schema, numbered migrations, and each store operation.

Both `SQLiteStore` (sqlite3 on a worker thread) and `SQLStore` (SQLAlchemy async: Postgres, or
SQLite through aiosqlite) run these same functions. They take a `DB` — four methods over one open
transaction — and use only SQL that SQLite and Postgres both accept, with `:name` parameters
(sqlite3's named style and SQLAlchemy's `text()` style alike). Compare-and-set is
`INSERT … ON CONFLICT DO NOTHING` on the `(checkpoint_id, version)` key: zero rows inserted means
another writer took that version first.

Leases are judged on one clock (engine/keep/store.py, guarantee 9): in every statement that writes or
compares a lease or a queue claim, "now" is `now_sql(db)` — the database server's
`clock_timestamp()` on Postgres, whose clients may sit on machines whose clocks disagree; on SQLite the
host's clock as SQLite reads it (`julianday('now')`), which every process that can open the file shares
whatever its own `time.time()` says. Every write for a run is fenced in its own transaction (guarantee 11):
`put` reads the newest version's lease in the same round trip as its compare-and-set, `record_call` inserts
only `WHERE` the writer still holds the run, `delete(force=False)` checks the lease after taking the run's lock.

Where the two databases differ, the difference is one statement keyed by `db.dialect`: SQLite runs
every write transaction under the database's one write lock (`BEGIN IMMEDIATE`), so writers never
interleave; Postgres runs them side by side (READ COMMITTED), so a write that reads before it writes
(put's compare-and-set and blob check, a fenced ledger write, delete, prune, expire) first takes the run's advisory lock
(`_lock_run`), and migrations take a database-wide one, so processes that start at once migrate one
after the other.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from waypoint.engine.errors import CheckpointConflict, CheckpointCorrupted, CheckpointError, LeaseLost
from waypoint.engine.keep.store import (
    MAX_HASH,
    MAX_PART_NAME,
    MAX_PARTS,
    Blob,
    Checkpoint,
    CheckpointMeta,
    MissingBlobs,
    RunStatus,
    meta_problem,
    parts_problem,
    version_label,
)

from ._common import (
    LEDGER_NEEDED,
    RESTORE,
    Expiry,
    chain_from,
    check_holder,
    check_idle,
    check_limit,
    check_newest,
    check_due_by,
    check_put,
    check_status,
    conflict_message,
    cursor,
    lost_message,
    needed_blobs,
    stamped,
)

SCHEMA_VERSION = 12
T = TypeVar("T")

_BINARY = {"sqlite": "BLOB", "postgresql": "BYTEA"}
_REAL = {"sqlite": "REAL", "postgresql": "DOUBLE PRECISION"}

# Migration N brings a database from schema N-1 to N. Never edit a released one: add the next.
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE waypoint_checkpoints (
            checkpoint_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            status TEXT NOT NULL,
            step INTEGER NOT NULL,
            fingerprint TEXT NOT NULL,
            created_at {real} NOT NULL,
            updated_at {real} NOT NULL,
            lease_owner TEXT,
            lease_expires {real},
            error TEXT,
            header {binary} NOT NULL,
            parts TEXT NOT NULL,
            PRIMARY KEY (checkpoint_id, version))""",
        "CREATE INDEX waypoint_checkpoints_updated ON waypoint_checkpoints (updated_at)",
        """CREATE TABLE waypoint_blobs (
            checkpoint_id TEXT NOT NULL,
            hash TEXT NOT NULL,
            parent TEXT,
            data {binary} NOT NULL,
            PRIMARY KEY (checkpoint_id, hash))""",
        """CREATE TABLE waypoint_ledger (
            checkpoint_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            call_id TEXT NOT NULL,
            result {binary} NOT NULL,
            created_at {real} NOT NULL,
            PRIMARY KEY (checkpoint_id, version, call_id))""",
    ],
    2: ["ALTER TABLE waypoint_checkpoints ADD COLUMN origin TEXT"],
    # The run queue (stores/queue.py): one row per run with work to do or last done.
    3: [
        """CREATE TABLE waypoint_queue (
            checkpoint_id TEXT NOT NULL PRIMARY KEY,
            graph TEXT NOT NULL,
            kind TEXT NOT NULL,
            payload {binary} NOT NULL,
            base_version INTEGER,
            state TEXT NOT NULL,
            worker TEXT,
            attempts INTEGER NOT NULL,
            submitted_at {real} NOT NULL,
            claimed_at {real},
            claimed_until {real},
            finished_at {real},
            outcome TEXT,
            error TEXT,
            result {binary})""",
        "CREATE INDEX waypoint_queue_ready ON waypoint_queue (state, submitted_at)",
    ],
    # Claims that let go (stores/_queue_sql.py): a token per claim, hand-backs that are not failures, a
    # backoff, the version an outcome left the run at; and the workers serving each graph.
    4: [
        "ALTER TABLE waypoint_queue ADD COLUMN claim TEXT",
        "ALTER TABLE waypoint_queue ADD COLUMN handbacks INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE waypoint_queue ADD COLUMN not_before {real}",
        "ALTER TABLE waypoint_queue ADD COLUMN version INTEGER",
        """CREATE TABLE waypoint_workers (
            name TEXT NOT NULL,
            graph TEXT NOT NULL,
            until {real} NOT NULL,
            PRIMARY KEY (graph, name))""",
    ],
    # Claims in a row that found the run where the previous claim found it (no progress in between): what
    # a worker gives work up by, so a run whose workers die now and then while it moves on goes on.
    5: [
        "ALTER TABLE waypoint_queue ADD COLUMN stalls INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE waypoint_queue ADD COLUMN seen INTEGER",
    ],
    # Ledger entries bound to the run's incarnation (its created_at): a run deleted and started again on its ID
    # never reads an entry of the run before it. Existing entries get the incarnation of the version their
    # page began at (or the run's newest).
    6: [
        "ALTER TABLE waypoint_ledger ADD COLUMN incarnation {real}",
        "UPDATE waypoint_ledger SET incarnation = COALESCE("
        "(SELECT c.created_at FROM waypoint_checkpoints c WHERE c.checkpoint_id = waypoint_ledger.checkpoint_id "
        "AND c.version >= waypoint_ledger.version ORDER BY c.version LIMIT 1), "
        "(SELECT c.created_at FROM waypoint_checkpoints c WHERE c.checkpoint_id = waypoint_ledger.checkpoint_id "
        "ORDER BY c.version DESC LIMIT 1))",
    ],
    # Pause deadlines (engine/keep/store.py, guarantee 13): kept on a run's newest version only, so the partial
    # index holds one row per run that waits with a deadline and a look for due ones reads only those.
    7: [
        "ALTER TABLE waypoint_checkpoints ADD COLUMN deadline {real}",
        "CREATE INDEX waypoint_checkpoints_deadline ON waypoint_checkpoints (deadline) WHERE deadline IS NOT NULL",
    ],
    # Webhook deliveries (stores/deliveries.py): one row per (run incarnation, version, event, receiver), inserted
    # by whichever service sees the event first, then claimed for each attempt; its `id` is the delivery's ID.
    8: [
        """CREATE TABLE waypoint_deliveries (
            checkpoint_id TEXT NOT NULL, incarnation {real} NOT NULL, version INTEGER NOT NULL, event TEXT NOT NULL,
            target TEXT NOT NULL, id TEXT NOT NULL UNIQUE, body {binary} NOT NULL, state TEXT NOT NULL,
            attempts INTEGER NOT NULL, next_try {real} NOT NULL, claim TEXT, claimed_until {real},
            created_at {real} NOT NULL, finished_at {real}, last_error TEXT,
            PRIMARY KEY (checkpoint_id, incarnation, version, event, target))""",
        "CREATE INDEX waypoint_deliveries_due ON waypoint_deliveries (target, state, next_try)",
    ],
    # Cancel requests (stores/_cancel_sql.py): a person's newest request to stop a running run, read by the process
    # executing it.
    9: [
        """CREATE TABLE waypoint_cancels (
            checkpoint_id TEXT NOT NULL PRIMARY KEY, version INTEGER NOT NULL, cancel_when TEXT NOT NULL,
            requested_by TEXT NOT NULL, requested_at {real} NOT NULL)""",
    ],
    # Live events relayed from the process executing a run (stores/_relay_sql.py): a short, trimmed log per run of
    # what the store does not keep (a model's tokens), numbered per checkpoint ID.
    10: [
        """CREATE TABLE waypoint_run_events (
            checkpoint_id TEXT NOT NULL, n INTEGER NOT NULL, incarnation {real} NOT NULL, base INTEGER NOT NULL,
            kind TEXT NOT NULL, data TEXT NOT NULL, at {real} NOT NULL, PRIMARY KEY (checkpoint_id, n))""",
    ],
    # Queued inputs (stores/_input_sql.py): new input for a running run, numbered per run, run after its turn.
    11: [
        """CREATE TABLE waypoint_inputs (
            checkpoint_id TEXT NOT NULL, n INTEGER NOT NULL, policy TEXT NOT NULL, queued_by TEXT NOT NULL,
            queued_at {real} NOT NULL, payload {binary} NOT NULL, PRIMARY KEY (checkpoint_id, n))""",
    ],
    # Each input's `state`: "waiting", "taken" or "stuck" (a hint the engine writes after the fact, for
    # `waiting_inputs`); the inputs that are not taken are indexed.
    12: [
        "ALTER TABLE waypoint_inputs ADD COLUMN state TEXT NOT NULL DEFAULT 'waiting'",
        "CREATE INDEX waypoint_inputs_waiting ON waypoint_inputs (checkpoint_id) WHERE state <> 'taken'",
    ],
}

_MIGRATION_LOCK = 0x57A7_0001  # Postgres advisory lock key: one migrating process at a time


_NOW = {"postgresql": "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
        "sqlite": "((julianday('now') - 2440587.5) * 86400.0)"}
"""The store's clock in SQL, seconds since the epoch: the server's on Postgres; on SQLite the host's as SQLite
itself reads it (never the calling process's `time.time()`, which a process may have wrong)."""


def now_sql(db: DB) -> str:
    """SQL for the store's clock (seconds since the epoch), evaluated by the database in the statement."""
    return _NOW[db.dialect]


def clock(db: DB) -> float:
    """The store's clock now."""
    return float(db.rows(f"SELECT {_NOW[db.dialect]}")[0][0])


class DB(Protocol):
    """One open transaction, whatever the driver; `dialect` is "sqlite" or "postgresql"."""

    dialect: str

    def rows(self, sql: str, params: Mapping[str, Any] = ...) -> list[tuple]: ...
    def run(self, sql: str, params: Mapping[str, Any] = ...) -> int: ...
    def many(self, sql: str, params: Sequence[Mapping[str, Any]]) -> None: ...


# --- schema ---------------------------------------------------------------------------------------------

def migrate(db: DB, dialect: str) -> None:
    """Create or upgrade the schema inside the caller's (write) transaction.

    On Postgres the transaction first takes an advisory lock, so processes starting at once on a new
    database migrate one after the other (two `CREATE TABLE IF NOT EXISTS` racing can both fail)."""
    if dialect == "postgresql":
        db.rows(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
    db.run("CREATE TABLE IF NOT EXISTS waypoint_schema (version INTEGER NOT NULL)")
    found = db.rows("SELECT version FROM waypoint_schema")
    current = found[0][0] if found else 0
    if current > SCHEMA_VERSION:
        raise CheckpointError(
            f"the checkpoint database has schema version {current}, newer than this Waypoint "
            f"knows ({SCHEMA_VERSION}); upgrade waypoint-graph to use it"
        )
    for number in range(current + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[number]:
            db.run(statement.format(binary=_BINARY[dialect], real=_REAL[dialect]))
    if current == 0:
        db.run("INSERT INTO waypoint_schema (version) VALUES (:v)", {"v": SCHEMA_VERSION})
    elif current < SCHEMA_VERSION:
        db.run("UPDATE waypoint_schema SET version = :v", {"v": SCHEMA_VERSION})


# --- operations -------------------------------------------------------------------------------------------

RUNS_CHANNEL = "waypoint_runs"
"""Postgres NOTIFY channel: a run's transitions — a version that starts it or claims it (written after one
that was not running), one at which it stops (paused, completed, failed) — and its deletion, announced when
the transaction commits, as `<version> <status> <checkpoint id>` ("0 deleted <id>" for a delete). What
`waypoint serve` follows runs executed by other processes with (`SQLStore.listen_runs`). Not every step:
Postgres serialises the commits of every transaction that notifies (one lock for the whole database), and
a worker commits at every step."""
_NOTIFY_ID_BYTES = 7000  # a NOTIFY payload must stay under 8000 bytes: a longer ID is announced as ""


def _announce(db: DB, params: dict[str, Any], version: int, status: str, checkpoint_id: str, *,
              always: bool = False) -> str:
    """Postgres: a `, pg_notify(...)` column announcing this write on `RUNS_CHANNEL` if it is a transition
    (`always`: a deletion), evaluated in the statement the write makes anyway (delivered at commit, never for a
    transaction rolled back); "" on SQLite, where followers poll."""
    if db.dialect != "postgresql":
        return ""
    named = checkpoint_id if len(checkpoint_id.encode("utf-8", "surrogatepass")) <= _NOTIFY_ID_BYTES else ""
    params["announce"] = f"{int(version)} {status} {named}"
    if always:
        return f", pg_notify('{RUNS_CHANNEL}', :announce)"
    params["announce_status"] = status
    before = ("COALESCE((SELECT a.status FROM waypoint_checkpoints a WHERE a.checkpoint_id = :c "
              "ORDER BY a.version DESC LIMIT 1), '')")
    return (f", CASE WHEN :announce_status <> 'running' OR {before} <> 'running' "
            f"THEN pg_notify('{RUNS_CHANNEL}', :announce) END")


def _lock_run(db: DB, checkpoint_id: str) -> None:
    """Postgres: the run's writers take turns until this transaction ends. (SQLite needs nothing: a
    write transaction already holds the database's only write lock.)"""
    if db.dialect == "postgresql":
        db.rows("SELECT pg_advisory_xact_lock(hashtextextended(:c, 0))", {"c": checkpoint_id})


_META_COLUMNS = ("checkpoint_id, version, status, step, fingerprint, created_at, updated_at, "
                 "lease_owner, lease_expires, error, origin, deadline")


def _meta(row: Sequence[Any]) -> CheckpointMeta:
    """The meta columns of a row, type-checked: a damaged or altered row is CheckpointCorrupted."""
    meta = CheckpointMeta(
        checkpoint_id=row[0], version=row[1], status=row[2], step=row[3], fingerprint=row[4],
        created_at=row[5], updated_at=row[6], lease_owner=row[7], lease_expires=row[8], error=row[9],
        origin=row[10], deadline=row[11],
    )
    problem = meta_problem(meta)
    if problem is not None:
        raise CheckpointCorrupted(f"{version_label(row[0], row[1])}: {problem}; {RESTORE}")
    return meta


def get(db: DB, checkpoint_id: str, version: int | None) -> Checkpoint | None:
    sql = f"SELECT {_META_COLUMNS}, header, parts FROM waypoint_checkpoints WHERE checkpoint_id = :c"
    params: dict[str, Any] = {"c": checkpoint_id}
    if version is None:
        sql += " ORDER BY version DESC LIMIT 1"
    else:
        sql += " AND version = :v"
        params["v"] = version
    found = db.rows(sql, params)
    if not found:
        return None
    row = found[0]
    meta = _meta(row)
    where = version_label(checkpoint_id, meta.version)
    parts = _parts(row[13], where)
    blobs = _blobs(db, checkpoint_id, set(parts.values()), where)
    return Checkpoint(meta=meta, header=_bytes(row[12], where, "header"), parts=parts,
                      chains={name: chain_from(blobs, head, where, name) for name, head in parts.items()})


# A parts cell holding MAX_PARTS names and hashes of the longest kinds, every character JSON-escaped.
_MAX_PARTS_CELL = MAX_PARTS * (6 * (MAX_PART_NAME + MAX_HASH) + 8) + 2


def _bytes(value: Any, where: str, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):  # bytes(an int) would allocate that many
        raise CheckpointCorrupted(f"{where}: its {what} is stored as {type(value).__name__}, not bytes; {RESTORE}")
    return bytes(value)


def _parts(cell: Any, where: str) -> dict[str, str]:
    """A row's part map (JSON text), checked for type and size before and after parsing."""
    if type(cell) is not str or len(cell) > _MAX_PARTS_CELL:
        raise CheckpointCorrupted(f"{where}: its part list is not JSON text of a possible size; {RESTORE}")
    try:
        parts = json.loads(cell)
    except (ValueError, RecursionError, MemoryError):
        raise CheckpointCorrupted(f"{where}: its part list is not valid JSON; {RESTORE}") from None
    problem = parts_problem(parts)
    if problem is not None:
        raise CheckpointCorrupted(f"{where}: {problem}; {RESTORE}")
    return parts


_HEADS_PER_QUERY = 500  # bound parameters per query stay far below every database's limit


def _reach_sql(heads: int, columns: str) -> str:
    """Every blob reachable from the heads, each once. UNION (not UNION ALL) drops a (hash, parent)
    row already produced, so a parent cycle written into the table ends the recursion (it cannot run
    forever) and a blob shared by several chains is read once. The walk in Python (`chain_from`)
    then bounds each chain's length and reports the cycle."""
    names = ", ".join(f":h{i}" for i in range(heads))
    return f"""WITH RECURSIVE reach (hash, parent) AS (
                SELECT hash, parent FROM waypoint_blobs WHERE checkpoint_id = :c AND hash IN ({names})
                UNION
                SELECT b.hash, b.parent FROM waypoint_blobs b
                  JOIN reach ON b.checkpoint_id = :c AND b.hash = reach.parent)
            SELECT {columns} FROM waypoint_blobs b
             WHERE b.checkpoint_id = :c AND b.hash IN (SELECT hash FROM reach)"""


def _reach(db: DB, checkpoint_id: str, heads: set[str], columns: str) -> list[tuple]:
    ordered, rows = sorted(heads), []
    for start in range(0, len(ordered), _HEADS_PER_QUERY):
        chunk = ordered[start:start + _HEADS_PER_QUERY]
        params: dict[str, Any] = {f"h{i}": h for i, h in enumerate(chunk)}
        params["c"] = checkpoint_id
        rows += db.rows(_reach_sql(len(chunk), columns), params)
    return rows


def _blobs(db: DB, checkpoint_id: str, heads: set[str], where: str) -> dict[str, Blob]:
    """The blobs reachable from `heads`, by hash, each type-checked."""
    found: dict[str, Blob] = {}
    for digest, parent, data in _reach(db, checkpoint_id, heads, "b.hash, b.parent, b.data"):
        if type(digest) is not str or not (parent is None or type(parent) is str):
            raise CheckpointCorrupted(f"{where}: a blob's hash or parent link is not text; {RESTORE}")
        found[digest] = Blob(hash=digest, data=_bytes(data, where, "blob data"), parent=parent)
    return found


def put(db: DB, meta: CheckpointMeta, header: bytes, parts: Mapping[str, str], blobs: Sequence[Blob],
        expected_version: int | None, holder: str | None = None, takeover: bool = False,
        fresh: bool = False, due_by: float | None = None) -> CheckpointMeta:
    check_put(meta, expected_version)
    cid = meta.checkpoint_id
    _lock_run(db, cid)  # a delete, prune or other writer of this run cannot slip between the checks and the insert
    needed = sorted(needed_blobs(parts, blobs))
    params: dict[str, Any] = {f"h{i}": h for i, h in enumerate(needed)}
    params["c"] = cid
    in_needed = f"FROM waypoint_blobs WHERE checkpoint_id = :c AND hash IN ({', '.join(f':h{i}' for i in range(len(needed)))})"
    found_sql = f", (SELECT COUNT(*) {in_needed})" if needed else ", 0"
    announce = _announce(db, params, meta.version, meta.status, cid)  # in the same round trip
    # one round trip for every check: the newest version (compare-and-set, incarnation, its lease on the store's
    # clock) and the blobs this version points at without carrying them
    now = now_sql(db)
    newest, created, status, owner, live, clock_now, found, waited = db.rows(
        f"SELECT n.version, n.created_at, n.status, n.lease_owner, CASE WHEN n.lease_expires > {now} THEN 1 "
        f"ELSE 0 END, {now}{found_sql}, n.deadline{announce} FROM (SELECT 1 AS one) d LEFT JOIN (SELECT version, "
        "created_at, status, lease_owner, lease_expires, deadline FROM waypoint_checkpoints WHERE checkpoint_id = :c "
        "ORDER BY version DESC LIMIT 1) n ON 1 = 1", params)[0][:8]
    check_newest(cid, newest, expected_version, created, meta.created_at, fresh)
    check_holder(cid, status, owner, bool(live), holder, takeover)
    check_due_by(cid, due_by, float(clock_now))  # this transaction's own reading of the store's clock
    meta = stamped(meta, float(clock_now), created, fresh)
    if found < len(needed):
        present = {h for (h,) in db.rows(f"SELECT hash {in_needed}", params)}
        raise MissingBlobs(cid, set(needed) - present)
    if blobs:
        db.many(
            "INSERT INTO waypoint_blobs (checkpoint_id, hash, parent, data) VALUES (:c, :h, :p, :d) "
            "ON CONFLICT DO NOTHING",
            [{"c": meta.checkpoint_id, "h": b.hash, "p": b.parent, "d": b.data} for b in blobs],
        )
    row: dict[str, Any] = {
        "c": meta.checkpoint_id, "v": meta.version, "s": meta.status, "st": meta.step, "f": meta.fingerprint,
        "ca": meta.created_at, "ua": meta.updated_at, "lo": meta.lease_owner, "le": meta.lease_expires,
        "e": meta.error, "o": meta.origin, "dl": meta.deadline, "hd": header,
        "p": json.dumps(dict(parts), sort_keys=True)}
    inserted = db.run(
        f"INSERT INTO waypoint_checkpoints ({_META_COLUMNS}, header, parts) VALUES "
        "(:c, :v, :s, :st, :f, :ca, :ua, :lo, :le, :e, :o, :dl, :hd, :p) ON CONFLICT DO NOTHING", row)
    if inserted != 1:
        raise CheckpointConflict(conflict_message(meta.checkpoint_id, expected_version))
    if waited is not None:  # only the newest version keeps a deadline (guarantee 13): the index stays one per run
        db.run("UPDATE waypoint_checkpoints SET deadline = NULL WHERE checkpoint_id = :c AND version = :v",
               {"c": cid, "v": newest})
    return meta


def renew_lease(db: DB, checkpoint_id: str, version: int, owner: str, seconds: float) -> bool:
    now = now_sql(db)
    return db.run(
        f"UPDATE waypoint_checkpoints SET lease_expires = {now} + :s WHERE checkpoint_id = :c AND version = :v "
        f"AND lease_owner = :o AND lease_expires > {now} "
        "AND version = (SELECT MAX(version) FROM waypoint_checkpoints WHERE checkpoint_id = :c)",
        {"s": float(seconds), "c": checkpoint_id, "v": version, "o": owner}) == 1


def renew_leases(db: DB, leases: Sequence[tuple[str, int, str, float]]) -> list[bool]:
    return [renew_lease(db, *lease) for lease in leases]


_HELD = ("EXISTS (SELECT 1 FROM waypoint_checkpoints h WHERE h.checkpoint_id = :c AND h.status = 'running' "
         "AND h.lease_owner = :o AND h.lease_expires > {now} AND h.created_at = :i AND h.version = "
         "(SELECT MAX(m.version) FROM waypoint_checkpoints m WHERE m.checkpoint_id = :c))")
"""The run's newest version is `running` under owner :o's unexpired lease, in incarnation :i."""


def record_call(db: DB, checkpoint_id: str, version: int, call_id: str, result: bytes, holder: str | None = None,
                incarnation: float | None = None) -> bool:
    params: dict[str, Any] = {"c": checkpoint_id, "v": version, "k": call_id, "r": result, "i": incarnation}
    now = now_sql(db)
    if holder is None:
        return db.run(
            "INSERT INTO waypoint_ledger (checkpoint_id, version, call_id, result, created_at, incarnation) "
            f"VALUES (:c, :v, :k, :r, {now}, :i) ON CONFLICT DO NOTHING", params) == 1
    params["o"] = holder
    _lock_run(db, checkpoint_id)  # a delete of the run cannot slip between the check and the insert
    held = _HELD.format(now=now)
    if db.run("INSERT INTO waypoint_ledger (checkpoint_id, version, call_id, result, created_at, incarnation) "
              f"SELECT :c, :v, :k, :r, {now}, :i WHERE {held} ON CONFLICT DO NOTHING", params) == 1:
        return True
    (still,), = db.rows(f"SELECT CASE WHEN {held} THEN 1 ELSE 0 END", params)
    if not still:
        raise LeaseLost(lost_message(checkpoint_id, False) + f" (ledger entry {call_id[-80:]!r} was not recorded)",
                        checkpoint_id=checkpoint_id)
    return False


def recorded_calls(db: DB, checkpoint_id: str, version: int, incarnation: float | None = None,
                   prefix: str | None = None) -> dict[str, bytes]:
    sql = "SELECT call_id, result FROM waypoint_ledger WHERE checkpoint_id = :c AND version = :v"
    if incarnation is not None:  # entries written before they were bound (NULL) are read as before
        sql += " AND (incarnation = :i OR incarnation IS NULL)"
    bound = None
    if prefix:  # by characters in both databases; compared in the database, so other tasks' rows are not sent
        sql += " AND substr(call_id, 1, :n) = :p"
        if db.dialect == "sqlite" and ord(prefix[-1]) < 0x7F:  # BINARY order is code point order: the primary
            bound = prefix[:-1] + chr(ord(prefix[-1]) + 1)         # key's index seeks to the prefix's rows
            sql += " AND call_id >= :p AND call_id < :q"
    rows = db.rows(sql, {"c": checkpoint_id, "v": version, "i": incarnation, "p": prefix, "n": len(prefix or ""),
                         "q": bound})
    where = version_label(checkpoint_id, version)
    calls = {}
    for call_id, result in rows:
        if type(call_id) is not str:
            raise CheckpointCorrupted(f"{where}: a tool-ledger call id is not text; {RESTORE}")
        calls[call_id] = _bytes(result, where, f"tool-ledger result for call {call_id[:80]!r}")
    return calls


def history(db: DB, checkpoint_id: str, limit: int | None) -> list[CheckpointMeta]:
    check_limit(limit, f"history('{checkpoint_id}')")
    sql = f"SELECT {_META_COLUMNS} FROM waypoint_checkpoints WHERE checkpoint_id = :c ORDER BY version DESC"
    params: dict[str, Any] = {"c": checkpoint_id}
    if limit is not None:
        sql += " LIMIT :n"
        params["n"] = limit
    return [_meta(r) for r in db.rows(sql, params)]


def list_runs(db: DB, status: str | None, limit: int, before: Any) -> list[CheckpointMeta]:
    check_status(status)
    check_limit(limit, "list()")
    after = cursor(before)
    sql = (f"SELECT {', '.join('c.' + c.strip() for c in _META_COLUMNS.split(','))} "
           "FROM waypoint_checkpoints c JOIN (SELECT checkpoint_id, MAX(version) AS v FROM waypoint_checkpoints "
           "GROUP BY checkpoint_id) h ON c.checkpoint_id = h.checkpoint_id AND c.version = h.v WHERE 1 = 1")
    params: dict[str, Any] = {"n": limit}
    if status is not None:
        sql += " AND c.status = :s"
        params["s"] = status
    if after is not None:
        sql += " AND (c.updated_at < :b OR (c.updated_at = :b AND c.checkpoint_id < :bid))"
        params["b"], params["bid"] = after[0], after[1] if after[1] is not None else ""
    sql += " ORDER BY c.updated_at DESC, c.checkpoint_id DESC LIMIT :n"
    return [_meta(r) for r in db.rows(sql, params)]


def list_due(db: DB, limit: int, after: Any = None) -> list[CheckpointMeta]:
    check_limit(limit, "list_due()")
    params: dict[str, Any] = {"n": limit}
    sql = (f"SELECT {_META_COLUMNS} FROM waypoint_checkpoints c WHERE deadline IS NOT NULL AND deadline <= "
           f"{now_sql(db)} AND version = (SELECT MAX(m.version) FROM waypoint_checkpoints m WHERE m.checkpoint_id = "
           "c.checkpoint_id)")  # a row an older writer left on an earlier version is not the run's
    if after is not None:
        sql += " AND (deadline > :ad OR (deadline = :ad AND checkpoint_id > :ac))"
        params["ad"], params["ac"] = after.deadline, after.checkpoint_id
    return [_meta(r) for r in db.rows(sql + " ORDER BY deadline, checkpoint_id LIMIT :n", params)]


def delete(db: DB, checkpoint_id: str, force: bool = True) -> bool:
    params: dict[str, Any] = {"c": checkpoint_id}
    _lock_run(db, checkpoint_id)
    if not force:
        check_idle(checkpoint_id, db.rows(
            f"SELECT lease_owner, lease_expires - {now_sql(db)} FROM waypoint_checkpoints WHERE checkpoint_id = :c "
            "AND status = 'running' AND version = (SELECT MAX(version) FROM waypoint_checkpoints WHERE "
            "checkpoint_id = :c)", params))
    announce = _announce(db, params, 0, "deleted", checkpoint_id, always=True)
    if announce:
        db.rows(f"SELECT 1{announce}", params)
    existed = db.run("DELETE FROM waypoint_checkpoints WHERE checkpoint_id = :c", params) > 0
    db.run("DELETE FROM waypoint_blobs WHERE checkpoint_id = :c", params)
    db.run("DELETE FROM waypoint_ledger WHERE checkpoint_id = :c", params)
    db.run("DELETE FROM waypoint_queue WHERE checkpoint_id = :c", params)  # its queued work goes with it
    db.run("DELETE FROM waypoint_cancels WHERE checkpoint_id = :c", params)
    db.run("DELETE FROM waypoint_inputs WHERE checkpoint_id = :c", params)
    return existed


def prune(db: DB, checkpoint_id: str, keep_last: int) -> int:
    params: dict[str, Any] = {"c": checkpoint_id, "k": max(1, keep_last)}
    _lock_run(db, checkpoint_id)
    keep_from = db.rows(
        "SELECT MIN(version) FROM (SELECT version FROM waypoint_checkpoints WHERE checkpoint_id = :c "
        "ORDER BY version DESC LIMIT :k) newest", params)
    if not keep_from or keep_from[0][0] is None:
        return 0
    params["v"] = keep_from[0][0]
    newest = db.rows("SELECT status FROM waypoint_checkpoints WHERE checkpoint_id = :c ORDER BY version DESC "
                     "LIMIT 1", params)
    dropped = db.run("DELETE FROM waypoint_checkpoints WHERE checkpoint_id = :c AND version < :v", params)
    if newest and newest[0][0] not in LEDGER_NEEDED:
        db.run("DELETE FROM waypoint_ledger WHERE checkpoint_id = :c AND version < :v", params)
    # Keep every blob some remaining version still reaches (heads and their whole chains); a damaged
    # part list fails the prune (and rolls it back) rather than guess what is still in use.
    heads: set[str] = set()
    for version, parts in db.rows("SELECT version, parts FROM waypoint_checkpoints WHERE checkpoint_id = :c", params):
        heads.update(_parts(parts, version_label(checkpoint_id, version)).values())
    live = {digest for (digest,) in _reach(db, checkpoint_id, heads, "b.hash")}
    stored = [h for (h,) in db.rows("SELECT hash FROM waypoint_blobs WHERE checkpoint_id = :c", params)]
    dead = [{"c": checkpoint_id, "h": h} for h in stored if h not in live]
    if dead:
        db.many("DELETE FROM waypoint_blobs WHERE checkpoint_id = :c AND hash = :h", dead)
    return dropped


_EXPIRED = ("SELECT c.checkpoint_id FROM waypoint_checkpoints c JOIN (SELECT checkpoint_id, MAX(version) AS v "
            "FROM waypoint_checkpoints {where} GROUP BY checkpoint_id) h ON c.checkpoint_id = h.checkpoint_id "
            "AND c.version = h.v WHERE c.status = 'interrupted' AND c.updated_at < :t ORDER BY c.checkpoint_id")


def expire(db: DB, older_than: float, now: float | None) -> list[str]:
    cutoff = (time.time() if now is None else now) - older_than
    gone = []
    for (checkpoint_id,) in db.rows(_EXPIRED.format(where=""), {"t": cutoff}):
        _lock_run(db, checkpoint_id)  # then look again: a resume may have claimed it meanwhile (Postgres)
        if db.rows(_EXPIRED.format(where="WHERE checkpoint_id = :c"), {"t": cutoff, "c": checkpoint_id}):
            delete(db, checkpoint_id)
            gone.append(checkpoint_id)
    return gone


class SQLStoreMethods:
    """The store contract for every SQL store: each method is one `_call` of the function above.

    A concrete store provides `_call(fn, *args, write=False)`, running `fn(db, *args)` in one
    transaction (a write transaction when `write`).
    """

    expiry: Expiry

    async def _call(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T:
        raise NotImplementedError

    async def get(self, checkpoint_id: str, version: int | None = None) -> Checkpoint | None:
        return await self._call(get, checkpoint_id, version)

    async def _renewals_call(self, fn: Callable[..., T], *args: Any) -> T:
        """`_call` for lease renewals: a store with a connection kept for them alone uses it (guarantee 12)."""
        return await self._call(fn, *args, write=True)

    async def list_due(self, *, limit: int = 100, after: CheckpointMeta | None = None) -> list[CheckpointMeta]:
        return await self._call(list_due, limit, after)

    async def put(self, meta: CheckpointMeta, header: bytes, parts: Mapping[str, str], blobs: Sequence[Blob],
                  *, expected_version: int | None, holder: str | None = None, takeover: bool = False,
                  fresh: bool = False, due_by: float | None = None) -> CheckpointMeta:
        stored = await self._call(put, meta, header, parts, blobs, expected_version, holder, takeover, fresh,
                                  due_by, write=True)
        if self.expiry.due():
            await self.expire()
        return stored

    async def renew_lease(self, checkpoint_id: str, version: int, owner: str, seconds: float) -> bool:
        return await self._call(renew_lease, checkpoint_id, version, owner, seconds, write=True)

    async def renew_leases(self, leases: Sequence[tuple[str, int, str, float]]) -> list[bool]:
        return await self._renewals_call(renew_leases, list(leases))

    async def clock(self) -> float:
        return await self._call(clock)

    async def record_call(self, checkpoint_id: str, version: int, call_id: str, result: bytes, *,
                          holder: str | None = None, incarnation: float | None = None) -> bool:
        return await self._call(record_call, checkpoint_id, version, call_id, result, holder, incarnation, write=True)

    async def recorded_calls(self, checkpoint_id: str, version: int, *,
                             incarnation: float | None = None, prefix: str | None = None) -> dict[str, bytes]:
        return await self._call(recorded_calls, checkpoint_id, version, incarnation, prefix)

    async def history(self, checkpoint_id: str, *, limit: int | None = None) -> list[CheckpointMeta]:
        return await self._call(history, checkpoint_id, limit)

    async def list(self, *, status: RunStatus | None = None, limit: int = 100,
                   before: float | CheckpointMeta | None = None) -> list[CheckpointMeta]:
        return await self._call(list_runs, status, limit, before)

    async def delete(self, checkpoint_id: str, *, force: bool = True) -> bool:
        return await self._call(delete, checkpoint_id, force, write=True)

    async def prune(self, checkpoint_id: str, *, keep_last: int = 1) -> int:
        return await self._call(prune, checkpoint_id, keep_last, write=True)

    async def expire(self, *, older_than: float | None = None, now: float | None = None) -> list[str]:
        return await self._call(expire, self.expiry.older_than(older_than), now, write=True)
