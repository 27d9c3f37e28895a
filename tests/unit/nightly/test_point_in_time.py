"""Snapshots as of their run's cut-off, retained per date, reused by reruns and backfills.

The store (SQLite and PostgreSQL) holds a history around two dates. Cut-off of 2026-11-01 =
2026-11-02 00:00 UTC. By hand, with ``D = 2026-11-02 00:00``::

    users      1, 2  created 2026-10-01;  3 created 2026-11-01 12:00;  4 created 2026-11-05
               last activity: 1 2026-11-06 (clamped to D), 2 2026-10-20, 3 2026-11-01 18:00,
               4 2026-11-06
    follows    1->2 10-02, 2->1 10-02, 1->3 11-01 20:00, 3->1 11-03 (after D),
               4->1 11-05 (names 4: after D anyway), 2->3 11-04 (after D)
    blocks     2 blocks 3 at 11-03 (after D);  mutes 1 mutes 2 at 10-15
    dismissed  2 dismissed 3 at 11-01 21:00;  interests 1 music, 4 sports (4 goes: created after D)

As of 2026-11-01: users 1 2 3; follows 1->2 2->1 1->3; no blocks; the mute; the dismissal;
interest 1 music. The store's newest timestamp is 2026-11-06, more than 36 h after D, so a run
of 2026-11-01 needs a retained snapshot or an explicit rebuild; a run of 2026-11-05 (cut-off
11-06 00:00) is fresh enough.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest
from history_store import CUT_OFF, at, build_store

from recs.config import Settings, get_settings
from recs.errors import (
    CutOffAheadError,
    RunInProgressError,
    ShardPlanError,
    SnapshotNotRetainedError,
)
from recs.files import read_json
from recs.nightly import pipeline, point_in_time, retained
from recs.nightly.runs import RunPaths
from recs.nightly.snapshot import freeze_snapshot


@pytest.fixture
def settings(store_url: str, tmp_path: Path) -> Settings:
    url = None if store_url.startswith("sqlite") else store_url
    settings = Settings(home=tmp_path / "home", store_url=url, shard_count_min=1)
    build_store(settings)
    return settings


def _table(paths: RunPaths, name: str) -> pl.DataFrame:
    return pl.read_parquet(paths.snapshot_dir / f"{name}.parquet")


def _edges(paths: RunPaths) -> list[tuple[int, int]]:
    frame = pl.read_parquet(paths.snapshot_dir / "follow_edges" / "**" / "*.parquet")
    return sorted(zip(frame["follower_id"].to_list(), frame["followee_id"].to_list(), strict=True))


def test_a_past_date_without_a_retained_snapshot_is_refused_and_writes_nothing(settings):
    paths = RunPaths.create(settings.home, "2026-11-01", "backfill-1")
    with pytest.raises(SnapshotNotRetainedError) as raised:
        freeze_snapshot(paths, settings)
    message = str(raised.value)
    assert message.startswith("no snapshot of 2026-11-01 is retained")
    assert "2026-11-06T00:00:00Z" in message and "--rebuild-snapshot" in message
    assert not paths.snapshot_dir.exists()
    assert not retained.is_complete(retained.folder(settings.home, paths.snapshot_date))
    # nor its date's lock file (de50639 left an empty snapshots/.2026-11-01.lock until gc)
    assert sorted(p.name for p in (settings.home / "snapshots").iterdir()) == []


def test_a_cut_off_ahead_of_the_clock_is_refused_at_the_instant_it_is_not_past():
    """The cut-off of 2026-11-01 is 11-02 00:00 UTC: refused one microsecond before it, allowed
    at it (the interval is half-open) and after; the message names the latest complete day."""
    paths = RunPaths.create("/tmp/unused", "2026-11-01", "r")
    with pytest.raises(CutOffAheadError) as raised:
        point_in_time.refuse_cut_off_ahead(paths, dt.datetime(2026, 11, 1, 23, 59, 59, 999_999))
    message = str(raised.value)
    assert message.startswith("the day 2026-11-01 is not over: its cut-off 2026-11-02T00:00:00Z")
    assert "now 2026-11-01T23:59:59Z" in message and "Run 2026-10-31 or an earlier day" in message
    point_in_time.refuse_cut_off_ahead(paths, dt.datetime(2026, 11, 2))
    point_in_time.refuse_cut_off_ahead(paths, dt.datetime(2026, 11, 2, 0, 0, 1))


@pytest.mark.parametrize("rebuild", [False, True])
def test_a_run_of_today_is_refused_and_retains_nothing(settings, rebuild):
    """Today (the real clock) is not over: neither a run nor a rebuild of it may freeze it, or
    tonight's run of the same date would reuse a snapshot missing the rest of the day."""
    today = dt.datetime.now(dt.UTC).date()
    paths = RunPaths.create(settings.home, today, "early")
    with pytest.raises(CutOffAheadError, match=f"the day {today.isoformat()} is not over"):
        freeze_snapshot(paths, settings, rebuild=rebuild)
    assert not paths.snapshot_dir.exists()
    assert not retained.folder(settings.home, today).exists()


def test_a_refused_run_leaves_no_run_folder_but_another_runs_folder_stays(settings):
    """``recs run`` (``run_all``) refused before its snapshot exists, for a day not over and for
    a past date with nothing retained: the run folder it made (holding only ``.lock``) and its
    date's folder, if empty, are gone; a folder it did not make, here another run's of the same
    date, stays whole."""
    today = dt.datetime.now(dt.UTC).date()
    started = []  # refused before the first stage starts (a newcomer read the freeze started)
    with pytest.raises(CutOffAheadError):
        pipeline.run_all(settings.home, today, "early", settings, progress=started.append)
    assert started == []
    assert not (settings.home / "runs" / today.isoformat()).exists()
    other = RunPaths.create(settings.home, "2026-11-01", "other")
    (other.run_dir / "notes").mkdir(parents=True)
    with pytest.raises(SnapshotNotRetainedError):
        pipeline.run_all(settings.home, "2026-11-01", "backfill-2", settings)
    assert sorted(p.name for p in other.run_dir.parent.iterdir()) == ["other"]
    assert (other.run_dir / "notes").is_dir()


def test_the_dags_refused_freeze_leaves_no_run_folder_either(settings):
    """The DAG's freeze_snapshot task (``pipeline.freeze_snapshot``, no ``run_all`` around it)
    refused for a past date with nothing retained: the run folder its lock made is gone with
    its date's (a DAG run left ``runs/2026-11-01/<run_id>/.lock`` for `recs runs` to list)."""
    paths = RunPaths.create(settings.home, "2026-11-01", "scheduled__2026-11-01T00_00_00_00_00")
    with pytest.raises(SnapshotNotRetainedError):
        pipeline.freeze_snapshot(paths, settings)
    assert not (settings.home / "runs" / "2026-11-01").exists()


def test_a_rerun_refused_before_its_snapshot_keeps_the_folder_it_found(settings):
    """(From a review.) The run folder was there before (an earlier attempt's outputs, no
    snapshot): a rerun refused in the freeze removes nothing of it."""
    paths = RunPaths.create(settings.home, "2026-11-01", "again")
    (paths.run_dir / "exports").mkdir(parents=True)
    with pytest.raises(SnapshotNotRetainedError):
        pipeline.run_all(settings.home, "2026-11-01", "again", settings)
    assert (paths.run_dir / "exports").is_dir()


def test_a_retained_snapshot_of_a_day_not_over_is_not_reused(settings, monkeypatch):
    """(From a review.) Today's snapshot retained before the check existed (frozen here with
    the clock set past midnight, as a version without the check froze it, or pulled from a
    worker running one): a run of today is refused before reusing it."""
    from recs.nightly import snapshot

    today = dt.datetime.now(dt.UTC).date()
    tomorrow = dt.datetime.combine(today + dt.timedelta(days=1), dt.time(0, 0, 1))
    monkeypatch.setattr(snapshot, "wall_clock", lambda: tomorrow)
    freeze_snapshot(RunPaths.create(settings.home, today, "early"), settings)
    assert retained.is_complete(retained.folder(settings.home, today))
    monkeypatch.undo()
    paths = RunPaths.create(settings.home, today, "again")
    with pytest.raises(CutOffAheadError, match=f"the day {today.isoformat()} is not over"):
        freeze_snapshot(paths, settings)
    assert not paths.snapshot_dir.exists()


def test_a_rebuilt_snapshot_holds_only_what_existed_by_the_cut_off(settings):
    paths = RunPaths.create(settings.home, "2026-11-01", "backfill-1")
    freeze_snapshot(paths, settings, rebuild=True)
    users = _table(paths, "users").sort("user_id")
    assert users["user_id"].to_list() == [1, 2, 3]
    assert users["last_active_at"].to_list() == [CUT_OFF, dt.datetime(2026, 10, 20), at(0.75)]
    assert _edges(paths) == [(1, 2), (1, 3), (2, 1)]
    assert _table(paths, "blocks").height == 0
    assert _table(paths, "mutes")["muted_id"].to_list() == [2]
    assert _table(paths, "dismissed_candidates")["candidate_id"].to_list() == [3]
    assert _table(paths, "user_interests")["tag"].to_list() == ["music"]
    manifest = read_json(paths.snapshot_manifest)
    assert manifest["cut_off"] == "2026-11-02T00:00:00+00:00"
    assert manifest["source"]["kind"] == "rebuilt" and manifest["source"]["rebuilt"] is True
    assert manifest["excluded_after_cut_off"] == {
        "users": 1, "follow_edges": 3, "blocks": 1, "mutes": 0, "dismissed_candidates": 0,
        "user_interests": 1,
    }  # fmt: skip


def test_a_fresh_date_reads_the_live_store_without_asking(settings):
    """2026-11-05: cut-off 11-06 00:00, the store's newest timestamp: allowed, not rebuilt."""
    paths = RunPaths.create(settings.home, "2026-11-05", "nightly")
    result = freeze_snapshot(paths, settings)
    manifest = read_json(paths.snapshot_manifest)
    assert result["source"] == "live_store"
    assert manifest["source"]["kind"] == "live_store" and manifest["source"]["rebuilt"] is False
    assert _edges(paths) == [(1, 2), (1, 3), (2, 1), (2, 3), (3, 1), (4, 1)]


def test_a_rerun_and_a_backfill_reuse_the_retained_snapshot_without_the_store(settings):
    """After a rebuild of 2026-11-01 the store is deleted (SQLite) or its URL broken: another
    run of that date still gets the same tables, byte for byte, from snapshots/2026-11-01/."""
    first = RunPaths.create(settings.home, "2026-11-01", "backfill-1")
    freeze_snapshot(first, settings, rebuild=True)
    gone = settings.model_copy(update={"store_url": "sqlite:////nonexistent/live.db"})
    second = RunPaths.create(settings.home, "2026-11-01", "backfill-2")
    result = freeze_snapshot(second, gone)
    assert result["source"] == "retained"
    for name in ("users", "blocks", "mutes", "dismissed_candidates", "user_interests"):
        assert (second.snapshot_dir / f"{name}.parquet").read_bytes() == (
            first.snapshot_dir / f"{name}.parquet"
        ).read_bytes()
    assert _edges(second) == _edges(first)
    manifest = read_json(second.snapshot_manifest)
    assert manifest["source"]["frozen_by_run_id"] == "backfill-1"


def test_a_retained_snapshot_is_repartitioned_for_another_plan(settings):
    first = RunPaths.create(settings.home, "2026-11-01", "four")
    freeze_snapshot(first, settings.model_copy(update={"shard_count": 4}), rebuild=True)
    second = RunPaths.create(settings.home, "2026-11-01", "two")
    freeze_snapshot(second, settings.model_copy(update={"shard_count": 2}))
    assert sorted(p.name for p in (second.snapshot_dir / "follow_edges").iterdir()) == [
        "shard_id=000", "shard_id=001",
    ]  # fmt: skip
    assert _edges(second) == _edges(first)
    assert read_json(second.snapshot_manifest)["shard_count"] == 2


def test_the_shard_plan_comes_from_the_eligible_users(settings):
    """2026-11-05: eligible (active within 30 days of 11-06) = 1 2 3 4 (2 was active 10-20);
    2 users per shard → 2 shards; a fixed RECS_SHARD_COUNT wins; a plan over Airflow's
    max_map_length fails before anything is written."""
    paths = RunPaths.create(settings.home, "2026-11-05", "plan")
    planned = settings.model_copy(update={"shard_users_target": 2, "shard_count_max": 8})
    freeze_snapshot(paths, planned)
    manifest = read_json(paths.snapshot_manifest)
    assert manifest["shard_plan"]["eligible_users"] == 4
    assert manifest["shard_count"] == 2 == pipeline.run_settings(paths).shard_count
    fixed = RunPaths.create(settings.home, "2026-11-05", "fixed")
    freeze_snapshot(fixed, planned.model_copy(update={"shard_count": 5}))
    assert read_json(fixed.snapshot_manifest)["shard_count"] == 5
    huge = RunPaths.create(settings.home, "2026-11-05", "huge")
    with pytest.raises(ShardPlanError, match="max_map_length is 1"):
        freeze_snapshot(huge, planned, max_map_length=1)
    assert not huge.snapshot_dir.exists()


HOLDER = textwrap.dedent(
    """
    import sys, time
    from recs.nightly.locks import run_lock
    from recs.nightly.runs import RunPaths
    with run_lock(RunPaths.create(sys.argv[1], sys.argv[2], sys.argv[3])):
        print("held", flush=True)
        time.sleep(60)
    """
)


def test_a_second_run_of_a_run_in_progress_is_refused_and_touches_nothing(settings):
    """Another process holds the run (as a running `recs run` does): freezing it is refused at
    once with "... is in progress", and nothing of the run or the retained snapshot appears."""
    paths = RunPaths.create(settings.home, "2026-11-05", "busy")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(settings.home), "2026-11-05", "busy"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunInProgressError, match="run busy of 2026-11-05 is in progress"):
            freeze_snapshot(paths, settings)
        with pytest.raises(RunInProgressError):
            pipeline.run_all(settings.home, "2026-11-05", "busy", settings)
        assert not paths.snapshot_dir.exists()
        assert not retained.folder(settings.home, paths.snapshot_date).exists()
    finally:
        holder.kill()
        holder.wait()
    freeze_snapshot(paths, settings)  # the holder is gone: the kernel dropped its lock
    assert paths.snapshot_manifest.exists()


def test_a_rerun_with_fewer_shards_removes_the_others(settings):
    paths = RunPaths.create(settings.home, "2026-11-05", "shrink")
    freeze_snapshot(paths, settings.model_copy(update={"shard_count": 2}))
    for shard_id in (0, 1):
        paths.shard_dir(shard_id).mkdir(parents=True)
        (paths.shard_dir(shard_id) / "recommendations.parquet").write_bytes(b"old")
    freeze_snapshot(paths, settings.model_copy(update={"shard_count": 1}))
    assert pipeline.plan_shards(paths) == [0]
    assert sorted(p.name for p in paths.shards_dir.iterdir() if not p.name.startswith(".")) == [
        "shard_id=000"
    ]


def _full_disk(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_the_gate_checks_the_plan_counted_the_eligible_users_as_dbt_does(settings):
    """A whole run of 2026-11-05 (with users 5 6 7, so user 1 gets [7]) passes, the plan's
    count (7 eligible: all seven accounts were active within 30 days of 11-06) equal to dbt's.
    The manifest then says 8: validate_run fails naming plan_eligible_matches_models."""
    from history_store import add_mutual_friends

    from recs.errors import ValidationFailedError
    from recs.files import write_json

    add_mutual_friends(settings)
    result = pipeline.run_all(settings.home, "2026-11-05", "whole", settings)
    paths = RunPaths.create(settings.home, "2026-11-05", "whole")
    recorded = read_json(paths.stage_times)["stages"]  # for recs report: what run_all timed
    assert recorded == {name: stage["seconds"] for name, stage in result["stages"].items()}
    assert set(recorded) == {"freeze_snapshot", "build_models", "build_graph", "plan_shards",
                             "traverse_shard", "validate_shards", "validate_run", "publish_run"}
    # (An open note: a gate rerun on its own left run_all's figure standing.) A gate run alone
    # records its own seconds, a gate that raised none; a shard rerun is not the whole stage
    write_json(paths.stage_times, {"stages": {**recorded, "validate_run": 999.0}})
    pipeline.traverse_shard(paths, 0)
    pipeline.validate_run(paths)
    rerun = read_json(paths.stage_times)["stages"]
    assert rerun["validate_run"] != 999.0
    assert {**rerun, "validate_run": 0} == {**recorded, "validate_run": 0}
    read_json_as_before = pipeline.read_json

    def eio_on_times(path):
        if path == paths.stage_times:
            raise OSError(5, "Input/output error")
        return read_json_as_before(path)

    for name, fault in (("write_json", _full_disk), ("read_json", eio_on_times)):
        with pytest.MonkeyPatch.context() as patch:  # the record fails, not the gate
            patch.setattr(pipeline, name, fault)
            assert pipeline.validate_run(paths)["success"] is True
    manifest = read_json(paths.snapshot_manifest)
    assert manifest["shard_plan"]["eligible_users"] == 7
    manifest["shard_plan"]["eligible_users"] = 8
    write_json(paths.snapshot_manifest, manifest)
    with pytest.raises(ValidationFailedError, match="plan_eligible_matches_models"):
        pipeline.validate_run(paths)
    assert "validate_run" not in read_json(paths.stage_times)["stages"]


def test_gc_leaves_a_run_in_progress_alone(settings):
    """An old run (2026-10-01, past run_retention_days on 2026-12-01) held by another process
    stays; once that process is gone, gc removes it."""
    from recs.nightly.retention import collect_garbage

    run_dir = settings.home / "runs" / "2026-10-01" / "old"
    run_dir.mkdir(parents=True)
    stamp = dt.datetime(2026, 10, 1, tzinfo=dt.UTC).timestamp()
    os.utime(run_dir, (stamp, stamp))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(settings.home), "2026-10-01", "old"],
        stdout=subprocess.PIPE, text=True, env={**os.environ},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        for path in (run_dir, run_dir / ".lock"):
            os.utime(path, (stamp, stamp))
        kept = collect_garbage(settings, today=dt.date(2026, 12, 1))
        assert kept["removed"]["runs"] == [] and run_dir.exists()
    finally:
        holder.kill()
        holder.wait()
    removed = collect_garbage(settings, today=dt.date(2026, 12, 1))
    assert removed["removed"]["runs"] == ["2026-10-01/old"] and not run_dir.exists()


def test_a_backfill_on_another_worker_reuses_the_date_from_the_run_store(
    settings, tmp_path, monkeypatch
):
    """Run store set. Worker a rebuilds 2026-11-01 (the store has moved on); its retained
    snapshot goes to the run store. Worker b, with its own RECS_HOME and no retained snapshot,
    backfills that date without a rebuild: the store's live rows are too new (it would be
    refused), so it takes the retained snapshot from the run store, byte for byte, and never
    reads the live store. A second backfill on b reuses its own copy. When a rebuilds the date
    again, b's next run takes the rebuilt one. gc removes the store's snapshot once the date is
    past RECS_SNAPSHOT_RETENTION_DAYS and unwritten since. Without a run store, b is refused."""
    from recs.errors import LiveStoreError
    from recs.nightly import artifacts
    from recs.nightly.retention import collect_garbage

    worker_b = settings.model_copy(update={"home": tmp_path / "b"})
    b_paths = RunPaths.create(worker_b.home, "2026-11-01", "backfill-b")
    with pytest.raises((SnapshotNotRetainedError, LiveStoreError)):
        freeze_snapshot(b_paths, worker_b)  # no run store: nothing to reuse

    url = (tmp_path / "store").as_uri()
    monkeypatch.setenv("RECS_RUN_STORE_URL", url)
    get_settings.cache_clear()
    artifacts._open.cache_clear()
    try:
        a_paths = RunPaths.create(settings.home, "2026-11-01", "rebuild-a")
        freeze_snapshot(a_paths, settings, rebuild=True)
        a_folder = retained.folder(settings.home, a_paths.snapshot_date)

        def files(root: Path) -> dict[str, bytes]:
            return {p.relative_to(root).as_posix(): p.read_bytes()
                    for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip

        real_reader = retained.open_reader
        monkeypatch.setattr(retained, "open_reader", _no_live_store)
        result = freeze_snapshot(b_paths, worker_b)
        assert result["source"] == "retained"
        b_folder = retained.folder(worker_b.home, b_paths.snapshot_date)
        assert files(b_folder) == files(a_folder) and len(files(a_folder)) >= 7
        assert _edges(b_paths) == [(1, 2), (1, 3), (2, 1)]
        again = RunPaths.create(worker_b.home, "2026-11-01", "backfill-b2")
        assert freeze_snapshot(again, worker_b)["source"] == "retained"

        # a rebuilds the date again: b's next run takes that one; b's older copy, reused before
        # the rebuild, never overwrote the store's
        monkeypatch.setattr(retained, "open_reader", real_reader)
        freeze_snapshot(RunPaths.create(settings.home, "2026-11-01", "rebuild-a2"), settings,
                        rebuild=True)  # fmt: skip
        monkeypatch.setattr(retained, "open_reader", _no_live_store)
        retained.to_run_store(worker_b.home, b_paths.snapshot_date, replace=False)  # b's old copy
        assert retained.manifest(b_folder)["frozen_by_run_id"] == "rebuild-a"
        later = RunPaths.create(worker_b.home, "2026-11-01", "backfill-b3")
        assert freeze_snapshot(later, worker_b)["source"] == "retained"
        assert retained.manifest(b_folder)["frozen_by_run_id"] == "rebuild-a2"
        assert files(b_folder) == files(a_folder)

        store = artifacts.RunStore(url)
        assert store.folders("snapshots") == ["2026-11-01"]
        for path in (tmp_path / "store" / "snapshots").rglob("*"):  # as uploaded on 11-02
            os.utime(path, (1_793_620_800, 1_793_620_800))
        gc_settings = worker_b.model_copy(update={"run_store_url": url})
        kept = collect_garbage(gc_settings, today=dt.date(2026, 11, 20))["removed"]["run_store"]
        gone = collect_garbage(gc_settings, today=dt.date(2026, 12, 20))["removed"]["run_store"]
        assert "snapshots/2026-11-01" not in kept and "snapshots/2026-11-01" in gone
        assert store.folders("snapshots") == []
    finally:
        get_settings.cache_clear()
        artifacts._open.cache_clear()


def _no_live_store(url):
    raise AssertionError(f"the live store {url} was read: the retained snapshot should be used")
