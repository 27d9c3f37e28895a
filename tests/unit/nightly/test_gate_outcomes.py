"""The gate's outcomes and its comparison with the version a run would replace.

Runs are test_validation's hand-built run (4 shards; users 6 | 4 | 2 | 1, 8 with 2, 1, 3, 3
rows; 8 eligible users, two per shard: 6, 7 | 4, 5 | 2, 3 | 1, 8). Each test injects one fault
for real (a missing manifest, an empty export, a published version with more users, a GX
metric or checkpoint that raises) and checks the outcome, its class and exit code, and that
``results.json`` and ``summary.json`` were saved.
"""

from __future__ import annotations

import json
import shutil

import pytest
from test_validation import GOOD_ROWS, recommendation_frame, write_eligible, write_good_run

import recs.nightly.shard_gate as shard_gate
import recs.nightly.validation as validation_module
from recs.errors import NothingToValidateError, ValidationEngineError, ValidationFailedError
from recs.nightly.baseline import replaced_version
from recs.nightly.publish import publish_run
from recs.nightly.validation import validate_run
from recs.sharding import shard_of


def saved(paths) -> tuple[dict, dict]:
    """(summary.json, results.json) of a run."""
    folder = paths.validation_dir
    return (
        json.loads((folder / "summary.json").read_text()),
        json.loads((folder / "results.json").read_text()),
    )


def published_good_run(home, run_id="night_1", rows=None, **overrides):
    """A good run, validated and published (CURRENT names it)."""
    paths, settings = write_good_run(home, run_id=run_id, rows=rows, **overrides)
    validate_run(paths, settings)
    publish_run(paths, settings)
    return paths, settings


# --- nothing to validate ---------------------------------------------------------------------
def test_no_computed_shard_is_nothing_to_validate(tmp_path):
    """Every traversal failed (no manifest anywhere): exit 5, not a pass and not 'bad data'."""
    paths, settings = write_good_run(tmp_path / "home")
    for shard_id in range(4):
        paths.shard_manifest(shard_id).unlink()
    with pytest.raises(NothingToValidateError, match="no shard produced output") as raised:
        validate_run(paths, settings)
    assert raised.value.exit_code == 5
    summary, results = saved(paths)
    assert summary["outcome"] == "nothing_to_validate" and summary["success"] is False
    assert summary["failed_shards"] == [0, 1, 2, 3]
    assert results["outcome"] == "nothing_to_validate" and results["checkpoints"] == []


def test_nobody_eligible_is_nothing_to_validate(tmp_path):
    """The 2026-12-03 case: nobody active in the window, every shard computed and empty."""
    paths, settings = write_good_run(tmp_path / "home", rows={}, eligible=[])
    with pytest.raises(NothingToValidateError, match="nobody is eligible tonight"):
        validate_run(paths, settings)
    summary, _ = saved(paths)
    assert (summary["outcome"], summary["eligible_users"], summary["rows"]) == (
        "nothing_to_validate",
        0,
        0,
    )


def test_a_missing_earlier_stage_is_nothing_to_validate(tmp_path):
    """No graph (build_graph failed): one line naming the stage and the file."""
    paths, settings = write_good_run(tmp_path / "home")
    (paths.graph_dir / "meta.json").unlink()
    with pytest.raises(NothingToValidateError) as raised:
        validate_run(paths, settings)
    message = str(raised.value)
    assert "build_graph has not written" in message and "graph/meta.json" in message
    assert "\n" not in message
    assert saved(paths)[0]["outcome"] == "nothing_to_validate"


# --- failed and unplanned shards ---------------------------------------------------------------
def test_failed_shards_are_left_out_and_listed(tmp_path):
    """Shard 2's folder is gone and shard 1 has output but no manifest (its traversal died
    after writing, and its rows are poisoned: a self-recommendation): both are failed, left
    out of every check and listed for the carry-over. Computed: shards 0 and 3, 5 rows, users
    6, 1, 8 of 4 eligible there (6, 7, 1, 8): share 0.75."""
    paths, settings = write_good_run(tmp_path / "home")
    shutil.rmtree(paths.shard_dir(2))
    recommendation_frame(paths, [(4, 4, 2, 0.8, 1, [23])]).write_parquet(paths.shard_output(1))
    paths.shard_manifest(1).unlink()

    result = validate_run(paths, settings)
    assert (result["computed_shards"], result["failed_shards"]) == ([0, 3], [1, 2])
    assert (result["rows"], result["users"]) == (5, 3)
    summary, _ = saved(paths)
    assert [(s["shard_id"], s["status"]) for s in summary["shards"]] == [
        (0, "computed"),
        (1, "failed"),
        (2, "failed"),
        (3, "computed"),
    ]
    assert summary["shards"][1]["sha256"] is None
    assert summary["eligible_users_in_computed_shards"] == 4


def test_shard_folders_outside_the_plan_are_ignored(tmp_path):
    """A rerun with fewer shards: shard_id=004 (garbage) and shard_id=7 are not read."""
    paths, settings = write_good_run(tmp_path / "home")
    for name in ("shard_id=004", "shard_id=7"):
        (paths.shards_dir / name).mkdir()
        (paths.shards_dir / name / "recommendations.parquet").write_bytes(b"garbage")
        (paths.shards_dir / name / "manifest.json").write_text("{}")
    assert validate_run(paths, settings)["computed_shards"] == [0, 1, 2, 3]


# --- comparison with the version being replaced ------------------------------------------------
def test_a_drop_against_the_replaced_version_fails(tmp_path):
    """night_1 (5 users, 9 rows) is CURRENT; night_2 keeps users 6 and 2 only (5 rows):
    users -60 %, rows -44 %, both beyond the 25 % allowed. The share (2 of 8) still passes."""
    home = tmp_path / "home"
    published_good_run(home)
    half = {0: GOOD_ROWS[0], 2: GOOD_ROWS[2]}
    paths, settings = write_good_run(home, run_id="night_2", rows=half)
    with pytest.raises(ValidationFailedError) as raised:
        validate_run(paths, settings)
    assert raised.value.exit_code == 3
    assert (  # the figures in the error line (a newcomer had to open results.json for them)
        "; users with lists 2 against 5 in night_1 (-60.0 %), rows 5 against 9 in night_1 "
        "(-44.4 %); allowed -25 % to +300 % (this run's gate_max_drop / gate_max_growth, "
        "frozen with its snapshot); if the change is real, run it again with bounds that allow "
        "it: `RECS_GATE_MAX_DROP=0.61 recs run --snapshot-date 2026-11-01 --run-id night_2` "
        "(the bounds are frozen when the run is made; it reuses the date's retained snapshot, "
        "which holds the graph as it was frozen); if the live store lost rows by mistake, "
        "restore them, then add --rebuild-snapshot (details: "
    ) in str(raised.value)
    summary, results = saved(paths)
    assert set(summary["failed"]) == {"users_change_within_bounds", "rows_change_within_bounds"}
    assert summary["compared_with"] == "night_1" and summary["skipped"] == []
    assert (summary["replaced_users"], summary["replaced_rows"]) == (5, 9)
    run_checks = {e["name"]: e for e in results["checkpoints"][0]["expectations"]}
    assert run_checks["users_change_within_bounds"]["result"]["partial_unexpected_list"] == [
        pytest.approx(2 / 5 - 1)
    ]
    # the bound it names lets the same run pass (-60 % is the largest drop seen)
    allowed = settings.model_copy(update={"gate_max_drop": 0.61})
    assert validate_run(paths, allowed)["compared_with"] == "night_1"
    # with another check failing too (2 of 8 eligible users have lists), no bound alone would
    # pass: no command is offered (a review ran it and failed again)
    stricter = settings.model_copy(update={"gate_min_list_share": 0.5})
    with pytest.raises(ValidationFailedError, match="list_share_at_least_min") as raised:
        validate_run(paths, stricter)
    assert "users with lists 2 against 5 in night_1" in str(raised.value)
    assert "if the change is real" not in str(raised.value)


def test_the_same_volume_passes_and_names_the_version_compared_with(tmp_path):
    home = tmp_path / "home"
    published_good_run(home)
    paths, settings = write_good_run(home, run_id="night_2")
    result = validate_run(paths, settings)
    assert result["compared_with"] == "night_1" and result["skipped"] == []
    assert result["evaluated"] == 35  # CHECK_COUNT (33) and the two change checks


def test_growth_beyond_the_bound_fails(tmp_path):
    """night_1 had user 4 only (1 row); night_2 has 5 users and 9 rows: +400 % and +800 %,
    beyond gate_max_growth 3.0 (+300 %)."""
    home = tmp_path / "home"
    published_good_run(home, rows={1: GOOD_ROWS[1]})
    paths, settings = write_good_run(home, run_id="night_2")
    with pytest.raises(ValidationFailedError, match="users_change_within_bounds") as raised:
        validate_run(paths, settings)
    # +800 % rows is the largest growth: the smallest whole percent beyond it
    assert "bounds that allow it: `RECS_GATE_MAX_GROWTH=8.01 recs run " in str(raised.value)
    assert set(saved(paths)[0]["failed"]) == {
        "users_change_within_bounds",
        "rows_change_within_bounds",
    }


def test_the_current_version_rerun_smaller_fails_against_its_published_copy(tmp_path):
    """(From a review.) night_1 (5 users, 9 rows) is CURRENT; a shard rerun replaces its
    shard files (new files: the published copy keeps the old ones) and keeps user 4 only.
    Validated again, it is compared with its published copy, what a republish would replace:
    -80 % users and -89 % rows fail. (Comparing with the version night_1 replaced, none here,
    would skip both checks and let the 1-user list be republished.)"""
    home = tmp_path / "home"
    paths, _ = published_good_run(home)
    for path in paths.shards_dir.rglob("*"):
        if path.is_file():
            path.unlink()  # as a rerun writes: new files, never the published ones in place
    paths, settings = write_good_run(home, run_id="night_1", rows={1: GOOD_ROWS[1]})
    with pytest.raises(ValidationFailedError, match="users_change_within_bounds"):
        validate_run(paths, settings)
    summary, _ = saved(paths)
    assert summary["compared_with"] == "night_1"
    assert (summary["replaced_users"], summary["replaced_rows"]) == (5, 9)
    assert set(summary["failed"]) == {"users_change_within_bounds", "rows_change_within_bounds"}


def test_the_comparison_covers_the_computed_shards_only(tmp_path):
    """night_2 equals night_1 but shard 2 failed: compared over shards 0, 1, 3 (4 users, 6
    rows both nights), it passes even with gate_max_drop 0.1, where the whole night_1 (5
    users) would have shown a 20 % drop."""
    home = tmp_path / "home"
    published_good_run(home)
    paths, settings = write_good_run(home, run_id="night_2", gate_max_drop=0.1)
    paths.shard_manifest(2).unlink()
    result = validate_run(paths, settings)
    assert result["failed_shards"] == [2]
    summary, _ = saved(paths)
    assert (summary["users"], summary["replaced_users"], summary["replaced_rows"]) == (4, 4, 6)


def test_a_version_with_another_shard_count_is_resharded_to_compare(tmp_path):
    """night_1 was published with 2 shards; tonight has 4 and shard 2 failed: night_1's rows
    are counted under shard_of(user_id, 4), so shards 0, 1, 3 hold users 6, 4, 1, 8 (6 rows)."""
    home = tmp_path / "home"
    two_shards: dict[int, list[tuple]] = {}
    for rows in GOOD_ROWS.values():
        for row in rows:
            two_shards.setdefault(shard_of(row[0], 2), []).append(row)
    two_shards = {
        shard: sorted(rows, key=lambda r: (r[0], r[4])) for shard, rows in two_shards.items()
    }
    published_good_run(home, rows=two_shards, shard_count=2)
    counts, reason = replaced_version(home / "published", 4, [0, 1, 3])
    assert reason is None
    assert (counts.run_id, counts.users, counts.rows) == ("night_1", 4, 6)
    _, reason = replaced_version(home / "published", 2, [])
    assert "no users with lists" in reason


# --- the gate itself errs ----------------------------------------------------------------------
def test_a_metric_that_raises_is_an_engine_error_not_bad_data(tmp_path, monkeypatch):
    """GX's ``table.row_count`` metric raises (a metric-resolution exception inside the
    results, which GX reports as success: false): exit 4 and its own message, naming the
    checks that could not be evaluated; the results are saved with the exception."""
    import great_expectations.execution_engine.execution_engine as engine_module

    real_provider = engine_module.get_metric_provider

    def broken_provider(metric_name, execution_engine):
        metric_class, metric_fn = real_provider(metric_name, execution_engine)
        if metric_name != "table.row_count":
            return metric_class, metric_fn

        def raising(*args, **kwargs):
            raise RuntimeError("injected metric failure")

        return metric_class, raising

    monkeypatch.setattr(engine_module, "get_metric_provider", broken_provider)
    paths, settings = write_good_run(tmp_path / "home")
    with pytest.raises(ValidationEngineError) as raised:
        validate_run(paths, settings)
    message = str(raised.value)
    assert raised.value.exit_code == 4 and "\n" not in message
    assert "could not be evaluated" in message and "injected metric failure" in message
    assert "not a verdict on the data" in message
    summary, results = saved(paths)
    assert summary["outcome"] == "errored" and summary["success"] is False
    assert "rows_at_least_one" in summary["errored"]
    assert not set(summary["failed"]) & set(summary["errored"])
    check = next(
        e
        for c in results["checkpoints"]
        for e in c["expectations"]
        if e["name"] == "rows_at_least_one"
    )
    assert check["errored"] is True and "injected metric failure" in check["exception"]
    assert check["exception_info"]


def test_a_checkpoint_that_raises_is_an_engine_error_and_the_rest_still_runs(tmp_path, monkeypatch):
    """The users checkpoint raises out of ``Checkpoint.run``: its six checks are errored,
    the other batches are evaluated (and pass), results saved; no raw traceback."""
    import great_expectations as gx

    real_run = gx.Checkpoint.run

    def run(self, *args, **kwargs):
        if self.name == "recs_gate_users":
            raise RuntimeError("injected checkpoint failure")
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(gx.Checkpoint, "run", run)
    paths, settings = write_good_run(tmp_path / "home")
    with pytest.raises(ValidationEngineError, match="injected checkpoint failure"):
        validate_run(paths, settings)
    summary, results = saved(paths)
    assert summary["errored"] == [
        "rank_starts_at_1",
        "rank_gapless_per_user",
        "rank_unique_per_user",
        "unique_user_candidate",
        "user_in_home_shard",
        "user_is_eligible",
    ]
    assert summary["failed"] == []
    users = next(c for c in results["checkpoints"] if c["batch"] == "users")
    assert users["error"] == "RuntimeError: injected checkpoint failure"
    shards = next(c for c in results["checkpoints"] if c["batch"] == "shards")
    assert shards["success"] is True


def test_an_exception_in_the_gate_code_is_an_engine_error(tmp_path, monkeypatch):
    """The gate's own frame building raises: errored, results.json carries the error."""

    def broken(paths, shard_id, conformed):
        raise OSError("injected read failure")

    monkeypatch.setattr(shard_gate, "recommendation_rules", broken)
    paths, settings = write_good_run(tmp_path / "home")
    with pytest.raises(ValidationEngineError, match="OSError: injected read failure"):
        validate_run(paths, settings)
    summary, results = saved(paths)
    assert summary["outcome"] == results["outcome"] == "errored"
    assert "injected read failure" in results["error"]


def test_a_run_that_errs_after_a_pass_is_not_left_looking_validated(tmp_path, monkeypatch):
    """A passed summary is replaced by the errored one: a publish can never use a stale pass."""
    paths, settings = write_good_run(tmp_path / "home")
    validate_run(paths, settings)
    write_eligible(paths, [1, 2, 3, 4, 5, 6, 7, 8])
    monkeypatch.setattr(validation_module, "eligible_counts", lambda exports_dir: 1 / 0)
    with pytest.raises(ValidationEngineError):
        validate_run(paths, settings)
    assert saved(paths)[0]["success"] is False


def test_the_bound_a_failed_change_names_is_one_the_setting_takes():
    """1,000 users and rows before, none tonight (-100 %): the next whole percent, 1.01, is
    one RECS_GATE_MAX_DROP refuses (at most 1.0): the line names 1.00, which it takes."""
    import datetime as dt
    from pathlib import Path

    from recs.config import Settings
    from recs.nightly.baseline import ReplacedVersion, change_text
    from recs.nightly.runs import RunPaths

    paths = RunPaths(Path("/tmp/home"), dt.date(2026, 11, 1), "night_2")
    text = change_text(
        paths, {"users": 0, "rows": 0}, ReplacedVersion("night_1", 1000, 1000), Settings()
    )
    assert "`RECS_GATE_MAX_DROP=1.00 recs run --snapshot-date 2026-11-01 --run-id night_2`" in text
    assert Settings(gate_max_drop=1.00).gate_max_drop == 1.0
