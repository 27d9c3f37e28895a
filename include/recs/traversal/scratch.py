"""The kernel's per-user working memory: an open-addressing counter table and candidate buffers.

Per user, the table (linear probing, Fibonacci hashing, Knuth TAOCP vol. 3 §6.4, at most half
full) has ``2**bits >= 2 * bound`` slots, ``bound`` = ``user_bound``: the distinct accounts its
expansion and its exclusions can put there. Every array is sized by the shard's largest bound
(at most ``hop1_cap * hop2_cap`` + exclusions), never by the graph, so a shard task's private
memory grows with its own users only; ``touched`` lists the slots a user used, and they are
reset before the next user (``predicates.prefilter``); the weight sums need no reset, as the
first count of a slot overwrites its sum (``candidates.count_row``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from recs.traversal.jit import compiled, stage

#: Fibonacci hashing multiplier (Knuth TAOCP vol. 3 §6.4): 2**32 / golden ratio.
_FIBONACCI32 = 2_654_435_769


class Scratch(NamedTuple):
    """``table_*`` / ``reached_by`` / ``touched``: the counter table, per slot (node int32, -1 =
    free; count int32; path-weight sum float64, valid where the count is not 0; drop reason
    uint8, 0 = none; the first ``followed_by_count`` first-hop ids that reached it).
    ``pass_*``: the passing candidates reached at least twice (slot, node, count);
    ``single_keys``: those reached once, as ``node_key`` words; ``tie_keys`` / ``histogram``:
    the ``max_candidates_to_score`` cut (``predicates``). ``best_*``: top-k (node, count, slot,
    score; ``take``)."""

    table_nodes: np.ndarray
    table_counts: np.ndarray
    table_weights: np.ndarray
    table_reasons: np.ndarray
    reached_by: np.ndarray
    touched: np.ndarray
    pass_slot: np.ndarray
    pass_node: np.ndarray
    pass_count: np.ndarray
    single_keys: np.ndarray
    tie_keys: np.ndarray
    histogram: np.ndarray
    best_node: np.ndarray
    best_count: np.ndarray
    best_slot: np.ndarray
    best_score: np.ndarray

    @classmethod
    def allocate(cls, bound: int, max_count: int, top_k: int, followed_by_count: int) -> Scratch:
        """Scratch for users of at most ``bound`` table entries and ``max_count`` mutuals:
        ``table_size(bound)`` slots x (4 + 4 + 8 + 1 + 4 * followed_by_count) bytes plus
        ``bound`` x 28 bytes of candidate buffers."""
        size = table_size(bound)
        return cls(
            table_nodes=np.full(size, -1, dtype=np.int32),
            table_counts=np.zeros(size, dtype=np.int32),
            table_weights=np.zeros(size, dtype=np.float64),
            table_reasons=np.zeros(size, dtype=np.uint8),
            reached_by=np.empty(max(1, size * followed_by_count), dtype=np.int32),
            touched=np.empty(size, dtype=np.int32),
            pass_slot=np.empty(bound, dtype=np.int32),
            pass_node=np.empty(bound, dtype=np.int32),
            pass_count=np.empty(bound, dtype=np.int32),
            single_keys=np.empty(bound, dtype=np.uint64),
            tie_keys=np.empty(bound, dtype=np.uint64),
            histogram=np.empty(max_count + 2, dtype=np.int64),
            best_node=np.empty(top_k, dtype=np.int32),
            best_count=np.empty(top_k, dtype=np.int32),
            best_slot=np.empty(top_k, dtype=np.int32),
            best_score=np.empty(top_k, dtype=np.float64),
        )


def table_size(bound: int) -> int:
    """Slots of the table for ``bound`` entries: the least power of two >= 2 * bound, >= 16."""
    size = 16
    while size < 2 * bound:
        size *= 2
    return size


@stage
def user_bound(user, lists, indptr, hop2_cap):  # pragma: no cover - compiled
    """Upper bound of the distinct nodes ``user``'s table holds: the expanded row lengths of its
    first hop (each at most ``hop2_cap``) + its exclusions + itself. ``lists``: ShardInputs."""
    bound = lists.excl_ptr[user + 1] - lists.excl_ptr[user] + 1
    for p in range(lists.hop1_ptr[user], lists.hop1_ptr[user + 1]):
        friend = lists.hop1_nodes[p]
        bound += min(indptr[friend + 1] - indptr[friend], hop2_cap)
    return bound


@compiled
def largest_user_bound(lists, indptr, hop2_cap):  # pragma: no cover - compiled
    """The largest ``user_bound`` of the shard's users (1 if it has none): sizes ``Scratch``."""
    largest = 1
    for user in range(len(lists.user_ids)):
        largest = max(largest, user_bound(user, lists, indptr, hop2_cap))
    return largest


@stage
def table_shape(bound):  # pragma: no cover - compiled
    """``(shift, mask)`` of a user's table: ``2**bits`` slots, the least power of two (>= 16)
    holding ``bound`` entries at most half full (``table_size``)."""
    bits = 4
    while (1 << bits) < 2 * bound:
        bits += 1
    return 32 - bits, (1 << bits) - 1


@stage
def claim_slot(table_nodes, touched, node, shift, mask, n_touched):  # pragma: no cover
    """The slot of ``node`` in the table, taking a free one (and listing it in ``touched``) if
    it is not there yet: returns ``(slot, n_touched)``. Home slot ``(node * _FIBONACCI32 mod
    2**32) >> shift``, then linear probing. Slots and ``n_touched`` are unsigned, so array
    accesses need no negative-index wraparound (``bench/README.md``)."""
    h = np.uint64(((node * _FIBONACCI32) & 0xFFFFFFFF) >> shift)
    while True:
        held = table_nodes[h]
        if held == node:
            return h, n_touched
        if held < 0:
            table_nodes[h] = node
            touched[n_touched] = h
            return h, n_touched + np.uint64(1)
        h = (h + np.uint64(1)) & np.uint64(mask)


@stage
def node_key(node, slot):  # pragma: no cover - compiled
    """One ``uint64`` word ordering candidates by node (= candidate id order): the node in the
    high 32 bits, its table slot in the low ones (``key_node`` / ``key_slot`` read them back)."""
    return (np.uint64(node) << np.uint64(32)) | np.uint64(slot)


@stage
def key_node(key):  # pragma: no cover - compiled
    """The node (``int32``) of a ``node_key`` word."""
    return np.int32(key >> np.uint64(32))


@stage
def key_slot(key):  # pragma: no cover - compiled
    """The table slot (``uint64``) of a ``node_key`` word."""
    return key & np.uint64(0xFFFFFFFF)
