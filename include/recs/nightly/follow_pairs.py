"""The snapshot's rule for follow edges: one row per ``(follower_id, followee_id)``, neither NULL.

The pair is ``follow_edges``' primary key in the store (``recs.store.schema``), and the dbt models
count follows with ``count(*)`` on that rule (``int_user_in_degrees_counted``), so a snapshot
partition that breaks it is refused before it is written, never counted twice. The check is one
vectorised pass over a partition that is already in key order (the SQLite store scans in key
order) and a sort only when it is not. A NULL id is refused too: ``stg_follow_edges`` would drop
the row unseen (``follower_id <> followee_id`` is NULL), so dbt's not_null tests never see it.

An edge naming an account the snapshot's users lack breaks no rule (the store has no foreign
keys, and such an edge only ever adds an exclusion): ``UnknownAccounts`` counts those rows as the
freeze reads them, for the manifest and a warning (dbt's relationships tests on
``stg_follow_edges`` reported them at severity warn, with two joins of every edge: 5.4 s each at
50 M edges, on the build's critical path; here, one hash probe per id column of each chunk).

``PAIRS_CHECKED`` marks a retained manifest whose partitions were checked when frozen; one made by
an earlier version (or received from the run store) without it is checked when reused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from recs.errors import LiveStoreError

KEYS = ["follower_id", "followee_id"]
PAIRS_CHECKED = "unique"
"""``manifest["follow_edges_pairs"]`` of a retained snapshot whose partitions passed ``checked``."""


class Origin(NamedTuple):
    """Where the follow edges being checked came from, for the error: its name and the remedy."""

    name: str
    remedy: str


LIVE_STORE = Origin(
    "the live store",
    "the pair is the table's primary key, so one follow is one row; mend those rows (or load the "
    "store with `recs import`) and freeze again",
)


def retained(path: Path) -> Origin:
    """The origin of a retained snapshot's follow edges (made by an earlier version)."""
    return Origin(
        f"the retained snapshot {path}",
        "make it again from the live store with --rebuild-snapshot (the DAG's rebuild_snapshot "
        "param)",
    )


def refuse_nulls(edges: pl.DataFrame, origin: Origin) -> pl.DataFrame:
    """``edges``, unchanged, unless a follower_id or a followee_id is NULL: then a
    ``LiveStoreError`` naming ``origin``, how many rows and one example (the null counts are
    Arrow metadata: free when none). Called on the rows as read, before any filter (a NULL id
    makes ``is_in`` NULL, so a filter would drop the row unseen)."""
    if not (edges["follower_id"].null_count() or edges["followee_id"].null_count()):
        return edges
    nulls = edges.filter(pl.col("follower_id").is_null() | pl.col("followee_id").is_null())
    first = nulls.row(0, named=True)
    raise LiveStoreError(
        f"{origin.name} holds follow-edge rows with a NULL follower_id or followee_id ("
        f"{nulls.height:,} in one read; e.g. ({first['follower_id']}, {first['followee_id']})); "
        f"{origin.remedy}"
    )


def checked(part: pl.DataFrame, shard_id: int, origin: Origin) -> pl.DataFrame:
    """``part`` (follow edges of shard ``shard_id``, any row order) in key order, sorted only if it
    is not already. Raises ``LiveStoreError`` naming ``origin`` if an id is NULL
    (``refuse_nulls``) or a pair appears more than once (with the shard, how many of its rows
    and one example; other shards are not counted: the first partition that breaks the rule
    stops the freeze)."""
    refuse_nulls(part, origin)
    order = pair_order(part)
    if order == "unsorted":
        part = part.sort(KEYS)
        order = pair_order(part)
    if order == "repeated":
        repeated = part.filter(pl.struct(*KEYS).is_duplicated())
        first = repeated.row(0, named=True)
        raise LiveStoreError(
            f"{origin.name} holds {repeated.height:,} follow-edge rows whose (follower_id, "
            f"followee_id) pair appears more than once (shard {shard_id:03d}; e.g. "
            f"({first['follower_id']}, {first['followee_id']})); {origin.remedy}"
        )
    return part


def pair_order(part: pl.DataFrame) -> str:
    """How NULL-free follow edges are ordered by ``(follower_id, followee_id)``, in one vectorised
    pass (a fifth of the time of sorting 3 M rows): ``strict`` (ascending, every pair once),
    ``repeated`` (ascending, a pair more than once) or ``unsorted``."""
    follower = part["follower_id"].to_numpy()
    followee = part["followee_id"].to_numpy()
    same = follower[1:] == follower[:-1]
    if not ((follower[1:] > follower[:-1]) | (same & (followee[1:] >= followee[:-1]))).all():
        return "unsorted"
    return "repeated" if (same & (followee[1:] == followee[:-1])).any() else "strict"


BITMAP_IDS_PER_USER = 16
"""``UnknownAccounts`` looks ids up in a bitmap (one byte per id from 0 to the largest user id)
when that is at most this many bytes per user: at 1 M users it tallies a 1 M-edge chunk in
about a third of the time of Polars' ``is_in``, which hashes every user id again for each chunk
(``bench/README.md``, "The whole night at 1 M users"). Sparser ids (e.g. 64-bit snowflakes)
are looked up with ``is_in``."""


class UnknownAccounts:
    """Counts follow edges (self-follows aside) whose follower_id or followee_id is not a
    ``user_ids`` value (the snapshot's users), chunk by chunk; keeps the smallest such pair as
    an example."""

    def __init__(self, user_ids: pl.Series) -> None:
        self._known: pl.Series | None = None  # the ids as one list, for is_in: sparse ids only
        self._bitmap: np.ndarray | None = None
        ids = user_ids.drop_nulls().to_numpy()
        if ids.size and ids.min() >= 0 and ids.max() < BITMAP_IDS_PER_USER * ids.size:
            self._bitmap = np.zeros(int(ids.max()) + 1, dtype=np.bool_)
            self._bitmap[ids] = True
        else:
            self._known = user_ids.implode()
        self.rows = 0
        self.example: list[int] | None = None

    def _known_by_bitmap(self, chunk: pl.DataFrame) -> np.ndarray:
        """Whether both ids of each row of ``chunk`` (no NULLs: ``refuse_nulls``) are user ids."""
        known = np.ones(chunk.height, dtype=np.bool_)
        for column in KEYS:
            ids = chunk[column].to_numpy()
            inside = (ids >= 0) & (ids < self._bitmap.size)
            if inside.all():
                known &= self._bitmap[ids]
            else:
                known &= inside
                known[inside] &= self._bitmap[ids[inside]]
        return known

    def tally(self, chunk: pl.DataFrame) -> pl.DataFrame:
        """Count ``chunk``'s edges naming an unknown account; return ``chunk`` unchanged."""
        if self._bitmap is None:
            known = pl.col("follower_id").is_in(self._known) & pl.col("followee_id").is_in(
                self._known
            )
        else:
            known = pl.lit(pl.Series(self._known_by_bitmap(chunk)))
        unknown = ~known & (pl.col("follower_id") != pl.col("followee_id"))  # stg drops self-loops
        found = chunk.filter(unknown).select(KEYS)
        if found.height:
            self.rows += found.height
            first = list(found.sort(KEYS).row(0))  # the smallest pair: whatever the read order
            self.example = first if self.example is None else min(self.example, first)
        return chunk

    def add(self, other: UnknownAccounts) -> None:
        """Count ``other``'s rows too (another range of the same read), keeping the smaller
        example."""
        self.rows += other.rows
        if other.example is not None:
            examples = [other.example] if self.example is None else [self.example, other.example]
            self.example = min(examples)

    def as_dict(self) -> dict[str, Any]:
        """``{"rows", "example"}`` for the manifest (``example``: a [follower_id, followee_id]
        pair, or None when every edge names known accounts)."""
        return {"rows": self.rows, "example": self.example}
