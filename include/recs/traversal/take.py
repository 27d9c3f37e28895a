"""Filter-and-take: a user's top ``top_k`` scored candidates and their output rows.

Order (ARCHITECTURE §1): ``score desc, mutual_count desc, candidate_id asc`` (dense ids are in
id order), a total order, so the result does not depend on the order candidates arrive in. A
bounded insertion buffer (``scratch.best_*``) holds the best so far; each kept row carries rank
1..k and up to ``followed_by_count`` first-hop follows that reached it, the first ones in the
user's sample order (``candidates.count_row``), ``-1`` padded.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from recs.traversal.jit import stage


class OutputRows(NamedTuple):
    """One entry per output row (user position, rank order): ``user`` int32 position in
    ``ShardInputs.user_ids``, ``candidate`` int32 dense id, ``mutual_count`` int32, ``score``
    float64, ``rank`` int32 (1..top_k), ``followed_by`` int32[rows * followed_by_count] dense
    ids (-1 padded), ``followed_by_n`` int32: how many of a row's followed_by are set."""

    user: np.ndarray
    candidate: np.ndarray
    mutual_count: np.ndarray
    score: np.ndarray
    rank: np.ndarray
    followed_by: np.ndarray
    followed_by_n: np.ndarray

    @classmethod
    def allocate(cls, capacity: int, followed_by_count: int) -> OutputRows:
        """Buffers for ``capacity`` rows. ``np.empty`` only reserves address space: pages are
        touched (and count in RSS) as rows are written."""
        rows = [np.empty(capacity, dtype=np.int32) for _ in range(5)]
        return cls(
            user=rows[0],
            candidate=rows[1],
            mutual_count=rows[2],
            score=np.empty(capacity, dtype=np.float64),
            rank=rows[3],
            followed_by=np.empty(max(1, capacity * followed_by_count), dtype=np.int32),
            followed_by_n=rows[4],
        )

    def tail(self, start: int, followed_by_count: int) -> OutputRows:
        """Views of the buffers from row ``start`` on (where the next chunk writes)."""
        return OutputRows(
            *(column[start:] for column in self[:5]),
            followed_by=self.followed_by[start * followed_by_count :],
            followed_by_n=self.followed_by_n[start:],
        )

    def head(self, rows: int, followed_by_count: int) -> OutputRows:
        """The first ``rows`` rows; ``followed_by`` shaped ``[rows, followed_by_count]``."""
        return OutputRows(
            *(column[:rows] for column in self[:5]),
            followed_by=self.followed_by[: rows * followed_by_count].reshape(
                rows, followed_by_count
            ),
            followed_by_n=self.followed_by_n[:rows],
        )


@stage
def ranks_before(score, count, node, other_score, other_count, other_node):  # pragma: no cover
    """True if candidate ``(score, count, node)`` ranks before the other one."""
    if score != other_score:
        return score > other_score
    return count > other_count or (count == other_count and node < other_node)


@stage
def insert_top_k(node, count, slot, score, n_best, top_k, scratch):  # pragma: no cover
    """Offer candidate ``node`` (``count`` mutuals, table ``slot``, ``score``) to the best-first
    buffer of ``n_best`` (< ``top_k`` or full) entries; returns the new length."""
    pos = n_best
    while pos > 0:
        if ranks_before(
            score,
            count,
            node,
            scratch.best_score[pos - 1],
            scratch.best_count[pos - 1],
            scratch.best_node[pos - 1],
        ):
            pos -= 1
        else:
            break
    if pos >= top_k:
        return n_best
    last = min(n_best, top_k - 1)
    for j in range(last, pos, -1):
        scratch.best_node[j] = scratch.best_node[j - 1]
        scratch.best_count[j] = scratch.best_count[j - 1]
        scratch.best_slot[j] = scratch.best_slot[j - 1]
        scratch.best_score[j] = scratch.best_score[j - 1]
    scratch.best_node[pos] = node
    scratch.best_count[pos] = count
    scratch.best_slot[pos] = slot
    scratch.best_score[pos] = score
    return min(n_best + 1, top_k)


@stage
def emit_rows(user, n_best, followed_by_count, scratch, out, n_rows):  # pragma: no cover
    """Write the user's ``n_best`` rows at ``out[n_rows:]`` in rank order; returns the new
    ``n_rows``."""
    fb = followed_by_count
    for r in range(n_best):
        h = scratch.best_slot[r]
        count = scratch.best_count[r]
        out.user[n_rows] = user
        out.candidate[n_rows] = scratch.best_node[r]
        out.mutual_count[n_rows] = count
        out.score[n_rows] = scratch.best_score[r]
        out.rank[n_rows] = r + 1
        n_fb = min(count, fb)
        out.followed_by_n[n_rows] = n_fb
        for k in range(fb):
            out.followed_by[n_rows * fb + k] = scratch.reached_by[h * fb + k] if k < n_fb else -1
        n_rows += 1
    return n_rows
