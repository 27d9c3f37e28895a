"""Atomic publish of a validated run: write the version completely, then swap one pointer.

``publish_run`` (the last stage of the nightly run):

1. Refuses (``ValidationFailedError``) unless ``validation/summary.json`` of this run says
   success, and every shard file still has the sha256 the gate validated (a shard rerun after
   validation needs a new validation).
2. Builds the version in a hidden staging folder ``published/.<run_id>.staging``:
   each ``shard_id=NNN/recommendations.parquet`` hard-linked from the run (copied when the run
   is on another filesystem), the ``popularity_index`` and ``candidate_profiles`` exports, and
   ``manifest.json`` last; everything fsynced.
3. Renames the staging folder to ``published/<run_id>/``. A rerun of the same run that
   produced identical files keeps the existing folder untouched; otherwise the new folder
   replaces only that run's folder, by an atomic exchange of the two folders (Linux
   ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames).
4. Makes the version visible by one atomic, durable replace of ``published/CURRENT``
   (``recs.files.atomic_write``) -- unless the current version has a later snapshot date: a
   backfill of an older date is published but does not replace tonight's list.

Previous versions stay; ``set_current`` points ``CURRENT`` back at one of them (rollback) after
checking it is complete. Publishers are serialised by an ``flock`` on ``published/.lock``. The
manifest's bytes depend only on the run, so a rerun is byte-identical. Why hard links oblige
shard writers to replace files, never rewrite them: ``recs/nightly/README.md``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from recs.config import Settings
from recs.errors import RunNotFoundError, ValidationFailedError
from recs.files import atomic_write, fsync_dir, link_or_copy, read_json, sha256_file, write_json
from recs.nightly.runs import RunPaths, check_run_id
from recs.nightly.validation import SUMMARY_FILE
from recs.published import (
    CURRENT_FILE,
    MANIFEST_FILE,
    RECOMMENDATIONS_FILE,
    check_version,
    current_version,
    version_manifest,
)

EXPORT_FILES = ("popularity_index.parquet", "candidate_profiles.parquet")

# The settings a reader of a version may need to interpret it (the full set is frozen in the
# run's snapshot manifest).
MANIFEST_SETTINGS = (
    "shard_count",
    "top_k",
    "hop1_cap",
    "hop2_cap",
    "min_mutual_count",
    "max_candidates_to_score",
    "followed_by_count",
    "mutual_weight",
    "mutual_saturation",
    "activity_weight",
    "half_life_days",
    "sample_seed",
)

log = logging.getLogger(__name__)


def publish_run(paths: RunPaths, settings: Settings) -> dict[str, Any]:
    """Publish the validated run as ``published/<run_id>/`` and point ``CURRENT`` at it
    (module docstring: steps, atomicity, the later-snapshot rule).

    Returns ``{"run_id", "version_dir", "rows", "users", "shard_count", "previous",
    "current", "replaced"}``: ``previous`` is the version ``CURRENT`` named before (None if
    none), ``current`` whether ``CURRENT`` now names this run (False only when the previous
    version's snapshot date is later than this run's), ``replaced`` is ``"new"``,
    ``"unchanged"`` (a rerun with identical files) or ``"replaced"`` (a rerun with different
    files).

    Raises ``ValidationFailedError`` if the run has not passed the gate (no summary, a failed
    summary, a summary of another run, or a shard file changed since validation), and
    ``RunNotFoundError`` if an export to publish is missing. On any error ``CURRENT`` and every
    existing version are left as they were.
    """
    summary = _validated_summary(paths, settings)
    published_dir = Path(settings.published_dir)
    published_dir.mkdir(parents=True, exist_ok=True)
    run_id = paths.run_id

    with _publisher_lock(published_dir):
        previous = current_version(published_dir)
        staging = _empty_dir(published_dir / f".{run_id}.staging")  # left by a crash? redo
        try:
            manifest = _stage_version(paths, settings, summary, staging)
            replaced = _move_into_place(staging, published_dir / run_id)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        newer = _newer_snapshot(published_dir, previous, paths.snapshot_date.isoformat())
        if newer is None:
            _write_current(published_dir, run_id)
        else:
            log.warning(
                "published %s but left CURRENT on %s: its snapshot %s is newer than %s "
                "(use set_current to serve this version)",
                run_id,
                previous,
                newer,
                paths.snapshot_date.isoformat(),
            )

    return {
        "run_id": run_id,
        "version_dir": str(published_dir / run_id),
        "rows": manifest["rows"],
        "users": manifest["users"],
        "shard_count": manifest["shard_count"],
        "previous": previous,
        "current": current_version(published_dir) == run_id,
        "replaced": replaced,
    }


def set_current(home_or_settings: Path | str | Settings, run_id: str) -> dict[str, Any]:
    """Point ``CURRENT`` at an existing, complete version (rollback or roll forward).

    ``home_or_settings`` is a ``Settings`` or a ``RECS_HOME`` folder (versions live in its
    ``published/``). Returns ``{"run_id", "previous"}``. Raises ``RunNotFoundError`` if the
    version does not exist or is incomplete (a listed file missing or of the wrong size).
    """
    if isinstance(home_or_settings, Settings):
        published_dir = Path(home_or_settings.published_dir)
    else:
        published_dir = Path(home_or_settings) / "published"
    run_id = check_run_id(run_id)
    check_version(published_dir, run_id)
    with _publisher_lock(published_dir):
        check_version(published_dir, run_id)  # again, now that no publisher can interfere
        previous = current_version(published_dir)
        _write_current(published_dir, run_id)
    return {"run_id": run_id, "previous": previous}


def _newer_snapshot(published_dir: Path, current: str | None, snapshot_date: str) -> str | None:
    """The snapshot date of the current version if it is later than ``snapshot_date``."""
    if current is None:
        return None
    try:
        current_date = version_manifest(published_dir, current).get("snapshot_date")
    except RunNotFoundError:
        return None  # CURRENT names a missing version: anything complete is better
    return current_date if current_date and current_date > snapshot_date else None


def _validated_summary(paths: RunPaths, settings: Settings) -> dict[str, Any]:
    """The gate's summary of this run; raise ``ValidationFailedError`` unless it passed."""
    summary_path = paths.validation_dir / SUMMARY_FILE
    try:
        summary = read_json(summary_path)
    except RunNotFoundError:
        raise ValidationFailedError(
            f"refusing to publish run {paths.run_id}: it has not been validated "
            f"(no {summary_path}); run validate_run first"
        ) from None
    if summary.get("run_id") != paths.run_id:
        raise ValidationFailedError(
            f"refusing to publish run {paths.run_id}: {summary_path} is for run "
            f"{summary.get('run_id')!r}"
        )
    if summary.get("success") is not True:
        failed = ", ".join(summary.get("failed") or []) or "unknown"
        raise ValidationFailedError(
            f"refusing to publish run {paths.run_id}: validation failed ({failed})"
        )
    validated = {item["shard_id"]: item for item in summary.get("shards", [])}
    if sorted(validated) != list(range(settings.shard_count)):
        raise ValidationFailedError(
            f"refusing to publish run {paths.run_id}: the validated shards "
            f"{sorted(validated)} are not 0..{settings.shard_count - 1}"
        )
    return summary


def _stage_version(
    paths: RunPaths, settings: Settings, summary: dict[str, Any], staging: Path
) -> dict[str, Any]:
    """Write the whole version into ``staging``; return its manifest (written last)."""
    validated = {item["shard_id"]: item for item in summary["shards"]}
    shards = []
    for shard_id in range(settings.shard_count):
        relative = f"shard_id={shard_id:03d}/{RECOMMENDATIONS_FILE}"
        target = staging / relative
        link_or_copy(paths.shard_output(shard_id), target, sync=True)
        digest = sha256_file(target)
        if digest != validated[shard_id]["sha256"]:
            raise ValidationFailedError(
                f"refusing to publish run {paths.run_id}: shard {shard_id} changed since it "
                "was validated; run validate_run again"
            )
        shards.append(
            {
                "shard_id": shard_id,
                "path": relative,
                "rows": validated[shard_id]["rows"],
                "users": validated[shard_id]["users"],
                "bytes": target.stat().st_size,
                "sha256": digest,
            }
        )
        fsync_dir(target.parent)
    exports = []
    for name in EXPORT_FILES:
        source = paths.exports_dir / name
        if not source.is_file():
            raise RunNotFoundError(f"cannot publish run {paths.run_id}: missing export {source}")
        link_or_copy(source, staging / name, sync=True)
        exports.append(
            {
                "path": name,
                "bytes": (staging / name).stat().st_size,
                "sha256": sha256_file(staging / name),
            }
        )
    manifest = {
        "run_id": paths.run_id,
        "snapshot_date": paths.snapshot_date.isoformat(),
        "generated_at": summary.get("generated_at"),
        "shard_count": settings.shard_count,
        "rows": sum(s["rows"] for s in shards),
        "users": sum(s["users"] for s in shards),
        "shards": shards,
        "exports": exports,
        "settings": {name: getattr(settings, name) for name in MANIFEST_SETTINGS},
        "validation": {"success": True, "evaluated": summary.get("evaluated")},
    }
    write_json(staging / MANIFEST_FILE, manifest)
    fsync_dir(staging)
    return manifest


def _move_into_place(staging: Path, target: Path) -> str:
    """Make ``staging`` the version folder ``target``; return new / unchanged / replaced."""
    if not target.exists():
        os.rename(staging, target)
        fsync_dir(target.parent)
        return "new"
    new_manifest = (staging / MANIFEST_FILE).read_bytes()
    try:
        same = (target / MANIFEST_FILE).read_bytes() == new_manifest
        if same:
            check_version(target.parent, target.name)
    except (FileNotFoundError, RunNotFoundError):
        same = False
    if same:
        return "unchanged"  # identical bytes already in place: leave readers undisturbed
    if _exchange(staging, target):
        return "replaced"  # ``staging`` now holds the old version; the caller removes it
    # No atomic exchange here: move the old folder aside first. Readers that resolve this
    # run id in between find no folder (never a partial one) and may retry.
    aside = _empty_dir(target.parent / f".{target.name}.old")
    os.rename(target, aside / "version")
    os.rename(staging, target)
    fsync_dir(target.parent)
    shutil.rmtree(aside, ignore_errors=True)
    return "replaced"


def _exchange(first: Path, second: Path) -> bool:
    """Atomically swap two folders (Linux renameat2 RENAME_EXCHANGE); False if unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second), rename_exchange)
    if result != 0:
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            return False
        raise OSError(code, os.strerror(code), str(second))
    fsync_dir(second.parent)
    return True


def _empty_dir(path: Path) -> Path:
    """A fresh empty folder at ``path`` (called under the publisher lock)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir()
    return path


def _write_current(published_dir: Path, run_id: str) -> None:
    """Replace ``CURRENT`` atomically and durably: readers see the old name or the new one."""
    with atomic_write(published_dir / CURRENT_FILE, sync_folder=True) as handle:
        handle.write(f"{run_id}\n")


@contextmanager
def _publisher_lock(published_dir: Path):
    """Serialise publishers and rollbacks (readers take no lock)."""
    published_dir.mkdir(parents=True, exist_ok=True)
    with (published_dir / ".lock").open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
