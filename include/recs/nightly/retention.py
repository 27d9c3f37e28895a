"""``recs gc``: remove what the retention settings no longer keep, never what serves or backs it.

Three kinds of folders under ``RECS_HOME``, each by its own setting (``recs.config``):

- ``published/<run_id>/``: the ``published_retention_versions`` most recently used versions are
  kept (``recs.nightly.history.recency``), and always the version ``CURRENT`` names and its
  predecessor (the rollback target). Removed under the publisher lock.
- ``runs/<date>/<run_id>/``: removed once ``date`` is older than ``run_retention_days`` and
  nothing directly in the folder changed since that cut-off either (a backfill of an old date
  keeps its run while it works), except the runs of ``CURRENT`` and its predecessor.
- ``snapshots/<date>/``: removed once ``date`` is older than ``snapshot_retention_days`` and
  nothing directly in the folder was written since that cut-off either (an old date frozen
  lately, by a backfill or ``make demo``, is kept as its run is), with its lock file
  ``snapshots/.<date>.lock`` (also one left by a freeze that was refused), both under that lock
  taken without waiting: a run freezing or reading the date keeps them (``snapshot_removal``).
- With a run store (``RECS_RUN_STORE_URL``, ``artifacts``), last: its ``runs/<date>/<run_id>/``
  by the rule of local runs, "changed" from the store's own modification times (an upload in
  progress, marker or not, is recent), markers removed first; kept likewise the runs of
  ``CURRENT`` and its predecessor and a run whose local folder here is in progress; none at all
  when the store records a ``CURRENT`` other than this machine's (``RunStore.current``: then
  this machine cannot tell which runs back it). Its ``snapshots/<date>/``
  (``retained.to_run_store``) by the rule of local snapshots, and not while written. A store
  that fails leaves the local retention done and is reported (``run_store_error``).

Each local folder is renamed aside before it is deleted (``recs.files.remove_folder``), so a reader
finds a whole folder or none; what a removal cut short left aside (a hidden ``*.gc`` folder whose
process has ended) is deleted by the next gc, whatever the retention says by then, and two gc's
at once never trip on each other's removals.

"Older than N days" is against ``today`` (UTC, the wall clock unless given): a folder of date
``d`` goes when ``d < today - N``. Names that are not dates are left alone. ``dry_run`` lists
what would go now and removes nothing (a run in progress, or a date whose lock a run holds, is
left out, as gc would leave it).
"""

from __future__ import annotations

import datetime as dt
import errno
import logging
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from recs.config import Settings
from recs.errors import CorruptFileError, RunNotFoundError, RunStoreError
from recs.files import remove_folder, sweep_removals
from recs.nightly import history, snapshot_removal
from recs.nightly.locks import in_progress
from recs.nightly.publish import publisher_lock
from recs.published import current_version, version_manifest

log = logging.getLogger("recs.nightly.retention")


def collect_garbage(
    settings: Settings, today: dt.date | None = None, *, dry_run: bool = False
) -> dict[str, Any]:
    """Apply the retention settings under ``settings.home`` (module docstring).

    Returns ``{"today", "dry_run", "kept": {"current", "predecessor"}, "removed":
    {"published": [run_id], "runs": ["<date>/<run_id>"], "run_store": ["runs/<date>/<run_id>",
    "snapshots/<date>"], "snapshots": ["<date>"]}}`` (with ``dry_run``, what would be
    removed). Raises nothing for missing folders; ``RunStoreError`` for a run store that fails.
    """
    today = today or dt.datetime.now(dt.UTC).date()
    published_dir = Path(settings.published_dir)
    removed: dict[str, list[str]] = {"published": [], "runs": [], "run_store": [], "snapshots": []}
    # no published/ (a first night, or RECS_HOME relative to another folder): nothing to
    # guard, and nothing made, so a dry run leaves no trace
    with publisher_lock(published_dir) if published_dir.is_dir() else nullcontext():
        if not dry_run:  # what removals cut short left aside, whatever the retention is by now
            _sweep_removals(Path(settings.home), [published_dir])
        current = current_version(published_dir)
        predecessor = history.predecessor(published_dir, current) if current else None
        protected = {name for name in (current, predecessor) if name}
        by_recency = history.recency(published_dir)
        keep = set(by_recency[-settings.published_retention_versions :]) | protected
        for name in by_recency:
            if name in keep:
                continue
            removed["published"].append(name)
            if not dry_run:
                remove_folder(published_dir / name)
        backing = _backing_runs(published_dir, protected)

    if not dry_run:
        _sweep_removals(
            Path(settings.home),
            [Path(settings.home) / "snapshots", *_date_folders(settings.runs_dir)],
        )
    run_cutoff = today - dt.timedelta(days=settings.run_retention_days)
    changed_cutoff = dt.datetime.combine(run_cutoff, dt.time(), dt.UTC).timestamp()
    for date_dir in _dated_folders(Path(settings.runs_dir), run_cutoff):
        for run_dir in _run_folders(date_dir):
            kept = (date_dir.name, run_dir.name) in backing or ("*", run_dir.name) in backing
            if kept or _changed_since(run_dir, changed_cutoff):
                continue
            if in_progress(run_dir):
                continue  # another process is working on it: left alone
            if not dry_run:
                try:
                    remove_folder(run_dir)
                except FileNotFoundError:
                    continue  # another gc removed it meanwhile
            removed["runs"].append(f"{date_dir.name}/{run_dir.name}")
        if not dry_run:
            try:
                date_dir.rmdir()  # if empty
            except OSError as error:  # not empty, or another gc removed it meanwhile
                if error.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
                    raise

    snapshot_cutoff = today - dt.timedelta(days=settings.snapshot_retention_days)
    # an old date frozen lately (a backfill's, `make demo`'s) is kept by the rule of runs: a
    # newcomer's `recs gc` right after the demo listed the snapshot the demo had just made
    snapshots_changed = dt.datetime.combine(snapshot_cutoff, dt.time(), dt.UTC).timestamp()
    snapshots = Path(settings.home) / "snapshots"
    folders = {p.name: p for p in _dated_folders(snapshots, snapshot_cutoff)}
    locks = _dates_before(snapshot_removal.locked_dates(settings.home), snapshot_cutoff)
    for date in sorted(set(folders).union(locks)):
        if _backfill_running(settings, date):
            continue  # a backfill of that date is running: its rerun would need it again
        if dry_run:  # what gc would do now: a date whose lock a run holds is left (BUSY)
            if date in folders and not _snapshot_recent(folders[date], snapshots_changed):
                try:
                    if not snapshot_removal.busy(settings.home, date):
                        removed["snapshots"].append(date)
                except OSError as error:  # as gc would: a lock it cannot take, the others go
                    log.warning("would leave snapshots/%s: %s", date, error)
            continue
        try:
            outcome = snapshot_removal.remove(
                settings.home, date, unchanged_since=snapshots_changed
            )
        except OSError as error:  # a lock that is a folder, a file it may not remove: the others go
            log.warning("left snapshots/%s: %s", date, error)
            continue
        if outcome == snapshot_removal.BUSY:
            log.warning(
                "left snapshots/%s: a run of that date holds its lock (freezing or reading it)",
                date,
            )
        elif outcome == snapshot_removal.REMOVED:
            removed["snapshots"].append(date)

    document = {
        "today": today.isoformat(),
        "dry_run": dry_run,
        "kept": {"current": current, "predecessor": predecessor},
        "removed": removed,
    }
    try:  # last: a store that fails does not stop the local retention
        removed["run_store"] = _prune_run_store(
            settings, current, run_cutoff, changed_cutoff, backing, dry_run=dry_run
        )
        removed["run_store"] += _prune_store_snapshots(
            settings, snapshot_cutoff, snapshots_changed, dry_run=dry_run
        )
    except RunStoreError as error:
        document["run_store_error"] = str(error)
    return document


def _prune_run_store(
    settings: Settings,
    current: str | None,
    cutoff: dt.date,
    changed_cutoff: float,
    backing: set[tuple[str, str]],
    *,
    dry_run: bool,
) -> list[str]:
    """Remove the run store's runs the retention no longer keeps (module docstring); returns
    ``["runs/<date>/<run_id>"]``. Nothing goes when the store records a ``CURRENT`` that this
    machine's ``published/`` does not name (it cannot tell which runs back the served version
    and its rollback target). Raises ``RunStoreError``."""
    from recs.nightly.artifacts import store_for
    from recs.nightly.served import unseen_current

    store = store_for(settings)
    if store is None:
        return []
    unseen = unseen_current(settings.published_dir, current, store)
    if unseen is not None:
        log.warning(
            "run store %s: not pruning its runs: %s (run recs gc where published/ is)",
            store.url, unseen,
        )  # fmt: skip
        return []
    removed = []
    for date, run_id in store.runs():
        relative = f"runs/{date}/{run_id}"
        if date not in _dates_before([date], cutoff):
            continue
        if (date, run_id) in backing or ("*", run_id) in backing:
            continue
        if (store.last_changed(relative) or 0.0) > changed_cutoff:
            continue  # an old date worked on lately (a backfill), or an upload in progress
        if in_progress(Path(settings.runs_dir) / date / run_id):
            continue
        removed.append(relative)
        if not dry_run:
            store.remove(relative)
    return removed


def _prune_store_snapshots(
    settings: Settings, cutoff: dt.date, changed_cutoff: float, *, dry_run: bool
) -> list[str]:
    """Remove the run store's retained snapshots dated before ``cutoff`` and not written since
    ``changed_cutoff`` (a rebuild of an old date being pushed), except a date a backfill here is
    running (module docstring); returns ``["snapshots/<date>"]``. Raises ``RunStoreError``."""
    from recs.nightly.artifacts import store_for

    store = store_for(settings)
    if store is None:
        return []
    removed = []
    for date in _dates_before(store.folders("snapshots"), cutoff):
        relative = f"snapshots/{date}"
        if _backfill_running(settings, date) or (
            store.last_changed(relative) or 0.0
        ) > changed_cutoff:
            continue
        removed.append(relative)
        if not dry_run:
            store.remove(relative)
    return removed


def _sweep_removals(home: Path, parents: list[Path]) -> None:
    """End the removals cut short in each of ``parents`` (``recs.files.sweep_removals``),
    logged (relative to ``home`` when under it); one that fails is reported and the rest of gc
    goes on."""
    for parent in parents:
        where = parent.relative_to(home) if parent.is_relative_to(home) else parent
        try:
            for name in sweep_removals(parent):
                log.info("finished removing %s, a removal cut short", where / name)
        except OSError as error:
            log.warning("left a removal cut short in %s: %s", where, error)


def _date_folders(root: Path | str) -> list[Path]:
    """Every folder directly under ``root`` whose name is a ``YYYY-MM-DD`` date."""
    return _dated_folders(Path(root), dt.date.max)


def _run_folders(date_dir: Path) -> list[Path]:
    """The run folders in ``runs/<date>/``, sorted: not hidden ones (a removal's leftover, a
    staging folder), not links (an operator's: gc removes no data it did not write), none if
    another gc removed the date's folder meanwhile."""
    try:
        return sorted(
            p for p in date_dir.iterdir()
            if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
        )  # fmt: skip
    except FileNotFoundError:
        return []


def _backfill_running(settings: Settings, date: str) -> bool:
    """Whether a run of ``date`` here is in progress (its rerun would need the snapshot)."""
    return any(in_progress(p) for p in _run_folders(Path(settings.runs_dir) / date))


def _backing_runs(published_dir: Path, names: set[str]) -> set[tuple[str, str]]:
    """``(snapshot_date, run_id)`` of the runs behind the versions ``names``; ``("*",
    run_id)`` when a version's manifest is damaged (its date unknown: every run of that id is
    kept)."""
    backing = set()
    for name in names:
        try:
            backing.add((version_manifest(published_dir, name).get("snapshot_date"), name))
        except CorruptFileError:
            backing.add(("*", name))
        except RunNotFoundError:
            continue  # CURRENT names a missing version: there is no run of it to keep
    return backing


def _dated_folders(root: Path, cutoff: dt.date) -> list[Path]:
    """The ``YYYY-MM-DD`` folders directly under ``root`` dated before ``cutoff``."""
    if not root.is_dir():
        return []
    folders = {p.name: p for p in sorted(root.iterdir()) if p.is_dir()}
    return [folders[name] for name in _dates_before(list(folders), cutoff)]


def _dates_before(names: list[str], cutoff: dt.date) -> list[str]:
    """The ``names`` that are ``YYYY-MM-DD`` dates before ``cutoff`` (others are left alone)."""
    found = []
    for name in names:
        try:
            date = dt.date.fromisoformat(name)
        except ValueError:
            continue
        if name == date.isoformat() and date < cutoff:
            found.append(name)
    return found


def _changed_since(folder: Path, timestamp: float) -> bool:
    """Whether ``folder`` or anything directly in it was modified after ``timestamp`` (links
    not followed: a dangling one stopped gc; False once the folder is gone)."""
    try:
        entries = [folder, *folder.iterdir()]
        return any(entry.lstat().st_mtime > timestamp for entry in entries)
    except FileNotFoundError:
        return False


def _snapshot_recent(folder: Path, timestamp: float) -> bool:
    """``snapshot_removal.changed_since`` for a dry run, which takes no lock: a folder it
    cannot read, or a symbolic link in its place, is listed, as the removal would try it (and
    say why it could not)."""
    try:
        return not folder.is_symlink() and snapshot_removal.changed_since(folder, timestamp)
    except OSError:
        return False
