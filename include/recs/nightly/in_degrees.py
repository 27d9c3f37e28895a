"""The snapshot's in-degrees: active followers per account, counted as the freeze reads the edges.

``in_degree(a)`` = rows of the snapshot's follow edges with ``followee_id = a``, ``status =
'active'`` and ``follower_id <> followee_id`` (``stg_follow_edges`` drops self-follows; one row
per pair, ``follow_pairs``). It feeds the hub list, the candidate profiles and the popularity
index (dbt: ``stg_in_degrees`` → ``int_user_in_degrees_counted``).

Why here: dbt grouped every edge by ``followee_id`` to get it, the build's slowest node (26.9 s
of 50.6 s at 5 M users and 250 M edges, ``bench/README.md``), a second pass over edges the freeze
already holds chunk by chunk. ``InDegrees`` tallies each chunk as it streams past and writes one
row per followed account, so dbt reads a file the size of the users table, not of the edges,
and a freeze split by ``follower_id`` range adds its ranges' tallies (``add``): the small global
aggregate the per-shard models need. ``from_follow_edges`` counts a written snapshot's edges
(a snapshot retained by an earlier version has no ``in_degrees.parquet``). dbt checks the file
against the edges it counts: the sum of ``in_degree`` equals the active follows
(``assert_in_degrees_sum_to_active_follows``).

Output (``contracts.IN_DEGREE_SCHEMA``): ``user_id``, ``in_degree`` (>= 1; accounts nobody
follows have no row), sorted by ``user_id``.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from recs.contracts import IN_DEGREE_SCHEMA

FILE = "in_degrees.parquet"
"""Its name in a snapshot folder (retained and the run's)."""

COMPACT_ROWS = 1_000_000
"""Pending per-chunk tallies are summed into the running one once they hold this many rows and
at least as many as it: amortised, each tally row is summed a constant number of times, and
memory stays within about twice the accounts followed."""


def _counted(edges: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """Active, non-self follows of ``edges`` counted per ``followee_id`` (as ``user_id``)."""
    return (
        edges.lazy()
        .filter((pl.col("status") == "active") & (pl.col("follower_id") != pl.col("followee_id")))
        .group_by(pl.col("followee_id").alias("user_id"))
        .agg(pl.len().cast(pl.Int64).alias("in_degree"))
    )


class InDegrees:
    """A running tally of in-degrees over chunks of follow edges (``SNAPSHOT_SCHEMAS
    ["follow_edges"]`` columns; the rule: module docstring). Not thread-safe: one per reading
    thread, summed with ``add``."""

    def __init__(self) -> None:
        self._total = pl.DataFrame(schema=IN_DEGREE_SCHEMA)
        self._pending: list[pl.DataFrame] = []
        self._pending_rows = 0

    def tally(self, chunk: pl.DataFrame) -> pl.DataFrame:
        """Count ``chunk``'s follows; returns ``chunk`` unchanged (for use inside a stream)."""
        counted = _counted(chunk).collect()
        if counted.height:
            self._pending.append(counted)
            self._pending_rows += counted.height
            if self._pending_rows >= max(COMPACT_ROWS, self._total.height):
                self._compact()
        return chunk

    def add(self, other: InDegrees) -> None:
        """Add ``other``'s tally (another range of the same snapshot) to this one."""
        other._compact()
        self._pending.append(other._total)
        self._pending_rows += other._total.height
        self._compact()

    def _compact(self) -> None:
        if self._pending:
            self._total = (
                pl.concat([self._total, *self._pending])
                .group_by("user_id")
                .agg(pl.col("in_degree").sum())
            )
            self._pending, self._pending_rows = [], 0

    def frame(self) -> pl.DataFrame:
        """The tally so far: one row per followed account, sorted by ``user_id``."""
        self._compact()
        return self._total.sort("user_id")


def from_follow_edges(folder: Path) -> pl.DataFrame:
    """The in-degrees of a written snapshot ``folder``'s follow edges
    (``follow_edges/shard_id=*/*.parquet``), streamed: ``InDegrees.frame()``'s shape."""
    edges = pl.scan_parquet(folder / "follow_edges" / "*" / "*.parquet", hive_partitioning=False)
    return _counted(edges).collect(engine="streaming").sort("user_id")
