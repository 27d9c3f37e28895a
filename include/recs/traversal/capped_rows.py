"""The capped rows of the run's graph: each account's first ``hop2_cap`` active follows.

``capped_in_order`` reads the snapshot's ``follow_edges`` files (contract
``SNAPSHOT_SCHEMAS["follow_edges"]``), keeps the active follows of known accounts (no
self-follows, no duplicate pairs), sorts each follower's row in ``hop2_order`` (``RowOrder``,
``hop_order``; sample order: ``recs.sampling``) and cuts it at ``hop2_cap``;
``graph_pieces.cap_pieces`` saves each file's rows as a piece. ``assemble_rows`` writes the
pieces' rows into ``indices.npy`` with their ``indptr``; ``graph.assemble_graph`` calls it and
writes the rest of the graph. ``GRAPH_THREADS`` files are capped at once, on threads, consumed
in order, each with its own ``EdgeCounts`` added in that order: the bytes do not depend on the
threads. Memory: that many files' edges plus ``n_nodes`` counters (bench/README, "The night at
scale").
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from recs.arrays import sorted_unique
from recs.errors import CorruptFileError
from recs.files import atomic_path, read_parquet
from recs.sampling import rank_within_groups, sample_keys
from recs.sharding import misfiled, partition_files
from recs.traversal.hop_order import (
    grouped_order,
    ordered_keys,
    pair_codes,
    popularity_priority,
    recency_priority,
    reciprocated,
    reciprocity_priority,
)
from recs.traversal.ids import DenseIndex
from recs.traversal.in_degree_check import followee_sums

log = logging.getLogger("recs.graph")

#: Partitions capped at once (``capped_in_order``): the Parquet read, NumPy's sorts, gathers
#: and bincounts release the GIL, so two threads use both cores of a small machine (the 16
#: partitions of 1 M users: 8.4-8.6 s on one thread, 4.9-5.4 s on two, 6.0 s on three;
#: ``bench/README.md``, "The night at scale"). Memory: this many partitions' edges at once.
GRAPH_THREADS = 2


@dataclass(frozen=True)
class RowOrder:
    """How rows are cut (``hop_order``): ``order`` and what it needs, by dense id:
    ``in_degree`` (popularity), ``reciprocal_codes`` (reciprocity, sorted pair codes)."""

    order: str = "sample"
    in_degree: np.ndarray | None = None
    reciprocal_codes: np.ndarray | None = None

    def keys(self, followers, followees, src, dst, created_at_us, seed) -> np.ndarray:
        """The ``uint64`` order keys of these edges (original and dense ids, times in µs)."""
        keys = sample_keys(followers, followees, seed)
        if self.order == "sample":
            return keys
        if self.order == "recency":
            priority = recency_priority(created_at_us)
        elif self.order == "popularity":
            priority = popularity_priority(self.in_degree[dst])
        else:
            priority = reciprocity_priority(reciprocated(src, dst, self.reciprocal_codes))
        return ordered_keys(keys, priority)


def sample_sorted(
    groups: np.ndarray, n_groups: int, keys: np.ndarray, tie_breaks: np.ndarray
) -> np.ndarray:
    """Permutation ordering edges by ``(group, key, tie_break)`` (``int64``).

    ``groups``: non-negative ints below ``n_groups`` (dense follower ids or user positions).
    ``keys``: ``uint64`` sample keys; ``tie_breaks``: followee ids (original or dense: dense
    order equals original order). Fast path: one ``argsort`` of a packed ``uint64`` of the group
    and the key's high bits; if two packed values tie (a duplicate pair, or a 1-in-2**40 key
    collision) it falls back to the exact three-key ``lexsort``, so the order is always exact.
    """
    n = len(groups)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    group_bits = max(1, int(n_groups - 1).bit_length())
    if group_bits <= 40:
        shift = np.uint64(group_bits)
        packed = (groups.astype(np.uint64) << np.uint64(64 - group_bits)) | (keys >> shift)
        order = np.argsort(packed, kind="quicksort")
        ordered = packed[order]
        if not (ordered[1:] == ordered[:-1]).any():
            return order
    return np.lexsort((tie_breaks, keys, groups))


@dataclass
class EdgeCounts:
    """What reading follow-edge files counted (rows, and why rows were left out of the graph);
    ``in_degree_follows``, ``followee_id_sum`` and ``followee_hash_sum`` are the
    ``in_degree_check`` sums of their active follows (unknown accounts' too)."""

    edges_read: int = 0
    pending_skipped: int = 0
    unknown_endpoint_dropped: int = 0
    self_loops_dropped: int = 0
    duplicates_dropped: int = 0
    rows_capped: int = 0
    in_degree_follows: int = 0
    followee_id_sum: int = 0
    followee_hash_sum: int = 0
    partitions: list[int] = field(default_factory=list)

    def add(self, other: EdgeCounts) -> None:
        """Add ``other``'s counts (a partition's, counted on its own thread) to these."""
        for name in (counter.name for counter in fields(self) if counter.name != "partitions"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def _active_partition(
    path: Path, index: DenseIndex, counts: EdgeCounts | None, home: tuple[int, int] | None = None
):
    """One partition's active follows of known accounts, no self-follows: ``(followers,
    followees)`` original int64, ``(src, dst)`` dense, ``created_at`` int64 µs. With ``home``
    (``(shard_id, shard_count)``): ``CorruptFileError`` if a row's follower is of another
    shard (``recs.sharding.misfiled``)."""
    import polars as pl

    frame = read_parquet(path, ["follower_id", "followee_id", "created_at", "status"])
    wrong = home and misfiled(frame["follower_id"].to_numpy(), *home)
    if wrong:
        raise CorruptFileError(f"{path}: {wrong}")
    active = frame.filter(pl.col("status") == "active")
    followers = active["follower_id"].to_numpy().astype(np.int64, copy=False)
    followees = active["followee_id"].to_numpy().astype(np.int64, copy=False)
    created = active["created_at"].cast(pl.Datetime("us")).dt.epoch("us").fill_null(0).to_numpy()
    src = index(followers)
    dst = index(followees)
    known = (src >= 0) & (dst >= 0)
    not_self = src != dst
    if counts is not None:
        counts.edges_read += frame.height
        counts.pending_skipped += frame.height - active.height
        counts.unknown_endpoint_dropped += int(len(known) - known.sum())
        counts.self_loops_dropped += int((known & ~not_self).sum())
        follows, id_sum, hash_sum = followee_sums(followers, followees)  # unknown ones too
        counts.in_degree_follows += follows
        counts.followee_id_sum += id_sum
        counts.followee_hash_sum += hash_sum
    keep = known & not_self
    return followers[keep], followees[keep], src[keep], dst[keep], created[keep]


def _capped_partition(
    path: Path, index: DenseIndex, hop2_cap: int, seed: int, counts: EdgeCounts,
    row_order: RowOrder | None = None, home: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One partition's capped edges: ``(follower dense int32, followee dense int32, full
    out-degree int64[n_nodes])``, the last counting every distinct active follow.

    Sorted by follower, then ``row_order`` (default ``sample``); at most ``hop2_cap`` per
    follower. ``home``: ``_active_partition``'s check.
    """
    row_order = row_order or RowOrder()
    followers, followees, src, dst, created = _active_partition(path, index, counts, home)
    keys = row_order.keys(followers, followees, src, dst, created, seed)
    del followers, followees, created
    if row_order.order == "sample":
        order = sample_sorted(src, len(index.user_ids), keys, dst)
    else:  # keys are priority-first: exact (packing them with the group would lose bits)
        order = grouped_order(src, keys, dst)
    src, dst, keys = src[order], dst[order], keys[order]
    duplicate = np.zeros(len(src), dtype=bool)
    duplicate[1:] = (src[1:] == src[:-1]) & (dst[1:] == dst[:-1])
    if duplicate.any():
        counts.duplicates_dropped += int(duplicate.sum())
        src, dst, keys = src[~duplicate], dst[~duplicate], keys[~duplicate]
    out_degree = np.bincount(src, minlength=len(index.user_ids)).astype(np.int64)
    rank = rank_within_groups(src)
    counts.rows_capped += int((rank == hop2_cap).sum())
    within = rank < hop2_cap
    return src[within].astype(np.int32), dst[within].astype(np.int32), out_degree


def capped_in_order(
    files: list[tuple[int, Path]], index: DenseIndex, hop2_cap: int, seed: int,
    row_order: RowOrder, shard_count: int,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, EdgeCounts]]:
    """``_capped_partition`` of each of ``files`` (``(shard_id, path)``: every follower of the
    file must be of that shard of ``shard_count``), in their order, with its own counts;
    ``GRAPH_THREADS`` of them computed or held at once, counting the one the caller holds
    (memory: that many partitions). An error is raised at its file; the
    ones not started by then are cancelled."""

    def one(shard_id: int, path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, EdgeCounts]:
        counts = EdgeCounts()
        home = (shard_id, shard_count)
        return (
            *_capped_partition(path, index, hop2_cap, seed, counts, row_order, home=home),
            counts,
        )

    with ThreadPoolExecutor(GRAPH_THREADS, thread_name_prefix="recs-graph") as pool:
        pending: deque[Future] = deque()
        try:
            for shard_id, path in files:
                pending.append(pool.submit(one, shard_id, path))
                if len(pending) == GRAPH_THREADS:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def reciprocal_pair_codes(snapshot_dir: Path, index: DenseIndex) -> np.ndarray:
    """Sorted ``hop_order.pair_codes`` of the snapshot's active follows whose reverse is an
    active follow too (one pass over every partition; 8 bytes per follow while it runs)."""
    pieces = []
    for files in partition_files(Path(snapshot_dir) / "follow_edges").values():
        for path in files:
            _, _, src, dst, _ = _active_partition(path, index, None)
            pieces.append(pair_codes(src, dst))
    codes = (
        sorted_unique(np.concatenate(pieces), np.uint64) if pieces
        else np.zeros(0, dtype=np.uint64)
    )
    src = (codes >> np.uint64(32)).astype(np.int64)
    dst = (codes & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return codes[reciprocated(src, dst, codes)]


def assemble_rows(
    pieces: Iterable, index: DenseIndex, n_nodes: int, counts: EdgeCounts, row_order: RowOrder,
    settings, indices_path: Path,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The capped rows of every piece, assembled into ``indices_path`` (int32 ``.npy``).

    ``pieces``: ``graph_pieces.PieceFile``s in partition then file order (``cap_pieces`` capped
    each file). Pass 1 reads each one's followers (``src``) and uncapped out-degrees and adds its
    counts; pass 2 scatters each row into a memory map of ``indices_path`` written through
    ``atomic_path`` (file-backed pages, not private memory), so the assembly's memory grows with
    the largest piece and ``n_nodes``, not with the graph's edges. Returns ``(indptr
    int64[n_nodes + 1], degree int64[n_nodes] capped, out_degree int64[n_nodes] uncapped,
    n_edges)``.
    """
    hop2_cap = int(settings.hop2_cap)
    pieces = list(pieces)
    degree = np.zeros(n_nodes, dtype=np.int64)
    out_degree = np.zeros(n_nodes, dtype=np.int64)
    overlapping = False
    for piece in pieces:
        counts.add(piece.counts)
        out_degree[np.load(piece.followers)] += np.load(piece.out_degree)
        piece_degree = np.bincount(np.load(piece.src), minlength=n_nodes)
        overlapping = overlapping or bool(((degree > 0) & (piece_degree > 0)).any())
        degree += piece_degree
        del piece_degree

    if overlapping:
        # A follower split across files (not the snapshot's layout, but harmless): the
        # union of per-file prefixes contains the global prefix, so re-sort and re-cap.
        src = np.concatenate([np.load(p.src) for p in pieces])
        dst = np.concatenate([np.load(p.dst) for p in pieces])
        user_ids = index.user_ids
        keys = row_order.keys(
            user_ids[src], user_ids[dst], src, dst, np.zeros(len(src), dtype=np.int64),
            settings.sample_seed,
        )  # (recency: the times are not kept per piece; the re-cut is in sample order then)
        order = grouped_order(src, keys, dst)
        src, dst = src[order], dst[order]
        duplicate = np.zeros(len(src), dtype=bool)
        duplicate[1:] = (src[1:] == src[:-1]) & (dst[1:] == dst[:-1])
        counts.duplicates_dropped += int(duplicate.sum())
        src, dst = src[~duplicate], dst[~duplicate]
        within = rank_within_groups(src) < hop2_cap
        src, dst = src[within], dst[within]
        degree = np.bincount(src, minlength=n_nodes).astype(np.int64)
    indptr = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(degree, out=indptr[1:])
    n_edges = int(indptr[-1])
    with atomic_path(indices_path) as tmp:
        indices = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int32, shape=(n_edges,))
        if overlapping:
            indices[:] = dst  # already in row order
        else:
            # Pass 2: each row lives in exactly one piece, already in row order: scatter it.
            for piece in pieces:
                src = np.load(piece.src)
                indices[indptr[src] + rank_within_groups(src)] = np.load(piece.dst)
        indices.flush()
        del indices
    return indptr, degree, out_degree, n_edges
