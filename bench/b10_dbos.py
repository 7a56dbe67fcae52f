"""B10: a durable workflow of 100 trivial steps on SQLite, Waypoint against DBOS (the durable-execution
library a Python user would pick instead; `pip install -e '.[bench]'` brings `dbos`). Figure: ms per step.

Both commit every step before the next one starts, with SQLite's `synchronous=FULL` (DBOS's SQLite default,
in its default rollback journal; Waypoint's `SQLiteStore(synchronous="FULL")`, in WAL):

  waypoint  a 100-node linear graph, each node adds 1, `durability="step"` (one committed version per step),
            one `invoke` per workflow on a new checkpoint ID (B1's "sqlite-full" case)
  dbos      a `@DBOS.workflow()` calling a `@DBOS.step()` that adds 1, 100 times, one call per workflow
            (a new workflow ID each), on its SQLite system database

  floor     the disk's floor for the same work: the standard library's sqlite3 on a WAL file with
            `synchronous=FULL`, one transaction per step writing what a Waypoint step writes there (a
            375-byte row and a 170-byte blob row, each under a primary key; measured on B1's file) —
            Waypoint ÷ floor is what its engine adds to the fsync it cannot avoid

    python -m bench.b10_dbos --impl dbos --case sqlite-full

(The figure is reported as `ms_per_step`: the harness's per-unit figure with the unit a step ÷ 1000.)
"""

from __future__ import annotations

import logging
from typing import Any

from bench._harness import Budget, NotAvailable, Target, child_main
from bench.b1_linear import N_NODES, make_waypoint

CASES = ("sqlite-full",)


def _check(result: Any) -> None:
    if result != N_NODES:
        raise AssertionError(f"wrong result: {result!r}")


def make_dbos(case: str, api: str) -> Target:
    try:
        from dbos import DBOS
    except ImportError as exc:
        raise NotAvailable(f"dbos is not installed (pip install -e '.[bench]'): {exc}") from exc
    from bench._stores import temp_db

    logging.getLogger("dbos").setLevel(logging.WARNING)
    path, cleanup = temp_db()
    DBOS(config={"name": "b10", "system_database_url": f"sqlite:///{path}"})

    @DBOS.step()
    def step(x: int) -> int:
        return x + 1

    @DBOS.workflow()
    def workflow(x: int) -> int:
        for _ in range(N_NODES):
            x = step(x)
        return x

    DBOS.launch()

    def close() -> None:
        DBOS.destroy()
        cleanup()

    return Target(call=lambda i: workflow(0), divisor=N_NODES * 1000, check=_check, close=close)


def make_floor(case: str, api: str) -> Target:
    import os
    import sqlite3

    from bench._stores import temp_db

    path, cleanup = temp_db()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE versions (run TEXT, version INTEGER, data BLOB, PRIMARY KEY (run, version))")
    conn.execute("CREATE TABLE blobs (hash TEXT PRIMARY KEY, data BLOB)")
    version_row, blob_row = os.urandom(375), os.urandom(170)

    def workflow(i: int) -> int:
        run = f"floor-{i}"
        for step in range(N_NODES):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO versions VALUES (?, ?, ?)", (run, step, version_row))
            conn.execute("INSERT INTO blobs VALUES (?, ?)", (f"{run}-{step}", blob_row))
            conn.execute("COMMIT")
        return N_NODES

    def close() -> None:
        conn.close()
        cleanup()

    return Target(call=workflow, divisor=N_NODES * 1000, check=_check, close=close)


def make(impl: str, case: str, api: str) -> Target:
    if impl == "floor":
        return make_floor(case, api)
    if impl == "waypoint":
        target = make_waypoint(case, api)
        target.divisor = N_NODES * 1000  # ms, as DBOS's figure
        return target
    return make_dbos(case, api)


if __name__ == "__main__":
    child_main(make, CASES, "ms_per_step", __doc__, budget=Budget(min_reps=5, max_reps=50, seconds=3.0))
