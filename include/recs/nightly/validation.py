"""The Great Expectations gate: nothing is published unless every check here passes.

``validate_run`` reads every shard output of a run (``shards/shard_id=NNN/``), derives four
frames from them in Polars (``gate_batches``: **the gate's expectations are defined there**),
runs each as a GX checkpoint (``recs.nightly.checkpoints``), saves the results with the run and
raises ``ValidationFailedError`` if anything failed. The four batches, one row per ...:

``recommendations``  published row as written: contract columns, types, no nulls, unique
    (user_id, candidate_id), this run's run_id.
``recommendation_rules``  published row with derived columns: rank in 1..top_k, score in
    [0, score_max], mutual_count >= min_mutual_count, followed_by within followed_by_count, no
    self-recommendation, no excluded candidate (``exports/follow_exclusions``), candidate active
    and discoverable (``exports/candidate_profiles``).
``users``  user with recommendations: ranks 1..n gapless and unique; all rows in the one shard
    ``recs.sharding.shard_of`` assigns (the read path looks nowhere else).
``shards``  ``shard_id=NNN`` directory: exactly the planned shards, output and manifest present,
    readable Parquet with the contract schema sorted by (user_id, rank), manifest counts equal.

Outputs under ``paths.validation_dir``: ``results.json`` (per checkpoint, per expectation: name,
type, kwargs, success, unexpected counts, up to 20 offending keys) and ``summary.json``
(``run_id, success, evaluated, failed`` plus the validated shard files' sha256, rows and users,
which ``recs.nightly.publish`` checks before publishing them).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from recs.config import Settings
from recs.contracts import RECOMMENDATION_SCHEMA
from recs.errors import ValidationFailedError
from recs.files import write_json
from recs.nightly.checkpoints import GateBatch, quiet_gx, run_checkpoints
from recs.nightly.runs import RunPaths
from recs.sharding import shard_expr

RESULTS_FILE = "results.json"
SUMMARY_FILE = "summary.json"

# Scores are sums of floats; allow for one rounding step above the exact bound.
SCORE_TOLERANCE = 1e-9

log = logging.getLogger(__name__)

_SHARD_DIR = re.compile(r"shard_id=(\d+)")

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
    """Run the gate over a run's shard outputs; save results; raise if any expectation failed.

    Reads ``paths.shard_output(i)`` / ``paths.shard_manifest(i)`` for every shard directory
    found, ``exports/follow_exclusions/shard_id=N/*.parquet`` and
    ``exports/candidate_profiles.parquet``. Writes ``validation/results.json`` and
    ``validation/summary.json`` (atomically, also on failure).

    Returns ``{"run_id", "success", "evaluated", "failed", "rows", "users", "results",
    "summary", "seconds"}``. Raises ``ValidationFailedError`` (one line naming the failed
    checks) after saving the results. The wall clock is not read except to time the stage.
    """
    started = time.perf_counter()
    quiet_gx()  # imports GX first, so the timings below exclude it
    seconds = {"gx_import": time.perf_counter() - started}
    lap = time.perf_counter()
    outputs = read_shard_outputs(paths)
    seconds["read"], lap = time.perf_counter() - lap, time.perf_counter()
    batches = gate_batches(paths, settings, outputs)
    seconds["frames"], lap = time.perf_counter() - lap, time.perf_counter()
    log.info(
        "validate %s: %d shard folders, %d rows; GX import %.2fs, read %.2fs, frames %.2fs",
        paths.run_id,
        outputs.shards.height,
        outputs.union.height,
        seconds["gx_import"],
        seconds["read"],
        seconds["frames"],
    )
    results = run_checkpoints(batches, paths)
    seconds["checkpoints"] = time.perf_counter() - lap

    failed = [
        item["name"]
        for checkpoint in results["checkpoints"]
        for item in checkpoint["expectations"]
        if not item["success"]
    ]
    evaluated = sum(len(c["expectations"]) for c in results["checkpoints"])
    union = outputs.union
    summary = {
        "run_id": paths.run_id,
        "snapshot_date": paths.snapshot_date.isoformat(),
        "success": not failed,
        "evaluated": evaluated,
        "failed": failed,
        "rows": union.height,
        "users": union.get_column("user_id").n_unique() if "user_id" in union.columns else 0,
        "generated_at": _max_generated_at(union),
        "shards": outputs.fingerprints,
    }
    validation_dir = paths.validation_dir
    results_path = write_json(validation_dir / RESULTS_FILE, results)
    summary_path = write_json(validation_dir / SUMMARY_FILE, summary)
    log.info(
        "validate %s: %d of %d expectations passed (checkpoints %.2fs, total %.2fs)",
        paths.run_id,
        evaluated - len(failed),
        evaluated,
        seconds["checkpoints"],
        time.perf_counter() - started,
    )
    if failed:
        raise ValidationFailedError(
            f"validation failed for run {paths.run_id}: {len(failed)} of {evaluated} "
            f"expectations failed: {', '.join(failed)} (details: {results_path})"
        )
    return {
        "run_id": paths.run_id,
        "success": True,
        "evaluated": evaluated,
        "failed": [],
        "rows": summary["rows"],
        "users": summary["users"],
        "results": str(results_path),
        "summary": str(summary_path),
        "seconds": round(time.perf_counter() - started, 3),
    }


@dataclass
class ShardOutputs:
    """What the gate read from a run's ``shards/`` folder.

    ``union``: every readable shard file concatenated (``how="diagonal_relaxed"``), columns as
    written, plus ``shard_id`` (Int32, the directory's id). ``shards``: one row per directory
    found (see ``read_shard_outputs``). ``fingerprints``: ``[{"shard_id", "sha256", "rows",
    "users"}]`` of the readable files, by shard id.
    """

    union: pl.DataFrame
    shards: pl.DataFrame
    fingerprints: list[dict[str, Any]]


def read_shard_outputs(paths: RunPaths) -> ShardOutputs:
    """Read every ``shards/shard_id=NNN/`` directory of the run (no expectations yet).

    The ``shards`` frame, one row per directory found, sorted by shard_id:
    ``shard_id`` Int64 (-1 if the name is not ``shard_id=`` + three or more digits),
    ``has_output`` / ``has_manifest`` Boolean, ``readable`` / ``schema_matches`` / ``is_sorted``
    Boolean (null when there is no file to judge), ``file_rows`` / ``file_users`` Int64,
    ``manifest_shard_id`` / ``manifest_rows`` / ``manifest_users`` Int64 (null when absent).
    The file's bytes are read once: the sha256 saved in the summary is of the bytes validated.
    """
    records: list[dict[str, Any]] = []
    frames: list[pl.DataFrame] = []
    fingerprints: list[dict[str, Any]] = []
    shard_dirs = sorted(p for p in paths.shards_dir.glob("shard_id=*") if p.is_dir())
    for shard_dir in shard_dirs:
        match = _SHARD_DIR.fullmatch(shard_dir.name)
        shard_id = int(match.group(1)) if match else -1
        if match and shard_dir.name != paths.shard_dir(shard_id).name:
            shard_id = -1  # e.g. shard_id=7: not where publish and the readers look
        output = shard_dir / "recommendations.parquet"
        manifest_path = shard_dir / "manifest.json"
        record: dict[str, Any] = {
            "shard_id": shard_id,
            "has_output": output.is_file(),
            "has_manifest": manifest_path.is_file(),
            "readable": None,
            "schema_matches": None,
            "is_sorted": None,
            "file_rows": None,
            "file_users": None,
            "manifest_shard_id": None,
            "manifest_rows": None,
            "manifest_users": None,
        }
        if record["has_output"]:
            content = output.read_bytes()
            try:
                frame = pl.read_parquet(io.BytesIO(content))
            except Exception:  # noqa: BLE001 - any unreadable file is a failed check, not a crash
                record["readable"] = False
            else:
                users = frame.get_column("user_id").n_unique() if "user_id" in frame.columns else 0
                record.update(
                    readable=True,
                    schema_matches=dict(frame.schema) == dict(RECOMMENDATION_SCHEMA)
                    and frame.columns == list(RECOMMENDATION_SCHEMA),
                    is_sorted=_is_sorted_by_user_rank(frame),
                    file_rows=frame.height,
                    file_users=users,
                )
                frames.append(frame.with_columns(pl.lit(shard_id, pl.Int32).alias("shard_id")))
                fingerprints.append(
                    {
                        "shard_id": shard_id,
                        "sha256": hashlib.sha256(content).hexdigest(),
                        "rows": frame.height,
                        "users": users,
                    }
                )
        if record["has_manifest"]:
            manifest = _read_manifest(manifest_path)
            record.update(
                manifest_shard_id=_as_int(manifest.get("shard_id")),
                manifest_rows=_as_int(manifest.get("rows")),
                manifest_users=_as_int(manifest.get("users_with_recommendations")),
            )
        records.append(record)

    shards = pl.DataFrame(
        records,
        schema={
            "shard_id": pl.Int64,
            "has_output": pl.Boolean,
            "has_manifest": pl.Boolean,
            "readable": pl.Boolean,
            "schema_matches": pl.Boolean,
            "is_sorted": pl.Boolean,
            "file_rows": pl.Int64,
            "file_users": pl.Int64,
            "manifest_shard_id": pl.Int64,
            "manifest_rows": pl.Int64,
            "manifest_users": pl.Int64,
        },
    ).sort("shard_id")
    if frames:
        union = pl.concat(frames, how="diagonal_relaxed")
    else:
        union = pl.DataFrame(schema={**RECOMMENDATION_SCHEMA, "shard_id": pl.Int32})
    fingerprints.sort(key=lambda item: item["shard_id"])
    return ShardOutputs(union=union, shards=shards, fingerprints=fingerprints)


def gate_batches(paths: RunPaths, settings: Settings, outputs: ShardOutputs) -> list[GateBatch]:
    """The four batches of the gate, each with its expectations (module docstring).

    Pure given its inputs except for reading the run's exclusion and candidate-profile exports.
    Check names are stable identifiers: they appear in ``summary.json`` and in the error.
    """
    quiet_gx()
    import great_expectations.expectations as gxe

    union = outputs.union
    conformed = _conformed(union)
    recommendations = GateBatch(
        "recommendations",
        union.select([c for c in union.columns if c != "shard_id"]),
        keys=["user_id", "candidate_id"],
    )
    rules = GateBatch(
        "recommendation_rules", recommendation_rules(paths, conformed), ["user_id", "candidate_id"]
    )
    users = GateBatch("users", user_rank_stats(conformed, settings.shard_count), ["user_id"])
    shards = GateBatch("shards", outputs.shards, ["shard_id"])

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
    recommendations.expect(
        "run_id_is_this_run",
        gxe.ExpectColumnValuesToBeInSet,
        column="run_id",
        value_set=[paths.run_id],
    )

    between = gxe.ExpectColumnValuesToBeBetween
    in_set = gxe.ExpectColumnValuesToBeInSet
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

    pair_equal = gxe.ExpectColumnPairValuesToBeEqual
    users.expect("rank_starts_at_1", between, column="min_rank", min_value=1, max_value=1)
    users.expect("rank_gapless_per_user", pair_equal, column_A="max_rank", column_B="rows")
    users.expect("rank_unique_per_user", pair_equal, column_A="distinct_ranks", column_B="rows")
    users.expect("user_in_home_shard", in_set, column="in_home_shard", value_set=[True])

    shards.expect(
        "planned_shards_present",
        gxe.ExpectColumnDistinctValuesToEqualSet,
        column="shard_id",
        value_set=list(range(settings.shard_count)),
    )
    shards.expect("shard_ids_unique", gxe.ExpectColumnValuesToBeUnique, column="shard_id")
    shards.expect("shard_output_present", in_set, column="has_output", value_set=[True])
    shards.expect("shard_manifest_present", in_set, column="has_manifest", value_set=[True])
    shards.expect("shard_output_readable", in_set, column="readable", value_set=[True])
    shards.expect(
        "shard_schema_matches_contract", in_set, column="schema_matches", value_set=[True]
    )
    shards.expect("shard_sorted_by_user_rank", in_set, column="is_sorted", value_set=[True])
    # A missing manifest or output is reported by the *_present checks, not again here.
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
    return [recommendations, rules, users, shards]


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


def _is_sorted_by_user_rank(frame: pl.DataFrame) -> bool | None:
    """True if rows are in strictly increasing (user_id, rank) order; None if a key is missing."""
    if not {"user_id", "rank"} <= set(frame.columns):
        return None
    if frame.height < 2:
        return True
    user_step = pl.col("user_id").diff()
    rank_step = pl.col("rank").cast(pl.Int64).diff()
    ordered = (user_step > 0) | ((user_step == 0) & (rank_step > 0))
    return bool(frame.select(ordered.slice(1).fill_null(False).all()).item())


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _max_generated_at(union: pl.DataFrame) -> str | None:
    """Latest ``generated_at`` of the run's rows (ISO, naive UTC), None if there are none."""
    if "generated_at" not in union.columns or union.height == 0:
        return None
    latest = union.get_column("generated_at").max()
    return latest.isoformat() if latest is not None else None
