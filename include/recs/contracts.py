"""Schemas shared between the stages: snapshot Parquet, dbt exports, shard output, published table.

One place defines each contract; producers cast to it, consumers check it, and a test checks that
what dbt exports is exactly what the traversal reads (ARCHITECTURE §5). Schemas are given as
``{column: polars dtype}`` dicts; ``check_schema`` raises ``SchemaMismatchError`` with a readable
diff. All timestamps are timezone-naive UTC, microsecond precision (DuckDB ``TIMESTAMP``).
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from recs.errors import SchemaMismatchError

TS = pl.Datetime("us")

# --- snapshot/ (freeze_snapshot) -----------------------------------------------------------
SNAPSHOT_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    # One row per account.
    "users": {
        "user_id": pl.Int64,
        "created_at": TS,
        "last_active_at": TS,
        "account_status": pl.String,
        "is_discoverable": pl.Boolean,
        "is_private": pl.Boolean,
    },
    # One row per (follower_id, followee_id); stored as follow_edges/shard_id=NNN/part-0.parquet,
    # partitioned by shard_of(follower_id). status is 'active' or 'pending'.
    "follow_edges": {
        "follower_id": pl.Int64,
        "followee_id": pl.Int64,
        "created_at": TS,
        "status": pl.String,
    },
    "blocks": {"blocker_id": pl.Int64, "blocked_id": pl.Int64, "created_at": TS},
    "mutes": {"muter_id": pl.Int64, "muted_id": pl.Int64, "created_at": TS},
    "dismissed_candidates": {"user_id": pl.Int64, "candidate_id": pl.Int64, "dismissed_at": TS},
    "user_interests": {"user_id": pl.Int64, "tag": pl.String},
}
# snapshot/in_degrees.parquet — one row per account with active followers, counted by
# freeze_snapshot from the follow edges it wrote (recs.nightly.in_degrees); in_degree >= 1.
IN_DEGREE_SCHEMA: dict[str, pl.DataType] = {"user_id": pl.Int64, "in_degree": pl.Int64}
IN_DEGREES_FILE = "in_degrees.parquet"  # its name in a snapshot folder (retained and the run's)

# --- exports/ (dbt build_models; read by the traversal) -------------------------------------
EXPORT_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    # exports/eligible_users/shard_id=N/*.parquet — one row per user refreshed tonight.
    "eligible_users": {"user_id": pl.Int64},
    # exports/follow_exclusions/shard_id=N/*.parquet — one row per (user_id, excluded_id, reason);
    # reason in EXCLUSION_REASONS (a user's own follows are its shard's snapshot follow edges).
    "follow_exclusions": {"user_id": pl.Int64, "excluded_id": pl.Int64, "reason": pl.String},
    # exports/candidate_profiles.parquet — one row per account.
    "candidate_profiles": {
        "candidate_id": pl.Int64,
        "account_status": pl.String,
        "last_active_at": TS,
        "is_discoverable": pl.Boolean,
        "in_degree": pl.Int64,
        "is_recommendable": pl.Boolean,
    },
    # exports/popularity_index.parquet — one row per (tag, candidate_id); tag '_global' is the
    # tag-agnostic list. popularity_rank starts at 1 within a tag.
    "popularity_index": {
        "tag": pl.String,
        "candidate_id": pl.Int64,
        "popularity_rank": pl.Int64,
        "in_degree": pl.Int64,
    },
    # exports/hub_accounts.parquet — one row per hub account.
    "hub_accounts": {"user_id": pl.Int64, "in_degree": pl.Int64},
}

MAX_USER_ID = 2**63 - 1
"""Largest account id: ids are non-negative signed 64-bit integers (``BIGINT``, ``Int64``)."""
GLOBAL_TAG = "_global"
"""The tag of the tag-agnostic popularity list (the dbt macro ``global_tag`` spells it too)."""
FOLLOW_REASONS = ("following", "pending")
"""Why a user's own follow excludes the account it follows: ``following`` (status ``active``) or
``pending`` (a request). Not in ``follow_exclusions``: they are the snapshot's follow edges,
partitioned by the follower's shard, which the traversal and the gate read for that shard."""
EXCLUSION_REASONS = ("blocked", "blocked_by", "muted", "dismissed")
"""Why a candidate is excluded for a user besides its follows (``follow_exclusions.reason``). A
new reason is added here and in ``dbt_project/models/intermediate/int_exclusions_unioned.sql``;
a test checks that the dbt ``accepted_values`` of every ``reason`` column equal this list."""

# --- shards/ and published/ -----------------------------------------------------------------
# One row per (user_id, candidate_id); sorted by user_id, rank.
RECOMMENDATION_SCHEMA: dict[str, pl.DataType] = {
    "user_id": pl.Int64,
    "candidate_id": pl.Int64,
    "mutual_count": pl.Int32,
    "score": pl.Float64,
    "rank": pl.Int32,
    "followed_by": pl.List(pl.Int64),
    "generated_at": TS,
    "run_id": pl.String,
}


def check_schema(schema: Mapping[str, pl.DataType], expected: Mapping[str, pl.DataType], what: str):
    """Raise ``SchemaMismatchError`` unless ``schema`` has exactly ``expected``'s columns/dtypes.

    Column order is not checked. ``what`` names the table in the message.
    """
    actual = dict(schema)
    missing = [c for c in expected if c not in actual]
    extra = [c for c in actual if c not in expected]
    wrong = [
        f"{c}: {actual[c]} != {expected[c]}"
        for c in expected
        if c in actual and actual[c] != expected[c]
    ]
    if missing or extra or wrong:
        raise SchemaMismatchError(
            f"{what} does not match its contract: missing={missing} extra={extra} wrong={wrong}"
        )


def conform(frame: pl.DataFrame, expected: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """Select and cast ``frame`` to ``expected`` (column order of the contract)."""
    return frame.select([pl.col(name).cast(dtype) for name, dtype in expected.items()])


def arrow_schema(contract: Mapping[str, pl.DataType]):
    """The ``pyarrow.Schema`` of a contract, as Parquet files are written (plain ``string``,
    naive ``timestamp[us]``). Supports the scalar dtypes of the snapshot and export contracts."""
    import pyarrow as pa

    mapping = {
        pl.Int64: pa.int64(),
        pl.Int32: pa.int32(),
        pl.String: pa.string(),
        pl.Boolean: pa.bool_(),
        TS: pa.timestamp("us"),
    }
    return pa.schema([pa.field(name, mapping[dtype]) for name, dtype in contract.items()])
