"""The snapshot's in-degrees: active followers per account, counted as the freeze writes the edges.

``in_degree(a)`` = rows of the snapshot's follow edges with ``followee_id = a``, ``status =
'active'`` and ``follower_id <> followee_id`` (``stg_follow_edges`` drops self-follows; one row
per pair, ``follow_pairs``). It feeds the hub list, the candidate profiles and the popularity
index (dbt: ``stg_in_degrees`` → ``int_user_in_degrees_counted``).

Why here: dbt grouped every edge by ``followee_id`` to get it, the build's slowest node (26.9 s
of 50.6 s at 5 M users and 250 M edges, ``bench/README.md``), a second pass over edges the freeze
already holds, one shard at a time, to sort and write them. ``InDegrees.count`` adds each
shard's follows as it is written (the shards' counts are partial sums: the small global
aggregate a freeze split by shard would add up), and dbt reads a file the size of the users
table, not of the edges. ``from_follow_edges`` counts a written snapshot's edges (a snapshot
retained by an earlier version has no ``in_degrees.parquet``). ``build_graph`` checks the file
against the edges, by sums the ``cap_graph`` tasks add as they read them
(``recs.traversal.in_degree_check``): the in-degrees sum to the active follows, and so do the
accounts' ids and hashes weighted by them.

Output (``contracts.IN_DEGREE_SCHEMA``): ``user_id``, ``in_degree`` (>= 1; accounts nobody
follows have no row), sorted by ``user_id``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import polars as pl

from recs.contracts import IN_DEGREE_SCHEMA, IN_DEGREES_FILE

FILE = IN_DEGREES_FILE
"""Its name in a snapshot folder (retained and the run's)."""

DENSE_FACTOR = 8
DENSE_SLACK = 1 << 20
"""Ids ``0 .. max(user_id)`` are counted in one array (8 bytes each, ``np.bincount``) when
``max(user_id) < DENSE_FACTOR * accounts + DENSE_SLACK``; sparser ids (an imported graph's
64-bit ids) and followees above the largest account are counted by Polars' group-by instead."""

COMPACT_ROWS = 1_000_000
"""Pending group-by counts are summed into the running one once they hold this many rows and
at least as many as it: amortised, each row is summed a constant number of times, and memory
stays within about twice the sparse accounts followed."""


def _active_followees(edges: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """The ``followee_id`` (as ``user_id``) of each active, non-self follow of ``edges``."""
    return (
        edges.lazy()
        .filter((pl.col("status") == "active") & (pl.col("follower_id") != pl.col("followee_id")))
        .select(pl.col("followee_id").alias("user_id"))
    )


def _grouped(followees: pl.LazyFrame) -> pl.LazyFrame:
    return followees.group_by("user_id").agg(pl.len().cast(pl.Int64).alias("in_degree"))


class InDegrees:
    """Running in-degrees over batches of follow edges (``SNAPSHOT_SCHEMAS["follow_edges"]``
    columns; the rule: module docstring). ``count`` may be called from several threads."""

    def __init__(self, dense_ids: int = 0) -> None:
        """``dense_ids``: ids below it are counted in an array (``for_accounts`` chooses it)."""
        self._dense = np.zeros(dense_ids, dtype=np.int64)
        self._lock = threading.Lock()
        self._total = pl.DataFrame(schema=IN_DEGREE_SCHEMA)
        self._pending: list[pl.DataFrame] = []
        self._pending_rows = 0

    @classmethod
    def for_accounts(cls, user_ids: pl.Series) -> InDegrees:
        """Counters for the snapshot's accounts ``user_ids`` (dense if ``DENSE_FACTOR`` allows)."""
        largest = user_ids.max() if len(user_ids) else None
        if largest is None or largest >= DENSE_FACTOR * len(user_ids) + DENSE_SLACK:
            return cls(0)
        return cls(int(largest) + 1)

    def count(self, edges: pl.DataFrame) -> None:
        """Add ``edges``' active, non-self follows (a shard, or any batch of rows)."""
        followees = _active_followees(edges).collect().get_column("user_id").to_numpy()
        dense = (followees >= 0) & (followees < len(self._dense))
        counts = np.bincount(followees[dense]) if dense.any() else None
        rest = followees if counts is None else followees[~dense]
        grouped = _grouped(pl.LazyFrame({"user_id": rest})).collect() if len(rest) else None
        with self._lock:
            if counts is not None:
                self._dense[: len(counts)] += counts
            if grouped is not None:
                self._pending.append(grouped)
                self._pending_rows += grouped.height
                if self._pending_rows >= max(COMPACT_ROWS, self._total.height):
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
        """The counts so far: one row per followed account, sorted by ``user_id``."""
        with self._lock:
            self._compact()
            followed = np.flatnonzero(self._dense)
            dense = pl.DataFrame(
                {"user_id": followed, "in_degree": self._dense[followed]}, schema=IN_DEGREE_SCHEMA
            )
            # sparse ids are all outside the dense range: the two parts never share an id
            return pl.concat([dense, self._total]).sort("user_id")


def from_follow_edges(folder: Path) -> pl.DataFrame:
    """The in-degrees of a written snapshot ``folder``'s follow edges
    (``follow_edges/shard_id=*/*.parquet``), streamed: ``InDegrees.frame()``'s shape."""
    edges = pl.scan_parquet(folder / "follow_edges" / "*" / "*.parquet", hive_partitioning=False)
    return _grouped(_active_followees(edges)).collect(engine="streaming").sort("user_id")
