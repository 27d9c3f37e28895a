"""Inputs of one shard task: its eligible users, first-hop lists and exclusions (ARCHITECTURE §3).

Reads the run's Hive-partitioned Parquet (``recs.sharding.partition_files``):
``exports/eligible_users``, ``snapshot/follow_edges`` (the shard's own partition: its users'
follows, any status) and ``exports/follow_exclusions`` (the other reasons: blocks, mutes,
dismissals). Returns
``ShardInputs``: per user, the first hop = its active follows of known, active accounts (a
suspended or deactivated account is no one's first hop, so it is never in "followed by"
either), no self-follows or duplicates, ordered by ``(sample key, followee)``
(``recs.sampling``; or ``hop1_order``'s key, ``hop_order``) and cut to ``hop1_cap``; its
exclusions = every own follow of a known account (any status) and the other rows, each with a
drop code (``predicates``). All in one compiled pass over the partition; memory grows with the
shard's edges, not with the graph.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np

from recs.arrays import sorted_unique
from recs.contracts import EXPORT_SCHEMAS, SNAPSHOT_SCHEMAS
from recs.errors import RecsError
from recs.files import read_parquet
from recs.sampling import sample_key, seed_mixer
from recs.sharding import misfiled, partition_files, shard_array
from recs.traversal.hop_order import (
    ordered_keys,
    popularity_priority,
    recency_priority,
    reciprocated,
    reciprocity_priority,
)
from recs.traversal.ids import DenseIndex
from recs.traversal.jit import compiled
from recs.traversal.predicates import (
    OTHER_EXCLUSION,
    exclusion_codes,
    follow_reason,
)


class ShardMismatchError(RecsError):
    """An eligible user filed under a shard other than the stable shard function's."""


def read_partition(root: Path, shard_id: int, columns: list[str], schema: dict):
    """All rows of ``root/shard_id=<shard_id>/*.parquet`` as a Polars frame (``columns``).

    The ``shard_id=N`` folder may be zero-padded or not; a shard without a folder or files
    yields an empty frame with ``schema``'s dtypes (``{column: polars dtype}``).
    """
    import polars as pl

    files = partition_files(root).get(int(shard_id), [])
    if not files:
        return pl.DataFrame(schema={c: schema[c] for c in columns})
    return pl.concat([read_parquet(f, columns) for f in files], how="vertical")


def eligible_user_ids(paths, shard_id: int, shard_count: int) -> np.ndarray:
    """Sorted unique eligible user ids (``int64``) of one shard, from the dbt export.

    Raises ``ShardMismatchError`` if a user's stable shard is not ``shard_id`` (the SQL and
    Python shard functions disagree, so its follows would be in another partition).
    """
    frame = read_partition(
        Path(paths.exports_dir) / "eligible_users", shard_id, ["user_id"],
        EXPORT_SCHEMAS["eligible_users"],
    )
    user_ids = sorted_unique(frame["user_id"].drop_nulls().to_numpy())
    wrong = user_ids[shard_array(user_ids, shard_count) != shard_id] if len(user_ids) else user_ids
    if len(wrong):
        raise ShardMismatchError(
            f"{len(wrong)} eligible users of shard {shard_id} belong to another shard "
            f"(e.g. user {int(wrong[0])}): the export and recs.sharding disagree"
        )
    return user_ids


class ShardInputs(NamedTuple):
    """The per-user inputs of one shard, as CSR arrays indexed by user position.

    ``user_ids`` int64[n] sorted eligible user ids; ``user_dense`` int32[n] their dense graph
    ids (-1 if not in ``users``); ``hop1_ptr`` int64[n+1] / ``hop1_nodes`` int32: each user's
    first hop (dense ids, sample order, at most ``hop1_cap``); ``excl_ptr`` int64[n+1] /
    ``excl_nodes`` int32 / ``excl_reasons`` uint8: dense ids each user must not be recommended
    (may repeat) and why (``predicates`` drop codes). A tuple, so the kernel takes it whole.
    """

    user_ids: np.ndarray
    user_dense: np.ndarray
    hop1_ptr: np.ndarray
    hop1_nodes: np.ndarray
    excl_ptr: np.ndarray
    excl_nodes: np.ndarray
    excl_reasons: np.ndarray


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
    extra_reasons: np.ndarray | None = None,
    expandable: np.ndarray | None = None,
    edge_keys: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """First-hop and exclusion CSRs of the shard's users, in one compiled pass.

    Edges of the shard's snapshot partition: ``user_positions`` (int32, the follower's position
    among the shard's sorted users, -1 if not eligible), ``followers`` / ``followees`` (int64
    original ids, for the sample key), ``followee_dense`` (int32 graph ids, -1 if not in the graph),
    ``active`` (bool: the edge's status) and ``expandable`` (bool, default ``active``: the edge may
    be a first hop, i.e. also its followee's account is active). Extra exclusions:
    ``extra_positions`` / ``extra_dense`` (int32, -1 = drop) / ``extra_reasons`` (uint8 drop codes,
    default ``OTHER_EXCLUSION``). Returns ``(hop1_ptr int64[n+1], hop1_nodes int32, excl_ptr
    int64[n+1], excl_nodes int32, excl_reasons uint8)``: each user's first hop = its expandable
    follows of known accounts, no self-follows or duplicates, ordered by ``(sample key, followee)``
    (``recs.sampling``) and cut to ``hop1_cap``; its exclusions = every follow of a known account
    (any status, code ``predicates.follow_reason``) + the extras, in input order.
    ``edge_keys`` (``uint64`` per edge): the order keys of another ``hop1_order``
    (``hop_order``); default the sample keys, computed in the pass.
    """
    as_u64 = lambda a: np.ascontiguousarray(a, dtype=np.int64).view(np.uint64)  # noqa: E731
    as_i32 = lambda a: np.ascontiguousarray(a, dtype=np.int32)  # noqa: E731
    if extra_reasons is None:
        extra_reasons = np.full(len(extra_positions), OTHER_EXCLUSION, dtype=np.uint8)
    if expandable is None:
        expandable = active
    if edge_keys is None:
        edge_keys = np.zeros(0, dtype=np.uint64)
    return _shard_lists(
        as_i32(user_positions), as_u64(followers), as_u64(followees), as_i32(followee_dense),
        np.ascontiguousarray(active, dtype=np.bool_),
        np.ascontiguousarray(expandable, dtype=np.bool_), as_i32(extra_positions),
        as_i32(extra_dense), np.ascontiguousarray(extra_reasons, dtype=np.uint8), int(n_users),
        int(hop1_cap), seed_mixer(seed), np.ascontiguousarray(edge_keys, dtype=np.uint64),
    )


_HIGH32 = np.uint64(0xFFFFFFFF00000000)
_LOW32 = np.uint64(0xFFFFFFFF)


@compiled
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


@compiled
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


@compiled
def _shard_lists(
    positions, followers, followees, dense, active, expandable, extra_positions, extra_dense,
    extra_reasons, n_users, hop1_cap, seed_mix, edge_keys,
):  # pragma: no cover - compiled; see shard_lists
    # counting sort by user: every known follow -> exclusions; expandable non-self -> first hop
    excl_ptr = np.zeros(n_users + 1, dtype=np.int64)
    hop_starts = np.zeros(n_users + 1, dtype=np.int64)
    for i in range(len(positions)):
        user = positions[i]
        if user >= 0 and dense[i] >= 0:
            excl_ptr[user + 1] += 1
            if expandable[i] and followers[i] != followees[i]:
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
    excl_reasons = np.empty(excl_ptr[n_users], dtype=np.uint8)
    excl_fill = excl_ptr[:-1].copy()
    group_keys = np.empty(hop_starts[n_users], dtype=np.uint64)
    group_values = np.empty(hop_starts[n_users], dtype=np.int32)
    hop_fill = hop_starts[:-1].copy()
    for i in range(len(positions)):
        user = positions[i]
        node = dense[i]
        if user >= 0 and node >= 0:
            excl_nodes[excl_fill[user]] = node
            excl_reasons[excl_fill[user]] = follow_reason(active[i])
            excl_fill[user] += 1
            if expandable[i] and followers[i] != followees[i]:
                at = hop_fill[user]
                if len(edge_keys):
                    group_keys[at] = edge_keys[i]
                else:
                    group_keys[at] = sample_key(followers[i], followees[i], seed_mix)
                group_values[at] = node
                hop_fill[user] += 1
    for i in range(len(extra_positions)):
        user = extra_positions[i]
        if user >= 0 and extra_dense[i] >= 0:
            excl_nodes[excl_fill[user]] = extra_dense[i]
            excl_reasons[excl_fill[user]] = extra_reasons[i]
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
    return hop1_ptr, hop1_nodes[:n_out], excl_ptr, excl_nodes, excl_reasons


def hop1_keys(settings, followers, followees, follower_dense, followee_dense, created_at, graph):
    """The first hop's order keys for ``settings.hop1_order`` (``hop_order``), or ``None`` for
    ``sample`` (the pass computes those itself). ``created_at``: int64 µs (recency only)."""
    from recs.sampling import sample_keys

    order = settings.hop1_order
    if order == "sample":
        return None
    keys = sample_keys(followers, followees, settings.sample_seed)
    known = followee_dense >= 0
    if order == "recency":
        priority = recency_priority(created_at)
    elif order == "popularity":
        followers_of = np.zeros(len(followee_dense), dtype=np.int64)
        followers_of[known] = graph.in_degree[followee_dense[known]]
        priority = popularity_priority(followers_of)
    else:
        both = known & (follower_dense >= 0)
        back = np.zeros(len(followee_dense), dtype=bool)
        back[both] = reciprocated(
            follower_dense[both], followee_dense[both], graph.reciprocal_pairs
        )
        priority = reciprocity_priority(back)
    return ordered_keys(keys, priority)


def shard_inputs(paths, settings, shard_id: int, graph) -> ShardInputs:
    """Read the shard's eligible users, its snapshot partition and its extra exclusions.

    Inputs: ``exports/eligible_users/shard_id=N``, ``snapshot/follow_edges/shard_id=NNN``
    (both statuses: active ones are the first hop, all are excluded) and, from
    ``exports/follow_exclusions/shard_id=N`` (the exclusions other than those follows).
    ``graph``: the run's ``CappedGraph`` (its id map). Raises ``ShardMismatchError``.
    """
    import polars as pl

    user_ids = eligible_user_ids(paths, shard_id, settings.shard_count)
    positions = DenseIndex(user_ids)
    columns = ["follower_id", "followee_id", "status"]
    if settings.hop1_order == "recency":
        columns.append("created_at")
    edges = read_partition(
        Path(paths.snapshot_dir) / "follow_edges", shard_id, columns,
        SNAPSHOT_SCHEMAS["follow_edges"],
    )
    followers = edges["follower_id"].to_numpy().astype(np.int64, copy=False)
    wrong = misfiled(followers, shard_id, settings.shard_count)  # a stray file, say
    if wrong:
        root = Path(paths.snapshot_dir) / "follow_edges"
        raise ShardMismatchError(f"{root}/shard_id={shard_id:03d}: {wrong}")
    followees = edges["followee_id"].to_numpy().astype(np.int64, copy=False)
    active = (edges["status"] == "active").fill_null(False).to_numpy()
    created_at = (
        edges["created_at"].cast(pl.Datetime("us")).dt.epoch("us").fill_null(0).to_numpy()
        if "created_at" in edges.columns else None
    )
    del edges
    extra = read_partition(
        Path(paths.exports_dir) / "follow_exclusions", shard_id,
        ["user_id", "excluded_id", "reason"], EXPORT_SCHEMAS["follow_exclusions"],
    ).drop_nulls(["user_id", "excluded_id"])
    followee_dense = graph.dense_ids(followees)
    followee_active = np.zeros(len(followee_dense), dtype=np.bool_)
    known = followee_dense >= 0
    followee_active[known] = graph.account_active[followee_dense[known]]
    edge_keys = hop1_keys(
        settings, followers, followees, graph.dense_ids(followers), followee_dense, created_at,
        graph,
    )
    hop1_ptr, hop1_nodes, excl_ptr, excl_nodes, excl_reasons = shard_lists(
        positions(followers), followers, followees, followee_dense, active,
        positions(extra["user_id"].to_numpy()), graph.dense_ids(extra["excluded_id"].to_numpy()),
        len(user_ids), settings.hop1_cap, settings.sample_seed,
        extra_reasons=exclusion_codes(extra["reason"]),
        expandable=active & followee_active, edge_keys=edge_keys,
    )
    return ShardInputs(
        user_ids=user_ids,
        user_dense=graph.dense_ids(user_ids),
        hop1_ptr=hop1_ptr,
        hop1_nodes=hop1_nodes,
        excl_ptr=excl_ptr,
        excl_nodes=excl_nodes,
        excl_reasons=excl_reasons,
    )
