"""The gate by shard: each shard's checks saved by its own task, merged by ``validate_run``.

Runs are test_validation's hand-built run (4 shards; users 6 | 4 | 2 | 1, 8 with 2, 1, 3, 3
rows; 8 eligible users, two per shard). Faults are injected for real: a shard file rewritten
after its gate ran, a saved result truncated or deleted, a GX checkpoint that raises in the run
step (so only the saved results can pass it).
"""

from __future__ import annotations

import json

import pytest
from test_validation import _row, _set, rewrite_shard, write_good_run

import recs.nightly.validation as validation_module
from recs.errors import ValidationFailedError
from recs.nightly.shard_gate import validate_shard
from recs.nightly.validation import validate_run

SHARD_CHECKS = 30  # of the 33: 3 (row count, list share, planned eligible) are the run step's


def gate_every_shard(paths, settings) -> list[dict]:
    return [validate_shard(paths, settings, shard_id) for shard_id in range(4)]


def test_each_shard_saves_its_checks_and_figures(tmp_path):
    """Shard 2 holds user 2's 3 rows and eligible users 2 and 3: its result says so, and its
    30 checks passed; shard 0's too (user 6, 2 rows, eligible 6 and 7)."""
    paths, settings = write_good_run(tmp_path / "home")
    results = gate_every_shard(paths, settings)
    assert [(r["shard_id"], r["status"], r["rows"], r["users"], r["eligible_users"])
            for r in results] == [  # fmt: skip
        (0, "computed", 2, 1, 2), (1, "computed", 1, 1, 2),
        (2, "computed", 3, 1, 2), (3, "computed", 3, 2, 2),
    ]  # fmt: skip
    assert all(r["success"] is True for r in results)
    saved = json.loads(paths.shard_validation(2).read_text())
    assert sum(len(c["expectations"]) for c in saved["checkpoints"]) == SHARD_CHECKS
    assert [c["batch"] for c in saved["checkpoints"]] == [
        "recommendations", "recommendation_rules", "users", "shards",
    ]  # fmt: skip
    assert len(saved["gx_results"]) == 4 and len(saved["sha256"]) == 64


def test_the_run_step_uses_the_saved_results_of_unchanged_shards(tmp_path, monkeypatch):
    """Every shard gated by its task: validate_run passes without validating any shard again
    (the in-process fallback is made to raise), and its merged checks count the 9 rows."""
    paths, settings = write_good_run(tmp_path / "home")
    gate_every_shard(paths, settings)

    def again(*args, **kwargs):
        raise AssertionError("a shard with a current saved result was validated again")

    monkeypatch.setattr(validation_module, "validate_shard_result", again)
    result = validate_run(paths, settings)
    assert result["outcome"] == "passed" and result["rows"] == 9 and result["users"] == 5
    results = json.loads((paths.validation_dir / "results.json").read_text())
    checks = {e["name"]: e for c in results["checkpoints"] for e in c["expectations"]}
    assert checks["no_excluded_candidate"]["result"]["element_count"] == 9
    assert checks["no_excluded_candidate"]["shards_failed"] == []
    assert "gx_results" not in results


def test_a_shard_rewritten_after_its_gate_is_validated_again_and_fails(tmp_path):
    """Shard 0's file is rewritten (rank 2 -> 7) after its task saved a pass: the saved result
    is of other bytes, so validate_run checks the shard itself and fails rank_gapless_per_user,
    naming shard 0 only."""
    paths, settings = write_good_run(tmp_path / "home")
    gate_every_shard(paths, settings)
    rewrite_shard(paths, 0, _set("rank", 7, where=_row(6, 2)))
    with pytest.raises(ValidationFailedError, match="rank_gapless_per_user"):
        validate_run(paths, settings)
    results = json.loads((paths.validation_dir / "results.json").read_text())
    check = next(e for c in results["checkpoints"] for e in c["expectations"]
                 if e["name"] == "rank_gapless_per_user")  # fmt: skip
    assert check["shards_failed"] == [0] and check["result"]["unexpected_count"] == 1
    assert check["result"]["element_count"] == 5  # users with lists over the 4 shards


@pytest.mark.parametrize("damage", ["deleted", "truncated", "another_run_s"])
def test_a_lost_or_damaged_saved_result_is_never_trusted(tmp_path, damage):
    """Shard 0 is poisoned (a self-recommendation) and its saved result then replaced: deleted,
    truncated mid-JSON, or swapped for a passing result of the good file. Each time the run step
    validates the shard itself and fails no_self_recommendation."""
    paths, settings = write_good_run(tmp_path / "home")
    gate_every_shard(paths, settings)
    passing = paths.shard_validation(0).read_bytes()
    rewrite_shard(paths, 0, _set("candidate_id", 6, where=_row(6, 2)))
    validate_shard(paths, settings, 0)
    target = paths.shard_validation(0)
    if damage == "deleted":
        target.unlink()
    elif damage == "truncated":
        target.write_bytes(target.read_bytes()[:200])
    else:
        target.write_bytes(passing)
    with pytest.raises(ValidationFailedError, match="no_self_recommendation"):
        validate_run(paths, settings)


def test_a_saved_failure_fails_the_run(tmp_path):
    """The shard task's own verdict counts: a failing saved result (unchanged file) fails the
    run with the same check, without the shard being validated again."""
    paths, settings = write_good_run(tmp_path / "home")
    rewrite_shard(paths, 3, _set("mutual_count", 1, where=_row(8, 1)))
    results = gate_every_shard(paths, settings)
    assert [r["success"] for r in results] == [True, True, True, False]
    with pytest.raises(ValidationFailedError, match="mutual_count_at_least_min"):
        validate_run(paths, settings)


def test_a_failed_shard_is_recorded_as_failed_and_carried_over(tmp_path):
    """Shard 1 never wrote its manifest: its gate task records it as failed (nothing judged),
    and the run step leaves it out."""
    paths, settings = write_good_run(tmp_path / "home")
    paths.shard_manifest(1).unlink()
    result = validate_shard(paths, settings, 1)
    assert (result["status"], result["success"]) == ("failed", None)
    summary = validate_run(paths, settings)
    assert summary["failed_shards"] == [1] and summary["computed_shards"] == [0, 2, 3]


def test_a_result_judged_against_other_inputs_is_not_reused(tmp_path):
    """After shard 0's task passed, user 6 blocks 10 (a new follow_exclusions file): the shard
    file is the same bytes, but its saved result is of other inputs, so the run step checks it
    again and fails no_excluded_candidate (6 is recommended 10)."""
    import polars as pl

    from recs.contracts import EXPORT_SCHEMAS

    paths, settings = write_good_run(tmp_path / "home")
    gate_every_shard(paths, settings)
    folder = paths.exports_dir / "follow_exclusions" / "shard_id=0"
    folder.mkdir(parents=True, exist_ok=True)
    pl.DataFrame([(6, 10, "blocked")], schema=EXPORT_SCHEMAS["follow_exclusions"],
                 orient="row").write_parquet(folder / "data_1.parquet")  # fmt: skip
    with pytest.raises(ValidationFailedError, match="no_excluded_candidate"):
        validate_run(paths, settings)


@pytest.mark.parametrize(
    ("damage", "check"),
    [("unreadable", "shard_manifest_readable"), ("rows", "manifest_rows_match_output")],
)
def test_a_manifest_changed_after_the_shard_passed_is_judged_again(tmp_path, damage, check):
    """(From a review.) After shard 2's task passed, its manifest is cut short, or says 5 rows
    (the file holds 3): the output's bytes are the same, but the saved result judged another
    manifest, so the run step checks the shard again and fails the manifest's check."""
    paths, settings = write_good_run(tmp_path / "home")
    gate_every_shard(paths, settings)
    manifest = paths.shard_manifest(2)
    text = manifest.read_text()
    if damage == "unreadable":
        manifest.write_text(text[:20])
    else:
        manifest.write_text(json.dumps({**json.loads(text), "rows": 5}))
    with pytest.raises(ValidationFailedError, match=check):
        validate_run(paths, settings)


@pytest.mark.parametrize("forgery", ["no_checkpoints", "no_rules_batch", "one_check_less"])
def test_an_incomplete_saved_result_is_validated_again(tmp_path, forgery):
    """Shard 0 has a self-recommendation and its saved result is then cut down (every batch
    gone, the rules batch gone, or one check dropped from it): the result is not complete, or
    lacks a check the other shards hold, so the run step checks the shard itself and fails."""
    paths, settings = write_good_run(tmp_path / "home")
    rewrite_shard(paths, 0, _set("candidate_id", 6, where=_row(6, 2)))
    gate_every_shard(paths, settings)
    target = paths.shard_validation(0)
    saved = json.loads(target.read_text())
    if forgery == "no_checkpoints":
        saved["checkpoints"] = []
    elif forgery == "no_rules_batch":
        saved["checkpoints"] = [c for c in saved["checkpoints"]
                                if c["batch"] != "recommendation_rules"]  # fmt: skip
    else:
        rules = next(c for c in saved["checkpoints"] if c["batch"] == "recommendation_rules")
        rules["expectations"] = [e for e in rules["expectations"]
                                 if e["name"] != "no_self_recommendation"]  # fmt: skip
        rules["success"] = True
    target.write_text(json.dumps(saved))
    with pytest.raises(ValidationFailedError, match="no_self_recommendation"):
        validate_run(paths, settings)


def test_an_engine_error_in_a_saved_result_is_retried_not_reused(tmp_path):
    """Shard 1's saved result carries an errored check (GX could not compute it, e.g. a
    transient failure): the run step does not reuse it but validates the shard again, and the
    run passes."""
    paths, settings = write_good_run(tmp_path / "home")
    gate_every_shard(paths, settings)
    target = paths.shard_validation(1)
    saved = json.loads(target.read_text())
    check = saved["checkpoints"][0]["expectations"][0]
    check.update(success=False, errored=True, exception="transient failure")
    target.write_text(json.dumps(saved))
    assert validate_run(paths, settings)["outcome"] == "passed"
    assert json.loads(target.read_text())["checkpoints"][0]["expectations"][0]["errored"] is False


def test_a_shard_without_its_follow_edge_partition_is_never_passed(tmp_path):
    """The snapshot's partition of shard 0 is gone: the users' own follows cannot be checked,
    so the gate errs (exit 4) naming the partition, and nothing looks validated."""
    import shutil

    from recs.errors import ValidationEngineError

    paths, settings = write_good_run(tmp_path / "home")
    shutil.rmtree(paths.snapshot_dir / "follow_edges" / "shard_id=000")
    with pytest.raises(ValidationEngineError, match="no follow-edge partition for shard 000"):
        validate_run(paths, settings)
    assert json.loads((paths.validation_dir / "summary.json").read_text())["success"] is False


def test_unexpected_value_counts_are_summed_over_shards(tmp_path):
    """Shard 0 has one self-recommendation, shard 3 two: the merged check counts 3 unexpected
    rows, names shards 0 and 3, and its value counts say True x 3."""
    paths, settings = write_good_run(tmp_path / "home")
    rewrite_shard(paths, 0, _set("candidate_id", 6, where=_row(6, 2)))
    rewrite_shard(paths, 3, lambda f: _set("candidate_id", 1, where=_row(1, 1))(
        _set("candidate_id", 8, where=_row(8, 2))(f)))  # fmt: skip
    with pytest.raises(ValidationFailedError):
        validate_run(paths, settings)
    results = json.loads((paths.validation_dir / "results.json").read_text())
    check = next(e for c in results["checkpoints"] for e in c["expectations"]
                 if e["name"] == "no_self_recommendation")  # fmt: skip
    assert check["shards_failed"] == [0, 3] and check["result"]["unexpected_count"] == 3
    assert check["result"]["partial_unexpected_counts"] == [{"value": True, "count": 3}]


@pytest.mark.parametrize(
    ("n_shards", "per_task", "groups"),
    [
        (16, 8, [list(range(8)), list(range(8, 16))]),
        (10, 8, [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]),  # two tasks, as even as two allow
        (17, 8, [list(range(6)), list(range(6, 12)), list(range(12, 17))]),
        (3, 8, [[0, 1, 2]]),
        (3, 1, [[0], [1], [2]]),
        (0, 8, []),
    ],
)
def test_the_gate_groups_cover_the_plan_in_order(n_shards, per_task, groups):
    from recs.nightly.shard_plan import task_groups

    assert task_groups(list(range(n_shards)), per_task) == groups


def test_a_gate_group_of_no_shards_per_task_is_refused():
    from recs.nightly.shard_plan import task_groups

    with pytest.raises(ValueError, match="at least 1"):
        task_groups([0, 1], 0)


def _with_frozen_settings(paths, settings):
    """The snapshot manifest's settings, which ``pipeline`` reads back (``run_settings``)."""
    from recs.files import write_json

    write_json(paths.snapshot_manifest, {"settings": settings.model_dump(mode="json")})


def test_a_gate_task_checks_its_group_one_shard_after_another(tmp_path):
    """``validate_shards([3, 1])``: shard 3's result (3 rows), then shard 1's (1 row), each
    saved; shards 0 and 2, of another group, untouched."""
    from recs.nightly import pipeline

    paths, settings = write_good_run(tmp_path / "home")
    _with_frozen_settings(paths, settings)
    results = pipeline.validate_shards(paths, [3, 1])
    assert [(r["shard_id"], r["rows"], r["success"]) for r in results] == [
        (3, 3, True),
        (1, 1, True),
    ]
    assert [paths.shard_validation(i).exists() for i in range(4)] == [False, True, False, True]


def _locks_held(paths, shard_ids) -> list[int]:
    """The shards among ``shard_ids`` whose lock file is locked (by any open file: a fresh
    one's non-blocking ``flock`` fails), asked as another process would."""
    import fcntl

    held = []
    for shard_id in shard_ids:
        path = paths.run_dir / ".locks" / f"shard_id={shard_id:03d}.lock"
        if not path.exists():
            continue
        with path.open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(shard_id)
            else:
                fcntl.flock(handle, fcntl.LOCK_UN)
    return held


def test_the_next_shard_is_read_while_gx_judges_the_one_before(tmp_path, monkeypatch):
    """``validate_shards([0, 1, 2, 3])``: GX's checks of each shard wait until the next shard
    is being read (a sequential gate would wait for ever: the test times out), and while
    shard k is judged the locks held are k's and k+1's, never a third. The results are those
    of the shards gated one by one."""
    import threading

    import recs.nightly.shard_gate as shard_gate
    from recs.nightly import pipeline

    paths, settings = write_good_run(tmp_path / "home")
    _with_frozen_settings(paths, settings)
    one_by_one = [
        {k: v for k, v in r.items() if k != "seconds"} for r in gate_every_shard(paths, settings)
    ]
    reading = {shard_id: threading.Event() for shard_id in range(4)}
    held_while_judged = {}
    prepare, judge = shard_gate.prepare_shard, shard_gate.run_checkpoints

    def marked_prepare(paths, settings, shard_id):
        reading[shard_id].set()
        return prepare(paths, settings, shard_id)

    def waiting_judge(batches, paths, *, label, **kwargs):
        shard_id = int(label.removeprefix("shard_"))
        held_while_judged[shard_id] = _locks_held(paths, range(4))
        if shard_id < 3:
            assert reading[shard_id + 1].wait(timeout=30), f"shard {shard_id + 1} not read ahead"
        return judge(batches, paths, label=label, **kwargs)

    monkeypatch.setattr(shard_gate, "prepare_shard", marked_prepare)
    monkeypatch.setattr(shard_gate, "run_checkpoints", waiting_judge)
    results = pipeline.validate_shards(paths, [0, 1, 2, 3])
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in results] == one_by_one
    assert held_while_judged == {0: [0, 1], 1: [1, 2], 2: [2, 3], 3: [3]}
    assert _locks_held(paths, range(4)) == []


def test_a_gate_task_failing_half_way_lets_go_of_both_shards(tmp_path, monkeypatch):
    """GX raises while it judges shard 1 of ``[0, 1, 2]`` (shard 2 read ahead by then): the
    error comes out, shard 0's result is saved and shard 2's is not, no shard's lock is held
    afterwards and no reading thread is left."""
    import threading

    import recs.nightly.shard_gate as shard_gate
    from recs.nightly import pipeline

    paths, settings = write_good_run(tmp_path / "home")
    _with_frozen_settings(paths, settings)
    judge = shard_gate.run_checkpoints

    def broken_judge(batches, paths, *, label, **kwargs):
        if label == "shard_001":
            assert _locks_held(paths, range(4)) == [1, 2]  # shard 2 is held: read ahead
            raise RuntimeError("GX broke on shard 1")
        return judge(batches, paths, label=label, **kwargs)

    monkeypatch.setattr(shard_gate, "run_checkpoints", broken_judge)
    with pytest.raises(RuntimeError, match="GX broke on shard 1"):
        pipeline.validate_shards(paths, [0, 1, 2])
    assert [paths.shard_validation(i).exists() for i in range(3)] == [True, False, False]
    assert _locks_held(paths, range(4)) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("recs-gate-read")]


def test_a_gate_task_leaves_the_process_freeze_as_it_found_it(tmp_path):
    """The gate freezes what lived before its first shard out of the collections: in a process
    that froze nothing, everything is unfrozen after; in one that froze objects itself (a
    worker that forks its tasks), nothing is unfrozen, those objects included.

    Frozen objects are out of ``gc.get_objects()``; unfrozen, they are back in it. (The frozen
    count is no test of the second case: a frozen object that dies meanwhile leaves it, as
    two did in a full ``make test`` run.)"""
    import gc

    from recs.nightly import pipeline

    paths, settings = write_good_run(tmp_path / "home")
    _with_frozen_settings(paths, settings)
    gc.unfreeze()
    pipeline.validate_shards(paths, [1])
    assert gc.get_freeze_count() == 0
    forked_worker = [[] for _ in range(10)]  # lists: tracked by the collector
    gc.freeze()
    try:
        tracked = {id(item) for item in gc.get_objects()}
        assert not tracked & {id(item) for item in forked_worker}
        pipeline.validate_shards(paths, [3])
        tracked = {id(item) for item in gc.get_objects()}
        assert gc.get_freeze_count() > 0
        assert not tracked & {id(item) for item in forked_worker}
    finally:
        gc.unfreeze()
    del forked_worker


def test_a_gate_group_outside_the_plan_is_refused_before_any_check(tmp_path):
    from recs.errors import ShardOutOfRangeError
    from recs.nightly import pipeline

    paths, settings = write_good_run(tmp_path / "home")
    _with_frozen_settings(paths, settings)
    with pytest.raises(ShardOutOfRangeError, match="shard 4 is out of range"):
        pipeline.validate_shards(paths, [1, 4])
    assert not paths.shard_validation(1).exists()


def test_gx_does_not_fingerprint_the_gate_batches(tmp_path):
    """GX's batch fingerprint (a hash of the whole frame, unused) is off: no saved result
    holds one (``checkpoints.GX_FINGERPRINT_MAX_BYTES``)."""
    paths, settings = write_good_run(tmp_path / "home")
    validate_shard(paths, settings, 0)
    saved = paths.shard_validation(0).read_text()
    assert "batch_markers" in saved and "ge_load_time" in saved  # saved: the check below can fail
    assert "pandas_data_fingerprint" not in saved
