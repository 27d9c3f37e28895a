"""The Great Expectations gate: nothing is published unless it passes, and it cannot pass empty.

``validate_run`` reads the run's planned shards only (``shards/shard_id=NNN/``, NNN below
``shard_count``). A shard is *computed* if its manifest and its output are there (the traversal
writes the manifest last); the others *failed*, are left out of the checks and carried over by
the publish. Five frames are derived in Polars (``gate_batches``: **the gate's expectations are
defined there**) and run as GX checkpoints (``recs.nightly.checkpoints``). One row per ...:

``run``  the run: users with lists >= ``gate_min_list_share`` of tonight's eligible users
    (``exports/eligible_users``); users with lists and rows within ``-gate_max_drop ..
    gate_max_growth`` (relative change) of the version ``CURRENT`` names, over the same shards
    (``recs.nightly.baseline``; nothing to compare with: the checks are recorded as skipped).
``recommendations``  row as written: at least one; contract columns, types, no nulls, unique
    (user_id, candidate_id), this run's run_id.
``recommendation_rules``  rank, score, mutual_count and followed_by within bounds; no self,
    excluded, inactive or undiscoverable candidate.
``users``  user with a list: ranks 1..n gapless and unique, in its home shard, eligible tonight.
``shards``  computed shard: readable Parquet of the contract schema sorted by (user_id, rank),
    a readable manifest whose shard id and counts equal the file's.

Outcomes, each saved in ``validation/results.json`` and ``summary.json`` (``outcome``):
``passed``; ``failed`` (``ValidationFailedError``); ``errored`` (``ValidationEngineError``: GX or
the gate raised, or a result carries an exception); ``nothing_to_validate``
(``NothingToValidateError``: no computed shard, nobody eligible, or an earlier stage missing).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from recs.config import Settings
from recs.contracts import RECOMMENDATION_SCHEMA
from recs.errors import NothingToValidateError, ValidationEngineError, ValidationFailedError
from recs.files import write_json
from recs.nightly.baseline import ReplacedVersion, replaced_version
from recs.nightly.checkpoints import GateBatch, quiet_gx, run_checkpoints
from recs.nightly.gate_inputs import (
    ShardOutputs,
    as_int,
    eligible_in_shards,
    eligible_users,
    max_generated_at,
    missing_upstream,
    read_manifest,
    read_shard_outputs,
)
from recs.nightly.runs import RunPaths
from recs.sharding import shard_expr

RESULTS_FILE = "results.json"
SUMMARY_FILE = "summary.json"

# Scores are sums of floats; allow for one rounding step above the exact bound.
SCORE_TOLERANCE = 1e-9


CHANGE_CHECKS = ("users_change_within_bounds", "rows_change_within_bounds")

log = logging.getLogger(__name__)

# How a contract dtype looks in the pandas batch (NumPy dtypes; lists stay Arrow-backed, which
# GX reports as the Python type of their values). The exact Polars/Arrow dtypes, including the
# datetime unit and the list's element type, are checked per file by ``shard_schema_matches``.
_PANDAS_TYPE_NAMES: dict[type[pl.DataType], str] = {
    pl.Int64: "int64",
    pl.Int32: "int32",
    pl.Float64: "float64",
    pl.Boolean: "bool",
    pl.String: "str",
    pl.Datetime: "datetime64",
    pl.List: "list",
}


def validate_run(paths: RunPaths, settings: Settings) -> dict[str, Any]:
    """Run the gate over a run's computed shards; save the results; raise unless it passed.

    Reads ``paths.shard_output(i)`` / ``paths.shard_manifest(i)`` for ``i < shard_count``,
    ``exports/eligible_users/``, ``exports/follow_exclusions/``,
    ``exports/candidate_profiles.parquet`` and the manifest (and, if its shard count differs,
    the ``user_id`` column) of the version ``CURRENT`` names. Writes ``validation/results.json``
    and ``validation/summary.json`` atomically whatever the outcome (module docstring).

    Returns ``{"run_id", "outcome": "passed", "success", "evaluated", "failed", "skipped",
    "computed_shards", "failed_shards", "compared_with", "rows", "users", "eligible_users",
    "results", "summary", "data_docs", "seconds"}`` (``data_docs``: the GX Data Docs'
    ``index.html`` under ``validation/data_docs/``, None if they could not be built). Raises,
    after saving: ``ValidationFailedError`` (the failed checks), ``ValidationEngineError`` (the
    checks that could not be evaluated, or the exception), ``NothingToValidateError``; each a
    one-line message naming ``results.json`` and the Data Docs. The wall clock is only read to
    time the stage.
    """
    started = time.perf_counter()
    report = _Report(paths)
    try:
        missing = missing_upstream(paths)
        if missing:
            raise NothingToValidateError(
                f"nothing to validate for run {paths.run_id}: {missing} (an earlier stage did "
                "not complete)"
            )
        quiet_gx()  # imports GX first, so the timings below exclude it
        lap = time.perf_counter()
        outputs = read_shard_outputs(paths, settings.shard_count)
        eligible = eligible_users(paths.exports_dir)
        report.outputs, report.eligible = outputs, eligible
        read_seconds = time.perf_counter() - lap
        if not outputs.computed:
            raise NothingToValidateError(
                f"nothing to validate for run {paths.run_id}: no shard produced output "
                f"(all {settings.shard_count} failed)"
            )
        if eligible.height == 0:
            raise NothingToValidateError(
                f"nothing to validate for run {paths.run_id}: nobody is eligible tonight "
                f"(exports/eligible_users is empty)"
            )
        report.replaced, report.not_compared = replaced_version(
            settings.published_dir, settings.shard_count, outputs.computed
        )
        lap = time.perf_counter()
        batches = gate_batches(paths, settings, outputs, eligible, report.replaced)
        log.info(
            "validate %s: %d of %d shards computed, %d rows; read %.2fs, frames %.2fs",
            paths.run_id,
            len(outputs.computed),
            settings.shard_count,
            outputs.union.height,
            read_seconds,
            time.perf_counter() - lap,
        )
        report.results = run_checkpoints(batches, paths)
    except NothingToValidateError as error:
        report.save("nothing_to_validate", str(error))
        raise
    except Exception as error:  # noqa: BLE001 - any exception of the gate is its own outcome
        message = (
            f"validation errored for run {paths.run_id}: {type(error).__name__}: "
            f"{' '.join(str(error).split())[:300]}"
        )
        log.exception("validate %s: the gate raised", paths.run_id)
        results_path = report.save("errored", message)
        raise ValidationEngineError(f"{message} (details: {results_path})") from error

    checks = [e for c in report.results["checkpoints"] for e in c["expectations"]]
    errored = [e["name"] for e in checks if e.get("errored")]
    failed = [e["name"] for e in checks if not e["success"] and not e.get("errored")]
    evaluated = len(checks)
    docs = report.results.get("data_docs") or "not built"
    if errored:
        results_path = report.save("errored", None, failed=failed, errored=errored)
        first = next(e for e in checks if e.get("errored"))
        named = ", ".join(errored[:5]) + (f" and {len(errored) - 5} more" if errored[5:] else "")
        raise ValidationEngineError(
            f"validation errored for run {paths.run_id}: {len(errored)} of {evaluated} checks "
            f"could not be evaluated ({named}): {first.get('exception')} "
            f"(details: {results_path}; Data Docs: {docs}); this is not a verdict on the data"
        )
    if failed:
        results_path = report.save("failed", None, failed=failed)
        raise ValidationFailedError(
            f"validation failed for run {paths.run_id}: {len(failed)} of {evaluated} "
            f"expectations failed: {', '.join(failed)} (details: {results_path}; Data Docs: {docs})"
        )
    results_path = report.save("passed", None)
    summary = report.summary
    log.info(
        "validate %s: %d of %d expectations passed, %d skipped, shards carried over: %s "
        "(%.2fs); results: %s; Data Docs: %s",
        paths.run_id,
        evaluated,
        evaluated,
        len(summary["skipped"]),
        summary["failed_shards"] or "none",
        time.perf_counter() - started,
        results_path,
        docs,
    )
    return {
        "run_id": paths.run_id,
        **{
            key: summary[key]
            for key in (
                "outcome",
                "success",
                "evaluated",
                "failed",
                "skipped",
                "computed_shards",
                "failed_shards",
                "compared_with",
                "rows",
                "users",
                "eligible_users",
            )
        },
        "results": str(results_path),
        "summary": str(paths.validation_dir / SUMMARY_FILE),
        "data_docs": report.results.get("data_docs"),
        "seconds": round(time.perf_counter() - started, 3),
    }


@dataclass
class _Report:
    """What the gate learned so far, saved as ``results.json`` + ``summary.json`` whatever
    the outcome (``save``)."""

    paths: RunPaths
    outputs: ShardOutputs | None = None
    eligible: pl.DataFrame | None = None
    replaced: ReplacedVersion | None = None
    not_compared: str | None = None
    results: dict[str, Any] | None = None
    summary: dict[str, Any] = field(default_factory=dict)

    def save(
        self,
        outcome: str,
        error: str | None,
        failed: list[str] | None = None,
        errored: list[str] | None = None,
    ) -> Path:
        """Write both documents atomically; return the path of ``results.json``."""
        paths = self.paths
        results = self.results or {
            "run_id": paths.run_id,
            "snapshot_date": paths.snapshot_date.isoformat(),
            "success": False,
            "checkpoints": [],
        }
        results = {**results, "outcome": outcome, "error": error, "skipped": self.skipped()}
        outputs = self.outputs
        union = outputs.union if outputs is not None else pl.DataFrame()
        users = union.get_column("user_id").n_unique() if "user_id" in union.columns else 0
        computed = outputs.computed if outputs is not None else []
        eligible_in_computed = eligible_in_shards(self.eligible, computed, outputs)
        self.summary = {
            "run_id": paths.run_id,
            "snapshot_date": paths.snapshot_date.isoformat(),
            "outcome": outcome,
            "success": outcome == "passed",
            "error": error,
            "evaluated": sum(len(c["expectations"]) for c in results["checkpoints"]),
            "failed": failed or [],
            "errored": errored or [],
            "skipped": self.skipped(),
            "computed_shards": computed,
            "failed_shards": outputs.failed if outputs is not None else [],
            "compared_with": self.replaced.run_id if self.replaced else None,
            "rows": union.height,
            "users": users,
            "eligible_users": self.eligible.height if self.eligible is not None else None,
            "eligible_users_in_computed_shards": eligible_in_computed,
            "replaced_users": self.replaced.users if self.replaced else None,
            "replaced_rows": self.replaced.rows if self.replaced else None,
            "generated_at": max_generated_at(union),
            "shards": outputs.statuses if outputs is not None else [],
        }
        validation_dir = paths.validation_dir
        results_path = write_json(validation_dir / RESULTS_FILE, results)
        write_json(validation_dir / SUMMARY_FILE, self.summary)
        return results_path

    def skipped(self) -> list[dict[str, str]]:
        """The comparison checks not run, each with the reason (empty once compared)."""
        if self.replaced is not None or self.not_compared is None:
            return []
        return [{"name": name, "reason": self.not_compared} for name in CHANGE_CHECKS]


def run_figures(
    paths: RunPaths,
    settings: Settings,
    outputs: ShardOutputs,
    eligible: pl.DataFrame,
    replaced: ReplacedVersion | None,
) -> pl.DataFrame:
    """The ``run`` batch: one row, ``run_id`` String, ``rows, users, eligible_users`` Int64
    (over the computed shards), ``list_share`` Float64 (users / eligible_users; 0.0 when no
    eligible user is in them), ``users_change, rows_change`` Float64 (``tonight / replaced -
    1``; null without a replaced version), ``eligible_all`` Int64 (every row of the
    ``eligible_users`` export) and ``eligible_planned`` Int64 (the count the shard plan was
    sized by, ``snapshot/manifest.json``'s ``shard_plan``; null for a run frozen without one)."""
    union = outputs.union
    users = union.get_column("user_id").n_unique() if "user_id" in union.columns else 0
    in_computed = eligible_in_shards(eligible, outputs.computed, outputs) or 0
    plan = read_manifest(paths.snapshot_manifest).get("shard_plan") or {}
    return pl.DataFrame(
        {
            "run_id": [paths.run_id],
            "rows": [union.height],
            "users": [users],
            "eligible_users": [in_computed],
            "list_share": [users / in_computed if in_computed else 0.0],
            "users_change": [users / replaced.users - 1.0 if replaced else None],
            "rows_change": [union.height / replaced.rows - 1.0 if replaced else None],
            "eligible_all": [eligible.height],
            "eligible_planned": [as_int(plan.get("eligible_users"))],
        },
        schema={
            "run_id": pl.String,
            "rows": pl.Int64,
            "users": pl.Int64,
            "eligible_users": pl.Int64,
            "list_share": pl.Float64,
            "users_change": pl.Float64,
            "rows_change": pl.Float64,
            "eligible_all": pl.Int64,
            "eligible_planned": pl.Int64,
        },
    )


def gate_batches(
    paths: RunPaths,
    settings: Settings,
    outputs: ShardOutputs,
    eligible: pl.DataFrame,
    replaced: ReplacedVersion | None = None,
) -> list[GateBatch]:
    """The five batches of the gate, each with its expectations (module docstring).

    ``eligible``: tonight's eligible ``user_id`` (``eligible_users``); ``replaced``: the counts
    of the version the run would replace (``recs.nightly.baseline``), None to skip the change
    checks. Pure given its inputs except for reading the run's exclusion and candidate-profile
    exports. Check names are stable identifiers: they appear in ``summary.json`` and errors.
    """
    quiet_gx()
    import great_expectations.expectations as gxe

    union = outputs.union
    conformed = _conformed(union)
    between = gxe.ExpectColumnValuesToBeBetween
    in_set = gxe.ExpectColumnValuesToBeInSet
    pair_equal = gxe.ExpectColumnPairValuesToBeEqual

    run = GateBatch("run", run_figures(paths, settings, outputs, eligible, replaced), ["run_id"])
    run.expect(
        "list_share_at_least_min",
        between,
        column="list_share",
        min_value=settings.gate_min_list_share,
        max_value=1.0,
    )
    # The plan's count (the snapshot's own spelling of the eligibility rule) must equal dbt's
    # eligible_users: the rule has one meaning, whichever code evaluates it.
    run.expect(
        "plan_eligible_matches_models",
        pair_equal,
        column_A="eligible_planned",
        column_B="eligible_all",
        ignore_row_if="either_value_is_missing",
    )
    if replaced is not None:
        for check, column in zip(CHANGE_CHECKS, ("users_change", "rows_change"), strict=True):
            run.expect(
                check,
                between,
                column=column,
                min_value=-settings.gate_max_drop,
                max_value=settings.gate_max_growth,
            )

    recommendations = GateBatch(
        "recommendations",
        union.select([c for c in union.columns if c != "shard_id"]),
        keys=["user_id", "candidate_id"],
    )
    rules = GateBatch(
        "recommendation_rules", recommendation_rules(paths, conformed), ["user_id", "candidate_id"]
    )
    eligible_ids = eligible.get_column("user_id").implode()
    users = GateBatch(
        "users",
        user_rank_stats(conformed, settings.shard_count).with_columns(
            pl.col("user_id").is_in(eligible_ids).alias("is_eligible")
        ),
        ["user_id"],
    )
    shards = GateBatch("shards", outputs.shards, ["shard_id"])

    recommendations.expect("rows_at_least_one", gxe.ExpectTableRowCountToBeBetween, min_value=1)
    recommendations.expect(
        "columns_match_contract",
        gxe.ExpectTableColumnsToMatchOrderedList,
        column_list=list(RECOMMENDATION_SCHEMA),
    )
    for column, dtype in RECOMMENDATION_SCHEMA.items():
        recommendations.expect(
            f"type_{column}",
            gxe.ExpectColumnValuesToBeOfType,
            column=column,
            type_=_PANDAS_TYPE_NAMES[dtype.base_type()],
        )
    for column in RECOMMENDATION_SCHEMA:
        recommendations.expect(
            f"not_null_{column}", gxe.ExpectColumnValuesToNotBeNull, column=column
        )
    recommendations.expect(
        "unique_user_candidate",
        gxe.ExpectCompoundColumnsToBeUnique,
        column_list=["user_id", "candidate_id"],
    )
    recommendations.expect("run_id_is_this_run", in_set, column="run_id", value_set=[paths.run_id])

    rules.expect("rank_within_top_k", between, column="rank", min_value=1, max_value=settings.top_k)
    rules.expect(
        "score_within_bounds",
        between,
        column="score",
        min_value=0.0,
        max_value=settings.score_max + SCORE_TOLERANCE,
    )
    rules.expect(
        "mutual_count_at_least_min",
        between,
        column="mutual_count",
        min_value=settings.min_mutual_count,
    )
    rules.expect(
        "followed_by_within_count",
        between,
        column="followed_by_length",
        min_value=0,
        max_value=settings.followed_by_count,
    )
    rules.expect(
        "no_self_recommendation", in_set, column="is_self_recommendation", value_set=[False]
    )
    rules.expect("no_excluded_candidate", in_set, column="is_excluded", value_set=[False])
    rules.expect(
        "candidate_active_and_discoverable",
        in_set,
        column="candidate_is_recommendable",
        value_set=[True],
    )

    users.expect("rank_starts_at_1", between, column="min_rank", min_value=1, max_value=1)
    users.expect("rank_gapless_per_user", pair_equal, column_A="max_rank", column_B="rows")
    users.expect("rank_unique_per_user", pair_equal, column_A="distinct_ranks", column_B="rows")
    users.expect("user_in_home_shard", in_set, column="in_home_shard", value_set=[True])
    users.expect("user_is_eligible", in_set, column="is_eligible", value_set=[True])

    shards.expect("shard_output_readable", in_set, column="readable", value_set=[True])
    shards.expect(
        "shard_schema_matches_contract", in_set, column="schema_matches", value_set=[True]
    )
    shards.expect("shard_sorted_by_user_rank", in_set, column="is_sorted", value_set=[True])
    shards.expect("shard_manifest_readable", in_set, column="manifest_readable", value_set=[True])
    # An unreadable file or manifest is reported by the *_readable checks, not again here.
    for check, column_a, column_b in (
        ("manifest_shard_id_matches", "manifest_shard_id", "shard_id"),
        ("manifest_rows_match_output", "manifest_rows", "file_rows"),
        ("manifest_users_match_output", "manifest_users", "file_users"),
    ):
        shards.expect(
            check,
            pair_equal,
            column_A=column_a,
            column_B=column_b,
            ignore_row_if="either_value_is_missing",
        )
    return [run, recommendations, rules, users, shards]


def recommendation_rules(paths: RunPaths, conformed: pl.DataFrame) -> pl.DataFrame:
    """One row per recommendation row, with the columns the product rules are checked on.

    ``conformed`` has the contract's columns and dtypes. Returns, in the input's row order:
    ``user_id, candidate_id`` Int64, ``rank, mutual_count`` Int64, ``score`` Float64,
    ``followed_by_length`` Int64, ``is_self_recommendation`` Boolean (user_id == candidate_id),
    ``is_excluded`` Boolean (the pair is in ``exports/follow_exclusions``, any reason),
    ``candidate_is_recommendable`` Boolean (candidate in ``exports/candidate_profiles`` with
    ``account_status == 'active'`` and ``is_discoverable``; an unknown candidate is False).
    """
    rows = conformed.lazy().with_row_index("row")
    excluded_rows = (
        rows.select("row", "user_id", "candidate_id")
        .join(_exclusion_pairs(paths.exports_dir), on=["user_id", "candidate_id"], how="semi")
        .select("row")
        .collect()
        .get_column("row")
    )
    recommendable = _recommendable_candidate_ids(paths.exports_dir)
    return rows.select(
        "user_id",
        "candidate_id",
        pl.col("rank").cast(pl.Int64),
        pl.col("mutual_count").cast(pl.Int64),
        "score",
        pl.col("followed_by").list.len().cast(pl.Int64).alias("followed_by_length"),
        (pl.col("user_id") == pl.col("candidate_id")).alias("is_self_recommendation"),
        pl.col("row").is_in(excluded_rows.implode()).alias("is_excluded"),
        pl.col("candidate_id").is_in(recommendable.implode()).alias("candidate_is_recommendable"),
    ).collect()


def user_rank_stats(conformed: pl.DataFrame, shard_count: int) -> pl.DataFrame:
    """One row per user_id with recommendations, sorted by user_id.

    ``conformed`` has the contract's columns plus ``shard_id`` (the directory the row came
    from). Returns ``user_id`` Int64, ``rows, min_rank, max_rank, distinct_ranks`` Int64,
    ``in_home_shard`` Boolean: every row of the user is in one shard directory, and it is
    ``shard_of(user_id, shard_count)``.
    """
    return (
        conformed.lazy()
        .filter(pl.col("user_id").is_not_null())
        .group_by("user_id")
        .agg(
            pl.len().cast(pl.Int64).alias("rows"),
            pl.col("rank").min().cast(pl.Int64).alias("min_rank"),
            pl.col("rank").max().cast(pl.Int64).alias("max_rank"),
            pl.col("rank").n_unique().cast(pl.Int64).alias("distinct_ranks"),
            pl.col("shard_id").n_unique().alias("shard_dirs"),
            pl.col("shard_id").first().alias("shard_id"),
        )
        .with_columns(
            (
                (pl.col("shard_dirs") == 1)
                & (pl.col("shard_id") == shard_expr("user_id", shard_count))
            ).alias("in_home_shard")
        )
        .select("user_id", "rows", "min_rank", "max_rank", "distinct_ranks", "in_home_shard")
        .sort("user_id")
        .collect()
    )


def _conformed(union: pl.DataFrame) -> pl.DataFrame:
    """The union with exactly the contract's columns and dtypes (missing or uncastable -> null),
    plus ``shard_id``, so the derived frames can always be computed."""
    columns = [
        pl.col(name).cast(dtype, strict=False) if name in union.columns else pl.lit(None, dtype)
        for name, dtype in RECOMMENDATION_SCHEMA.items()
    ]
    return union.select(
        *[c.alias(n) for c, n in zip(columns, RECOMMENDATION_SCHEMA, strict=True)],
        pl.col("shard_id"),
    )


def _exclusion_pairs(exports_dir: Path) -> pl.LazyFrame:
    """``(user_id, candidate_id)`` Int64 pairs excluded for any reason (may repeat). Reads
    ``follow_exclusions/shard_id=N/*.parquet`` (a shard may have no directory); the hive
    partition value is not needed, the pair is the key."""
    files = sorted((exports_dir / "follow_exclusions").glob("shard_id=*/*.parquet"))
    if not files:
        return pl.LazyFrame(schema={"user_id": pl.Int64, "candidate_id": pl.Int64})
    return pl.scan_parquet(files, hive_partitioning=False).select(
        pl.col("user_id").cast(pl.Int64),
        pl.col("excluded_id").cast(pl.Int64).alias("candidate_id"),
    )


def _recommendable_candidate_ids(exports_dir: Path) -> pl.Series:
    """Int64 ids of accounts that are active and discoverable, from
    ``candidate_profiles.parquet``; empty if the export is missing."""
    path = exports_dir / "candidate_profiles.parquet"
    if not path.exists():
        return pl.Series("candidate_id", [], pl.Int64)
    return (
        pl.scan_parquet(path)
        .filter((pl.col("account_status") == "active") & pl.col("is_discoverable"))
        .select(pl.col("candidate_id").cast(pl.Int64))
        .collect()
        .get_column("candidate_id")
    )
