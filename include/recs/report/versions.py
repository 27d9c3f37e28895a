"""The published versions as the operator sees them: which is current, which is rolled back to.

Reads only ``published/`` (``recs.published.list_versions``, ``recs.nightly.history``): no data
file is opened. ``recs rollback`` without ``--to`` moves ``CURRENT`` to the *rollback target*
(``history.predecessor`` of the current version); any other complete, validated version can be
named with ``--to``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recs.nightly import history
from recs.published import current_version, list_versions, version_manifest

CURRENT = "current"
ROLLBACK_TARGET = "rollback target"
AVAILABLE = "available"

HISTORY_SHOWN = 10


def versions_report(published_dir: Path) -> dict[str, Any]:
    """Every complete version, newest snapshot first, each with its ``role``.

    Returns ``{"current", "rollback_target", "versions": [{"run_id", "snapshot_date",
    "generated_at", "shard_count", "rows", "users", "carried_over": [{"shard_id",
    "carried_from"}], "is_current", "role", "validated", "rollback_command"}], "history":
    [the last HISTORY_SHOWN changes of CURRENT, newest first]}``. ``role`` is ``current``,
    ``rollback target`` (where ``recs rollback`` goes) or ``available``; ``validated`` whether
    the manifest records a passed gate (only those can be made current again). Each history
    event has ``failed``: a switch of ``CURRENT`` that did not happen
    (``history.failed_switches``).
    """
    published_dir = Path(published_dir)
    current = current_version(published_dir, strict=False)
    target = history.predecessor(published_dir, current) if current else None
    versions = []
    for version in reversed(list_versions(published_dir)):
        name = version["run_id"]
        try:
            validation = version_manifest(published_dir, name).get("validation") or {}
        except Exception:  # noqa: BLE001 - a version removed meanwhile is simply not validated
            validation = {}
        role = CURRENT if name == current else ROLLBACK_TARGET if name == target else AVAILABLE
        validated = validation.get("success") is True
        command = None
        if role == ROLLBACK_TARGET:
            command = "recs rollback"
        elif role == AVAILABLE and validated:
            command = f"recs rollback --to {name}"
        versions.append({**version, "role": role, "validated": validated,
                         "rollback_command": command})  # fmt: skip
    found = history.events(published_dir)
    failures = history.failed_switches(found, current)
    events = [{**event, "failed": failed} for event, failed in zip(found, failures, strict=True)]
    events = list(reversed(events))[:HISTORY_SHOWN]
    return {
        "current": current,
        "rollback_target": target,
        "versions": versions,
        "history": events,
    }
