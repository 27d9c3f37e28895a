"""Published versions: their layout, the ``CURRENT`` pointer, and what each version holds.

Shared by the writer (``recs.nightly.publish``) and the readers (``recs.serving``, ``recs runs``).
Layout under ``Settings.published_dir``::

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
that version's folder never sees a partial version or a mix of two. Reads only JSON and file
sizes here, never the live store or a DuckDB file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recs.errors import CorruptFileError, RunNotFoundError
from recs.files import read_json, sha256_file

CURRENT_FILE = "CURRENT"
MANIFEST_FILE = "manifest.json"
RECOMMENDATIONS_FILE = "recommendations.parquet"


def current_version(
    published_dir: Path, *, strict: bool = True, require_folder: bool = True
) -> str | None:
    """The run id ``CURRENT`` points at, or None if nothing was ever published (no ``CURRENT``).

    A ``CURRENT`` that names no version (empty, several words, a path, or a name with no
    version folder: it is only ever replaced whole, and ``recs gc`` never removes the version it
    names, so damage from outside) raises ``CorruptFileError`` with the remedy: taken for
    "nothing published", it would let the gate compare tonight's lists with nothing and ``recs
    gc`` forget what is served; taken for a version, a publish would record it as what it
    replaced, and every plain rollback after would go to it. ``strict=False`` reads it as None
    instead, for the views and for the commands that replace it (``recs rollback --to``,
    ``set_current``). ``require_folder=False`` takes a well-formed name without looking for its
    folder: for the read API's watcher (a version replaced by two renames is briefly absent; it
    keeps serving what it serves, as for any version it cannot load) and for comparing with a
    run store's record, which names what ``CURRENT`` says, folder or not."""
    path = Path(published_dir) / CURRENT_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        text = f"<unreadable: {error}>"
    name = text.strip()
    remedy = "point it at one with `recs rollback --to RUN_ID` (`recs runs` lists them)"
    if not name or any(c.isspace() for c in name) or "/" in name or name in (".", ".."):
        problem = f"{path} names no version ({text[:60]!r}): {remedy}"
    elif require_folder and not version_dir(published_dir, name).is_dir():
        problem = (
            f"{path} names {name!r}, which is not a published version (no folder "
            f"{version_dir(published_dir, name)}): {remedy}"
        )
    else:
        return name
    if not strict:
        return None
    raise CorruptFileError(problem)


def manifest_digest(published_dir: Path, run_id: str | None) -> str | None:
    """The sha256 of version ``run_id``'s manifest (which names every file's sha256, so it
    changes when the version is published again with other files); None for no version or no
    manifest."""
    if run_id is None:
        return None
    try:
        return sha256_file(version_dir(published_dir, run_id) / MANIFEST_FILE)
    except OSError:
        return None


def version_dir(published_dir: Path, run_id: str) -> Path:
    """The folder of one version (it may not exist)."""
    return Path(published_dir) / run_id


def shard_file(published_dir: Path, run_id: str, shard_id: int) -> Path:
    """``<run_id>/shard_id=NNN/recommendations.parquet`` of a version."""
    return version_dir(published_dir, run_id) / f"shard_id={shard_id:03d}" / RECOMMENDATIONS_FILE


def version_manifest(published_dir: Path, run_id: str | None = None) -> dict[str, Any]:
    """The manifest of version ``run_id`` (default: the current one).

    Keys: ``run_id, snapshot_date, generated_at, shard_count, rows, users, carried_over``
    (shard ids), ``shards`` (one ``{shard_id, path, status, carried_from, rows, users, bytes,
    sha256}`` per shard; ``status`` ``computed`` or ``carried_over``, ``carried_from`` the run
    the rows were computed in, null when computed), ``exports``, ``settings``, ``validation``.
    Versions published before carry-over have no ``status``: every shard computed. Raises
    ``RunNotFoundError`` if nothing is published or the version is missing.
    """
    published_dir = Path(published_dir)
    name = run_id or current_or_raise(published_dir)
    path = version_dir(published_dir, name) / MANIFEST_FILE
    try:
        return read_json(path)
    except CorruptFileError as damaged:
        raise CorruptFileError(f"published version {name!r} is damaged: {damaged}") from None
    except RunNotFoundError:
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
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise RunNotFoundError(
                f"published version {run_id!r} is damaged: a file entry names no path ({entry!r})"
            )
        path = root / entry["path"]
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise RunNotFoundError(
                f"published version {run_id!r} is incomplete: missing {path}"
            ) from None
        if size != entry.get("bytes"):
            raise RunNotFoundError(
                f"published version {run_id!r} is damaged: {path} has {size} bytes, "
                f"manifest says {entry.get('bytes')}"
            )
    return manifest


def list_versions(published_dir: Path) -> list[dict[str, Any]]:
    """Every complete published version, oldest snapshot first (then by run id).

    One dict per version: ``run_id, snapshot_date, generated_at, shard_count, rows, users,
    carried_over`` (``[{shard_id, carried_from}]``), ``is_current``. Staging folders and
    folders without a manifest are not versions. An absent ``published_dir`` yields ``[]``.
    """
    published_dir = Path(published_dir)
    if not published_dir.is_dir():
        return []
    current = current_version(published_dir, strict=False)
    versions = []
    for folder in published_dir.iterdir():
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        try:
            manifest = read_json(folder / MANIFEST_FILE)
        except RunNotFoundError:  # no manifest yet, or a damaged one: not a usable version
            continue
        versions.append(
            {
                "run_id": folder.name,
                "snapshot_date": manifest.get("snapshot_date"),
                "generated_at": manifest.get("generated_at"),
                "shard_count": manifest.get("shard_count"),
                "rows": manifest.get("rows"),
                "users": manifest.get("users"),
                "carried_over": [
                    {"shard_id": entry.get("shard_id"), "carried_from": entry.get("carried_from")}
                    for entry in manifest.get("shards", [])
                    if entry.get("status") == "carried_over"
                ],
                "is_current": folder.name == current,
            }
        )
    return sorted(versions, key=lambda v: (v["snapshot_date"] or "", v["run_id"]))


def current_or_raise(published_dir: Path) -> str:
    """The run id ``CURRENT`` names; ``RunNotFoundError`` if nothing is published."""
    name = current_version(published_dir)
    if name is None:
        raise RunNotFoundError(
            f"nothing is published under {published_dir}: run the nightly DAG or "
            "`recs run --snapshot-date YYYY-MM-DD` first"
        )
    return name
