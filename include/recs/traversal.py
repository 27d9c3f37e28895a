"""One shard's recommendations: capped two-hop traversal, pre-rank filters, ranking, top-k.

The flow for the shard's eligible users (ARCHITECTURE §1 and §3; the design document's
"Bounded BFS", "Candidate Pruning and Mutual-Connection Scorer" and batch driver):

1. **candidate generation** — first hop: each user's active follows from the shard's own
   snapshot partition, in sample order, cut to ``hop1_cap`` (``first_hop``); second hop: the
   capped CSR rows of those follows (``recs.graph``, ``hop2_cap`` each). ``mutual_count`` of a
   candidate = the number of expanded first-hop follows whose row contains it.
2. **pre-rank filters** (predicates) — drop the user, every id in the user's
   ``follow_exclusions`` (following, pending, blocked either way, muted, dismissed) and the
   user's own follows of any status in the snapshot, accounts not ``is_recommendable`` in
   ``candidate_profiles`` (suspended, deactivated, not discoverable; missing counts as not
   recommendable), and ``mutual_count < min_mutual_count``; then keep the top
   ``max_candidates_to_score`` by ``(mutual_count desc, candidate_id asc)``.
3. **ranking** — ``score = mutual_weight * min(mutual_count / mutual_saturation, 1)
   + activity_weight * 0.5 ** (days_inactive / half_life_days)`` (the design's
   ``score_candidate`` / ``activity_recency_score``), ``days_inactive = max(0, as_of -
   last_active_at)`` in days, activity term 0 when ``last_active_at`` is null.
4. **filter-and-take** — top ``top_k`` by ``(score desc, mutual_count desc, candidate_id asc)``,
   rank 1..k, with up to ``followed_by_count`` first-hop follows that reached the candidate
   (the first ones in the user's sample order) as the "followed by" explanation.

Why a compiled kernel, and why it also ranks: ARCHITECTURE §3 measured a hash group-by over all
(user, candidate) pairs at ~2.5 M traversals/s per core against ~60 M/s for a per-user counting
loop over a CSR. The loop here (``_recommend``, Numba) runs over all users of a chunk with no
per-user Python: a dense ``int32`` slot array over node ids plus a touched list reset per user
(never a hash table), exclusions as a per-user stamp array, the ``max_candidates_to_score`` cut
by a count histogram, and the top-k by a bounded insertion buffer, so it emits only the output
rows. Ranking in Polars instead (join, score, sort, take) means first emitting every scored
candidate: on the 200 k-user benchmark graph 1.0 M rows per 50 k-user shard (2.3x the output)
took 0.26 s single-threaded, about 60% of the kernel's own time, and with the design's caps on
a denser graph it is up to 25x the output (500 scored vs 20 kept per user). So the kernel
applies the blend; the part of the score that needs a join (the activity term per account,
from ``last_active_at``) is a Polars expression evaluated once per account while reading
``candidate_profiles``. Polars does all I/O, joins and output assembly.

Memory: the shard's partition, exclusions and output, plus O(n_nodes) scratch (``int32`` slots
and stamps, ``bool`` not-recommendable, ``float64`` activity, the id map: an ``int32`` table
over the id span or a hash table) and the memory-mapped CSR; no edge array of the whole graph
is copied.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from recs.contracts import (
    EXPORT_SCHEMAS,
    RECOMMENDATION_SCHEMA,
    SNAPSHOT_SCHEMAS,
    check_schema,
)
from recs.errors import RecsError, RunNotFoundError
from recs.graph import CappedGraph, DenseIndex, load_graph, partition_files
from recs.manifest import write_json
from recs.sampling import sample_keys
from recs.sharding import shard_array

log = logging.getLogger("recs.traversal")

#: Users per kernel call: bounds the per-call output buffers and paces progress logging.
USERS_PER_CHUNK = 65_536
_MICROS_PER_DAY = 86_400_000_000


class ShardMismatchError(RecsError):
    """An eligible user filed under a shard other than the stable shard function's."""


class StaleGraphError(RecsError):
    """The run's graph was built with a smaller ``hop2_cap`` or another ``sample_seed``."""


# --- candidate generation inputs ----------------------------------------------------------


@dataclass(frozen=True)
class ShardInputs:
    """The per-user inputs of one shard, as CSR arrays indexed by user position.

    ``user_ids`` int64[n] sorted eligible user ids; ``user_dense`` int32[n] their dense graph
    ids (-1 if not in ``users``); ``hop1_ptr`` int64[n+1] / ``hop1_nodes`` int32: each user's
    first hop (dense ids, sample order, at most ``hop1_cap``); ``excl_ptr`` int64[n+1] /
    ``excl_nodes`` int32: dense ids each user must not be recommended.
    """

    user_ids: np.ndarray
    user_dense: np.ndarray
    hop1_ptr: np.ndarray
    hop1_nodes: np.ndarray
    excl_ptr: np.ndarray
    excl_nodes: np.ndarray


def _csr_ptr(rows: np.ndarray, n_rows: int) -> np.ndarray:
    ptr = np.zeros(n_rows + 1, dtype=np.int64)
    if n_rows:
        np.cumsum(np.bincount(rows, minlength=n_rows), out=ptr[1:])
    return ptr


def read_partition(root: Path, shard_id: int, columns: list[str], schema: dict):
    """All rows of ``root/shard_id=<shard_id>/*.parquet`` as a Polars frame (``columns``).

    The ``shard_id=N`` folder may be zero-padded or not; a shard without a folder or files
    yields an empty frame with ``schema``'s dtypes (``{column: polars dtype}``).
    """
    import polars as pl

    files = partition_files(root).get(int(shard_id), [])
    if not files:
        return pl.DataFrame(schema={c: schema[c] for c in columns})
    return pl.concat([pl.read_parquet(f, columns=columns) for f in files], how="vertical")


def eligible_user_ids(paths, shard_id: int, shard_count: int) -> np.ndarray:
    """Sorted unique eligible user ids (``int64``) of one shard, from the dbt export.

    Raises ``ShardMismatchError`` if a user's stable shard is not ``shard_id`` (the SQL and
    Python shard functions disagree, so its follows would be in another partition).
    """
    frame = read_partition(
        Path(paths.exports_dir) / "eligible_users", shard_id, ["user_id"],
        EXPORT_SCHEMAS["eligible_users"],
    )
    user_ids = np.unique(frame["user_id"].drop_nulls().to_numpy().astype(np.int64))
    wrong = user_ids[shard_array(user_ids, shard_count) != shard_id] if len(user_ids) else user_ids
    if len(wrong):
        raise ShardMismatchError(
            f"{len(wrong)} eligible users of shard {shard_id} belong to another shard "
            f"(e.g. user {int(wrong[0])}): the export and recs.sharding disagree"
        )
    return user_ids


def first_hop(
    user_positions: np.ndarray,
    followers: np.ndarray,
    followees: np.ndarray,
    followee_dense: np.ndarray,
    n_users: int,
    hop1_cap: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """First-hop CSR of the shard's users: ``(hop1_ptr int64[n+1], hop1_nodes int32)``.

    One entry per ACTIVE follow edge of the shard: ``user_positions`` (int64, the follower's
    position among the shard's sorted users, -1 if not eligible), ``followers`` /
    ``followees`` (original ids, for the sample key) and ``followee_dense`` (graph ids, -1 if
    not in the graph). Ineligible followers, unknown followees, self-follows and duplicate pairs
    are dropped; each user's remaining follows are ordered by sample key (``recs.sampling``)
    and cut to ``hop1_cap``.
    """
    keep = (user_positions >= 0) & (followee_dense >= 0) & (followers != followees)
    if n_users == 0 or not keep.any():
        return np.zeros(n_users + 1, dtype=np.int64), np.zeros(0, dtype=np.int32)
    keys = sample_keys(followers[keep], followees[keep], seed)
    return _capped_rows(
        user_positions[keep], keys, followee_dense[keep].astype(np.int32), n_users, hop1_cap
    )


@njit(cache=True, nogil=True)
def _capped_rows(rows, keys, values, n_rows, cap):  # pragma: no cover - compiled
    """Group ``values`` by ``rows``, order each group by ``(key, value)``, drop duplicate
    values, keep the first ``cap``: returns ``(ptr int64[n_rows+1], values int32)``.

    A counting sort by row, then a small sort per row (insertion sort up to 32 entries), so
    the cost does not depend on the input order and there is no global sort.
    """
    starts = np.zeros(n_rows + 1, dtype=np.int64)
    for i in range(len(rows)):
        starts[rows[i] + 1] += 1
    longest = 0
    for r in range(n_rows):
        longest = max(longest, starts[r + 1])
        starts[r + 1] += starts[r]
    fill = starts[:-1].copy()
    group_keys = np.empty(len(rows), dtype=np.uint64)
    group_values = np.empty(len(rows), dtype=np.int32)
    for i in range(len(rows)):
        at = fill[rows[i]]
        group_keys[at] = keys[i]
        group_values[at] = values[i]
        fill[rows[i]] += 1
    sorted_keys = np.empty(longest, dtype=np.uint64)
    sorted_values = np.empty(longest, dtype=np.int32)
    ptr = np.zeros(n_rows + 1, dtype=np.int64)
    out = np.empty(len(rows), dtype=np.int32)
    n_out = 0
    for r in range(n_rows):
        start = starts[r]
        length = starts[r + 1] - start
        if length > 32:
            order = np.argsort(group_keys[start : start + length])
            for j in range(length):
                sorted_keys[j] = group_keys[start + order[j]]
                sorted_values[j] = group_values[start + order[j]]
        else:
            for j in range(length):
                sorted_keys[j] = group_keys[start + j]
                sorted_values[j] = group_values[start + j]
        # insertion pass: sorts short groups; in long ones only orders equal keys by value
        for j in range(1, length):
            key = sorted_keys[j]
            value = sorted_values[j]
            k = j
            while k > 0 and (
                sorted_keys[k - 1] > key
                or (sorted_keys[k - 1] == key and sorted_values[k - 1] > value)
            ):
                sorted_keys[k] = sorted_keys[k - 1]
                sorted_values[k] = sorted_values[k - 1]
                k -= 1
            sorted_keys[k] = key
            sorted_values[k] = value
        taken = 0
        for j in range(length):
            if taken >= cap:
                break
            if j > 0 and sorted_values[j] == sorted_values[j - 1]:
                continue  # a duplicate pair: equal values have equal keys, so are adjacent
            out[n_out] = sorted_values[j]
            n_out += 1
            taken += 1
        ptr[r + 1] = n_out
    return ptr, out[:n_out].copy()


def exclusion_lists(
    user_positions: np.ndarray, excluded_dense: np.ndarray, n_users: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exclusion CSR of the shard's users: ``(excl_ptr int64[n+1], excl_nodes int32)``.

    Pair ``i``: the user at ``user_positions[i]`` must not be recommended the graph node
    ``excluded_dense[i]``. Pairs with a -1 on either side (another shard's user, an account
    missing from the graph, which can never be a candidate) are dropped.
    """
    keep = (user_positions >= 0) & (excluded_dense >= 0)
    pos, dst = user_positions[keep], excluded_dense[keep].astype(np.int32)
    ptr = _csr_ptr(pos, n_users)
    if n_users == 0 or len(pos) == 0:
        return ptr, np.zeros(0, dtype=np.int32)
    return ptr, _bucket_by_row(pos, dst, ptr)


@njit(cache=True, nogil=True)
def _bucket_by_row(rows, values, ptr):  # pragma: no cover - compiled
    """Counting sort of ``values`` by ``rows`` into CSR order (stable, O(n))."""
    out = np.empty(len(values), dtype=np.int32)
    fill = ptr[:-1].copy()
    for i in range(len(rows)):
        out[fill[rows[i]]] = values[i]
        fill[rows[i]] += 1
    return out


def candidate_signals(
    profiles_path: Path, graph: CappedGraph, as_of: dt.datetime, half_life_days: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per-node arrays from ``candidate_profiles.parquet``, read in record batches.

    Returns ``(not_recommendable bool[n_nodes], activity float64[n_nodes])``:
    ``not_recommendable`` is True unless the account has a profile row with
    ``is_recommendable`` true; ``activity = 0.5 ** (days_inactive / half_life_days)`` with
    ``days_inactive = max(0, as_of - last_active_at)`` in days (``as_of`` naive UTC), 0 for a
    null ``last_active_at`` or a missing profile (the design's ``activity_recency_score``).
    Polars evaluates it (division by a literal as a multiplication by its reciprocal, its own
    ``pow``), so it may differ from a scalar ``0.5 ** x`` in the last bit; reruns are
    bit-identical.
    Raises ``RunNotFoundError`` if the file is missing.
    """
    import polars as pl
    import pyarrow.parquet as pq

    profiles_path = Path(profiles_path)
    if not profiles_path.exists():
        raise RunNotFoundError(f"missing export {profiles_path}: run build_models first")
    not_recommendable = np.ones(graph.n_nodes, dtype=bool)
    activity = np.zeros(graph.n_nodes, dtype=np.float64)
    days_inactive = (
        (pl.lit(as_of, dtype=pl.Datetime("us")) - pl.col("last_active_at")).dt.total_microseconds()
        / _MICROS_PER_DAY
    ).clip(lower_bound=0.0)
    activity_expr = pl.lit(0.5).pow(days_inactive / half_life_days).fill_null(0.0)
    columns = ["candidate_id", "is_recommendable", "last_active_at"]
    for batch in pq.ParquetFile(profiles_path).iter_batches(batch_size=1 << 20, columns=columns):
        frame = pl.from_arrow(batch).with_columns(
            pl.col("last_active_at").cast(pl.Datetime("us"))
        ).select(
            pl.col("candidate_id").cast(pl.Int64),
            pl.col("is_recommendable").fill_null(False),
            activity_expr.alias("activity"),
        )
        dense = graph.dense_ids(frame["candidate_id"].to_numpy())
        known = dense >= 0
        not_recommendable[dense[known]] = ~frame["is_recommendable"].to_numpy()[known]
        activity[dense[known]] = frame["activity"].to_numpy()[known]
    return not_recommendable, activity


def shard_inputs(paths, settings, shard_id: int, graph: CappedGraph) -> ShardInputs:
    """Read the shard's eligible users, its snapshot partition and its exclusions.

    Inputs: ``exports/eligible_users/shard_id=N``, ``snapshot/follow_edges/shard_id=NNN``
    (both statuses) and ``exports/follow_exclusions/shard_id=N``; see ``ShardInputs``.
    """
    user_ids = eligible_user_ids(paths, shard_id, settings.shard_count)
    n_users = len(user_ids)
    positions = DenseIndex(user_ids)
    edges = read_partition(
        Path(paths.snapshot_dir) / "follow_edges", shard_id,
        ["follower_id", "followee_id", "status"], SNAPSHOT_SCHEMAS["follow_edges"],
    )
    followers = edges["follower_id"].to_numpy().astype(np.int64, copy=False)
    followees = edges["followee_id"].to_numpy().astype(np.int64, copy=False)
    active = (edges["status"] == "active").fill_null(False).to_numpy()
    del edges
    follower_pos = positions(followers)
    followee_dense = graph.dense_ids(followees)
    hop1_ptr, hop1_nodes = first_hop(
        follower_pos[active], followers[active], followees[active], followee_dense[active],
        n_users, settings.hop1_cap, settings.sample_seed,
    )
    exclusions = read_partition(
        Path(paths.exports_dir) / "follow_exclusions", shard_id, ["user_id", "excluded_id"],
        EXPORT_SCHEMAS["follow_exclusions"],
    ).drop_nulls()
    # The export lists following and pending too; the snapshot's own follows (any status) are
    # added as well, so a follow is never recommended even if the two ever disagree.
    excl_ptr, excl_nodes = exclusion_lists(
        np.concatenate([positions(exclusions["user_id"].to_numpy()), follower_pos]),
        np.concatenate([graph.dense_ids(exclusions["excluded_id"].to_numpy()), followee_dense]),
        n_users,
    )
    return ShardInputs(
        user_ids=user_ids,
        user_dense=graph.dense_ids(user_ids).astype(np.int32),
        hop1_ptr=hop1_ptr,
        hop1_nodes=hop1_nodes,
        excl_ptr=excl_ptr,
        excl_nodes=excl_nodes,
    )


# --- the compiled kernel -------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _recommend(
    user_begin, user_end,
    user_dense, hop1_ptr, hop1_nodes, excl_ptr, excl_nodes,
    indptr, indices, not_recommendable, activity,
    hop2_cap, min_mutual_count, max_candidates, top_k, followed_by_count,
    mutual_weight, mutual_saturation, activity_weight,
    slot, stamp, touched, counts, reached_by, passing, tie_nodes, tie_slots, histogram,
    best_slot, best_score,
    out_user, out_candidate, out_mutual, out_score, out_rank, out_followed_by, out_followed_n,
):  # pragma: no cover - compiled; exercised through traverse_shard and the reference tests
    """Candidate generation, pre-rank filters, ranking and top-k for users [begin, end).

    ``slot`` (int32[n_nodes], all -1 between users) maps a node to its position in
    ``touched``; ``stamp`` (int32[n_nodes]) marks the current user's exclusions with
    ``user + 1`` (user positions are unique across chunks). Writes rows in (user, rank)
    order; returns (rows, traversals).
    """
    n_rows = 0
    traversals = 0
    fb = followed_by_count
    for user in range(user_begin, user_end):
        mark = user + 1
        if user_dense[user] >= 0:
            stamp[user_dense[user]] = mark
        for e in range(excl_ptr[user], excl_ptr[user + 1]):
            stamp[excl_nodes[e]] = mark

        # candidate generation: count each expanded first-hop row once per candidate
        n_touched = 0
        for p in range(hop1_ptr[user], hop1_ptr[user + 1]):
            friend = hop1_nodes[p]
            start = indptr[friend]
            end = min(indptr[friend + 1], start + hop2_cap)
            traversals += end - start
            for q in range(start, end):
                node = indices[q]
                s = slot[node]
                if s < 0:
                    s = n_touched
                    slot[node] = s
                    touched[s] = node
                    counts[s] = 0
                    n_touched += 1
                k = counts[s]
                if k < fb:
                    reached_by[s * fb + k] = friend
                counts[s] = k + 1

        # pre-rank filters; reset the slots for the next user
        n_passing = 0
        max_count = 0
        for s in range(n_touched):
            node = touched[s]
            slot[node] = -1
            c = counts[s]
            if c >= min_mutual_count and stamp[node] != mark and not not_recommendable[node]:
                passing[n_passing] = s
                n_passing += 1
                if c > max_count:
                    max_count = c

        # keep the top max_candidates by (mutual_count desc, candidate asc)
        n_selected = n_passing
        if n_passing > max_candidates:
            for c in range(max_count + 1):
                histogram[c] = 0
            for i in range(n_passing):
                histogram[counts[passing[i]]] += 1
            threshold = max_count
            above = 0
            while above + histogram[threshold] < max_candidates:
                above += histogram[threshold]
                threshold -= 1
            n_selected = 0
            n_ties = 0
            for i in range(n_passing):
                s = passing[i]
                if counts[s] > threshold:
                    passing[n_selected] = s
                    n_selected += 1
                elif counts[s] == threshold:
                    tie_nodes[n_ties] = touched[s]
                    tie_slots[n_ties] = s
                    n_ties += 1
            order = np.argsort(tie_nodes[:n_ties])
            for i in range(max_candidates - n_selected):
                passing[n_selected] = tie_slots[order[i]]
                n_selected += 1

        # ranking and filter-and-take: bounded insertion buffer ordered best first
        n_best = 0
        for i in range(n_selected):
            s = passing[i]
            node = touched[s]
            c = counts[s]
            mutual = min(c / mutual_saturation, 1.0)
            score = mutual_weight * mutual + activity_weight * activity[node]
            pos = n_best
            while pos > 0:
                t = best_slot[pos - 1]
                other = best_score[pos - 1]
                if score > other or (
                    score == other
                    and (c > counts[t] or (c == counts[t] and node < touched[t]))
                ):
                    pos -= 1
                else:
                    break
            if pos >= top_k:
                continue
            last = min(n_best, top_k - 1)
            for j in range(last, pos, -1):
                best_slot[j] = best_slot[j - 1]
                best_score[j] = best_score[j - 1]
            best_slot[pos] = s
            best_score[pos] = score
            if n_best < top_k:
                n_best += 1

        for r in range(n_best):
            s = best_slot[r]
            out_user[n_rows] = user
            out_candidate[n_rows] = touched[s]
            out_mutual[n_rows] = counts[s]
            out_score[n_rows] = best_score[r]
            out_rank[n_rows] = r + 1
            n_fb = min(counts[s], fb)
            out_followed_n[n_rows] = n_fb
            for k in range(n_fb):
                out_followed_by[n_rows * fb + k] = reached_by[s * fb + k]
            n_rows += 1
    return n_rows, traversals


@dataclass
class KernelResult:
    """Flat kernel output, one entry per output row (user position, rank order)."""

    user: np.ndarray  # int32 user position in ShardInputs.user_ids
    candidate: np.ndarray  # int32 dense id
    mutual_count: np.ndarray  # int32
    score: np.ndarray  # float64
    rank: np.ndarray  # int32, 1..top_k
    followed_by: np.ndarray  # int32 dense ids, flattened
    followed_by_offsets: np.ndarray  # int64[rows + 1] into followed_by
    traversals: int


def recommend_users(
    inputs: ShardInputs,
    graph: CappedGraph,
    not_recommendable: np.ndarray,
    activity: np.ndarray,
    settings,
    users_per_chunk: int = USERS_PER_CHUNK,
) -> KernelResult:
    """Run the compiled kernel over every user of ``inputs``, chunk by chunk.

    Scratch: two ``int32[n_nodes]`` arrays (slots, stamps) plus per-user buffers bounded by
    ``hop1_cap * hop2_cap``. Logs progress per chunk on ``recs.traversal``.
    """
    n_users = len(inputs.user_ids)
    fb = int(settings.followed_by_count)
    top_k = int(settings.top_k)
    hop2_cap = int(settings.hop2_cap)
    hop1_lengths = np.diff(inputs.hop1_ptr)
    max_hop1 = int(hop1_lengths.max()) if n_users else 0
    per_user = max(1, max_hop1 * hop2_cap)
    slot = np.full(graph.n_nodes, -1, dtype=np.int32)
    stamp = np.zeros(graph.n_nodes, dtype=np.int32)
    touched = np.empty(per_user, dtype=np.int32)
    counts = np.empty(per_user, dtype=np.int32)
    reached_by = np.empty(max(1, per_user * fb), dtype=np.int32)
    passing = np.empty(per_user, dtype=np.int32)
    tie_nodes = np.empty(per_user, dtype=np.int32)
    tie_slots = np.empty(per_user, dtype=np.int32)
    histogram = np.empty(max_hop1 + 2, dtype=np.int64)
    best_slot = np.empty(top_k, dtype=np.int32)
    best_score = np.empty(top_k, dtype=np.float64)

    parts: list[tuple] = []
    traversals = 0
    for begin in range(0, n_users, users_per_chunk):
        end = min(n_users, begin + users_per_chunk)
        capacity = (end - begin) * top_k
        out = (
            np.empty(capacity, dtype=np.int32),
            np.empty(capacity, dtype=np.int32),
            np.empty(capacity, dtype=np.int32),
            np.empty(capacity, dtype=np.float64),
            np.empty(capacity, dtype=np.int32),
            np.full(max(1, capacity * fb), -1, dtype=np.int32),
            np.zeros(capacity, dtype=np.int32),
        )
        rows, chunk_traversals = _recommend(
            begin, end,
            inputs.user_dense, inputs.hop1_ptr, inputs.hop1_nodes,
            inputs.excl_ptr, inputs.excl_nodes,
            graph.indptr, graph.indices, not_recommendable, activity,
            hop2_cap, int(settings.min_mutual_count), int(settings.max_candidates_to_score),
            top_k, fb,
            float(settings.mutual_weight), float(settings.mutual_saturation),
            float(settings.activity_weight),
            slot, stamp, touched, counts, reached_by, passing, tie_nodes, tie_slots, histogram,
            best_slot, best_score, *out,
        )
        traversals += int(chunk_traversals)
        fb_matrix = out[5][: rows * fb].reshape(rows, fb) if fb else np.zeros((rows, 0), np.int32)
        fb_n = out[6][:rows]
        valid = np.arange(fb)[None, :] < fb_n[:, None]
        parts.append((*(a[:rows] for a in out[:5]), fb_matrix[valid], fb_n))
        log.info(
            "users %d-%d of %d: %d rows, %d traversals", begin, end, n_users, rows,
            chunk_traversals,
        )

    if parts:
        columns = [np.concatenate([p[i] for p in parts]) for i in range(7)]
    else:
        columns = [
            np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32),
            np.zeros(0, np.float64), np.zeros(0, np.int32), np.zeros(0, np.int32),
            np.zeros(0, np.int32),
        ]
    offsets = np.zeros(len(columns[6]) + 1, dtype=np.int64)
    np.cumsum(columns[6], out=offsets[1:])
    return KernelResult(
        user=columns[0], candidate=columns[1], mutual_count=columns[2], score=columns[3],
        rank=columns[4], followed_by=columns[5], followed_by_offsets=offsets,
        traversals=traversals,
    )


# --- output ----------------------------------------------------------------------------------


def recommendation_frame(
    result: KernelResult, inputs: ShardInputs, graph: CappedGraph, paths
):
    """The shard's output frame in ``contracts.RECOMMENDATION_SCHEMA``, sorted (user_id, rank).

    Maps dense ids back to original ids; ``followed_by`` is ``List(Int64)`` of original ids;
    ``generated_at`` is ``paths.as_of`` (naive UTC) and ``run_id`` is ``paths.run_id``.
    """
    import polars as pl
    import pyarrow as pa

    followed_by = pa.ListArray.from_arrays(
        pa.array(result.followed_by_offsets.astype(np.int32)),
        pa.array(np.asarray(graph.user_ids[result.followed_by], dtype=np.int64)),
    )
    generated_at = paths.as_of.astimezone(dt.UTC).replace(tzinfo=None)
    frame = pl.DataFrame({
        "user_id": pl.Series(inputs.user_ids[result.user], dtype=pl.Int64),
        "candidate_id": pl.Series(np.asarray(graph.user_ids[result.candidate]), dtype=pl.Int64),
        "mutual_count": pl.Series(result.mutual_count, dtype=pl.Int32),
        "score": pl.Series(result.score, dtype=pl.Float64),
        "rank": pl.Series(result.rank, dtype=pl.Int32),
        "followed_by": pl.Series(followed_by, dtype=pl.List(pl.Int64)),
    }).with_columns(
        pl.lit(generated_at, dtype=pl.Datetime("us")).alias("generated_at"),
        pl.lit(paths.run_id, dtype=pl.String).alias("run_id"),
    )
    frame = frame.select(list(RECOMMENDATION_SCHEMA))
    check_schema(frame.schema, RECOMMENDATION_SCHEMA, "shard recommendations")
    return frame


def write_recommendations(frame, path: Path) -> Path:
    """Write ``frame`` as Parquet atomically (temp file + ``os.replace``), reproducibly.

    Fixed compression, one writer thread's deterministic layout: the same frame gives the same
    bytes on every run with the same library versions.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    frame.write_parquet(tmp, compression="zstd", compression_level=3, statistics=True)
    os.replace(tmp, path)
    return path


def _peak_rss_mb() -> float:
    # ru_maxrss is in KiB on Linux: the process's peak, which includes any earlier work.
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def traverse_shard(paths, settings, shard_id: int) -> dict[str, Any]:
    """Compute and write one shard's recommendations and manifest.

    Reads ``paths.graph_dir`` (``recs.graph``), ``snapshot/follow_edges/shard_id=NNN``,
    ``exports/eligible_users/shard_id=N``, ``exports/follow_exclusions/shard_id=N`` and
    ``exports/candidate_profiles.parquet``. Writes ``paths.shard_output(shard_id)`` (exactly
    ``RECOMMENDATION_SCHEMA``, sorted by user_id, rank; identical bytes on rerun; an empty,
    typed file when the shard has no eligible users) and ``paths.shard_manifest(shard_id)``.

    Returns the manifest: ``shard_id, users_in, users_with_recommendations, rows, traversals``
    (second-hop edge expansions counted), ``first_hop_edges, seconds, peak_rss_mb, output``.
    Raises ``RunNotFoundError`` (missing graph or export), ``StaleGraphError`` and
    ``ShardMismatchError``.
    """
    started = time.perf_counter()
    cpu_started = time.process_time()
    graph = load_graph(paths.graph_dir)
    built = graph.meta
    if built["hop2_cap"] < settings.hop2_cap or built["sample_seed"] != settings.sample_seed:
        raise StaleGraphError(
            f"graph {paths.graph_dir} was built with hop2_cap={graph.meta['hop2_cap']}, "
            f"sample_seed={graph.meta['sample_seed']}; this run needs hop2_cap="
            f"{settings.hop2_cap}, sample_seed={settings.sample_seed}: rerun build_graph"
        )
    inputs = shard_inputs(paths, settings, shard_id, graph)
    as_of = paths.as_of.astimezone(dt.UTC).replace(tzinfo=None)
    not_recommendable, activity = candidate_signals(
        Path(paths.exports_dir) / "candidate_profiles.parquet", graph, as_of,
        settings.half_life_days,
    )
    read_seconds = time.perf_counter() - started
    log.info(
        "shard %03d: %d eligible users, %d first-hop edges, %d exclusions (read in %.2fs)",
        shard_id, len(inputs.user_ids), len(inputs.hop1_nodes), len(inputs.excl_nodes),
        read_seconds,
    )
    kernel_started = time.perf_counter()
    result = recommend_users(inputs, graph, not_recommendable, activity, settings)
    kernel_seconds = time.perf_counter() - kernel_started
    frame = recommendation_frame(result, inputs, graph, paths)
    output = write_recommendations(frame, paths.shard_output(shard_id))
    seconds = time.perf_counter() - started
    manifest = {
        "shard_id": int(shard_id),
        "run_id": paths.run_id,
        "users_in": int(len(inputs.user_ids)),
        "users_with_recommendations": int(len(np.unique(result.user))),
        "rows": int(frame.height),
        "traversals": int(result.traversals),
        "first_hop_edges": int(len(inputs.hop1_nodes)),
        "seconds": round(seconds, 3),
        "cpu_seconds": round(time.process_time() - cpu_started, 3),
        "kernel_seconds": round(kernel_seconds, 3),
        "peak_rss_mb": _peak_rss_mb(),
        "output": str(output),
    }
    write_json(paths.shard_manifest(shard_id), manifest)
    log.info(
        "shard %03d: %d rows for %d of %d users, %d traversals in %.2fs (kernel %.2fs)",
        shard_id, manifest["rows"], manifest["users_with_recommendations"],
        manifest["users_in"], manifest["traversals"], seconds, kernel_seconds,
    )
    return manifest
