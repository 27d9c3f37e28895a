"""freeze_snapshot: the live store as of the run's cut-off, retained per date, in the run's Parquet.

The **cut-off** of a run is ``RunPaths.as_of``: midnight UTC after its snapshot date, the end of
the DAG run's data interval. A snapshot holds only what existed by then. Where it comes from:

1. **Retained**: ``<home>/snapshots/<date>/`` exists (``retained.py``) → reused, byte for byte
   (hard links made under the date's lock, shared: ``recs gc`` cannot remove it part-way, and
   one it removed first is made again), so a retry, a rerun or a backfill of that date reads the
   same rows and only recomputes what follows with today's code and settings. With a run
   store, the date as the store holds it (the last freeze or rebuild of it on any worker) is
   downloaded first when this machine has none or another one, and a date frozen here is
   pushed to it.
2. **The live store**, read in one consistent transaction (``recs.store.readers``), filtered to
   the rows created by the cut-off, and retained for the next runs of that date. Allowed when
   the store has nothing newer than the cut-off plus ``snapshot_max_lag_hours`` (its newest
   account creation or activity: a nightly run minutes after its interval), or when the operator
   asks to **rebuild** (``--rebuild-snapshot``; the manifest says ``rebuilt``). Otherwise
   ``SnapshotNotRetainedError`` before anything is written: the store no longer shows that date.

The shard plan is made here, from the snapshot's eligible users (``shard_plan``), and follow edges
are partitioned by it; a retained snapshot made with another plan is re-partitioned. Every
partition obeys ``follow_pairs`` (one row per pair): checked when frozen or re-partitioned, and
when reused if the retained manifest does not say it was checked (an earlier version's). Output
(``paths.snapshot_dir``, contracts.SNAPSHOT_SCHEMAS): ``users.parquet  blocks.parquet
mutes.parquet  dismissed_candidates.parquet  user_interests.parquet
follow_edges/shard_id=NNN/part-0.parquet  in_degrees.parquet  manifest.json``; the in-degrees
are counted from the follow edges as they are written (``in_degrees``). Rows are sorted by their
key with fixed Parquet options, so the same store gives the same bytes. What a rebuilt snapshot
cannot reproduce, and why: ``recs/nightly/README.md``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import polars as pl

from recs.config import Settings
from recs.errors import CorruptFileError, SnapshotNotRetainedError
from recs.files import link_or_copy, staging_name, write_json
from recs.nightly import follow_pairs, in_degrees, point_in_time, retained
from recs.nightly.locks import run_lock
from recs.nightly.runs import RunPaths
from recs.nightly.shard_plan import plan_for
from recs.times import wall_clock

log = logging.getLogger("recs.nightly.snapshot")

REUSE_ATTEMPTS = 3
"""How many times ``freeze_snapshot`` makes or finds the date's retained snapshot when ``recs gc``
removes it each time before the run holds it (``SnapshotNotRetainedError`` after)."""

TABLE_FILES = ("users", "blocks", "mutes", "dismissed_candidates", "user_interests")
"""The snapshot tables stored as one file each (follow edges are partitioned by shard)."""


def freeze_snapshot(
    paths: RunPaths,
    settings: Settings,
    *,
    rebuild: bool = False,
    max_map_length: int | None = None,
) -> dict[str, Any]:
    """Make ``paths.snapshot_dir`` (module docstring: where it comes from), holding the run's
    lock.

    ``rebuild`` reads the live store as of the cut-off even for a past date, replacing that
    date's retained snapshot; ``max_map_length`` is Airflow's (the plan is checked against it).
    Writes ``manifest.json`` last: ``snapshot_date``, ``run_id``, ``as_of`` (= ``cut_off``),
    ``source`` (``kind`` live_store / rebuilt, the retained folder, the run that froze it, so a
    rerun writes the same bytes), ``shard_count``, ``shard_plan``, ``store``, ``tables``,
    ``row_counts``, ``follow_edges_by_status``, ``follow_edges_naming_unknown_accounts`` (rows
    and an example pair), ``follow_edges_shards``, ``in_degrees`` (``path``, ``rows``,
    ``active_follows``), ``excluded_after_cut_off`` (rows per table left out) and
    ``settings`` (today's, with the planned ``shard_count``: what every later stage computes
    with, ``pipeline.run_settings``).

    Returns ``snapshot_dir``, ``manifest``, ``row_counts``, ``shard_count``, ``source``
    (``retained`` when this run reused the date's snapshot), ``standby`` (what
    ``wait_for_standby`` said when a hot standby was read, else None), ``seconds``. Raises
    ``CutOffAheadError`` (the day is not over: ``point_in_time.refuse_cut_off_ahead``, also
    before reusing a retained snapshot), ``SnapshotNotRetainedError`` (past date, nothing
    retained, no rebuild; or ``recs gc`` removed the date's snapshot ``REUSE_ATTEMPTS`` times
    before this run held it), ``ShardPlanError``, ``LiveStoreError``, ``RunInProgressError``
    (another process holds the run).
    """
    started = time.perf_counter()
    # before any reuse too: a day's snapshot retained before its cut-off (by a version without
    # this check, or pulled from a worker running one) is not the whole day
    point_in_time.refuse_cut_off_ahead(paths, wall_clock())
    with run_lock(paths):
        frozen = retained.folder(paths.home, paths.snapshot_date)
        if rebuild and retained.is_complete(frozen):  # a newcomer's went without a word
            log.warning(
                "rebuilding the retained snapshot of %s from the live store, replacing it: rows "
                "removed or changed there since its cut-off are not restored",
                paths.snapshot_date.isoformat(),
            )
        for attempt in range(1, REUSE_ATTEMPTS + 1):
            standby = None
            if not rebuild:
                retained.from_run_store(paths.home, paths.snapshot_date)  # another worker's
            if rebuild or not retained.is_complete(frozen):
                kind = "rebuilt" if rebuild else "live_store"
                standby = retained.freeze(
                    paths, settings, rebuild=rebuild, max_map_length=max_map_length
                )
                # at once: if this run fails after, the next one must not take the store's
                # older copy back over a rebuild (a review)
                retained.to_run_store(paths.home, paths.snapshot_date, replace=True)
            else:
                kind = "retained"
                log.info("reusing the retained snapshot %s", frozen)
            # linked into the run under the date's lock, shared: gc cannot take the folder away
            # part-way (it leaves a date whose lock is held); one it removed before is made again
            with retained.reading(frozen) as whole:
                if whole:
                    document = retained.manifest(frozen)
                    _refuse_damaged(frozen, document)
                    plan = plan_for(
                        retained.eligible_users(
                            frozen, paths.as_of, settings.eligibility_window_days
                        ),
                        settings,
                        max_map_length,
                    )
                    shards, degrees = _materialize(paths, frozen, document, plan.shard_count)
                    break
            log.warning(
                "the retained snapshot %s was removed (recs gc) before this run could read it "
                "(attempt %d of %d): making it again", frozen, attempt, REUSE_ATTEMPTS,
            )  # fmt: skip
        else:
            raise SnapshotNotRetainedError(
                f"the retained snapshot {frozen} was removed each time this run made or found it "
                f"({REUSE_ATTEMPTS} times): is a `recs gc` with a short snapshot_retention_days "
                "running in a loop? Rerun once it has stopped"
            )
        if kind == "retained":  # after its footers were checked: a damaged copy here must
            # not become every worker's (a review); one gc removed since is not pushed
            retained.to_run_store(paths.home, paths.snapshot_date, replace=False)
        run_settings = settings.model_copy(update={"shard_count": plan.shard_count})
        manifest = {
            "snapshot_date": paths.snapshot_date.isoformat(),
            "run_id": paths.run_id,
            "as_of": paths.as_of.isoformat(),
            "cut_off": paths.as_of.isoformat(),
            "source": {  # how the date's snapshot was made, not whether this run reused it
                "kind": "rebuilt" if document["rebuilt"] else "live_store",
                "retained_dir": str(frozen),
                "frozen_by_run_id": document["frozen_by_run_id"],
                "rebuilt": document["rebuilt"],
            },
            "shard_count": plan.shard_count,
            "shard_plan": plan.as_dict(),
            "store": document["store"],
            "tables": {
                **{name: document["tables"][name] for name in TABLE_FILES},
                "follow_edges": {"path": "follow_edges", "rows": sum(s["rows"] for s in shards)},
            },
            "row_counts": document["row_counts"],
            "follow_edges_by_status": document["follow_edges_by_status"],
            # None: frozen by a version that left this to dbt's relationships tests
            "follow_edges_naming_unknown_accounts": document.get(
                "follow_edges_naming_unknown_accounts"
            ),
            "follow_edges_shards": shards,
            "in_degrees": degrees,
            "excluded_after_cut_off": document["excluded_after_cut_off"],
            "settings": run_settings.model_dump(mode="json"),
        }
        write_json(paths.snapshot_manifest, manifest)
    seconds = time.perf_counter() - started
    log.info(
        "snapshot %s/%s from %s (%s): %s, %d shards, in %.1f s",
        paths.snapshot_date,
        paths.run_id,
        kind,
        frozen,
        document["row_counts"],
        plan.shard_count,
        seconds,
    )
    return {
        "snapshot_dir": str(paths.snapshot_dir),
        "manifest": str(paths.snapshot_manifest),
        "row_counts": document["row_counts"],
        "shard_count": plan.shard_count,
        "source": kind,
        "standby": standby,
        "seconds": round(seconds, 3),
    }


def _refuse_damaged(frozen: Path, document: dict[str, Any]) -> None:
    """``CorruptFileError`` naming the first file of the retained snapshot ``frozen`` whose
    Parquet footer cannot be read or whose row count is not its manifest's, with the remedy.
    The run's copies are hard links to these files: a run's file cut short or overwritten in
    place damages the date's snapshot, and every later run of the date read it (dbt failed on
    it with a data test's name). Footers only: a few KB per file, whatever the graph."""
    import pyarrow.parquet as pq

    entries = [document["tables"][name] for name in TABLE_FILES]
    entries += document["follow_edges_shards"]
    if document.get("in_degrees") is not None:  # None: retained by an earlier version
        entries.append(document["in_degrees"])
    for entry in entries:
        path = frozen / entry["path"]
        try:
            rows = pq.read_metadata(path).num_rows
            problem = None if rows == entry["rows"] else f"{rows:,} rows, not {entry['rows']:,}"
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
            problem = " ".join(str(error).split())[:200] or type(error).__name__
        if problem:
            raise CorruptFileError(
                f"the retained snapshot's {path} is damaged ({problem}): with a run store that "
                f"holds the date, remove {frozen} and run again (the store's copy is "
                "downloaded); without one, make it again from the live store with "
                "--rebuild-snapshot (the DAG's rebuild_snapshot param)"
            )


def _materialize(
    paths: RunPaths, frozen: Path, document: dict[str, Any], shard_count: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The run's ``snapshot/`` from the retained one: hard links, follow edges re-partitioned
    if the plan differs, the in-degrees counted from them if the retained snapshot has none
    (an earlier version's); staged in a sibling unique to this attempt, swapped in at the end
    (the manifest is written afterwards by the caller, so a half-made folder has none).
    Returns the follow-edge shards' and the in-degrees' manifest entries."""
    final = paths.snapshot_dir
    final.parent.mkdir(parents=True, exist_ok=True)
    for leftover in final.parent.glob(f".{final.name}.*.partial"):
        shutil.rmtree(leftover, ignore_errors=True)  # a killed attempt's (we hold the run lock)
    staging = final.with_name(staging_name(final.name, ".partial"))
    staging.mkdir()
    try:
        for name in TABLE_FILES:
            relative = document["tables"][name]["path"]
            link_or_copy(frozen / relative, staging / relative)
        if document["shard_count"] == shard_count:
            unchecked = document.get("follow_edges_pairs") != follow_pairs.PAIRS_CHECKED
            for shard in document["follow_edges_shards"]:
                if unchecked:  # frozen by an earlier version: the rule was dbt's test then
                    follow_pairs.checked(
                        pl.read_parquet(frozen / shard["path"], columns=follow_pairs.KEYS),
                        shard["shard_id"],
                        follow_pairs.retained(frozen),
                    )
                link_or_copy(frozen / shard["path"], staging / shard["path"])
            shards = document["follow_edges_shards"]
        else:
            log.info(
                "re-partitioning the retained follow edges: %d -> %d shards",
                document["shard_count"],
                shard_count,
            )
            chunks = (
                pl.read_parquet(frozen / shard["path"]) for shard in document["follow_edges_shards"]
            )
            origin = follow_pairs.retained(frozen)
            with retained.spill_folder(final) as spill:  # beside final: a leftover is found
                parts, _ = retained.partition_by_shard(chunks, shard_count, spill, origin)
                shards = retained.write_follow_edges(parts, shard_count, staging, origin)
        degrees = document.get("in_degrees")
        if degrees is None:  # retained by an earlier version
            degrees = retained.write_in_degrees(in_degrees.from_follow_edges(staging), staging)
        else:
            link_or_copy(frozen / degrees["path"], staging / degrees["path"])
        old = final.with_name(staging_name(final.name, ".old"))
        if final.exists():
            os.rename(final, old)
        os.rename(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return shards, degrees
