"""The read side of published versions: which version is current, what it holds, one user's list.

Layout under ``Settings.published_dir`` (written by ``recs.publish``)::

    published/
        CURRENT                         one line: the run id of the visible version
        <run_id>/                       one immutable version per run
            manifest.json               written last: its presence marks the version complete
            shard_id=NNN/recommendations.parquet   (contract RECOMMENDATION_SCHEMA,
                                        sorted by user_id, rank; NNN = shard_of(user_id))
            popularity_index.parquet  candidate_profiles.parquet
        .<run_id>.*                     hidden staging folders of a publish in progress

A version folder appears only by a rename of a fully written staging folder, and ``CURRENT``
changes only by an atomic replace, so a reader that resolves ``CURRENT`` once and then reads
that version's folder never sees a partial version or a mix of two. Used by the CLI now and the
HTTP API later; reads only Parquet and JSON, never the live store or a DuckDB file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recs.errors import RunNotFoundError, UnknownUserError

CURRENT_FILE = "CURRENT"
MANIFEST_FILE = "manifest.json"
RECOMMENDATIONS_FILE = "recommendations.parquet"


def current_version(published_dir: Path) -> str | None:
    """The run id ``CURRENT`` points at, or None if nothing was ever published."""
    try:
        name = (Path(published_dir) / CURRENT_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return name or None


def version_dir(published_dir: Path, run_id: str) -> Path:
    """The folder of one version (it may not exist)."""
    return Path(published_dir) / run_id


def shard_file(published_dir: Path, run_id: str, shard_id: int) -> Path:
    """``<run_id>/shard_id=NNN/recommendations.parquet`` of a version."""
    return version_dir(published_dir, run_id) / f"shard_id={shard_id:03d}" / RECOMMENDATIONS_FILE


def version_manifest(published_dir: Path, run_id: str | None = None) -> dict[str, Any]:
    """The manifest of version ``run_id`` (default: the current one).

    Keys: ``run_id, snapshot_date, generated_at, shard_count, rows, users, shards`` (one
    ``{shard_id, path, rows, users, bytes, sha256}`` per shard), ``exports``, ``settings``,
    ``validation``. Raises ``RunNotFoundError`` if nothing is published or the version is
    missing.
    """
    published_dir = Path(published_dir)
    name = run_id or _current_or_raise(published_dir)
    path = version_dir(published_dir, name) / MANIFEST_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        known = ", ".join(v["run_id"] for v in list_versions(published_dir)) or "none"
        raise RunNotFoundError(
            f"no published version {name!r} under {published_dir} (published: {known})"
        ) from None


def check_version(published_dir: Path, run_id: str) -> dict[str, Any]:
    """The manifest of version ``run_id`` after checking the version is complete.

    Complete: the manifest names ``run_id``, and every shard and export file it lists exists
    with the size it records. Cheap (``stat`` calls, no data read). Raises
    ``RunNotFoundError`` naming what is missing.
    """
    manifest = version_manifest(published_dir, run_id)
    root = version_dir(published_dir, run_id)
    named = manifest.get("run_id")
    if named != run_id:
        raise RunNotFoundError(
            f"published version {run_id!r} is damaged: its manifest names {named!r}"
        )
    entries = list(manifest.get("shards", [])) + list(manifest.get("exports", []))
    if len(manifest.get("shards", [])) != manifest.get("shard_count"):
        raise RunNotFoundError(f"published version {run_id!r} is incomplete: shard list is short")
    for entry in entries:
        path = root / entry["path"]
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise RunNotFoundError(
                f"published version {run_id!r} is incomplete: missing {path}"
            ) from None
        if size != entry["bytes"]:
            raise RunNotFoundError(
                f"published version {run_id!r} is damaged: {path} has {size} bytes, "
                f"manifest says {entry['bytes']}"
            )
    return manifest


def list_versions(published_dir: Path) -> list[dict[str, Any]]:
    """Every complete published version, oldest snapshot first (then by run id).

    One dict per version: ``run_id, snapshot_date, generated_at, shard_count, rows, users,
    is_current``. Staging folders and folders without a manifest are not versions. An absent
    ``published_dir`` yields ``[]``.
    """
    published_dir = Path(published_dir)
    if not published_dir.is_dir():
        return []
    current = current_version(published_dir)
    versions = []
    for folder in published_dir.iterdir():
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        try:
            manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            continue
        versions.append(
            {
                "run_id": folder.name,
                "snapshot_date": manifest.get("snapshot_date"),
                "generated_at": manifest.get("generated_at"),
                "shard_count": manifest.get("shard_count"),
                "rows": manifest.get("rows"),
                "users": manifest.get("users"),
                "is_current": folder.name == current,
            }
        )
    return sorted(versions, key=lambda v: (v["snapshot_date"] or "", v["run_id"]))


def recommendations_for(published_dir: Path, user_id: int, version: str | None = None):
    """One user's published list, best first, from the current version (or ``version``).

    Reads only the user's shard file, ``shard_of(user_id, shard_count)`` with the version's
    own shard count, through a Polars scan whose ``user_id == ...`` filter is pushed down to
    the Parquet reader: row groups whose min/max statistics exclude the id are skipped, and
    since shard files are sorted by user_id one row group (or two) is read.

    Returns a ``polars.DataFrame`` with the contract's columns (``RECOMMENDATION_SCHEMA``:
    user_id, candidate_id, mutual_count, score, rank, followed_by, generated_at, run_id)
    sorted by rank; empty (same schema) if the user has no published list. Raises
    ``RunNotFoundError`` if nothing is published, the version is missing or its shard file
    is, and ``UnknownUserError`` for a negative id.
    """
    import polars as pl

    from recs.contracts import RECOMMENDATION_SCHEMA
    from recs.sharding import shard_of

    if user_id < 0:
        raise UnknownUserError(f"invalid user id {user_id}: user ids are non-negative integers")
    published_dir = Path(published_dir)
    name = version or _current_or_raise(published_dir)
    manifest = version_manifest(published_dir, name)
    path = shard_file(published_dir, name, shard_of(user_id, int(manifest["shard_count"])))
    try:
        return (
            pl.scan_parquet(path)
            .filter(pl.col("user_id") == user_id)
            .select(list(RECOMMENDATION_SCHEMA))
            .sort("rank", "candidate_id")
            .collect()
        )
    except FileNotFoundError:
        raise RunNotFoundError(
            f"published version {name!r} is incomplete: missing {path}"
        ) from None


def _current_or_raise(published_dir: Path) -> str:
    name = current_version(published_dir)
    if name is None:
        raise RunNotFoundError(
            f"nothing is published under {published_dir}: run the nightly DAG or "
            "`recs run --snapshot-date YYYY-MM-DD` first"
        )
    return name
