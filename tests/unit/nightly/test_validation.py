"""The Great Expectations gate (recs.nightly.validation) on a tiny hand-built run.

The good run (``GOOD_ROWS``), shard_count 4, top_k 3, min_mutual_count 2, followed_by_count 2,
weights 0.7 + 0.3 (score_max 1.0). Users sit in the shard ``shard_of`` gives them
(6 -> 0, 4 -> 1, 2 -> 2, 1 and 8 -> 3):

    shard 0: user 6 -> 10 (rank 1), 11 (rank 2)
    shard 1: user 4 -> 10 (rank 1)
    shard 2: user 2 -> 12, 13, 14 (ranks 1..3)
    shard 3: user 1 -> 10 (rank 1); user 8 -> 12, 13 (ranks 1, 2)

9 rows, 5 users. Eligible tonight (``exports/eligible_users``): those 5 and 3 (shard 2), 5
(shard 1), 7 (shard 0), so 5 of 8 eligible users have a list (share 0.625). Exclusions: 6
excludes 15 (following) and 16 (blocked), 2 excludes 15 (muted), 1 excludes 12 (dismissed);
shard 1 has no exclusion folder. Candidate profiles: accounts 1..31, all active and
discoverable except 17 (suspended) and 18 (not discoverable). Nothing is published, so the two
change checks are skipped (``test_gate_outcomes`` compares with a published version).

Every check passes on it; each poisoning below breaks one rule and must fail exactly the
expectation(s) named, derived by hand in its comment.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from recs.config import Settings
from recs.contracts import EXPORT_SCHEMAS, RECOMMENDATION_SCHEMA, SNAPSHOT_SCHEMAS
from recs.errors import ValidationFailedError
from recs.nightly.data_docs import remote_assets
from recs.nightly.gate_inputs import read_shard_outputs
from recs.nightly.runs import RunPaths
from recs.nightly.shard_gate import recommendation_rules, user_rank_stats
from recs.nightly.validation import validate_run
from recs.sharding import shard_of

SNAPSHOT_DATE = dt.date(2026, 11, 1)
RUN_ID = "gate_test"

# shard -> rows (user_id, candidate_id, mutual_count, score, rank, followed_by)
GOOD_ROWS: dict[int, list[tuple]] = {
    0: [(6, 10, 3, 0.9, 1, [20, 21]), (6, 11, 2, 0.5, 2, [20, 22])],
    1: [(4, 10, 2, 0.8, 1, [23, 24])],
    2: [(2, 12, 4, 0.95, 1, [25, 26]), (2, 13, 3, 0.7, 2, [25]), (2, 14, 2, 0.6, 3, [26, 27])],
    3: [(1, 10, 2, 0.4, 1, [28, 29]), (8, 12, 2, 0.3, 1, [30, 31]), (8, 13, 2, 0.2, 2, [30, 31])],
}
# follow_exclusions rows; user 6 also follows 15 (a snapshot follow edge, not an export row)
EXCLUSIONS = [(6, 16, "blocked"), (2, 15, "muted"), (1, 12, "dismissed")]
FOLLOWS = [(6, 15, "active"), (6, 20, "active")]
ELIGIBLE = [1, 2, 3, 4, 5, 6, 7, 8]
# 2 run (the share, the plan's eligible count; 2 change checks skipped) + 20 recommendations
# + 7 rules + 5 users + 7 shards
CHECK_COUNT = 33


def gate_settings(home: Path, **overrides) -> Settings:
    values = {
        "home": home,
        "shard_count": 4,
        "top_k": 3,
        "min_mutual_count": 2,
        "followed_by_count": 2,
        "mutual_weight": 0.7,
        "activity_weight": 0.3,
        "popularity_weight": 0.0,
    }
    values.update(overrides)
    return Settings(**values)


def recommendation_frame(paths: RunPaths, rows: list[tuple]) -> pl.DataFrame:
    """Rows as a frame of exactly ``RECOMMENDATION_SCHEMA`` (generated_at = as_of, run_id)."""
    columns = ["user_id", "candidate_id", "mutual_count", "score", "rank", "followed_by"]
    frame = pl.DataFrame(
        [dict(zip(columns, row, strict=True)) for row in rows],
        schema={c: RECOMMENDATION_SCHEMA[c] for c in columns},
    )
    return frame.with_columns(
        pl.lit(paths.as_of.replace(tzinfo=None), RECOMMENDATION_SCHEMA["generated_at"]).alias(
            "generated_at"
        ),
        pl.lit(paths.run_id, pl.String).alias("run_id"),
    ).select(list(RECOMMENDATION_SCHEMA))


def write_shard(paths: RunPaths, shard_id: int, frame: pl.DataFrame, **manifest_overrides) -> None:
    """Write a shard's Parquet file and a manifest consistent with it (unless overridden)."""
    paths.shard_dir(shard_id).mkdir(parents=True, exist_ok=True)
    frame.write_parquet(paths.shard_output(shard_id))
    users = frame.get_column("user_id").n_unique() if "user_id" in frame.columns else 0
    manifest = {
        "shard_id": shard_id,
        "users_in": users,
        "users_with_recommendations": users,
        "rows": frame.height,
        "traversals": 0,
        "seconds": 0.0,
    }
    manifest.update(manifest_overrides)
    paths.shard_manifest(shard_id).write_text(json.dumps(manifest))


def rewrite_shard(paths: RunPaths, shard_id: int, change: Callable[[pl.DataFrame], pl.DataFrame]):
    """Apply ``change`` to a shard's rows and write it back with a consistent manifest."""
    write_shard(paths, shard_id, change(pl.read_parquet(paths.shard_output(shard_id))))


def write_eligible(paths: RunPaths, user_ids: list[int], shard_count: int = 4) -> None:
    """``exports/eligible_users/shard_id=N/data_0.parquet`` as dbt writes it (no empty shard
    folders)."""
    folder = paths.exports_dir / "eligible_users"
    shutil.rmtree(folder, ignore_errors=True)
    for user_id in user_ids:
        part = folder / f"shard_id={shard_of(user_id, shard_count)}"
        part.mkdir(parents=True, exist_ok=True)
    for part in folder.glob("shard_id=*"):
        shard_id = int(part.name.split("=")[1])
        ids = [u for u in user_ids if shard_of(u, shard_count) == shard_id]
        pl.DataFrame({"user_id": ids}, schema=EXPORT_SCHEMAS["eligible_users"]).write_parquet(
            part / "data_0.parquet"
        )


def write_good_run(
    home: Path,
    run_id: str = RUN_ID,
    rows: dict[int, list[tuple]] | None = None,
    snapshot_date: dt.date = SNAPSHOT_DATE,
    eligible: list[int] | None = None,
    **overrides,
) -> tuple[RunPaths, Settings]:
    """Write the docstring's run (shard outputs, manifests, exports, a stand-in for the
    graph's ``meta.json``) under ``home``."""
    settings = gate_settings(home, **overrides)
    paths = RunPaths.create(home, snapshot_date, run_id)
    rows = GOOD_ROWS if rows is None else rows
    for shard_id in range(settings.shard_count):
        shard_rows = rows.get(shard_id, [])
        assert all(shard_of(r[0], settings.shard_count) == shard_id for r in shard_rows)
        write_shard(paths, shard_id, recommendation_frame(paths, shard_rows))
    write_eligible(paths, ELIGIBLE if eligible is None else eligible, settings.shard_count)
    paths.graph_dir.mkdir(parents=True, exist_ok=True)
    (paths.graph_dir / "meta.json").write_text("{}")
    exclusions = pl.DataFrame(
        EXCLUSIONS, schema=EXPORT_SCHEMAS["follow_exclusions"], orient="row"
    ).with_columns(shard_id=pl.col("user_id").map_elements(lambda u: shard_of(u, 4), pl.Int64))
    for (shard_id,), part in exclusions.partition_by("shard_id", as_dict=True).items():
        folder = paths.exports_dir / "follow_exclusions" / f"shard_id={shard_id}"
        folder.mkdir(parents=True, exist_ok=True)
        part.drop("shard_id").write_parquet(folder / "data_0.parquet")
    follows = pl.DataFrame(
        [(f, t, dt.datetime(2026, 10, 1), status) for f, t, status in FOLLOWS],
        schema=SNAPSHOT_SCHEMAS["follow_edges"], orient="row",
    )
    for shard_id in range(settings.shard_count):  # every shard, empty ones too, as frozen
        folder = paths.snapshot_dir / "follow_edges" / f"shard_id={shard_id:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        in_shard = follows.filter(
            pl.col("follower_id").map_elements(lambda u: shard_of(u, 4), pl.Int64) == shard_id
        )
        in_shard.write_parquet(folder / "part-0.parquet")
    ids = list(range(1, 32))
    pl.DataFrame(
        {
            "candidate_id": ids,
            "account_status": ["suspended" if i == 17 else "active" for i in ids],
            "last_active_at": [dt.datetime(2026, 10, 30)] * len(ids),
            "is_discoverable": [i != 18 for i in ids],
            "in_degree": [100 - i for i in ids],
            "is_recommendable": [i not in (17, 18) for i in ids],
        },
        schema=EXPORT_SCHEMAS["candidate_profiles"],
    ).write_parquet(paths.exports_dir / "candidate_profiles.parquet")
    pl.DataFrame(
        {
            "tag": ["_global"] * 3,
            "candidate_id": [10, 12, 13],
            "popularity_rank": [1, 2, 3],
            "in_degree": [99, 97, 96],
        },
        schema=EXPORT_SCHEMAS["popularity_index"],
    ).write_parquet(paths.exports_dir / "popularity_index.parquet")
    return paths, settings


@pytest.fixture
def good_run(tmp_path):
    return write_good_run(tmp_path / "home")


def test_good_run_passes_and_saves_results(good_run, capfd):
    """All 33 checks pass; results.json lists each with success and unexpected counts;
    summary.json carries the counts (9 rows, 5 users) and a sha256 per shard; GX is quiet."""
    paths, settings = good_run
    result = validate_run(paths, settings)
    assert result["success"] is True and result["outcome"] == "passed"
    assert result["evaluated"] == CHECK_COUNT
    assert (result["rows"], result["users"], result["eligible_users"]) == (9, 5, 8)
    assert result["computed_shards"] == [0, 1, 2, 3] and result["failed_shards"] == []

    summary = json.loads((paths.validation_dir / "summary.json").read_text())
    assert summary["success"] is True and summary["failed"] == []
    assert summary["outcome"] == "passed" and summary["errored"] == []
    assert summary["evaluated"] == CHECK_COUNT
    assert summary["generated_at"] == "2026-11-02T00:00:00"
    assert [(s["shard_id"], s["status"], s["rows"], s["users"]) for s in summary["shards"]] == [
        (0, "computed", 2, 1),
        (1, "computed", 1, 1),
        (2, "computed", 3, 1),
        (3, "computed", 3, 2),
    ]
    assert all(len(s["sha256"]) == 64 for s in summary["shards"])
    # nothing published: the comparison is recorded as skipped, with the reason, not passed
    assert summary["compared_with"] is None
    assert [s["name"] for s in summary["skipped"]] == [
        "users_change_within_bounds",
        "rows_change_within_bounds",
    ]
    assert all("nothing is published yet" in s["reason"] for s in summary["skipped"])

    results = json.loads((paths.validation_dir / "results.json").read_text())
    checks = {e["name"]: e for c in results["checkpoints"] for e in c["expectations"]}
    assert len(checks) == CHECK_COUNT
    assert checks["no_excluded_candidate"]["success"] is True
    assert checks["no_excluded_candidate"]["result"]["unexpected_count"] == 0
    assert checks["no_excluded_candidate"]["result"]["element_count"] == 9
    assert checks["list_share_at_least_min"]["result"]["element_count"] == 1
    assert results["skipped"] == summary["skipped"]
    assert [c["batch"] for c in results["checkpoints"]] == [
        "run",
        "recommendations",
        "recommendation_rules",
        "users",
        "shards",
    ]
    captured = capfd.readouterr()
    assert "Calculating Metrics" not in captured.err + captured.out


def test_results_are_identical_on_rerun(good_run):
    """No wall clock in the saved documents: a second validation writes the same bytes."""
    paths, settings = good_run
    validate_run(paths, settings)
    first = [(paths.validation_dir / n).read_bytes() for n in ("results.json", "summary.json")]
    validate_run(paths, settings)
    second = [(paths.validation_dir / n).read_bytes() for n in ("results.json", "summary.json")]
    assert first == second


def test_data_docs_are_built_from_the_results_and_named_in_the_log(good_run, caplog):
    """GX's own HTML Data Docs of the five checkpoints land in validation/data_docs/ (one
    validation page per suite, the index linking them); the task log line names results.json and
    the index; a rerun replaces the site whole; a failed run's docs show the failed check."""
    paths, settings = good_run
    with caplog.at_level("INFO", logger="recs.nightly.validation"):
        result = validate_run(paths, settings)
    index = paths.validation_dir / "data_docs" / "index.html"
    assert result["data_docs"] == str(index) and index.is_file()
    results = json.loads((paths.validation_dir / "results.json").read_text())
    assert results["data_docs"] == str(index)
    pages = sorted((paths.validation_dir / "data_docs" / "validations").rglob("*.html"))
    validations = paths.validation_dir / "data_docs" / "validations"
    suites = [page.relative_to(validations).parts[0] for page in pages]
    batches = ("recommendations", "recommendation_rules", "users", "shards")
    # one page for the run, and one per batch for each of the 4 shards (their own tasks)
    assert sorted(suites) == sorted(["recs_run", *[f"recs_{b}" for b in batches for _ in "0123"]])
    assert sum(f"shard_{shard:03d}" in page.name for page in pages for shard in range(4)) == 16
    assert all(f"validations/{suite}/" in index.read_text() for suite in suites)
    site = paths.validation_dir / "data_docs"
    assert remote_assets(site) == []  # no page loads a script or stylesheet from a CDN
    for page in [index, *pages]:  # each page's local copies are where it looks for them
        for src in re.findall(r'<script src="([^"]+)"', page.read_text()):
            assert (page.parent / src).resolve().is_file(), (page, src)
    assert 'src="static/vendor/jquery.min.js"' in index.read_text()
    line = next(r.getMessage() for r in caplog.records if "expectations passed" in r.getMessage())
    assert f"{CHECK_COUNT} of {CHECK_COUNT} expectations passed" in line
    assert str(paths.validation_dir / "results.json") in line and str(index) in line

    (paths.validation_dir / "data_docs" / "stale.html").write_text("left by an earlier attempt")
    killed = paths.validation_dir / ".data_docs.4242-0badcafe.staging" / "validations"
    killed.mkdir(parents=True)  # an attempt stopped by Ctrl-C (a newcomer: it stayed for good)
    rewrite_shard(paths, 0, _set("rank", 7, where=_row(6, 2)))
    with pytest.raises(ValidationFailedError) as raised:
        validate_run(paths, settings)
    assert f"Data Docs: {index}" in str(raised.value)
    assert not (paths.validation_dir / "data_docs" / "stale.html").exists()
    users_page = next((paths.validation_dir / "data_docs" / "validations" / "recs_users").rglob(
        "*.html"))  # fmt: skip
    assert "Failed" in users_page.read_text() or "failed" in users_page.read_text()
    assert not [p for p in paths.validation_dir.iterdir() if p.name.startswith(".")]


def test_data_docs_are_built_under_a_relative_home(tmp_path, monkeypatch, caplog):
    """RECS_HOME defaults to the relative ./data: GX's site builder wants an absolute base
    directory, so the gate must hand it one (the site is built, nothing is logged as failed)."""
    monkeypatch.chdir(tmp_path)
    paths, settings = write_good_run(Path("data"))
    with caplog.at_level("WARNING", logger="recs.nightly.checkpoints"):
        result = validate_run(paths, settings)
    assert result["data_docs"] is not None
    assert (tmp_path / "data" / paths.validation_dir.relative_to("data") / "data_docs"
            / "index.html").is_file()  # fmt: skip
    assert not [r for r in caplog.records if "could not be built" in r.getMessage()]


def test_run_with_no_recommendations_fails(tmp_path):
    """Every planned shard computed but empty (typed, 0 rows) while 8 users are eligible: the
    gate cannot pass on nothing (0 rows < 1; 0 of 8 users with a list < 0.05). Each shard's
    own share is not judged: 0.05 of its 2 eligible users is less than one list."""
    paths, settings = write_good_run(tmp_path / "home", rows={})
    with pytest.raises(ValidationFailedError) as raised:
        validate_run(paths, settings)
    assert raised.value.exit_code == 3
    summary = json.loads((paths.validation_dir / "summary.json").read_text())
    assert summary["outcome"] == "failed"
    assert set(summary["failed"]) == {"rows_at_least_one", "list_share_at_least_min"}
    assert (summary["rows"], summary["users"], summary["eligible_users"]) == (0, 0, 8)


def test_a_shard_without_lists_fails_its_share_check(tmp_path):
    """(From a review.) Shard 1 written empty, with a manifest that agrees: 1 of 5 users with
    lists lost (-20 %) passes the run's change checks, so each shard's share is checked too.
    With a floor of 0.5 (one list asked of each shard's 2 eligible users), shard 1's 0 of 2
    fails it alone: the run's 4 of 8 and the other shards' 1 of 2, 1 of 2, 2 of 2 pass. At the
    default 0.05 a 2-user shard is not judged (less than one list asked)."""
    paths, settings = write_good_run(tmp_path / "home", gate_min_list_share=0.5)
    rewrite_shard(paths, 1, lambda f: f.head(0))
    with pytest.raises(ValidationFailedError, match="shard_list_share_at_least_min"):
        validate_run(paths, settings)
    summary = json.loads((paths.validation_dir / "summary.json").read_text())
    assert summary["failed"] == ["shard_list_share_at_least_min"]
    results = json.loads((paths.validation_dir / "results.json").read_text())
    check = next(e for c in results["checkpoints"] for e in c["expectations"]
                 if e["name"] == "shard_list_share_at_least_min")  # fmt: skip
    assert check["shards_failed"] == [1]
    assert check["result"]["partial_unexpected_list"] == [0.0]
    default, defaults = write_good_run(tmp_path / "default")
    rewrite_shard(default, 1, lambda f: f.head(0))
    assert validate_run(default, defaults)["outcome"] == "passed"


def test_too_few_users_with_lists_fail_the_share_check(tmp_path):
    """5 of 8 eligible users (0.625) have a list: below a minimum share of 0.7; so are shards
    0, 1 and 2 (1 of their 2 eligible users each: users 6, 4 and 2), not shard 3 (1 and 8)."""
    paths, settings = write_good_run(tmp_path / "home", gate_min_list_share=0.7)
    with pytest.raises(ValidationFailedError, match="list_share_at_least_min"):
        validate_run(paths, settings)
    summary = json.loads((paths.validation_dir / "summary.json").read_text())
    assert set(summary["failed"]) == {"list_share_at_least_min", "shard_list_share_at_least_min"}
    results = json.loads((paths.validation_dir / "results.json").read_text())
    checks = {e["name"]: e for c in results["checkpoints"] for e in c["expectations"]}
    assert checks["list_share_at_least_min"]["result"]["partial_unexpected_list"] == [0.625]
    assert checks["shard_list_share_at_least_min"]["shards_failed"] == [0, 1, 2]


def _set(column: str, value, *, where: pl.Expr) -> Callable[[pl.DataFrame], pl.DataFrame]:
    """A change that sets ``column`` to ``value`` on the rows matching ``where``."""
    dtype = RECOMMENDATION_SCHEMA[column]
    return lambda frame: frame.with_columns(
        pl.when(where).then(pl.lit(value, dtype)).otherwise(pl.col(column)).alias(column)
    )


def _row(user_id: int, rank: int) -> pl.Expr:
    return (pl.col("user_id") == user_id) & (pl.col("rank") == rank)


def _poison_manifest_unreadable(paths):
    paths.shard_manifest(1).write_text("{not json")


def _poison_manifest_rows(paths):
    frame = pl.read_parquet(paths.shard_output(2))
    write_shard(paths, 2, frame, rows=7)


def _poison_unreadable(paths):
    paths.shard_output(1).write_bytes(b"not parquet at all")


def _poison_user_in_wrong_shard(paths):
    # user 4 (shard 1) written into shard 0's file; shard 1 left empty.
    moved = pl.concat(
        [pl.read_parquet(paths.shard_output(1)), pl.read_parquet(paths.shard_output(0))]
    )
    write_shard(paths, 0, moved)
    write_shard(paths, 1, recommendation_frame(paths, []))


POISONINGS = {
    # (6, 11) becomes (6, 6): user_id == candidate_id on one row.
    "self_recommendation": (
        lambda p: rewrite_shard(p, 0, _set("candidate_id", 6, where=_row(6, 2))),
        {"no_self_recommendation"},
    ),
    # (6, 11) becomes (6, 15): 15 is in user 6's exclusions (following).
    "excluded_candidate": (
        lambda p: rewrite_shard(p, 0, _set("candidate_id", 15, where=_row(6, 2))),
        {"no_excluded_candidate"},
    ),
    # user 6 ranks 1, 2 -> 1, 3: max_rank 3 != 2 rows (3 is still within top_k).
    "rank_gap": (
        lambda p: rewrite_shard(p, 0, _set("rank", 3, where=_row(6, 2))),
        {"rank_gapless_per_user"},
    ),
    # user 8's rank-2 candidate 13 -> 12: (8, 12) twice; ranks 1, 2 stay gapless.
    "duplicate_pair": (
        lambda p: rewrite_shard(p, 3, _set("candidate_id", 12, where=_row(8, 2))),
        {"unique_user_candidate"},
    ),
    # 1.5 > score_max 1.0 (+1e-9 tolerance).
    "score_above_max": (
        lambda p: rewrite_shard(p, 1, _set("score", 1.5, where=_row(4, 1))),
        {"score_within_bounds"},
    ),
    # 1 < min_mutual_count 2.
    "mutual_count_1": (
        lambda p: rewrite_shard(p, 1, _set("mutual_count", 1, where=_row(4, 1))),
        {"mutual_count_at_least_min"},
    ),
    # user 8 (shard 3, 2 rows) is no longer eligible tonight but has a list.
    "user_not_eligible": (
        lambda p: write_eligible(p, [1, 2, 3, 4, 5, 6, 7]),
        {"user_is_eligible"},
    ),
    # (6, 11) -> (6, 17): 17 is suspended.
    "suspended_candidate": (
        lambda p: rewrite_shard(p, 0, _set("candidate_id", 17, where=_row(6, 2))),
        {"candidate_active_and_discoverable"},
    ),
    # three followed_by ids > followed_by_count 2.
    "followed_by_too_long": (
        lambda p: rewrite_shard(p, 0, _set("followed_by", [20, 21, 22], where=_row(6, 1))),
        {"followed_by_within_count"},
    ),
    # a null score (NaN in pandas is missing, so only the not-null check fires).
    "null_score": (
        lambda p: rewrite_shard(p, 1, _set("score", None, where=_row(4, 1))),
        {"not_null_score"},
    ),
    # rank written as Int64 in shard 1: the union's rank becomes int64 and the file's
    # schema differs from the contract.
    "rank_wrong_type": (
        lambda p: rewrite_shard(p, 1, lambda f: f.with_columns(pl.col("rank").cast(pl.Int64))),
        {"shard_schema_matches_contract"},
    ),
    # score and rank swapped in every file: column order differs from the contract.
    "columns_reordered": (
        lambda p: [
            rewrite_shard(
                p,
                s,
                lambda f: f.select(
                    "user_id",
                    "candidate_id",
                    "mutual_count",
                    "rank",
                    "score",
                    "followed_by",
                    "generated_at",
                    "run_id",
                ),
            )
            for s in range(4)
        ],
        {"shard_schema_matches_contract"},
    ),
    # shard 3 rows carry another run's id (a file left over from an older run).
    "other_run_id": (
        lambda p: rewrite_shard(p, 3, _set("run_id", "older_run", where=pl.lit(True))),
        {"run_id_is_this_run"},
    ),
    # shard 2 rows in reverse order (rank 3, 2, 1).
    "unsorted_shard": (
        lambda p: rewrite_shard(p, 2, lambda f: f.reverse()),
        {"shard_sorted_by_user_rank"},
    ),
    # the manifest is there but not JSON: the shard counts as computed, and is not trusted.
    "manifest_unreadable": (_poison_manifest_unreadable, {"shard_manifest_readable"}),
    # manifest says 7 rows, file has 3.
    "manifest_rows_wrong": (_poison_manifest_rows, {"manifest_rows_match_output"}),
    # garbage bytes: the file is not read, so only readability fails.
    "unreadable_shard": (_poison_unreadable, {"shard_output_readable"}),
    "user_in_wrong_shard": (_poison_user_in_wrong_shard, {"user_in_home_shard"}),
}


@pytest.mark.parametrize("poisoning", sorted(POISONINGS))
def test_poisoned_run_fails_the_named_expectation(good_run, poisoning):
    paths, settings = good_run
    poison, expected = POISONINGS[poisoning]
    poison(paths)
    with pytest.raises(ValidationFailedError) as raised:
        validate_run(paths, settings)

    summary = json.loads((paths.validation_dir / "summary.json").read_text())
    assert summary["success"] is False
    assert set(summary["failed"]) == expected
    message = str(raised.value)
    assert "\n" not in message
    assert all(name in message for name in expected)
    results = json.loads((paths.validation_dir / "results.json").read_text())
    failed = {
        e["name"] for c in results["checkpoints"] for e in c["expectations"] if not e["success"]
    }
    assert failed == expected


def test_a_failed_shard_check_names_its_shards_and_a_damaged_file_the_rerun(good_run):
    """(From a newcomer's run.) "shard_output_readable" alone named neither the shard nor how
    to write it again; a rule's failure names its shards and offers no rerun (it would write
    the same rows)."""
    paths, settings = good_run
    _poison_unreadable(paths)
    with pytest.raises(ValidationFailedError) as raised:
        validate_run(paths, settings)
    assert (
        "expectations failed: shard_output_readable (shard 001); write a damaged shard again "
        f"with `recs shard run --snapshot-date {paths.snapshot_date.isoformat()} --run-id "
        f"{paths.run_id} --shard 1`, then validate again"
    ) in str(raised.value)
    other, other_settings = write_good_run(paths.home.parent / "other")
    rewrite_shard(other, 2, lambda f: f.reverse())
    with pytest.raises(ValidationFailedError) as raised:
        validate_run(other, other_settings)
    assert "expectations failed: shard_sorted_by_user_rank (shard 002) (details" in str(
        raised.value
    )


def test_a_failing_batch_whose_examples_cannot_be_computed_keeps_its_verdict(
    good_run, monkeypatch
):
    """(From a review.) The second run of a failing batch (SUMMARY, for the failing rows'
    examples) raises: the data failure stands as it was judged (ValidationFailedError naming
    no_excluded_candidate, nothing errored), not an engine error marking every check."""
    import great_expectations as gx

    real_run = gx.Checkpoint.run

    def run(self, *args, **kwargs):
        if self.result_format != {"result_format": "BASIC"}:
            raise RuntimeError("injected failure of the detailed run")
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(gx.Checkpoint, "run", run)
    paths, settings = good_run
    rewrite_shard(paths, 0, _set("candidate_id", 15, where=_row(6, 2)))
    with pytest.raises(ValidationFailedError, match="no_excluded_candidate"):
        validate_run(paths, settings)
    summary = json.loads((paths.validation_dir / "summary.json").read_text())
    assert summary["failed"] == ["no_excluded_candidate"] and summary["errored"] == []


def test_unexpected_rows_are_named_by_their_keys(good_run):
    """The excluded pair (6, 15) is reported with its user and candidate ids."""
    paths, settings = good_run
    rewrite_shard(paths, 0, _set("candidate_id", 15, where=_row(6, 2)))
    with pytest.raises(ValidationFailedError):
        validate_run(paths, settings)
    results = json.loads((paths.validation_dir / "results.json").read_text())
    check = next(
        e
        for c in results["checkpoints"]
        for e in c["expectations"]
        if e["name"] == "no_excluded_candidate"
    )
    assert check["result"]["unexpected_count"] == 1
    assert check["result"]["partial_unexpected_index_list"] == [
        {"candidate_id": 15, "is_excluded": True, "user_id": 6}
    ]


def test_derived_frames_by_hand(good_run):
    """Per-user aggregates and rule flags of the good run, plus one excluded pair.

    users: 1 -> 1 row; 2 -> 3 rows, ranks 1..3, 3 candidates; 4 -> 1; 6 -> 2; 8 -> 2; all in
    their home shard. After (6, 11) -> (6, 15), only that row is flagged excluded, no row is a
    self-recommendation, and every candidate is active and discoverable.
    """
    paths, settings = good_run
    rewrite_shard(paths, 0, _set("candidate_id", 15, where=_row(6, 2)))
    outputs = read_shard_outputs(paths, settings.shard_count)
    conformed = outputs.union.select(*RECOMMENDATION_SCHEMA, "shard_id")
    users = user_rank_stats(conformed, settings.shard_count)
    assert users.rows() == [
        (1, 1, 1, 1, 1, 1, True),
        (2, 3, 1, 3, 3, 3, True),
        (4, 1, 1, 1, 1, 1, True),
        (6, 2, 1, 2, 2, 2, True),
        (8, 2, 1, 2, 2, 2, True),
    ]
    shard_0 = conformed.filter(pl.col("shard_id") == 0)
    rules = recommendation_rules(paths, 0, shard_0)
    flagged = rules.filter(pl.col("is_excluded")).select("user_id", "candidate_id").rows()
    assert flagged == [(6, 15)]  # user 6 follows 15: a snapshot follow edge
    rules = pl.concat([
        recommendation_rules(paths, shard_id, conformed.filter(pl.col("shard_id") == shard_id))
        for shard_id in range(settings.shard_count)
    ])  # fmt: skip
    assert not rules.get_column("is_self_recommendation").any()
    assert rules.get_column("candidate_is_recommendable").all()
    assert rules.get_column("followed_by_length").to_list() == [2, 2, 2, 2, 1, 2, 2, 2, 2]
    assert outputs.shards.get_column("shard_id").to_list() == [0, 1, 2, 3]
    assert outputs.shards.get_column("file_rows").to_list() == [2, 1, 3, 3]
    assert (outputs.computed, outputs.failed) == ([0, 1, 2, 3], [])


def test_a_known_error_in_the_gate_is_raised_whole_and_a_defect_cut(tmp_path, monkeypatch):
    """(From a review: the log line that held a known error's whole text went, and the raised
    one was cut at 300 characters, its remedy with it.) A ``RecsError`` of 400 characters raised
    inside the gate comes out whole; any other exception is cut at 300 (its traceback is
    logged)."""
    from recs.errors import CorruptFileError, ValidationEngineError
    from recs.nightly import validation

    paths, settings = write_good_run(tmp_path / "home")
    long = "x" * 380 + " the remedy"
    for raised, shown in ((CorruptFileError(long), long), (RuntimeError(long), long[:300])):

        def fail(*args, raised=raised, **kwargs):
            raise raised

        monkeypatch.setattr(validation, "replaced_version", fail)
        with pytest.raises(ValidationEngineError) as error:
            validate_run(paths, settings)
        assert f": {type(raised).__name__}: {shown} (details: " in str(error.value)


def test_the_failed_checks_text_names_several_shards_and_the_first_to_rerun(tmp_path):
    """Two damaged shards: both named, the rerun command given for the first; a run-wide
    check's failure names no shard."""
    from recs.nightly.validation import _failed_text

    paths = RunPaths.create(tmp_path, SNAPSHOT_DATE, RUN_ID)
    checks = [
        {"name": "shard_output_readable", "success": False, "shards_failed": [3, 12]},
        {"name": "rows_at_least_one", "success": False},
        {"name": "score_within_bounds", "success": True, "shards_failed": []},
    ]
    assert _failed_text(checks, paths) == (
        "shard_output_readable (shards 003, 012), rows_at_least_one; write a damaged shard again "
        f"with `recs shard run --snapshot-date {SNAPSHOT_DATE.isoformat()} --run-id {RUN_ID} "
        "--shard 3` (and each other shard named), then validate again"
    )
