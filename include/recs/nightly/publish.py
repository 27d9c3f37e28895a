"""Atomic publish of a validated run: write the version completely, then swap one pointer.

``publish_run`` (the last stage of the nightly run):

1. Refuses unless ``validation/summary.json`` of this run says ``passed`` (raising the class of
   the gate's outcome), and every computed shard file still has the sha256 the gate validated.
2. Builds the version in a hidden staging folder ``published/.<run_id>.staging``: each computed
   ``shard_id=NNN/recommendations.parquet`` hard-linked from the run (copied across
   filesystems); each failed shard *carried over* from the version ``CURRENT`` names
   (``recs.nightly.carryover``; ``CarryOverError`` if there is none); the ``popularity_index``
   and ``candidate_profiles`` exports; ``manifest.json`` last; everything fsynced.
3. Renames the staging folder to ``published/<run_id>/``. A rerun of the same run that
   produced identical files keeps the existing folder untouched; otherwise the new folder
   replaces only that run's folder, by an atomic exchange of the two folders (Linux
   ``renameat2(RENAME_EXCHANGE)``; elsewhere two renames).
4. Makes the version visible by one atomic, durable replace of ``published/CURRENT``
   (``recs.nightly.switch``) -- unless the current version has a later snapshot date: a
   backfill of an older date is published but does not replace tonight's list.

Previous versions stay; ``rollback`` and ``set_current`` point ``CURRENT`` back at one of them
after checking it is complete and validated. Publishers, rollbacks and ``recs gc`` are
serialised by an ``flock`` on ``published/.lock`` (``publisher_lock``); each change of
``CURRENT`` is appended to ``recs.nightly.history``, before the switch. The manifest's bytes
depend only on the run (and the carried rows), so a rerun is byte-identical. Why hard links
oblige shard writers to replace files, never rewrite them: ``recs/nightly/README.md``.
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

from recs.config import Settings, what_a_run_computes
from recs.errors import (
    CarryOverError,
    NothingToValidateError,
    RecsError,
    RunIdTakenError,
    RunNotFoundError,
    ValidationEngineError,
    ValidationFailedError,
)
from recs.files import fsync_dir, link_or_copy, read_json, sha256_file, write_json
from recs.nightly import history
from recs.nightly.carryover import (
    CARRIED_OVER,
    COMPUTED,
    carried_from,
    carried_rows,
    write_shard_file,
)
from recs.nightly.gate_inputs import eligible_users
from recs.nightly.runs import RunPaths, check_run_id
from recs.nightly.served import refuse_unseen
from recs.nightly.switch import record_event, record_in_run_store, write_current
from recs.published import (
    MANIFEST_FILE,
    RECOMMENDATIONS_FILE,
    check_version,
    current_or_raise,
    current_version,
    manifest_digest,
    version_manifest,
)

EXPORT_FILES = ("popularity_index.parquet", "candidate_profiles.parquet")

# The error a publish refuses with, by the outcome the gate saved (its own exit code each).
REFUSALS: dict[str, type[RecsError]] = {
    "failed": ValidationFailedError,
    "errored": ValidationEngineError,
    "nothing_to_validate": NothingToValidateError,
}

log = logging.getLogger(__name__)


def publish_run(paths: RunPaths, settings: Settings) -> dict[str, Any]:
    """Publish the validated run as ``published/<run_id>/`` and point ``CURRENT`` at it
    (module docstring: steps, atomicity, the later-snapshot rule).

    Returns ``{"run_id", "version_dir", "rows", "users", "shard_count", "carried_over",
    "previous", "current", "replaced"}``: ``carried_over`` the ``[{"shard_id",
    "carried_from"}]`` taken from the previous version, ``previous`` the version ``CURRENT``
    named before (None if none), ``current`` whether ``CURRENT`` now names this run (False only
    when the previous version's snapshot date is later than this run's), ``replaced`` is
    ``"new"``, ``"unchanged"`` (a rerun with identical files) or ``"replaced"`` (a rerun with
    different files, the manifest with its verdict among them).

    Raises, with ``CURRENT`` and every existing version left as they were:
    ``ValidationFailedError`` if the run has not been validated, its summary is another run's,
    the data failed, a shard file changed since validation, or the run would become current
    while ``CURRENT`` names another version than the gate compared it with (a rollback or
    another publish since; ``_refuse_moved_baseline``); ``ValidationEngineError`` /
    ``NothingToValidateError`` if that was the gate's outcome; ``RunIdTakenError`` if the
    run id names a published version of another date (``refuse_taken_run_id``);
    ``CarryOverError`` if shards failed and ``CURRENT`` names no complete version to carry them
    from; ``RunNotFoundError``
    if an export to publish is missing; ``RunStoreError`` if a run store records that
    ``CURRENT`` names another version than this machine's ``published/`` does (it is not the
    served one: ``served.unseen_current``); ``SwitchError`` if ``CURRENT`` cannot be written
    (saying whether it names the run now: ``switch.write_current``).
    """
    summary = _validated_summary(paths, settings)
    published_dir = Path(settings.published_dir)
    published_dir.mkdir(parents=True, exist_ok=True)
    run_id = paths.run_id

    with publisher_lock(published_dir):
        refuse_taken_run_id(published_dir, paths)
        previous = current_version(published_dir)
        newer = _newer_snapshot(published_dir, previous, paths.snapshot_date.isoformat())
        # a retry may finish its own switch cut off after the store's record (served.py)
        refuse_unseen(published_dir, previous, "publish_run", finishing=None if newer else run_id)
        if newer is None:  # it becomes current: the gate must have compared with what it replaces
            _refuse_moved_baseline(published_dir, run_id, summary, previous)
        staging = _empty_dir(published_dir / f".{run_id}.staging")  # left by a crash? redo
        try:
            manifest = _stage_version(paths, settings, summary, staging, previous)
            replaced = _move_into_place(staging, published_dir / run_id)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        event = {"current": newer is None, "snapshot_date": paths.snapshot_date.isoformat()}
        if newer is None:  # the event first (why: recs.nightly.history)
            record_event(published_dir, "publish", run_id, previous, **event)
            write_current(published_dir, run_id)
        else:
            log.warning(
                "published %s but left CURRENT on %s: its snapshot %s is newer than %s "
                "(`recs rollback --to %s` serves this version)",
                run_id,
                previous,
                newer,
                paths.snapshot_date.isoformat(),
                run_id,
            )
            record_event(published_dir, "publish", run_id, previous, **event)

    return {
        "run_id": run_id,
        "version_dir": str(published_dir / run_id),
        "rows": manifest["rows"],
        "users": manifest["users"],
        "shard_count": manifest["shard_count"],
        "carried_over": [
            {"shard_id": entry["shard_id"], "carried_from": entry["carried_from"]}
            for entry in manifest["shards"]
            if entry["status"] == CARRIED_OVER
        ],
        "previous": previous,
        "current": current_version(published_dir) == run_id,
        "replaced": replaced,
    }


def set_current(home_or_settings: Path | str | Settings, run_id: str) -> dict[str, Any]:
    """Point ``CURRENT`` at an existing, complete, validated version (roll forward or back).

    ``home_or_settings`` is a ``Settings`` or a ``RECS_HOME`` folder (versions live in its
    ``published/``). Returns ``{"run_id", "previous"}``. Raises ``RunNotFoundError`` if the
    version does not exist, is incomplete (a listed file missing or of the wrong size) or did
    not pass validation; ``InvalidRunIdError`` for a malformed run id; ``RunStoreError`` where
    ``published/`` is not the served one and ``SwitchError`` (as ``publish_run``).
    """
    published_dir = _published_dir(home_or_settings)
    run_id = check_run_id(run_id)
    check_servable(published_dir, run_id)
    with publisher_lock(published_dir):
        check_servable(published_dir, run_id)  # again, now that no publisher can interfere
        previous = current_version(published_dir, strict=False)  # it mends a damaged one
        # the store records the name CURRENT holds, its version folder gone or not
        named = current_version(published_dir, strict=False, require_folder=False)
        refuse_unseen(published_dir, named, "set_current", finishing=run_id)
        record_event(published_dir, "set_current", run_id, previous, current=True)
        write_current(published_dir, run_id)
    return {"run_id": run_id, "previous": previous}


def rollback(home_or_settings: Path | str | Settings, to: str | None = None) -> dict[str, Any]:
    """Point ``CURRENT`` back at version ``to``, by default at the version before it
    (``recs.nightly.history.predecessor``: the one ``CURRENT``'s version replaced when it was
    published), in one atomic replace under the publisher lock.

    Returns ``{"run_id", "previous", "changed"}`` (``changed`` False when ``to`` is already
    current). Raises ``RunNotFoundError`` (one line) if nothing is published, there is no
    version before ``CURRENT``, or the target is unknown, incomplete or not validated;
    ``InvalidRunIdError`` for a malformed ``to``; ``RunStoreError`` where ``published/`` is not
    the served one (as ``publish_run``), unless ``to`` is ``CURRENT`` itself: that only records
    it in the run store, the way to set a record that is missing or wrong, so it must run where
    the served ``published/`` is (elsewhere it records a stale copy's ``CURRENT``, and the
    gate and the next publish on the served machine refuse until it is recorded there again).
    ``CURRENT`` is unchanged on any error but ``SwitchError`` (``CURRENT`` could not be written:
    it says whether it moved, as a write that failed after its rename did).
    """
    published_dir = _published_dir(home_or_settings)
    if to is not None:
        check_run_id(to)
    if not published_dir.is_dir():  # refused before the lock would make the folder
        current_or_raise(published_dir)
    with publisher_lock(published_dir):
        if to is None:
            current = current_or_raise(published_dir)
        else:  # a named version also mends a CURRENT that names none
            current = current_version(published_dir, strict=False)
        target = to if to is not None else history.predecessor(published_dir, current)
        if target is None:
            raise RunNotFoundError(
                f"cannot roll back: {current} replaced no version when it was published "
                "(the first, or one published beside CURRENT), so there is none to go back to "
                "(name one with --to RUN_ID; `recs runs` lists them)"
            )
        try:
            check_servable(published_dir, target)
        except RunNotFoundError as error:
            raise RunNotFoundError(f"cannot roll back to {target}: {error}") from None
        if target != current:
            named = current_version(published_dir, strict=False, require_folder=False)
            # as the store records it; a retry may finish its own switch (served.py)
            refuse_unseen(published_dir, named, "recs rollback", finishing=target)
            record_event(published_dir, "rollback", target, current, current=True)
            write_current(published_dir, target)
        else:  # recorded again: how a deployment that just set a run store records CURRENT,
            record_in_run_store(published_dir, target)  # or mends a record lost or wrong
    return {"run_id": target, "previous": current, "changed": target != current}


def check_servable(published_dir: Path, run_id: str) -> dict[str, Any]:
    """The manifest of version ``run_id`` if it is complete (``recs.published.check_version``)
    and records a passed validation; ``RunNotFoundError`` naming what is wrong otherwise."""
    manifest = check_version(published_dir, run_id)
    if (manifest.get("validation") or {}).get("success") is not True:
        raise RunNotFoundError(
            f"published version {run_id!r} is invalid: its manifest records no passed validation"
        )
    return manifest


def _published_dir(home_or_settings: Path | str | Settings) -> Path:
    if isinstance(home_or_settings, Settings):
        return Path(home_or_settings.published_dir)
    return Path(home_or_settings) / "published"


def refuse_taken_run_id(published_dir: Path, paths: RunPaths) -> None:
    """Raise ``RunIdTakenError`` if ``published/<run_id>/`` is a version of another snapshot
    date than the run's: ``freeze_snapshot`` refuses such a run before any work, and
    ``publish_run`` before it writes (another run may have published it meanwhile). (A
    newcomer's `recs run` of 2026-10-28 reusing a run id published for 2026-11-01 replaced that
    version, which was the rollback target, with the older date's lists.) A rerun of the same
    date replaces its own version, as before; a version whose manifest cannot be read does not
    say its date, and is not refused here."""
    try:
        published = version_manifest(published_dir, paths.run_id).get("snapshot_date")
    except (RecsError, OSError):
        return
    if published is not None and str(published) != paths.snapshot_date.isoformat():
        raise RunIdTakenError(
            f"run id {paths.run_id} names the published version of snapshot {published}, not "
            f"of {paths.snapshot_date.isoformat()}: publishing would replace it (a version is "
            "stored by run id alone); give this run another --run-id"
        )


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
    """The gate's summary of this run; raise unless it passed (the class of its outcome)."""
    summary_path = paths.validation_summary
    try:
        summary = read_json(summary_path)
    except RunNotFoundError:
        raise ValidationFailedError(
            f"refusing to publish run {paths.run_id}: it has not been validated "
            f"(no {summary_path}); run validate_run (`recs validate`) first"
        ) from None
    if summary.get("run_id") != paths.run_id:
        raise ValidationFailedError(
            f"refusing to publish run {paths.run_id}: {summary_path} is for run "
            f"{summary.get('run_id')!r}"
        )
    outcome = summary.get("outcome", "passed" if summary.get("success") is True else "failed")
    if outcome != "passed" or summary.get("success") is not True:
        reason = ", ".join(summary.get("failed") or []) or summary.get("error") or "unknown"
        refusal = REFUSALS.get(outcome, ValidationFailedError)
        raise refusal(
            f"refusing to publish run {paths.run_id}: validation "
            f"{outcome.replace('_', ' ')} ({reason})"
        )
    planned = sorted(item["shard_id"] for item in summary.get("shards", []))
    if planned != list(range(settings.shard_count)):
        raise ValidationFailedError(
            f"refusing to publish run {paths.run_id}: the validated shards "
            f"{planned} are not 0..{settings.shard_count - 1}"
        )
    return summary


def _refuse_moved_baseline(
    published_dir: Path, run_id: str, summary: dict[str, Any], previous: str | None
) -> None:
    """Raise ``ValidationFailedError`` if ``CURRENT`` (``previous``) is not the version the gate
    compared the run with, as it was then: the version ``CURRENT`` named when it was validated
    (the summary's ``current_when_validated``) and the one it compared with (``compared_with``;
    the only one in a summary saved before the other was recorded) must both be ``previous``,
    and ``previous``'s manifest must still have the digest it had then
    (``current_manifest_sha256``: it was not published again with other files). A rollback or
    another publish in between would otherwise let the change checks judge the run against a
    version this publish does not replace. Only a republish identical to the copy ``CURRENT``
    names (every shard the gate saw computed has that sha256 there: a retry, or ``recs
    publish`` run again) goes whatever they were."""
    if _identical_republish(published_dir, run_id, summary, previous):
        return
    baselines = {summary.get("compared_with")} - {None}
    if "current_when_validated" in summary or not baselines:
        baselines.add(summary.get("current_when_validated"))
    if baselines != {previous}:
        then = ", ".join(sorted(name or "nothing" for name in baselines))
        raise ValidationFailedError(
            f"refusing to publish run {run_id}: it was validated against {then}, and CURRENT "
            f"now names {previous or 'nothing'}, so the gate's change checks compared it with "
            "another version than the one it would replace; run validate_run again (`recs "
            "validate`), then publish"
        )
    digest = summary.get("current_manifest_sha256")
    if "current_manifest_sha256" in summary and manifest_digest(published_dir, previous) != digest:
        raise ValidationFailedError(
            f"refusing to publish run {run_id}: {previous}, the version CURRENT names, was "
            "published again with other files since the gate compared the run with it; run "
            "validate_run again (`recs validate`), then publish"
        )


def _identical_republish(
    published_dir: Path, run_id: str, summary: dict[str, Any], previous: str | None
) -> bool:
    """Whether ``previous`` is ``run_id``'s own published copy holding, for every shard the
    gate saw computed (at least one), the file it validated (the same sha256)."""
    computed = [s for s in summary.get("shards") or [] if s.get("status", COMPUTED) == COMPUTED]
    if previous != run_id or not computed:
        return False
    try:
        published = {s["shard_id"]: s for s in version_manifest(published_dir, run_id)["shards"]}
    except (RecsError, KeyError, TypeError):
        return False
    return all(
        s.get("sha256") is not None
        and published.get(s["shard_id"], {}).get("status", COMPUTED) == COMPUTED
        and published.get(s["shard_id"], {}).get("sha256") == s["sha256"]
        for s in computed
    )


def _stage_version(
    paths: RunPaths,
    settings: Settings,
    summary: dict[str, Any],
    staging: Path,
    previous: str | None,
) -> dict[str, Any]:
    """Write the whole version into ``staging``; return its manifest (written last)."""
    validated = {item["shard_id"]: item for item in summary["shards"]}
    failed = [
        i for i, item in sorted(validated.items()) if item.get("status", COMPUTED) != COMPUTED
    ]
    for shard_id in failed:
        if paths.shard_manifest(shard_id).is_file():
            raise ValidationFailedError(
                f"refusing to publish run {paths.run_id}: shard {shard_id} had failed when the "
                "run was validated and has been computed since; run validate_run again (`recs "
                "validate`)"
            )
    source = _carry_over_source(paths, settings, failed, previous)
    eligible = eligible_users(paths.exports_dir).get_column("user_id") if failed else None
    shards = []
    for shard_id in range(settings.shard_count):
        relative = f"shard_id={shard_id:03d}/{RECOMMENDATIONS_FILE}"
        target = staging / relative
        if shard_id in failed:
            rows = carried_rows(
                settings.published_dir, source, shard_id, settings.shard_count, eligible
            )
            write_shard_file(rows, target)
            entry = {
                "status": CARRIED_OVER,
                "carried_from": carried_from(source, shard_id, settings.shard_count, rows),
                "rows": rows.height,
                "users": rows.get_column("user_id").n_unique(),
            }
        else:
            link_or_copy(paths.shard_output(shard_id), target, sync=True)
            entry = {
                "status": COMPUTED,
                "carried_from": None,
                "rows": validated[shard_id]["rows"],
                "users": validated[shard_id]["users"],
            }
        digest = sha256_file(target)
        if entry["status"] == COMPUTED and digest != validated[shard_id]["sha256"]:
            raise ValidationFailedError(
                f"refusing to publish run {paths.run_id}: shard {shard_id} changed since it "
                "was validated; run validate_run again (`recs validate`)"
            )
        shards.append(
            {
                "shard_id": shard_id,
                "path": relative,
                **entry,
                "bytes": target.stat().st_size,
                "sha256": digest,
            }
        )
        fsync_dir(target.parent)
    exports = []
    for name in EXPORT_FILES:
        export = paths.exports_dir / name
        if not export.is_file():
            raise RunNotFoundError(f"cannot publish run {paths.run_id}: missing export {export}")
        link_or_copy(export, staging / name, sync=True)
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
        "carried_over": failed,
        "shards": shards,
        "exports": exports,
        "settings": what_a_run_computes(settings),
        "validation": {
            "success": True,
            "evaluated": summary.get("evaluated"),
            "skipped": [item["name"] for item in summary.get("skipped", [])],
            "compared_with": summary.get("compared_with"),
        },
    }
    write_json(staging / MANIFEST_FILE, manifest)
    fsync_dir(staging)
    return manifest


def _carry_over_source(
    paths: RunPaths, settings: Settings, failed: list[int], previous: str | None
) -> dict[str, Any] | None:
    """The manifest of the version to carry ``failed`` shards from (None when none failed);
    ``CarryOverError`` if ``CURRENT`` names none, one that is not complete, or one of a later
    snapshot date than the run's (a backfill must not hold lists computed from a later graph)."""
    if not failed:
        return None
    shards = ", ".join(f"{shard_id:03d}" for shard_id in failed)
    if previous is None:
        raise CarryOverError(
            f"cannot publish run {paths.run_id}: shard(s) {shards} failed and nothing is "
            "published to carry their users' lists over from; rerun them "
            f"(`recs shard run --snapshot-date {paths.snapshot_date.isoformat()} --shard N`), "
            "then `recs validate` and `recs publish`"
        )
    try:
        manifest = check_version(settings.published_dir, previous)
    except RunNotFoundError as error:
        raise CarryOverError(
            f"cannot publish run {paths.run_id}: shard(s) {shards} failed and the version "
            f"CURRENT names cannot be carried from: {error}"
        ) from None
    later = manifest.get("snapshot_date")  # None: a version that does not say (not later)
    if later is not None and str(later) > paths.snapshot_date.isoformat():
        raise CarryOverError(
            f"cannot publish run {paths.run_id} of {paths.snapshot_date}: shard(s) {shards} "
            f"failed and the version CURRENT names, {previous}, is of a later date "
            f"({later}): a backfill does not take lists computed from a "
            f"later graph; rerun them (`recs shard run --snapshot-date "
            f"{paths.snapshot_date.isoformat()} --run-id {paths.run_id} --shard N`), then "
            "`recs validate` and `recs publish`"
        )
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


@contextmanager
def publisher_lock(published_dir: Path):
    """Serialise publishers, rollbacks and ``recs gc`` (readers take no lock). The holder
    writes its pid into ``published/.lock``; one that has to wait says so first (a warning
    naming the lock and that pid), then waits: a publish is seconds, never abandoned."""
    published_dir.mkdir(parents=True, exist_ok=True)
    lock = published_dir / ".lock"
    with lock.open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            log.warning(
                "waiting for %s: another publish, rollback or gc holds it (pid %s)", lock, holder
            )
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
