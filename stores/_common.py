"""Checks and messages every store shares."""

from __future__ import annotations

from waypoint.engine.store import STATUSES, CheckpointMeta


def check_put(meta: CheckpointMeta, expected_version: int | None) -> None:
    """Reject a put whose version does not follow the expected one (a caller bug, not a conflict)."""
    want = (expected_version or 0) + 1
    if meta.version != want:
        raise ValueError(
            f"run '{meta.checkpoint_id}': put of version {meta.version} with expected_version="
            f"{expected_version}; the new version must be {want}"
        )
    check_status(meta.status)


def check_status(status: str | None) -> None:
    if status is not None and status not in STATUSES:
        raise ValueError(f"unknown run status {status!r}; use one of {', '.join(STATUSES)}")


def conflict_message(checkpoint_id: str, expected_version: int | None) -> str:
    if expected_version is None:
        return (f"run '{checkpoint_id}' already exists (another writer created it first); "
                "load it and resume, or use another checkpoint_id")
    return (f"run '{checkpoint_id}' moved past version {expected_version} (another writer got there "
            "first); reload it before writing again")
