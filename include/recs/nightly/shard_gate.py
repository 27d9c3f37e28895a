"""The gate of one shard: its rows, rules, users and files, validated by GX in a mapped task.

``validate_shard`` is what the mapped ``validate_shards`` task of the DAG runs for each shard
of its group (``shard_plan.task_groups``), after every traversal: it reads one shard's output,
its eligible users and exclusions, and runs four batches as GX checkpoints, so its memory
grows with the shard, never with the graph. One row per ...:

``recommendations``  row as written: no nulls in the contract's columns, this run's run_id.
``recommendation_rules``  rank, score, mutual_count and followed_by within bounds; no self,
    excluded (its follows of any status, blocks, mutes, dismissals), inactive or undiscoverable
    candidate.
``users``  user with a list: ranks 1..n gapless and unique, each candidate once, in this shard
    (its home shard), eligible tonight.
``shards``  the shard: readable Parquet of the contract schema (its columns in order, their
    exact dtypes) sorted by (user_id, rank), a readable manifest whose shard id and counts equal
    the file's, and lists for at least ``gate_min_list_share`` of its eligible users
    (``shard_list_share``).

It never raises for what it finds: the verdict is the run's (``validation.validate_run`` merges
every shard's results with the run-wide checks, and validates itself any shard whose saved
result cannot stand for a check now: ``saved_result``). Saved, atomically:
``paths.shard_validation(shard_id)``: ``{"shard_id", "status" (computed | failed), "sha256",
"rows", "users", "eligible_users", "generated_at", "inputs" (``inputs_fingerprint``),
"checkpoints", "gx_results"}``
(``checkpoints`` as ``checkpoints.run_checkpoints`` describes them; ``gx_results``: GX's own
validation results, rendered into the run's Data Docs by ``validate_run``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from recs.config import Settings
from recs.contracts import RECOMMENDATION_SCHEMA
from recs.errors import RunNotFoundError
from recs.files import read_json, write_json
from recs.nightly.checkpoints import GateBatch, quiet_gx, run_checkpoints
from recs.nightly.gate_inputs import (
    ShardOutputs,
    eligible_users,
    max_generated_at,
    read_shard_outputs,
)
from recs.nightly.runs import RunPaths
from recs.sharding import partition_files, shard_expr

log = logging.getLogger("recs.nightly.validation")

#: The batches of a shard, in the order they run and are reported.
SHARD_BATCHES = ("recommendations", "recommendation_rules", "users", "shards")
# Scores are sums of floats; allow for one rounding step above the exact bound.
SCORE_TOLERANCE = 1e-9


def validate_shard(paths: RunPaths, settings: Settings, shard_id: int) -> dict[str, Any]:
    """Validate one planned shard and save its result (``validate_shard_result``); return it
    without ``checkpoints`` and ``gx_results``, plus ``success`` (None for a failed shard:
    nothing to judge, it is carried over) and ``seconds``, for XCom and the CLI."""
    started = time.perf_counter()
    return validate_prepared(paths, prepare_shard(paths, settings, shard_id), started)


def validate_prepared(
    paths: RunPaths, prepared: PreparedShard, started: float | None = None
) -> dict[str, Any]:
    """``validate_shard`` of a shard its caller read already (``prepare_shard``, e.g. ahead,
    on another thread); ``seconds`` counts from ``started`` (``time.perf_counter``; default:
    now, so the judging only)."""
    started = time.perf_counter() if started is None else started
    shard_id = prepared.shard_id
    result = judge_shard(paths, prepared)
    checks = [e for c in result["checkpoints"] for e in c["expectations"]]
    summary = {
        key: value for key, value in result.items() if key not in ("checkpoints", "gx_results")
    }
    summary["success"] = all(e["success"] for e in checks) if result["checkpoints"] else None
    summary["seconds"] = round(time.perf_counter() - started, 3)
    log.info(
        "validate %s shard %03d: %s, %d of %d checks passed (%.2fs)", paths.run_id, shard_id,
        result["status"], sum(bool(e["success"]) for e in checks), len(checks),
        summary["seconds"],
    )
    return summary


def validate_shard_result(paths: RunPaths, settings: Settings, shard_id: int) -> dict[str, Any]:
    """Run the shard's batches (``shard_batches``) and save the whole result (module
    docstring) at ``paths.shard_validation(shard_id)``; a shard without manifest or output is
    saved as ``failed``. A checkpoint that raised is recorded in the result, not raised.
    Raises only what reading the shard or writing the result raises."""
    return judge_shard(paths, prepare_shard(paths, settings, shard_id))


@dataclass
class PreparedShard:
    """One shard read and its batches built, not yet judged (``prepare_shard``): ``result``
    is its saved result but ``checkpoints`` and ``gx_results``; ``batches`` is None for a
    failed shard (nothing to judge)."""

    shard_id: int
    result: dict[str, Any]
    batches: list[GateBatch] | None


def prepare_shard(paths: RunPaths, settings: Settings, shard_id: int) -> PreparedShard:
    """Read one shard's output, eligible users and exclusions and build its batches
    (``shard_batches``): Polars work that releases the GIL, so a group's next shard can be
    read while GX judges the one before (``pipeline.validate_shards``). Raises what reading
    the shard raises."""
    outputs = read_shard_outputs(paths, settings.shard_count, shard_ids=[shard_id])
    if not outputs.computed:
        failed = {"shard_id": shard_id, "status": "failed", "sha256": None}
        return PreparedShard(shard_id, failed, None)
    union = outputs.union
    # a user in the wrong shard fails user_in_home_shard; its eligibility is looked up in
    # its home shard's partition, so it does not also fail user_is_eligible
    homes = (
        union.select(shard_expr("user_id", settings.shard_count).unique().drop_nulls())
        .to_series().to_list() if "user_id" in union.columns else []
    )  # fmt: skip
    eligible = eligible_users(paths.exports_dir, shard_ids=[shard_id, *homes])
    in_shard = eligible.filter(shard_expr("user_id", settings.shard_count) == shard_id)
    batches = shard_batches(paths, settings, shard_id, outputs, eligible, in_shard.height)
    result = {
        "shard_id": shard_id,
        "status": "computed",
        "sha256": outputs.fingerprints[0]["sha256"] if outputs.fingerprints else None,
        "rows": union.height,
        "users": union.get_column("user_id").n_unique() if "user_id" in union.columns else 0,
        "eligible_users": in_shard.height,
        "generated_at": max_generated_at(union),
        "inputs": inputs_fingerprint(paths, settings, shard_id),
    }
    return PreparedShard(shard_id, result, batches)


def judge_shard(paths: RunPaths, prepared: PreparedShard) -> dict[str, Any]:
    """Run a prepared shard's batches as GX checkpoints and save its whole result (module
    docstring) at ``paths.shard_validation``; return it. A checkpoint that raised is
    recorded in the result, not raised."""
    shard_id = prepared.shard_id
    gate = {"checkpoints": [], "gx_results": []}
    if prepared.batches is not None:
        gate = run_checkpoints(
            prepared.batches, paths, label=f"shard_{shard_id:03d}", data_docs=False
        )
    result = {
        **prepared.result, "checkpoints": gate["checkpoints"], "gx_results": gate["gx_results"]
    }
    write_json(paths.shard_validation(shard_id), result)
    return result


def saved_result(
    paths: RunPaths, settings: Settings, shard_id: int, sha256: str | None
) -> dict[str, Any] | None:
    """The saved result of ``shard_id`` if it can stand for a check of the shard now, else None
    (the shard is then validated again). It must have judged the file whose digest is
    ``sha256`` (the output there now) against the same inputs and settings
    (``inputs_fingerprint``), be complete (``is_complete``) and hold no errored check (an
    engine error is not a verdict: it is retried, never reused)."""
    try:
        result = read_json(paths.shard_validation(shard_id))
    except Exception:  # noqa: BLE001 - missing or damaged: the shard is validated again
        return None
    if result.get("status") != "computed" or sha256 is None or result.get("sha256") != sha256:
        return None
    if result.get("inputs") != inputs_fingerprint(paths, settings, shard_id):
        return None
    return result if is_complete(result) else None


def is_complete(result: dict[str, Any]) -> bool:
    """Whether a computed shard's result holds every batch of ``SHARD_BATCHES``, each with
    checks, no errored check or raised checkpoint, and batch sizes that agree with its figures
    (``recommendations`` and ``recommendation_rules``: its rows; ``users``: its users;
    ``shards``: one)."""
    try:
        by_batch = {c["batch"]: c for c in result["checkpoints"]}
        expected = {"recommendations": result["rows"], "recommendation_rules": result["rows"],
                    "users": result["users"], "shards": 1}  # fmt: skip
        return set(by_batch) == set(SHARD_BATCHES) and all(
            by_batch[batch]["rows"] == rows
            and by_batch[batch]["expectations"]
            and "error" not in by_batch[batch]
            and not any(e.get("errored") for e in by_batch[batch]["expectations"])
            for batch, rows in expected.items()
        )
    except (KeyError, TypeError, AttributeError):
        return False


def inputs_fingerprint(paths: RunPaths, settings: Settings, shard_id: int) -> str:
    """A digest of what a shard's checks read besides its output: the run's settings (not
    ``home``: where the run is found, which each worker may mount elsewhere) and, for each
    input file (the shard's ``manifest.json``, its snapshot follow-edge and
    ``follow_exclusions`` partitions, every ``eligible_users`` file,
    ``candidate_profiles.parquet``), its path relative to the run, size and modification time
    (every writer replaces its files whole, so a changed input has a new ``mtime_ns``). Cheap:
    nothing is read but directory entries."""
    files = [
        Path(paths.shard_manifest(shard_id)),  # its checks judge it too (the shards batch)
        *partition_files(Path(paths.snapshot_dir) / "follow_edges").get(shard_id, []),
        *partition_files(Path(paths.exports_dir) / "follow_exclusions").get(shard_id, []),
        *[f for fs in partition_files(Path(paths.exports_dir) / "eligible_users").values()
          for f in fs],
        Path(paths.exports_dir) / "candidate_profiles.parquet",
    ]  # fmt: skip
    stats = []
    for path in files:
        try:
            found = path.stat()
            stats.append([str(path.relative_to(paths.run_dir)), found.st_size, found.st_mtime_ns])
        except (OSError, ValueError):
            stats.append([str(path), None, None])
    document = json.dumps(  # not ``home``: where the run is found, not what it computes
        {"settings": settings.model_dump(mode="json", exclude={"home"}), "files": stats},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(document.encode()).hexdigest()


def shard_batches(
    paths: RunPaths,
    settings: Settings,
    shard_id: int,
    outputs: ShardOutputs,
    eligible: pl.DataFrame,
    eligible_in_shard: int,
) -> list[GateBatch]:
    """The four batches of one computed shard, each with its expectations (module docstring).

    ``outputs``: ``read_shard_outputs`` of this shard alone; ``eligible``: the eligible
    ``user_id`` of this shard and of the home shards of its users; ``eligible_in_shard``: how
    many of them are in this shard. Check names are stable identifiers: they appear in
    ``summary.json`` and errors.
    """
    quiet_gx()
    import great_expectations.expectations as gxe

    union = outputs.union
    conformed = _conformed(union)
    between = gxe.ExpectColumnValuesToBeBetween
    in_set = gxe.ExpectColumnValuesToBeInSet
    pair_equal = gxe.ExpectColumnPairValuesToBeEqual

    recommendations = GateBatch(
        "recommendations",
        union.select([c for c in union.columns if c != "shard_id"]),
        keys=["user_id", "candidate_id"],
    )
    rules = GateBatch(
        "recommendation_rules",
        recommendation_rules(paths, shard_id, conformed),
        ["user_id", "candidate_id"],
    )
    eligible_ids = eligible.get_column("user_id").implode()
    users = GateBatch(
        "users",
        user_rank_stats(conformed, settings.shard_count).with_columns(
            pl.col("user_id").is_in(eligible_ids).alias("is_eligible")
        ),
        ["user_id"],
    )
    shards = GateBatch(
        "shards", outputs.shards.with_columns(shard_list_share(eligible_in_shard, settings)),
        ["shard_id"],
    )  # fmt: skip

    # The columns, their order and exact dtypes are one check of the file, not of this pandas
    # copy: shard_schema_matches_contract (GX's per-column type checks here were weaker
    # duplicates of it, ~0.2 s a shard: bench/README.md, "The night at scale").
    for column in RECOMMENDATION_SCHEMA:
        recommendations.expect(
            f"not_null_{column}", gxe.ExpectColumnValuesToNotBeNull, column=column
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
    # (user_id, candidate_id) unique as a count per user: GX's ExpectCompoundColumnsToBeUnique
    # on the rows (pandas' duplicated) took 0.39 s a shard, a third of the gate (bench/README.md)
    users.expect(
        "unique_user_candidate", pair_equal, column_A="distinct_candidates", column_B="rows"
    )
    users.expect("user_in_home_shard", in_set, column="in_home_shard", value_set=[True])
    users.expect("user_is_eligible", in_set, column="is_eligible", value_set=[True])

    shards.expect("shard_output_readable", in_set, column="readable", value_set=[True])
    # The run's share is checked too (validation.run_batch), but a shard that lost its lists
    # hides in it: one of 4 emptied was -24.8 % of the users, inside the change checks' bound.
    shards.expect(
        "shard_list_share_at_least_min",
        between,
        column="list_share",
        min_value=settings.gate_min_list_share,
    )
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
    return [recommendations, rules, users, shards]


def recommendation_rules(paths: RunPaths, shard_id: int, conformed: pl.DataFrame) -> pl.DataFrame:
    """One row per recommendation row of shard ``shard_id``, with the columns the product rules
    are checked on.

    ``conformed`` has the contract's columns and dtypes. Returns, in the input's row order:
    ``user_id, candidate_id`` Int64, ``rank, mutual_count`` Int64, ``score`` Float64,
    ``followed_by_length`` Int64, ``is_self_recommendation`` Boolean (user_id == candidate_id),
    ``is_excluded`` Boolean (the pair is a follow of any status in the shard's
    ``snapshot/follow_edges`` partition, or in its ``exports/follow_exclusions`` partition, any
    reason), ``candidate_is_recommendable`` Boolean (candidate in
    ``exports/candidate_profiles`` with ``account_status == 'active'`` and ``is_discoverable``;
    an unknown candidate is False).
    """
    rows = conformed.lazy().with_row_index("row")
    excluded_rows = (
        rows.select("row", "user_id", "candidate_id")
        .join(_exclusion_pairs(paths, shard_id), on=["user_id", "candidate_id"], how="semi")
        .select("row")
        .collect()
        .get_column("row")
    )
    recommendable = _recommendable_candidate_ids(
        paths.exports_dir, conformed.get_column("candidate_id").drop_nulls().unique()
    )
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


def shard_list_share(in_shard: int, settings: Settings) -> pl.Expr:
    """``list_share`` Float64 for the ``shards`` frame's row: ``file_users`` over the shard's
    ``in_shard`` eligible users; its floor is
    ``gate_min_list_share``, as the run's. Null, so not judged, when the file could not be read
    (its readability check says so) or when the floor asks for less than one list (fewer than
    ``1 / gate_min_list_share`` eligible users, 20 by default: a shard of a tiny graph may
    rightly have none; a shard of the plan's size has thousands)."""
    if in_shard * settings.gate_min_list_share < 1:
        return pl.lit(None, pl.Float64).alias("list_share")
    return (pl.col("file_users").cast(pl.Float64) / in_shard).alias("list_share")


def user_rank_stats(conformed: pl.DataFrame, shard_count: int) -> pl.DataFrame:
    """One row per user_id with recommendations, sorted by user_id.

    ``conformed`` has the contract's columns plus ``shard_id`` (the directory the row came
    from). Returns ``user_id`` Int64, ``rows, min_rank, max_rank, distinct_ranks,
    distinct_candidates`` Int64, ``in_home_shard`` Boolean: every row of the user is in one
    shard directory, and it is ``shard_of(user_id, shard_count)``.
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
            pl.col("candidate_id").n_unique().cast(pl.Int64).alias("distinct_candidates"),
            pl.col("shard_id").n_unique().alias("shard_dirs"),
            pl.col("shard_id").first().alias("shard_id"),
        )
        .with_columns(
            (
                (pl.col("shard_dirs") == 1)
                & (pl.col("shard_id") == shard_expr("user_id", shard_count))
            ).alias("in_home_shard")
        )
        .select(
            "user_id", "rows", "min_rank", "max_rank", "distinct_ranks", "distinct_candidates",
            "in_home_shard",
        )
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


def _exclusion_pairs(paths: RunPaths, shard_id: int) -> pl.LazyFrame:
    """``(user_id, candidate_id)`` Int64 pairs excluded for the users of ``shard_id``, for any
    reason (may repeat): their follows of any status (``snapshot/follow_edges``) and the rows
    of ``exports/follow_exclusions`` (a shard may have no folder in either)."""
    edges = partition_files(Path(paths.snapshot_dir) / "follow_edges").get(shard_id, [])
    if not edges:  # freeze_snapshot writes every shard's partition, empty ones too
        raise RunNotFoundError(
            f"the snapshot has no follow-edge partition for shard {shard_id:03d} under "
            f"{Path(paths.snapshot_dir) / 'follow_edges'}: the users' own follows cannot be "
            "checked (freeze the snapshot again)"
        )
    others = partition_files(Path(paths.exports_dir) / "follow_exclusions").get(shard_id, [])
    frames = [
        pl.scan_parquet(edges, hive_partitioning=False).select(
            pl.col("follower_id").cast(pl.Int64).alias("user_id"),
            pl.col("followee_id").cast(pl.Int64).alias("candidate_id"),
        )
    ] if edges else []  # fmt: skip
    if others:
        frames.append(
            pl.scan_parquet(others, hive_partitioning=False).select(
                pl.col("user_id").cast(pl.Int64),
                pl.col("excluded_id").cast(pl.Int64).alias("candidate_id"),
            )
        )
    if not frames:
        return pl.LazyFrame(schema={"user_id": pl.Int64, "candidate_id": pl.Int64})
    return pl.concat(frames, how="vertical")


def _recommendable_candidate_ids(exports_dir: Path, candidates: pl.Series) -> pl.Series:
    """The Int64 ids among ``candidates`` of accounts that are active and discoverable, from
    ``candidate_profiles.parquet`` (scanned for those ids only, so the memory is the shard's);
    empty if the export is missing."""
    path = exports_dir / "candidate_profiles.parquet"
    if not path.exists():
        return pl.Series("candidate_id", [], pl.Int64)
    return (
        pl.scan_parquet(path)
        .filter(
            pl.col("candidate_id").is_in(candidates.cast(pl.Int64).implode())
            & (pl.col("account_status") == "active")
            & pl.col("is_discoverable")
        )
        .select(pl.col("candidate_id").cast(pl.Int64))
        .collect()
        .get_column("candidate_id")
    )

