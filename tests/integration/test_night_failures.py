"""Nights that go wrong, end to end (``run_all``: snapshot, dbt, graph, traversal, gate, publish).

One synthetic graph (2,000 users, ~30 k follows, generated relative to 2026-11-01) and one good
night, ``night_1`` of 2026-11-01 with 4 shards, published. Each test starts from a copy of that
home and injects one fault for real:

- a shard's input partition truncated after the plan: that traversal raises, the night
  publishes with the shard carried over from night_1, and the next night recomputes it;
- 2026-12-03, a night nobody is active in the 30-day window before: nothing to validate;
- half the follow edges lost from the live store: users with lists and rows drop far beyond
  25 %, the gate fails on the comparison with night_1;
- night_1 rerun with 2 shards instead of 4: the old shard_id=002/003 folders are removed by the
  plan, and the rerun passes and publishes;
- night_1 rerun with the date's retained in-degrees damaged: it stops at build_graph, and the
  first attempt's shards and verdict are withdrawn, not shown or published as the rerun's.
- a run of 2026-11-02 reusing the run id night_1: refused before its freeze, and at its
  publish were the freeze not to refuse it.

In every failure ``CURRENT`` still names night_1.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from recs.config import Settings
from recs.errors import CorruptFileError, NothingToValidateError, ValidationFailedError
from recs.nightly import pipeline
from recs.nightly.reporting import run_summary, total_lines
from recs.nightly.runs import RunPaths
from recs.published import current_version, shard_file, version_manifest
from recs.sharding import shard_expr

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The home after night_1: live store, run and published version."""
    from recs.demo.synthetic import generate_graph

    home = tmp_path_factory.mktemp("nights") / "home"
    settings = Settings(home=home, shard_count=4)
    generate_graph(2000, 7, settings, avg_out_degree=15)
    pipeline.run_all(home, "2026-11-01", "night_1", settings)
    assert current_version(settings.published_dir) == "night_1"
    return home


@pytest.fixture
def home(base, tmp_path):
    """A copy of the home after night_1, for one test to break."""
    copy = tmp_path / "home"
    shutil.copytree(base, copy)
    return copy


def settings_for(home: Path, **overrides) -> Settings:
    return Settings(home=home, shard_count=overrides.pop("shard_count", 4), **overrides)


def eligible_ids(home: Path, date: str, run_id: str) -> list[int]:
    files = home / "runs" / date / run_id / "exports" / "eligible_users" / "*" / "*.parquet"
    return pl.read_parquet(files, hive_partitioning=False)["user_id"].to_list()


def test_a_failing_shard_is_carried_over_and_the_next_night_recomputes_it(home, monkeypatch):
    """night_2: shard 1's follow-edge partition is truncated after the plan, so its traversal
    raises; the other shards are computed, the gate passes on them, and night_2 publishes with
    shard 1 carried over from night_1: exactly night_1's rows of the shard-1 users eligible
    tonight. night_3 has no fault: every shard computed again."""
    settings = settings_for(home)
    real_plan = pipeline.plan_shards

    def plan_then_truncate(paths):
        planned = real_plan(paths)
        partition = paths.snapshot_dir / "follow_edges" / "shard_id=001" / "part-0.parquet"
        partition.write_bytes(partition.read_bytes()[:100])
        return planned

    monkeypatch.setattr(pipeline, "plan_shards", plan_then_truncate)
    night_2 = pipeline.run_all(home, "2026-11-02", "night_2", settings)
    monkeypatch.setattr(pipeline, "plan_shards", real_plan)

    assert [f["shard_id"] for f in night_2["failed_shards"]] == [1]
    published = settings.published_dir
    assert current_version(published) == "night_2"
    manifest = version_manifest(published, "night_2")
    assert [(s["status"], s["carried_from"]) for s in manifest["shards"]] == [
        ("computed", None),
        ("carried_over", "night_1"),
        ("computed", None),
        ("computed", None),
    ]
    assert night_2["stages"]["publish_run"]["result"]["carried_over"] == [
        {"shard_id": 1, "carried_from": "night_1"}
    ]
    tonight = eligible_ids(home, "2026-11-02", "night_2")
    expected = (
        pl.read_parquet(shard_file(published, "night_1", 1))
        .filter(pl.col("user_id").is_in(tonight) & (shard_expr("user_id", 4) == 1))
        .sort("user_id", "rank")
    )
    carried = pl.read_parquet(shard_file(published, "night_2", 1))
    assert expected.height > 100
    assert carried.equals(expected)
    computed = pl.read_parquet(shard_file(published, "night_2", 0))
    assert computed["run_id"].unique().to_list() == ["night_2"]

    night_3 = pipeline.run_all(home, "2026-11-03", "night_3", settings)
    assert night_3["failed_shards"] == []
    manifest = version_manifest(published, "night_3")
    assert manifest["carried_over"] == []
    assert {s["status"] for s in manifest["shards"]} == {"computed"}


def test_a_night_with_nobody_eligible_is_not_published(home):
    """2026-12-03: nobody was active in the 30 days before, every shard is empty."""
    settings = settings_for(home)
    with pytest.raises(NothingToValidateError, match="nobody is eligible tonight"):
        pipeline.run_all(home, "2026-12-03", "empty", settings)
    assert current_version(settings.published_dir) == "night_1"
    assert not (settings.published_dir / "empty").exists()
    summary = (home / "runs" / "2026-12-03" / "empty" / "validation" / "summary.json").read_text()
    assert '"outcome": "nothing_to_validate"' in summary


def test_half_the_follows_lost_fails_the_comparison_and_is_not_published(home):
    """The live store loses the follows of every even follower id: users with lists and rows
    fall by far more than 25 % against night_1, which stays current."""
    with sqlite3.connect(home / "live.db") as connection:
        connection.execute("DELETE FROM follow_edges WHERE follower_id % 2 = 0")
    settings = settings_for(home)
    with pytest.raises(ValidationFailedError) as raised:
        pipeline.run_all(home, "2026-11-02", "night_2", settings)
    message = str(raised.value)
    assert "users_change_within_bounds" in message and "rows_change_within_bounds" in message
    assert current_version(settings.published_dir) == "night_1"
    assert not (settings.published_dir / "night_2").exists()
    summary = json.loads(
        (home / "runs" / "2026-11-02" / "night_2" / "validation" / "summary.json").read_text()
    )
    assert summary["compared_with"] == "night_1"
    assert summary["users"] / summary["replaced_users"] < 0.75


def test_a_rerun_with_fewer_shards_passes(home):
    """night_1 again with RECS_SHARD_COUNT 2: the plan removes shard_id=002 and 003, the gate
    reads shards 0 and 1 only (compared with the 4-shard night_1, re-sharded) and passes."""
    run_dir = home / "runs" / "2026-11-01" / "night_1"
    assert (run_dir / "shards" / "shard_id=003").is_dir()
    settings = settings_for(home, shard_count=2)
    result = pipeline.run_all(home, "2026-11-01", "night_1", settings)
    assert sorted(p.name for p in (run_dir / "shards").iterdir()) == [
        "shard_id=000",
        "shard_id=001",
    ]
    gate = result["stages"]["validate_run"]["result"]
    assert gate["computed_shards"] == [0, 1] and gate["compared_with"] == "night_1"
    manifest = version_manifest(settings.published_dir, "night_1")
    assert manifest["shard_count"] == 2 and len(manifest["shards"]) == 2


def test_a_rerun_that_stops_at_build_graph_withdraws_the_first_attempts_results(home):
    """night_1 again, its date's retained in-degrees damaged (one account's count plus one): the
    freeze links the damaged file into the run, build_graph refuses it, and the run now shows
    what this attempt computed: no shard, no verdict, no Data Docs (a newcomer's summary still
    said "4 of 4" and "validation passed", the first attempt's), and where it stopped, with the
    error, also after a gate run alone. A publish of it is refused; CURRENT and the published
    night_1 are untouched. A DAG rerun's freeze then withdraws that record and dbt's run
    results (a review's still said "last recs run: stopped at build_graph", and reported the
    earlier dbt time)."""
    from recs.report.content import run_report

    settings = settings_for(home)
    paths = RunPaths.find(home, "2026-11-01", "night_1")
    before = run_summary(home, "2026-11-01", "night_1")["totals"]
    assert (before["shards_done"], before["validation"]) == (4, "passed")
    retained = home / "snapshots" / "2026-11-01" / "in_degrees.parquet"
    degrees = pl.read_parquet(retained)
    damaged = degrees.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(pl.col("in_degree") + 1)
        .otherwise(pl.col("in_degree")).alias("in_degree")
    )  # fmt: skip
    retained.unlink()  # a new file: the first attempt's run folder links the old one
    damaged.write_parquet(retained)

    with pytest.raises(CorruptFileError, match="do not match its follow edges"):
        pipeline.run_all(home, "2026-11-01", "night_1", settings)

    after = run_summary(home, "2026-11-01", "night_1")
    assert after["totals"]["shards_done"] == 0 and after["failed_shards"] == [0, 1, 2, 3]
    assert after["totals"]["validation"] == "not_run" and after["validation"] is None
    assert not paths.validation_results.exists()
    assert not (paths.validation_dir / "data_docs").exists()
    assert not (paths.graph_dir / "meta.json").exists()  # no shard runs on the earlier graph
    assert after["totals"]["published"] == "served"  # the version published before, kept
    stopped = after["totals"]["stopped_at"]
    assert stopped["stage"] == "build_graph"
    assert stopped["error"].startswith("InDegreeMismatchError: the in-degrees of run night_1 (")
    assert stopped["error"].endswith(  # whole, its remedy with it
        "`recs run --snapshot-date 2026-11-01 --run-id night_1 --rebuild-snapshot` (the DAG's "
        "rebuild_snapshot param)"
    )
    assert total_lines(after)["last recs run"] == f"stopped at build_graph: {stopped['error']}"
    states = {row["stage"]: row["state"] for row in run_report(paths)["stages"]}
    assert states["build_graph"] == "failed" and states["build_models"] is None
    with pytest.raises(ValidationFailedError, match="it has not been validated"):
        pipeline.publish_run(paths)
    with pytest.raises(NothingToValidateError, match="build_graph has not written"):
        pipeline.validate_run(paths)  # a stage alone amends the times, keeps where it stopped
    assert run_summary(home, "2026-11-01", "night_1")["totals"]["stopped_at"] == stopped
    assert current_version(settings.published_dir) == "night_1"
    assert version_manifest(settings.published_dir, "night_1")["validation"]["success"] is True

    # the DAG's freeze (no `recs run`) reruns it: the earlier attempt's record is withdrawn
    pipeline.freeze_snapshot(paths, settings, rebuild=True)
    assert run_summary(home, "2026-11-01", "night_1")["totals"]["stopped_at"] is None
    assert not paths.stage_times.exists() and not paths.dbt_run_results.exists()
    assert "last recs run" not in total_lines(run_summary(home, "2026-11-01", "night_1"))
    seconds = {row["stage"]: row["seconds"] for row in run_report(paths)["stages"]}
    assert seconds["build_models"] is None  # not the earlier attempt's dbt time (a review's)


def test_ctrl_c_among_the_shards_is_recorded_as_where_the_run_stopped(home, monkeypatch):
    """(From a review.) A `recs run` interrupted while shard 1 runs: the interrupt stops the run
    (it is not a failed shard to carry over) and the summary says where it stopped; shard 0
    counts as computed, the others do not."""
    settings = settings_for(home)
    real = pipeline.traverse_shard

    def interrupted(paths, shard_id):
        if shard_id == 1:
            raise KeyboardInterrupt
        return real(paths, shard_id)

    monkeypatch.setattr(pipeline, "traverse_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_all(home, "2026-11-02", "night_2", settings)
    summary = run_summary(home, "2026-11-02", "night_2")
    assert summary["totals"]["stopped_at"] == {
        "stage": "traverse_shard", "error": "KeyboardInterrupt"
    }  # fmt: skip
    assert summary["failed_shards"] == [1, 2, 3]
    assert current_version(settings.published_dir) == "night_1"


def test_a_run_id_published_for_another_date_is_refused(home, monkeypatch):
    """(From a newcomer, whose run of an older date reusing a published run id replaced that
    version, the rollback target, with the older date's lists.) night_1 is published for
    2026-11-01: a run of 2026-11-02 with that run id is refused before its freeze, leaving no
    folder; were the freeze not to refuse it (a version published meanwhile), the publish
    refuses it after the gate. The published night_1 is untouched either way."""
    from recs.errors import RunIdTakenError
    from recs.nightly import publish

    settings = settings_for(home)
    before = version_manifest(settings.published_dir, "night_1")
    taken = "run id night_1 names the published version of snapshot 2026-11-01, not of 2026-11-02"
    with pytest.raises(RunIdTakenError, match=taken):
        pipeline.run_all(home, "2026-11-02", "night_1", settings)
    assert not (home / "runs" / "2026-11-02").exists()

    real, asked = publish.refuse_taken_run_id, []

    def not_at_the_freeze(published_dir, paths):
        asked.append(paths.run_id)
        if len(asked) > 1:
            real(published_dir, paths)

    monkeypatch.setattr(publish, "refuse_taken_run_id", not_at_the_freeze)
    with pytest.raises(RunIdTakenError, match=taken):
        pipeline.run_all(home, "2026-11-02", "night_1", settings)
    assert asked == ["night_1", "night_1"]
    assert version_manifest(settings.published_dir, "night_1") == before
    assert current_version(settings.published_dir) == "night_1"
