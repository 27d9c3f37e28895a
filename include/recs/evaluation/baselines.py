"""The classic link-prediction baselines, computed over the whole (uncapped) training graph.

For a test user ``u`` and a candidate ``v`` (never ``u``, never an account ``u`` already follows
in training), with ``A`` the training adjacency (``A[u, z] = 1`` if ``u`` follows ``z``),
``Γ(u)`` = the accounts ``u`` follows and ``Γ⁻(v)`` = the accounts following ``v``; each sum is
over the intermediate accounts ``z`` with ``u → z → v`` (Liben-Nowell & Kleinberg, "The
link-prediction problem for social networks", JASIST 2007; Zhou, Lü & Zhang, "Predicting
missing links via local information", EPJ B 2009, for resource allocation):

- ``common_neighbours``: ``Σ 1`` = ``(A A)[u, v]``, the product's uncapped ``mutual_count``;
- ``adamic_adar``: ``Σ 1 / log(deg z)``; ``resource_allocation``: ``Σ 1 / deg z``, where
  ``deg z`` = ``z``'s follows plus followers (>= 2 for any intermediate account);
- ``jaccard``: ``|Γ(u) ∩ Γ⁻(v)| / |Γ(u) ∪ Γ⁻(v)|``;
- ``global_popularity``: ``v``'s follower count (its in-degree), the same list for everyone.

Only candidates with a positive score are listed (a user two hops from nobody gets an empty
list, except from popularity). Ties: score desc, then candidate id asc. Vectorised with SciPy
sparse products over chunks of test users, each chunk's scores dense for the top-k.
"""

from __future__ import annotations

import numpy as np
import polars as pl

BASELINES = (
    "common_neighbours", "adamic_adar", "resource_allocation", "jaccard", "global_popularity",
)
#: Test users per chunk: bounds the dense score block at CHUNK_USERS x accounts float64.
CHUNK_USERS = 256


def adjacency(train: pl.DataFrame, user_ids: np.ndarray):
    """``A`` as a SciPy CSR matrix (float64, accounts x accounts, in ``user_ids`` order)."""
    from scipy import sparse

    n = len(user_ids)
    rows = np.searchsorted(user_ids, train["follower_id"].to_numpy())
    cols = np.searchsorted(user_ids, train["followee_id"].to_numpy())
    return sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))


def _top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``scores`` (excluded entries -inf or 0), the positive entries in (score desc,
    column asc) order, at most ``k``: ``(row, column)`` arrays in row then rank order."""
    n_rows, n_cols = scores.shape
    k = min(k, n_cols)
    if n_rows == 0 or k == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1]  # the k-th largest score per row
    threshold = np.maximum(kth, np.nextafter(0.0, 1.0))[:, None]
    rows, cols = np.nonzero(scores >= threshold)  # ties at the k-th score all come along
    order = np.lexsort((cols, -scores[rows, cols], rows))
    rows, cols = rows[order], cols[order]
    starts = np.searchsorted(rows, np.arange(n_rows))
    rank = np.arange(len(rows)) - starts[rows]
    keep = rank < k
    return rows[keep], cols[keep]


def baseline_lists(
    name: str, train: pl.DataFrame, user_ids: np.ndarray, test_users: np.ndarray, k: int,
    matrix=None,
) -> pl.DataFrame:
    """Top-``k`` lists of baseline ``name`` for ``test_users``: ``user_id`` Int64,
    ``candidate_id`` Int64, ``rank`` Int32 (1..k), sorted by user then rank. ``matrix``: the
    ``adjacency`` if already built. Raises ``ValueError`` for an unknown name."""
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}: one of {', '.join(BASELINES)}")
    a = adjacency(train, user_ids) if matrix is None else matrix
    out_degree = np.asarray(a.sum(axis=1)).ravel()
    in_degree = np.asarray(a.sum(axis=0)).ravel()
    degree = out_degree + in_degree
    positions = np.searchsorted(user_ids, test_users)
    if name == "adamic_adar":
        weight = np.zeros_like(degree)
        weight[degree > 1] = 1.0 / np.log(degree[degree > 1])
    elif name == "resource_allocation":
        weight = np.zeros_like(degree)
        weight[degree > 0] = 1.0 / degree[degree > 0]
    else:
        weight = None
    user_out, cand_out, rank_out = [], [], []
    for begin in range(0, len(positions), CHUNK_USERS):
        chunk = positions[begin : begin + CHUNK_USERS]
        rows = a[chunk]
        if name == "global_popularity":
            scores = np.broadcast_to(in_degree + 1.0, (len(chunk), len(user_ids))).copy()
            # +1: an account nobody follows is still listed (after every followed one)
        else:
            weighted = rows if weight is None else rows.multiply(weight[None, :]).tocsr()
            scores = (weighted @ a).toarray()
            if name == "jaccard":
                union = out_degree[chunk][:, None] + in_degree[None, :] - scores
                np.divide(scores, union, out=scores, where=union > 0)
        scores[rows.nonzero()] = 0.0  # already followed
        scores[np.arange(len(chunk)), chunk] = 0.0  # self
        r, c = _top_k(scores, k)
        user_out.append(test_users[begin + r])
        cand_out.append(user_ids[c])
        starts = np.searchsorted(r, np.arange(len(chunk)))
        rank_out.append(np.arange(len(r)) - starts[r] + 1)
    if not user_out:
        return pl.DataFrame(schema={"user_id": pl.Int64, "candidate_id": pl.Int64,
                                    "rank": pl.Int32})
    return pl.DataFrame({
        "user_id": np.concatenate(user_out).astype(np.int64),
        "candidate_id": np.concatenate(cand_out).astype(np.int64),
        "rank": np.concatenate(rank_out).astype(np.int32),
    })
