"""A directed follow graph in memory as CSR adjacency: what the demo generators build and load.

Light on memory (int32 positions while they fit: 4 bytes per edge) so a 50 M-edge synthetic
graph is generated and loaded on one machine. Positions index ``user_ids``; edges enumerate in
``(follower_id, followee_id)`` order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from recs.arrays import sorted_unique

EDGE_CHUNK_ROWS = 1 << 21
"""Edges per generated/written batch (fixed: the edge timestamps' random streams follow it)."""


@dataclass(frozen=True)
class FollowGraph:
    """A directed follow graph as CSR adjacency over user *positions* ``0 .. n-1``.

    ``user_ids`` (int64, sorted, unique) maps a position to its user id. The followees of the
    user at position ``p`` are ``indices[indptr[p]:indptr[p+1]]`` (positions, ascending), so
    edges enumerate in (follower_id, followee_id) order. ``indices`` is int32 while ``n`` fits,
    to halve memory on 50 M-edge graphs. No self-loops, no duplicate pairs.
    """

    user_ids: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray

    @classmethod
    def from_edges(
        cls, user_ids: np.ndarray, follower_ids: np.ndarray, followee_ids: np.ndarray
    ) -> FollowGraph:
        """Build from id arrays; ``user_ids`` must contain every id of the edges.

        Self-loops and duplicate pairs are dropped.
        """
        user_ids = np.asarray(user_ids, dtype=np.int64)
        n = len(user_ids)
        src = np.searchsorted(user_ids, np.asarray(follower_ids, dtype=np.int64))
        dst = np.searchsorted(user_ids, np.asarray(followee_ids, dtype=np.int64))
        if len(src) and (
            src.max() >= n
            or dst.max() >= n
            or not np.array_equal(user_ids[src], follower_ids)
            or not np.array_equal(user_ids[dst], followee_ids)
        ):
            raise ValueError("an edge endpoint is missing from user_ids")
        keys = sorted_unique(src.astype(np.int64) * n + dst)
        src, dst = keys // max(n, 1), keys % max(n, 1)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
        return cls(user_ids, indptr, dst.astype(position_dtype(n)))

    @property
    def n_users(self) -> int:
        return len(self.user_ids)

    @property
    def n_edges(self) -> int:
        return int(self.indptr[-1])

    def out_degree(self) -> np.ndarray:
        """Follows per user position (int64)."""
        return np.diff(self.indptr)

    def in_degree(self) -> np.ndarray:
        """Followers per user position (int64)."""
        return np.bincount(self.indices, minlength=self.n_users).astype(np.int64)

    def followees(self, position: int) -> np.ndarray:
        return self.indices[self.indptr[position] : self.indptr[position + 1]]

    def has_edge(self, follower: int, followee: int) -> bool:
        """Whether position ``follower`` follows position ``followee`` (binary search)."""
        row = self.followees(follower)
        at = int(np.searchsorted(row, followee))
        return at < len(row) and int(row[at]) == followee

    def edge_chunks(self, chunk_rows: int = EDGE_CHUNK_ROWS) -> Iterator[tuple[np.ndarray, ...]]:
        """Yield ``(follower_positions, followee_positions)`` for consecutive edge ranges."""
        for start in range(0, self.n_edges, chunk_rows):
            stop = min(start + chunk_rows, self.n_edges)
            first = int(np.searchsorted(self.indptr, start, side="right")) - 1
            last = int(np.searchsorted(self.indptr, stop - 1, side="right")) - 1
            bounds = np.clip(self.indptr[first : last + 2], start, stop)
            src = np.repeat(np.arange(first, last + 1, dtype=np.int64), np.diff(bounds))
            yield src, self.indices[start:stop].astype(np.int64)


def position_dtype(n_users: int) -> type:
    """int32 for positions while ``n_users`` fits, else int64."""
    return np.int32 if n_users < 2**31 else np.int64
