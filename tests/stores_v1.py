"""A checkpoint database as schema version 1 wrote it (before the `origin` column), for migration tests."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def create_v1_database(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.executescript(
            """
            PRAGMA journal_mode=WAL;
            CREATE TABLE waypoint_schema (version INTEGER NOT NULL);
            INSERT INTO waypoint_schema (version) VALUES (1);
            CREATE TABLE waypoint_checkpoints (
                checkpoint_id TEXT NOT NULL, version INTEGER NOT NULL, status TEXT NOT NULL,
                step INTEGER NOT NULL, fingerprint TEXT NOT NULL, created_at REAL NOT NULL,
                updated_at REAL NOT NULL, lease_owner TEXT, lease_expires REAL, error TEXT,
                header BLOB NOT NULL, parts TEXT NOT NULL, PRIMARY KEY (checkpoint_id, version));
            CREATE INDEX waypoint_checkpoints_updated ON waypoint_checkpoints (updated_at);
            CREATE TABLE waypoint_blobs (
                checkpoint_id TEXT NOT NULL, hash TEXT NOT NULL, parent TEXT, data BLOB NOT NULL,
                PRIMARY KEY (checkpoint_id, hash));
            CREATE TABLE waypoint_ledger (
                checkpoint_id TEXT NOT NULL, version INTEGER NOT NULL, call_id TEXT NOT NULL,
                result BLOB NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (checkpoint_id, version, call_id));
            INSERT INTO waypoint_checkpoints VALUES
                ('old-run', 1, 'interrupted', 1, 'fp', 1.0, 2.0, NULL, NULL, NULL, x'00', '{}');
            """
        )
