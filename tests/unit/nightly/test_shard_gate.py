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

SHARD_CHECKS = 38  # of the 41: 3 (row count, list share, planned eligible) are the run step's


def gate_every_shard(paths, settings) -> list[dict]:
    return [validate_shard(paths, settings, shard_id) for shard_id in range(4)]


def test_each_shard_saves_its_checks_and_figures(tmp_path):
    """Shard 2 holds user 2's 3 rows and eligible users 2 and 3: its result says so, and its
    38 checks passed; shard 0's too (user 6, 2 rows, eligible 6 and 7)."""
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
