"""Carry-over (recs.nightly.carryover via publish_run): a failed shard keeps yesterday's lists.

Runs are test_validation's hand-built run (4 shards: user 6 | 4 | 2 | 1 and 8, with 2, 1, 3,
3 rows; eligible 1..8). ``night_1`` (2026-11-01) is published as it is. Later nights halve
every score, so a row tells by its score (and its run_id) which night computed it. A shard
"fails" the way a traversal that died does: its manifest is missing (the traversal writes it
last), whatever its output folder holds.
"""

from __future__ import annotations

import datetime as dt
import json

import polars as pl
import pytest
from test_validation import GOOD_ROWS, rewrite_shard, write_eligible, write_good_run

from recs.errors import CarryOverError, ValidationFailedError
from recs.nightly.publish import publish_run
from recs.nightly.validation import validate_run
from recs.published import current_version, list_versions, shard_file, version_manifest
from recs.sharding import shard_of
from recs.testing.published import recommendations_for

DAY_1, DAY_2, DAY_3 = dt.date(2026, 11, 1), dt.date(2026, 11, 2), dt.date(2026, 11, 3)


def night(home, run_id, day, failed=(), rows=None, **overrides):
    """A run of ``day`` with halved scores (``day`` after DAY_1), shards ``failed`` failed;
    validated (it must pass)."""
    paths, settings = write_good_run(home, run_id=run_id, snapshot_date=day, rows=rows, **overrides)
    if day != DAY_1:
        for shard_id in range(settings.shard_count):
            rewrite_shard(paths, shard_id, lambda f: f.with_columns(pl.col("score") * 0.5))
    for shard_id in failed:
        paths.shard_manifest(shard_id).unlink()
    result = validate_run(paths, settings)
    assert result["failed_shards"] == list(failed)
    return paths, settings


def published_rows(settings, run_id, shard_id):
    return pl.read_parquet(shard_file(settings.published_dir, run_id, shard_id))


def test_a_failed_shard_is_carried_over_and_the_rest_publishes(tmp_path):
    """night_2's shard 2 failed: its file in night_2 holds night_1's rows of user 2 (scores
    0.95, 0.7, 0.6, run_id night_1), marked carried_over from night_1; the other shards are
    night_2's own; CURRENT moves to night_2."""
    home = tmp_path / "home"
    night_1, settings = night(home, "night_1", DAY_1)
    publish_run(night_1, settings)
    night_2, _ = night(home, "night_2", DAY_2, failed=[2])

    result = publish_run(night_2, settings)
    assert result["carried_over"] == [{"shard_id": 2, "carried_from": "night_1"}]
    assert result["current"] is True and current_version(settings.published_dir) == "night_2"
    manifest = version_manifest(settings.published_dir, "night_2")
    assert manifest["carried_over"] == [2]
    assert [(s["shard_id"], s["status"], s["carried_from"]) for s in manifest["shards"]] == [
        (0, "computed", None),
        (1, "computed", None),
        (2, "carried_over", "night_1"),
        (3, "computed", None),
    ]
    assert (manifest["rows"], manifest["users"]) == (9, 5)
    carried = published_rows(settings, "night_2", 2)
    assert carried.equals(published_rows(settings, "night_1", 2))
    assert carried["run_id"].unique().to_list() == ["night_1"]
    assert recommendations_for(settings.published_dir, 2)["score"].to_list() == [0.95, 0.7, 0.6]
    assert recommendations_for(settings.published_dir, 6)["score"].to_list() == [0.45, 0.25]
    # the carried file is written, not linked from the run (whose shard 2 output is stale)
    assert shard_file(settings.published_dir, "night_2", 2).stat().st_nlink == 1
    listed = {v["run_id"]: v["carried_over"] for v in list_versions(settings.published_dir)}
    assert listed == {"night_1": [], "night_2": [{"shard_id": 2, "carried_from": "night_1"}]}


def test_carried_rows_are_restricted_to_tonights_eligible_users(tmp_path):
    """Shard 3 (users 1 and 8) failed and user 8 is not eligible tonight: only user 1's row
    is carried; user 8 falls back to cold start."""
    home = tmp_path / "home"
    night_1, settings = night(home, "night_1", DAY_1)
    publish_run(night_1, settings)
    night_2, _ = write_good_run(home, run_id="night_2", snapshot_date=DAY_2)
    write_eligible(night_2, [1, 2, 3, 4, 5, 6, 7])
    night_2.shard_manifest(3).unlink()
    validate_run(night_2, settings)
    publish_run(night_2, settings)
    carried = published_rows(settings, "night_2", 3)
    assert carried.select("user_id", "candidate_id", "run_id").rows() == [(1, 10, "night_1")]
    entry = version_manifest(settings.published_dir, "night_2")["shards"][3]
    assert (entry["rows"], entry["users"]) == (1, 1)


def test_carried_from_follows_the_chain(tmp_path):
    """Shard 2 fails on night_2 and again on night_3: night_3 carries night_2's carried rows,
    which were computed in night_1, so carried_from says night_1."""
    home = tmp_path / "home"
    night_1, settings = night(home, "night_1", DAY_1)
    publish_run(night_1, settings)
    night_2, _ = night(home, "night_2", DAY_2, failed=[2])
    publish_run(night_2, settings)
    night_3, _ = night(home, "night_3", DAY_3, failed=[2, 3])
    result = publish_run(night_3, settings)
    assert result["carried_over"] == [
        {"shard_id": 2, "carried_from": "night_1"},
        {"shard_id": 3, "carried_from": "night_2"},
    ]
    assert published_rows(settings, "night_3", 2).equals(published_rows(settings, "night_1", 2))


def test_an_empty_carried_shard_names_its_origin_from_the_manifest(tmp_path):
    """Shard 2 had no lists in night_1 (user 2 had none): the carried file is empty and typed,
    and carried_from still names night_1."""
    home = tmp_path / "home"
    rows = {k: v for k, v in GOOD_ROWS.items() if k != 2}
    night_1, settings = night(home, "night_1", DAY_1, rows=rows)
    publish_run(night_1, settings)
    night_2, _ = night(home, "night_2", DAY_2, failed=[2], rows=rows)
    assert publish_run(night_2, settings)["carried_over"] == [
        {"shard_id": 2, "carried_from": "night_1"}
    ]
    assert published_rows(settings, "night_2", 2).height == 0


def test_a_version_with_another_shard_count_is_resharded(tmp_path):
    """night_1 had 2 shards; tonight has 4 and shard 2 failed: the carried shard holds the
    night_1 rows of the users shard_of(user_id, 4) puts in shard 2 (user 2), sorted."""
    home = tmp_path / "home"
    two_shards: dict[int, list[tuple]] = {}
    for shard_rows in GOOD_ROWS.values():
        for row in shard_rows:
            two_shards.setdefault(shard_of(row[0], 2), []).append(row)
    two_shards = {k: sorted(v, key=lambda r: (r[0], r[4])) for k, v in two_shards.items()}
    night_1, settings_2 = night(home, "night_1", DAY_1, rows=two_shards, shard_count=2)
    publish_run(night_1, settings_2)
    night_2, settings = night(home, "night_2", DAY_2, failed=[2])
    result = publish_run(night_2, settings)
    assert result["carried_over"] == [{"shard_id": 2, "carried_from": "night_1"}]
    carried = published_rows(settings, "night_2", 2)
    assert carried.select("user_id", "rank", "score").rows() == [
        (2, 1, 0.95),
        (2, 2, 0.7),
        (2, 3, 0.6),
    ]
    assert version_manifest(settings.published_dir, "night_2")["shard_count"] == 4


def test_a_failed_shard_without_a_published_version_fails_the_publish(tmp_path):
    """The first night ever, shard 1 failed: there is nothing to carry over, so the publish
    fails with its own error (exit 6), nothing is published, no staging is left."""
    night_1, settings = night(tmp_path / "home", "night_1", DAY_1, failed=[1])
    with pytest.raises(CarryOverError) as raised:
        publish_run(night_1, settings)
    message = str(raised.value)
    assert raised.value.exit_code == 6 and "\n" not in message
    assert "shard(s) 001 failed and nothing is published" in message
    assert current_version(settings.published_dir) is None
    assert sorted(p.name for p in settings.published_dir.iterdir()) == [".lock"]


def test_a_backfill_carries_nothing_from_a_later_dates_version(tmp_path):
    """(From a review.) CURRENT is night_2 of 2026-11-02; a backfill of 2026-11-01 whose shard
    2 failed would have held night_2's rows of user 2 (computed from the later graph) in a
    version of the earlier date: the publish fails with its own error (exit 6) naming the
    dates and the rerun, nothing of the backfill is published, CURRENT stays."""
    home = tmp_path / "home"
    night_2, settings = night(home, "night_2", DAY_2)
    publish_run(night_2, settings)
    backfill, _ = night(home, "backfill", DAY_1, failed=[2])
    with pytest.raises(CarryOverError) as raised:
        publish_run(backfill, settings)
    message = str(raised.value)
    assert raised.value.exit_code == 6 and "\n" not in message
    assert "night_2, is of a later date (2026-11-02)" in message
    assert "recs shard run --snapshot-date 2026-11-01 --run-id backfill --shard N" in message
    assert [v["run_id"] for v in list_versions(settings.published_dir)] == ["night_2"]
    assert current_version(settings.published_dir) == "night_2"


def test_a_shard_computed_after_validation_needs_a_new_validation(tmp_path):
    """Shard 2 failed at validation, then was rerun: publishing carried rows while fresher
    ones sit unvalidated in the run would be wrong either way, so the publish refuses."""
    home = tmp_path / "home"
    night_1, settings = night(home, "night_1", DAY_1)
    publish_run(night_1, settings)
    night_2, _ = night(home, "night_2", DAY_2, failed=[2])
    rewrite_shard(night_2, 2, lambda f: f)  # the rerun writes output and manifest again
    with pytest.raises(ValidationFailedError, match="has been computed since"):
        publish_run(night_2, settings)
    assert current_version(settings.published_dir) == "night_1"
    validate_run(night_2, settings)
    assert publish_run(night_2, settings)["carried_over"] == []


def test_manifest_of_a_carried_version_is_byte_identical_on_republish(tmp_path):
    home = tmp_path / "home"
    night_1, settings = night(home, "night_1", DAY_1)
    publish_run(night_1, settings)
    night_2, _ = night(home, "night_2", DAY_2, failed=[0])
    publish_run(night_2, settings)
    manifest = settings.published_dir / "night_2" / "manifest.json"
    first = manifest.read_bytes()
    assert publish_run(night_2, settings)["replaced"] == "unchanged"
    assert manifest.read_bytes() == first
    assert json.loads(first)["validation"]["compared_with"] == "night_1"
