"""Carry-over: a failed shard's users keep the lists of the version being replaced.

A planned shard without its manifest and output after the traversal's retries is *failed*
(``recs.nightly.validation``). The publish does not stop for it: that shard's file in the new
version holds the rows of the version ``CURRENT`` names for tonight's eligible users of the
shard, unchanged (their ``run_id`` and ``generated_at`` still say when they were computed), under
tonight's shard function (a version with another shard count is re-sharded with
``recs.sharding.shard_expr``). The manifest marks the shard ``carried_over`` with
``carried_from``, the run the rows were computed in, followed through versions that had carried
the shard themselves. The read path's filters (dismissals, blocks, new follows, suspensions)
apply to carried rows like to any other; the next run recomputes every shard.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from recs.contracts import RECOMMENDATION_SCHEMA
from recs.files import atomic_path
from recs.published import shard_file
from recs.sharding import shard_expr

COMPUTED = "computed"
CARRIED_OVER = "carried_over"


def carried_rows(
    published_dir: Path,
    previous: dict[str, Any],
    shard_id: int,
    shard_count: int,
    eligible_ids: pl.Series,
) -> pl.DataFrame:
    """The rows of version ``previous`` (its manifest) for shard ``shard_id`` of ``shard_count``:
    its users in ``eligible_ids`` (Int64) whose ``shard_of(user_id, shard_count)`` is
    ``shard_id``, exactly ``RECOMMENDATION_SCHEMA``, sorted by (user_id, rank)."""
    if int(previous["shard_count"]) == shard_count:
        sources = [shard_id]
    else:
        sources = [int(entry["shard_id"]) for entry in previous["shards"]]
    files = [shard_file(published_dir, previous["run_id"], source) for source in sources]
    return (
        pl.scan_parquet(files)
        .select(list(RECOMMENDATION_SCHEMA))
        .filter(
            (shard_expr("user_id", shard_count) == shard_id)
            & pl.col("user_id").is_in(eligible_ids.implode())
        )
        .sort("user_id", "rank")
        .collect()
    )


def carried_from(
    previous: dict[str, Any], shard_id: int, shard_count: int, rows: pl.DataFrame
) -> str | list[str]:
    """The run the carried ``rows`` were computed in: their ``run_id`` values; with no rows,
    what the previous version's manifest says of the shard(s) they would come from (its own
    run, or the ``carried_from`` of a shard it had carried). A list (sorted) only when a
    re-shard gathers rows computed in several runs."""
    origins = sorted(rows.get_column("run_id").unique().to_list())
    if not origins:
        same_count = int(previous["shard_count"]) == shard_count
        entries = [e for e in previous["shards"] if not same_count or e["shard_id"] == shard_id]
        found: set[str] = set()
        for entry in entries:
            origin = (
                entry.get("carried_from")
                if entry.get("status") == CARRIED_OVER
                else previous["run_id"]
            )
            found.update(origin if isinstance(origin, list) else [origin])
        origins = sorted(found)
    return origins[0] if len(origins) == 1 else origins


def write_shard_file(rows: pl.DataFrame, path: Path) -> Path:
    """Write a carried shard file atomically and reproducibly (the traversal's Parquet
    options: zstd level 3 with statistics, so equal rows give equal bytes)."""
    with atomic_path(path) as tmp:
        rows.write_parquet(tmp, compression="zstd", compression_level=3, statistics=True)
    return Path(path)
