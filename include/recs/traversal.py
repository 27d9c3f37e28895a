"""One shard's recommendations: capped two-hop traversal, pre-rank filters, ranking, top-k.

The flow for the shard's eligible users (ARCHITECTURE §1 and §3; the design document's
"Bounded BFS", "Candidate Pruning and Mutual-Connection Scorer" and batch driver):

1. **candidate generation** — first hop: each user's active follows from the shard's own
   snapshot partition, in sample order, cut to ``hop1_cap`` (``shard_lists``); second hop: the
   capped CSR rows of those follows (``recs.graph``, ``hop2_cap`` each). ``mutual_count`` of a
   candidate = the number of expanded first-hop follows whose row contains it.
2. **pre-rank filters** (predicates) — drop the user, every account the user follows or has a
   pending request to (the snapshot partition's own edges, any status), the other exclusions of
   ``follow_exclusions`` (blocked either way, muted, dismissed, and any reason added later),
   accounts that are not recommendable (``graph/activity.npy`` is NaN: suspended, deactivated,
   not discoverable, no candidate profile), and ``mutual_count < min_mutual_count``; then keep
   the top ``max_candidates_to_score`` by ``(mutual_count desc, candidate_id asc)``.
3. **ranking** — ``score = mutual_weight * min(mutual_count / mutual_saturation, 1)
   + activity_weight * activity`` (the design's ``score_candidate``), ``activity`` the
   per-account ``activity_recency_score`` computed once per run by ``recs.graph``.
4. **filter-and-take** — top ``top_k`` by ``(score desc, mutual_count desc, candidate_id asc)``,
   rank 1..k, with up to ``followed_by_count`` first-hop follows that reached the candidate
   (the first ones in the user's sample order) as the "followed by" explanation.

Why a compiled kernel, and why it also ranks: ARCHITECTURE §3 measured a hash group-by over all
(user, candidate) pairs at ~2.5 M traversals/s per core against ~60 M/s for a per-user counting
loop over a CSR (``make bench`` measures it again, side by side). The loop here
(``_recommend``, Numba) runs over all users of a chunk with no per-user Python: per user, an
open-addressing counter table sized to that user's own bound (at most ``hop1_cap * hop2_cap`` +
exclusions, so it stays in L1/L2 cache) holds node, count and the first ``followed_by_count``
first-hop ids; the user's exclusions are flagged in the same table before counting (a per-user
bitmap, no set lookups), the ``max_candidates_to_score`` cut is a count histogram, and the
top-k a bounded insertion buffer, so it emits only the output rows. While it counts one
first-hop row it prefetches the row ``PREFETCH_DISTANCE`` follows ahead: rows sit at random
places of the CSR, so without it the loop waits on memory. Measured on the 1 M-user graph of
``make bench-scale`` (one core, CPU time, one 48 k-user shard): the previous kernel (dense
``int32[n_nodes]`` slot and stamp arrays, no prefetch) ran 41 M traversals/s, this table
48 M/s, with the prefetch 60-64 M/s; and the dense arrays cost 8 bytes per account of private
memory in every shard process (4 GB at the design's 500 M accounts). Ranking in Polars instead
(join, score, sort, take) means first emitting every scored candidate: on the 200 k-user
benchmark graph 1.0 M rows per 50 k-user shard (2.3x the output)
took 0.26 s single-threaded, about 60% of the kernel's own time, and with the design's caps on a
denser graph it is up to 25x the output (500 scored vs 20 kept per user). So the kernel applies
the blend over the small cut set; the part of the score that needs a join (the activity term per
account) is computed once per run in Polars by ``recs.graph.candidate_activity``. Polars does
all I/O and output assembly.

Memory: a shard task holds its own partition's edges, eligible users, first-hop and exclusion
lists, kernel scratch bounded by ``hop1_cap * hop2_cap`` and its output; every O(n_nodes) array
(CSR, activity, id map) is the run's memory-mapped ``graph/``, shared through the page cache and
never copied. So its private memory depends on the shard's size, not the graph's.
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
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from recs.contracts import (
    EXPORT_SCHEMAS,
    RECOMMENDATION_SCHEMA,
    SNAPSHOT_SCHEMAS,
    check_schema,
)
from recs.errors import RecsError
from recs.files import write_json
from recs.graph import CappedGraph, DenseIndex, load_graph, partition_files
from recs.sampling import sample_key, seed_mixer
from recs.sharding import shard_array

log = logging.getLogger("recs.traversal")

#: Users per kernel call: bounds the per-call output buffers (about 1 KB per user at top_k 20)
#: and paces progress logging.
USERS_PER_CHUNK = 16_384
#: ``follow_exclusions`` reasons that are the snapshot's own follow edges (see
#: ``int_exclusions_unioned``): the task takes those from the partition it reads anyway.
FOLLOW_REASONS = ("following", "pending")
#: Fibonacci hashing multiplier (Knuth TAOCP vol. 3 §6.4): 2**32 / golden ratio.
_FIBONACCI32 = 2_654_435_769
#: The kernel prefetches the second-hop row of the first-hop follow this many places ahead.
#: Measured on the 1 M-user graph (116 MB of rows, so a row is usually a cache miss): distances
#: 2-8 all give 58-64 M traversals/s against 49 M/s without prefetching.
PREFETCH_DISTANCE = 4
_CACHE_LINE_INT32 = 16


class ShardMismatchError(RecsError):
    """An eligible user filed under a shard other than the stable shard function's."""


class StaleGraphError(RecsError):
    """The run's graph was built with other settings (``hop2_cap``, ``sample_seed``,
    ``half_life_days``) or for another ``as_of``."""


# --- candidate generation inputs ----------------------------------------------------------


@dataclass(frozen=True)
class ShardInputs:
    """The per-user inputs of one shard, as CSR arrays indexed by user position.

    ``user_ids`` int64[n] sorted eligible user ids; ``user_dense`` int32[n] their dense graph
    ids (-1 if not in ``users``); ``hop1_ptr`` int64[n+1] / ``hop1_nodes`` int32: each user's
    first hop (dense ids, sample order, at most ``hop1_cap``); ``excl_ptr`` int64[n+1] /
    ``excl_nodes`` int32: dense ids each user must not be recommended (may repeat).
    """

    user_ids: np.ndarray
    user_dense: np.ndarray
    hop1_ptr: np.ndarray
    hop1_nodes: np.ndarray
    excl_ptr: np.ndarray
    excl_nodes: np.ndarray


def read_partition(root: Path, shard_id: int, columns: list[str], schema: dict, where=None):
    """All rows of ``root/shard_id=<shard_id>/*.parquet`` as a Polars frame (``columns``).

    The ``shard_id=N`` folder may be zero-padded or not; a shard without a folder or files
    yields an empty frame with ``schema``'s dtypes (``{column: polars dtype}``). ``where``: an
    optional Polars predicate applied while scanning (its columns need not be in ``columns``).
    """
    import polars as pl

    files = partition_files(root).get(int(shard_id), [])
    if not files:
        return pl.DataFrame(schema={c: schema[c] for c in columns})
    if where is None:
        return pl.concat([pl.read_parquet(f, columns=columns) for f in files], how="vertical")
    return pl.scan_parquet(files).filter(where).select(columns).collect()


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


def shard_lists(
    user_positions: np.ndarray,
    followers: np.ndarray,
    followees: np.ndarray,
    followee_dense: np.ndarray,
    active: np.ndarray,
    extra_positions: np.ndarray,
    extra_dense: np.ndarray,
    n_users: int,
    hop1_cap: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """First-hop and exclusion CSRs of the shard's users, in one compiled pass.

    Edges of the shard's snapshot partition: ``user_positions`` (int32, the follower's position
    among the shard's sorted users, -1 if not eligible), ``followers`` / ``followees`` (int64
    original ids, for the sample key), ``followee_dense`` (int32 graph ids, -1 if not in the
    graph) and ``active`` (bool). Extra exclusions: ``extra_positions`` / ``extra_dense``
    (int32, -1 = drop). Returns ``(hop1_ptr int64[n+1], hop1_nodes int32, excl_ptr int64[n+1],
    excl_nodes int32)``: each user's first hop = its active follows of known accounts, no
    self-follows or duplicates, ordered by ``(sample key, followee)`` (``recs.sampling``) and cut
    to ``hop1_cap``; its exclusions = every follow of a known account (any status) + the extras.
    """
    as_u64 = lambda a: np.ascontiguousarray(a, dtype=np.int64).view(np.uint64)  # noqa: E731
    as_i32 = lambda a: np.ascontiguousarray(a, dtype=np.int32)  # noqa: E731
    return _shard_lists(
        as_i32(user_positions), as_u64(followers), as_u64(followees), as_i32(followee_dense),
        np.ascontiguousarray(active, dtype=np.bool_), as_i32(extra_positions),
        as_i32(extra_dense), int(n_users), int(hop1_cap), seed_mixer(seed),
    )


_HIGH32 = np.uint64(0xFFFFFFFF00000000)
_LOW32 = np.uint64(0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _take_sorted_prefix(
    group_keys, group_values, start, length, cap, sorted_keys, sorted_values, out, n_out
):  # pragma: no cover - compiled
    """Append to ``out`` the first ``cap`` distinct values of one group ordered by
    ``(key, value)``; returns the new ``n_out``. ``values`` are non-negative ``int32``.

    A small sort per group, so the cost does not depend on the input order and there is no
    global sort: up to 32 entries an insertion sort; above, one in-place sort of ``uint64``
    words packing the key's high 32 bits over the value, which is the exact order unless two
    different values share those bits (checked on neighbours, about once in 10**6 groups of
    60; then an ``argsort`` of the full keys and the insertion pass, which also orders equal
    keys by value). ``sorted_keys`` doubles as the packed scratch.
    """
    needs_pass = True
    if length > 32:
        for j in range(length):
            sorted_keys[j] = (group_keys[start + j] & _HIGH32) | np.uint64(group_values[start + j])
        sorted_keys[:length].sort()
        needs_pass = False
        for j in range(length):
            sorted_values[j] = np.int32(sorted_keys[j] & _LOW32)
            if j > 0 and sorted_values[j] != sorted_values[j - 1] and (
                (sorted_keys[j] & _HIGH32) == (sorted_keys[j - 1] & _HIGH32)
            ):
                needs_pass = True  # two keys share their high bits: redo this group exactly
        if needs_pass:
            order = np.argsort(group_keys[start : start + length])
            for j in range(length):
                sorted_keys[j] = group_keys[start + order[j]]
                sorted_values[j] = group_values[start + order[j]]
    else:
        for j in range(length):
            sorted_keys[j] = group_keys[start + j]
            sorted_values[j] = group_values[start + j]
    if needs_pass:
        # insertion pass: sorts short groups; in argsorted ones only orders equal keys by value
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
    return n_out


@njit(cache=True, nogil=True)
def _capped_rows(rows, keys, values, n_rows, cap):  # pragma: no cover - compiled
    """Group ``values`` by ``rows``, order each group by ``(key, value)``, drop duplicate
    values, keep the first ``cap``: returns ``(ptr int64[n_rows+1], values int32)``."""
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
        n_out = _take_sorted_prefix(
            group_keys, group_values, starts[r], starts[r + 1] - starts[r], cap,
            sorted_keys, sorted_values, out, n_out,
        )
        ptr[r + 1] = n_out
    return ptr, out[:n_out].copy()


@njit(cache=True, nogil=True)
def _shard_lists(
    positions, followers, followees, dense, active, extra_positions, extra_dense,
    n_users, hop1_cap, seed_mix,
):  # pragma: no cover - compiled; see shard_lists
    # counting sort by user: every known follow -> exclusions; active non-self -> first hop
    excl_ptr = np.zeros(n_users + 1, dtype=np.int64)
    hop_starts = np.zeros(n_users + 1, dtype=np.int64)
    for i in range(len(positions)):
        user = positions[i]
        if user >= 0 and dense[i] >= 0:
            excl_ptr[user + 1] += 1
            if active[i] and followers[i] != followees[i]:
                hop_starts[user + 1] += 1
    for i in range(len(extra_positions)):
        user = extra_positions[i]
        if user >= 0 and extra_dense[i] >= 0:
            excl_ptr[user + 1] += 1
    longest = 0
    for user in range(n_users):
        longest = max(longest, hop_starts[user + 1])
        excl_ptr[user + 1] += excl_ptr[user]
        hop_starts[user + 1] += hop_starts[user]
    excl_nodes = np.empty(excl_ptr[n_users], dtype=np.int32)
    excl_fill = excl_ptr[:-1].copy()
    group_keys = np.empty(hop_starts[n_users], dtype=np.uint64)
    group_values = np.empty(hop_starts[n_users], dtype=np.int32)
    hop_fill = hop_starts[:-1].copy()
    for i in range(len(positions)):
        user = positions[i]
        node = dense[i]
        if user >= 0 and node >= 0:
            excl_nodes[excl_fill[user]] = node
            excl_fill[user] += 1
            if active[i] and followers[i] != followees[i]:
                at = hop_fill[user]
                group_keys[at] = sample_key(followers[i], followees[i], seed_mix)
                group_values[at] = node
                hop_fill[user] += 1
    for i in range(len(extra_positions)):
        user = extra_positions[i]
        if user >= 0 and extra_dense[i] >= 0:
            excl_nodes[excl_fill[user]] = extra_dense[i]
            excl_fill[user] += 1
    # per user: order by (key, followee), drop duplicates, cut to hop1_cap
    sorted_keys = np.empty(longest, dtype=np.uint64)
    sorted_values = np.empty(longest, dtype=np.int32)
    hop1_ptr = np.zeros(n_users + 1, dtype=np.int64)
    hop1_nodes = np.empty(hop_starts[n_users], dtype=np.int32)
    n_out = 0
    for user in range(n_users):
        n_out = _take_sorted_prefix(
            group_keys, group_values, hop_starts[user], hop_starts[user + 1] - hop_starts[user],
            hop1_cap, sorted_keys, sorted_values, hop1_nodes, n_out,
        )
        hop1_ptr[user + 1] = n_out
    return hop1_ptr, hop1_nodes[:n_out], excl_ptr, excl_nodes


def shard_inputs(paths, settings, shard_id: int, graph: CappedGraph) -> ShardInputs:
    """Read the shard's eligible users, its snapshot partition and its extra exclusions.

    Inputs: ``exports/eligible_users/shard_id=N``, ``snapshot/follow_edges/shard_id=NNN``
    (both statuses: active ones are the first hop, all are excluded) and, from
    ``exports/follow_exclusions/shard_id=N``, the rows whose reason is not one of
    ``FOLLOW_REASONS`` (those rows are the same partition's edges, ``int_exclusions_unioned``).
    See ``ShardInputs``.
    """
    import polars as pl

    user_ids = eligible_user_ids(paths, shard_id, settings.shard_count)
    positions = DenseIndex(user_ids)
    edges = read_partition(
        Path(paths.snapshot_dir) / "follow_edges", shard_id,
        ["follower_id", "followee_id", "status"], SNAPSHOT_SCHEMAS["follow_edges"],
    )
    followers = edges["follower_id"].to_numpy().astype(np.int64, copy=False)
    followees = edges["followee_id"].to_numpy().astype(np.int64, copy=False)
    active = (edges["status"] == "active").fill_null(False).to_numpy()
    del edges
    extra = read_partition(
        Path(paths.exports_dir) / "follow_exclusions", shard_id, ["user_id", "excluded_id"],
        EXPORT_SCHEMAS["follow_exclusions"],
        where=~pl.col("reason").is_in(FOLLOW_REASONS).fill_null(False),
    ).drop_nulls()
    hop1_ptr, hop1_nodes, excl_ptr, excl_nodes = shard_lists(
        positions(followers), followers, followees, graph.dense_ids(followees), active,
        positions(extra["user_id"].to_numpy()), graph.dense_ids(extra["excluded_id"].to_numpy()),
        len(user_ids), settings.hop1_cap, settings.sample_seed,
    )
    return ShardInputs(
        user_ids=user_ids,
        user_dense=graph.dense_ids(user_ids),
        hop1_ptr=hop1_ptr,
        hop1_nodes=hop1_nodes,
        excl_ptr=excl_ptr,
        excl_nodes=excl_nodes,
    )


# --- the compiled kernel -------------------------------------------------------------------


@intrinsic
def _prefetch(typingctx, array, index):  # pragma: no cover - compiled
    """``llvm.prefetch`` (read, high locality) of ``array[index]``: a hint, never a fault.

    Numba has no prefetch; the kernel's first-hop rows sit at random places of the CSR, so it
    asks for the row a few follows ahead while it counts the current one (see
    ``PREFETCH_DISTANCE``).
    """
    signature = types.void(array, index)

    def codegen(context, builder, sig, args):
        array_type = sig.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        pointer = cgutils.get_item_pointer(
            context, builder, array_type, view, [args[1]], wraparound=False
        )
        byte_pointer = ir.IntType(8).as_pointer()
        int32 = ir.IntType(32)
        function = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [byte_pointer, int32, int32, int32]),
            "llvm.prefetch.p0i8",
        )
        builder.call(function, [
            builder.bitcast(pointer, byte_pointer),
            ir.Constant(int32, 0),  # read
            ir.Constant(int32, 3),  # keep in all cache levels
            ir.Constant(int32, 1),  # data cache
        ])
        return context.get_dummy_value()

    return signature, codegen



@njit(cache=True, nogil=True)
def _recommend(
    user_begin, user_end,
    user_dense, hop1_ptr, hop1_nodes, excl_ptr, excl_nodes,
    indptr, indices, activity,
    hop2_cap, min_mutual_count, max_candidates, top_k, followed_by_count,
    mutual_weight, mutual_saturation, activity_weight,
    table_nodes, table_counts, table_excluded, reached_by, touched,
    pass_slot, pass_node, pass_count, tie_nodes, tie_slots, histogram, best, best_score,
    out_user, out_candidate, out_mutual, out_score, out_rank, out_followed_by, out_followed_n,
):  # pragma: no cover - compiled; exercised through traverse_shard and the reference tests
    """Candidate generation, pre-rank filters, ranking and top-k for users [begin, end).

    Per user, an open-addressing table (linear probing, Fibonacci hashing, at most half full:
    2**bits >= 2 * the user's bound of distinct entries) over ``table_nodes`` (int32, -1 =
    free), ``table_counts``, ``table_excluded`` and ``reached_by`` (``followed_by_count`` per
    slot); ``touched`` lists the used slots, which are reset after the user, so the tables are
    clean between users. ``activity`` NaN = not recommendable. Writes rows in (user, rank)
    order; returns (rows, traversals).
    """
    n_rows = 0
    traversals = 0
    fb = followed_by_count
    for user in range(user_begin, user_end):
        bound = excl_ptr[user + 1] - excl_ptr[user] + 1
        for p in range(hop1_ptr[user], hop1_ptr[user + 1]):
            friend = hop1_nodes[p]
            bound += min(indptr[friend + 1] - indptr[friend], hop2_cap)
        bits = 4
        while (1 << bits) < 2 * bound:
            bits += 1
        mask = (1 << bits) - 1
        shift = 32 - bits
        n_touched = 0

        # pre-rank filter, part 1: flag the user and its exclusions in the table
        for e in range(excl_ptr[user] - 1, excl_ptr[user + 1]):
            node = user_dense[user] if e < excl_ptr[user] else excl_nodes[e]
            if node < 0:
                continue
            h = ((node * _FIBONACCI32) & 0xFFFFFFFF) >> shift
            while table_nodes[h] >= 0 and table_nodes[h] != node:
                h = (h + 1) & mask
            if table_nodes[h] < 0:
                table_nodes[h] = node
                touched[n_touched] = h
                n_touched += 1
            table_excluded[h] = True

        # candidate generation: count each expanded first-hop row once per candidate
        last_friend = hop1_ptr[user + 1]
        for p in range(hop1_ptr[user], last_friend):
            if p + PREFETCH_DISTANCE < last_friend:
                ahead = hop1_nodes[p + PREFETCH_DISTANCE]
                ahead_end = min(indptr[ahead + 1], indptr[ahead] + hop2_cap)
                for q in range(indptr[ahead], ahead_end, _CACHE_LINE_INT32):
                    _prefetch(indices, q)
            friend = hop1_nodes[p]
            start = indptr[friend]
            end = min(indptr[friend + 1], start + hop2_cap)
            traversals += end - start
            for q in range(start, end):
                node = indices[q]
                h = ((node * _FIBONACCI32) & 0xFFFFFFFF) >> shift
                while True:
                    held = table_nodes[h]
                    if held == node:
                        break
                    if held < 0:
                        table_nodes[h] = node
                        touched[n_touched] = h
                        n_touched += 1
                        break
                    h = (h + 1) & mask
                k = table_counts[h]
                if k < fb:
                    reached_by[h * fb + k] = friend
                table_counts[h] = k + 1

        # pre-rank filters, part 2, while resetting the table for the next user
        n_passing = 0
        max_count = 0
        for i in range(n_touched):
            h = touched[i]
            node = table_nodes[h]
            c = table_counts[h]
            excluded = table_excluded[h]
            table_nodes[h] = -1
            table_counts[h] = 0
            table_excluded[h] = False
            if excluded or c < min_mutual_count:
                continue
            if activity[node] != activity[node]:  # NaN: not recommendable
                continue
            pass_slot[n_passing] = h
            pass_node[n_passing] = node
            pass_count[n_passing] = c
            n_passing += 1
            if c > max_count:
                max_count = c

        # keep the top max_candidates by (mutual_count desc, candidate asc)
        n_selected = n_passing
        if n_passing > max_candidates:
            for c in range(max_count + 1):
                histogram[c] = 0
            for i in range(n_passing):
                histogram[pass_count[i]] += 1
            threshold = max_count
            above = 0
            while above + histogram[threshold] < max_candidates:
                above += histogram[threshold]
                threshold -= 1
            n_selected = 0
            n_ties = 0
            for i in range(n_passing):
                c = pass_count[i]
                if c > threshold:
                    pass_slot[n_selected] = pass_slot[i]
                    pass_node[n_selected] = pass_node[i]
                    pass_count[n_selected] = c
                    n_selected += 1
                elif c == threshold:
                    tie_nodes[n_ties] = pass_node[i]
                    tie_slots[n_ties] = pass_slot[i]
                    n_ties += 1
            order = np.argsort(tie_nodes[:n_ties])
            for j in range(max_candidates - n_selected):
                pass_slot[n_selected] = tie_slots[order[j]]
                pass_node[n_selected] = tie_nodes[order[j]]
                pass_count[n_selected] = threshold
                n_selected += 1

        # ranking and filter-and-take: bounded insertion buffer ordered best first
        n_best = 0
        for i in range(n_selected):
            node = pass_node[i]
            c = pass_count[i]
            mutual = min(c / mutual_saturation, 1.0)
            score = mutual_weight * mutual + activity_weight * activity[node]
            pos = n_best
            while pos > 0:
                t = best[pos - 1]
                other = best_score[pos - 1]
                if score > other or (
                    score == other
                    and (c > pass_count[t] or (c == pass_count[t] and node < pass_node[t]))
                ):
                    pos -= 1
                else:
                    break
            if pos >= top_k:
                continue
            last = min(n_best, top_k - 1)
            for j in range(last, pos, -1):
                best[j] = best[j - 1]
                best_score[j] = best_score[j - 1]
            best[pos] = i
            best_score[pos] = score
            if n_best < top_k:
                n_best += 1

        for r in range(n_best):
            i = best[r]
            h = pass_slot[i]
            out_user[n_rows] = user
            out_candidate[n_rows] = pass_node[i]
            out_mutual[n_rows] = pass_count[i]
            out_score[n_rows] = best_score[r]
            out_rank[n_rows] = r + 1
            n_fb = min(pass_count[i], fb)
            out_followed_n[n_rows] = n_fb
            for k in range(fb):
                out_followed_by[n_rows * fb + k] = reached_by[h * fb + k] if k < n_fb else -1
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
    followed_by: np.ndarray  # int32[rows, followed_by_count] dense ids, -1 padded
    followed_by_n: np.ndarray  # int32[rows]: how many of each row's followed_by are set
    traversals: int


def user_bounds(inputs: ShardInputs, graph: CappedGraph, hop2_cap: int) -> np.ndarray:
    """Per user, an upper bound (``int64``) of the distinct nodes its table holds: the expanded
    row lengths of its first hop (each at most ``hop2_cap``) + its exclusions + itself."""
    nodes = inputs.hop1_nodes.astype(np.int64)
    lengths = np.minimum(graph.indptr[nodes + 1] - graph.indptr[nodes], hop2_cap)
    summed = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=summed[1:])
    expanded = summed[inputs.hop1_ptr[1:]] - summed[inputs.hop1_ptr[:-1]]
    return expanded + np.diff(inputs.excl_ptr) + 1


def recommend_users(
    inputs: ShardInputs,
    graph: CappedGraph,
    settings,
    users_per_chunk: int = USERS_PER_CHUNK,
) -> KernelResult:
    """Run the compiled kernel over every user of ``inputs``, chunk by chunk.

    Scratch, all sized by the shard's largest per-user bound (``user_bounds``, at most
    ``hop1_cap * hop2_cap`` + exclusions), never by the graph: the counter table (2**bits slots
    x (4 + 4 + 1 + 4 * followed_by_count) bytes) and per-candidate buffers; the output goes
    straight into one buffer per column (``top_k`` rows per user reserved, only the rows written
    are touched). Logs progress per chunk on ``recs.traversal``.
    """
    n_users = len(inputs.user_ids)
    fb = int(settings.followed_by_count)
    top_k = int(settings.top_k)
    hop2_cap = int(settings.hop2_cap)
    bound = int(user_bounds(inputs, graph, hop2_cap).max()) if n_users else 1
    table_size = 16
    while table_size < 2 * bound:
        table_size *= 2
    max_count = int(np.diff(inputs.hop1_ptr).max()) if n_users else 0
    table_nodes = np.full(table_size, -1, dtype=np.int32)
    table_counts = np.zeros(table_size, dtype=np.int32)
    table_excluded = np.zeros(table_size, dtype=np.bool_)
    reached_by = np.empty(max(1, table_size * fb), dtype=np.int32)
    touched = np.empty(table_size, dtype=np.int32)
    pass_slot = np.empty(bound, dtype=np.int32)
    pass_node = np.empty(bound, dtype=np.int32)
    pass_count = np.empty(bound, dtype=np.int32)
    tie_nodes = np.empty(bound, dtype=np.int32)
    tie_slots = np.empty(bound, dtype=np.int32)
    histogram = np.empty(max_count + 2, dtype=np.int64)
    best = np.empty(top_k, dtype=np.int32)
    best_score = np.empty(top_k, dtype=np.float64)

    # One buffer per output column for the whole shard: at most top_k rows per user. np.empty
    # only reserves address space; pages are touched (and count in RSS) as rows are written.
    capacity = n_users * top_k
    out = (
        np.empty(capacity, dtype=np.int32),
        np.empty(capacity, dtype=np.int32),
        np.empty(capacity, dtype=np.int32),
        np.empty(capacity, dtype=np.float64),
        np.empty(capacity, dtype=np.int32),
        np.empty(max(1, capacity * fb), dtype=np.int32),
        np.empty(capacity, dtype=np.int32),
    )
    rows = 0
    traversals = 0
    for begin in range(0, n_users, users_per_chunk):
        end = min(n_users, begin + users_per_chunk)
        chunk_rows, chunk_traversals = _recommend(
            begin, end,
            inputs.user_dense, inputs.hop1_ptr, inputs.hop1_nodes,
            inputs.excl_ptr, inputs.excl_nodes,
            graph.indptr, graph.indices, graph.activity,
            hop2_cap, int(settings.min_mutual_count), int(settings.max_candidates_to_score),
            top_k, fb,
            float(settings.mutual_weight), float(settings.mutual_saturation),
            float(settings.activity_weight),
            table_nodes, table_counts, table_excluded, reached_by, touched,
            pass_slot, pass_node, pass_count, tie_nodes, tie_slots, histogram, best, best_score,
            out[0][rows:], out[1][rows:], out[2][rows:], out[3][rows:], out[4][rows:],
            out[5][rows * fb:], out[6][rows:],
        )
        rows += int(chunk_rows)
        traversals += int(chunk_traversals)
        log.info(
            "users %d-%d of %d: %d rows, %d traversals", begin, end, n_users, chunk_rows,
            chunk_traversals,
        )

    return KernelResult(
        user=out[0][:rows], candidate=out[1][:rows], mutual_count=out[2][:rows],
        score=out[3][:rows], rank=out[4][:rows],
        followed_by=out[5][: rows * fb].reshape(rows, fb), followed_by_n=out[6][:rows],
        traversals=traversals,
    )


# --- output ----------------------------------------------------------------------------------


def recommendation_frame(
    result: KernelResult, inputs: ShardInputs, graph: CappedGraph, paths
):
    """The shard's output frame in ``contracts.RECOMMENDATION_SCHEMA``, sorted (user_id, rank).

    Maps dense ids back to original ids; ``followed_by`` is ``List(Int64)`` of original ids;
    ``generated_at`` is ``paths.as_of`` (naive UTC) and ``run_id`` is ``paths.run_id``.
    Built in Polars from NumPy (no ``pyarrow.array``, whose first call imports pandas: 0.2-0.8 s
    per task process).
    """
    import polars as pl

    rows, fb = result.followed_by.shape
    set_ = result.followed_by >= 0
    followed_ids = np.zeros((rows, fb), dtype=np.int64)
    followed_ids[set_] = graph.user_ids[result.followed_by[set_]]
    if fb:
        followed_by = pl.DataFrame(
            {"ids": followed_ids, "n": result.followed_by_n}
        ).select(pl.col("ids").arr.to_list().list.head(pl.col("n")))["ids"]
    else:
        followed_by = pl.Series("followed_by", [[]] * rows, dtype=pl.List(pl.Int64))
    generated_at = paths.as_of.astimezone(dt.UTC).replace(tzinfo=None)
    frame = pl.DataFrame({
        "user_id": pl.Series(inputs.user_ids[result.user], dtype=pl.Int64),
        "candidate_id": pl.Series(np.asarray(graph.user_ids[result.candidate]), dtype=pl.Int64),
        "mutual_count": pl.Series(result.mutual_count, dtype=pl.Int32),
        "score": pl.Series(result.score, dtype=pl.Float64),
        "rank": pl.Series(result.rank, dtype=pl.Int32),
        "followed_by": followed_by.cast(pl.List(pl.Int64)),
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


def memory_mb() -> dict[str, float]:
    """This process's memory in MB: ``peak_rss_mb`` (the peak resident set, which counts the
    pages of the memory-mapped graph it touched) and, now, ``rss_anon_mb`` (private memory) and
    ``rss_file_mb`` (file-backed pages: the shared graph mapping and the libraries).

    On Linux from ``/proc/self/status`` (``VmHWM``, ``RssAnon``, ``RssFile``): ``ru_maxrss``
    is not used there because it survives ``exec``, so a task started by a big parent (a
    forked Airflow worker, a benchmark) would report the parent's peak. Elsewhere
    ``ru_maxrss`` only.
    """
    fields = {"VmHWM": "peak_rss_mb", "RssAnon": "rss_anon_mb", "RssFile": "rss_file_mb"}
    found: dict[str, float] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                name, _, value = line.partition(":")
                if name in fields:
                    found[fields[name]] = round(int(value.split()[0]) / 1024.0, 1)
    except OSError:
        pass
    if "peak_rss_mb" not in found:
        # ru_maxrss is in KiB on Linux, bytes on macOS; this fallback is for other systems
        found["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    return {"peak_rss_mb": found.pop("peak_rss_mb"), **found}


def traverse_shard(paths, settings, shard_id: int) -> dict[str, Any]:
    """Compute and write one shard's recommendations and manifest.

    Reads ``paths.graph_dir`` (``recs.graph``: CSR, per-node activity, id map, all
    memory-mapped), ``snapshot/follow_edges/shard_id=NNN``, ``exports/eligible_users/shard_id=N``
    and ``exports/follow_exclusions/shard_id=N``. Writes ``paths.shard_output(shard_id)`` (exactly
    ``RECOMMENDATION_SCHEMA``, sorted by user_id, rank; identical bytes on rerun; an empty,
    typed file when the shard has no eligible users) and ``paths.shard_manifest(shard_id)``.

    Returns the manifest: ``shard_id, users_in, users_with_recommendations, rows, traversals``
    (second-hop edge expansions counted), ``first_hop_edges, exclusions, seconds`` (wall, the
    whole task), ``cpu_seconds`` (this process, all threads), ``read_seconds, kernel_seconds,
    write_seconds`` (wall), ``traversals_per_cpu_second``, ``peak_rss_mb``, ``rss_anon_mb``,
    ``rss_file_mb`` (see ``memory_mb``) and ``output``.
    Raises ``RunNotFoundError`` (missing graph or export), ``StaleGraphError`` and
    ``ShardMismatchError``.
    """
    started = time.perf_counter()
    cpu_started = time.process_time()
    graph = load_graph(paths.graph_dir)
    built = graph.meta
    as_of = paths.as_of.astimezone(dt.UTC).replace(tzinfo=None)
    wanted = {
        "sample_seed": settings.sample_seed, "half_life_days": float(settings.half_life_days),
        "as_of": as_of.isoformat(),
    }
    if built["hop2_cap"] < settings.hop2_cap or any(built[k] != v for k, v in wanted.items()):
        have = ", ".join(f"{k}={built[k]}" for k in ("hop2_cap", *wanted))
        need = ", ".join(f"{k}={v}" for k, v in wanted.items())
        raise StaleGraphError(
            f"graph {paths.graph_dir} was built with {have}; this run needs hop2_cap="
            f"{settings.hop2_cap} (or more), {need}: rerun build_graph"
        )
    inputs = shard_inputs(paths, settings, shard_id, graph)
    read_seconds = time.perf_counter() - started
    log.info(
        "shard %03d: %d eligible users, %d first-hop edges, %d exclusions (read in %.2fs)",
        shard_id, len(inputs.user_ids), len(inputs.hop1_nodes), len(inputs.excl_nodes),
        read_seconds,
    )
    kernel_started = time.perf_counter()
    result = recommend_users(inputs, graph, settings)
    kernel_seconds = time.perf_counter() - kernel_started
    write_started = time.perf_counter()
    frame = recommendation_frame(result, inputs, graph, paths)
    output = write_recommendations(frame, paths.shard_output(shard_id))
    write_seconds = time.perf_counter() - write_started
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    manifest = {
        "shard_id": int(shard_id),
        "run_id": paths.run_id,
        "users_in": int(len(inputs.user_ids)),
        "users_with_recommendations": int(len(np.unique(result.user))),
        "rows": int(frame.height),
        "traversals": int(result.traversals),
        "first_hop_edges": int(len(inputs.hop1_nodes)),
        "exclusions": int(len(inputs.excl_nodes)),
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "read_seconds": round(read_seconds, 3),
        "kernel_seconds": round(kernel_seconds, 3),
        "write_seconds": round(write_seconds, 3),
        "traversals_per_cpu_second": int(result.traversals / cpu_seconds) if cpu_seconds else 0,
        **memory_mb(),
        "output": str(output),
    }
    write_json(paths.shard_manifest(shard_id), manifest)
    log.info(
        "shard %03d: %d rows for %d of %d users, %d traversals in %.2fs (kernel %.2fs)",
        shard_id, manifest["rows"], manifest["users_with_recommendations"],
        manifest["users_in"], manifest["traversals"], seconds, kernel_seconds,
    )
    return manifest
