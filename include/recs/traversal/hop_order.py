"""Which follows the caps keep: the order a follow list is cut in (``Settings.hop1_order`` /
``hop2_order``).

``sample`` is ``recs.sampling``'s uniform keyed order (ARCHITECTURE §5). The other orders put a
priority in front of the sample key, so within one priority the order is still the sample's:

- ``recency``: newer follows first (the edge's ``created_at``, whole seconds);
- ``reciprocity``: follows whose followee follows back first;
- ``popularity``: follows of more-followed accounts first (the followee's ``in_degree``).

``ordered_keys`` packs ``priority`` (32 bits, smaller first) over the sample key's high 32
bits into one ``uint64`` key; lists are then ordered by ``(key, followee)``, as for ``sample``
(``grouped_order``: the exact order of ``np.lexsort``, a run of each follower at a time).
The capped graph's rows use ``hop2_order`` (``graph.build_graph``), the first hops
``hop1_order`` (``inputs.shard_inputs``).
"""

from __future__ import annotations

import numpy as np

from recs.traversal.jit import compiled

HOP_ORDERS = ("sample", "recency", "reciprocity", "popularity")
_LOW32 = np.uint64(0xFFFFFFFF)


def ordered_keys(sample_keys: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """``uint64`` keys ordering by ``priority`` (non-negative ints below 2**32, smaller first),
    then by ``sample_keys``' high 32 bits."""
    priority = np.clip(np.asarray(priority, dtype=np.int64), 0, int(_LOW32)).astype(np.uint64)
    return (priority << np.uint64(32)) | (sample_keys >> np.uint64(32))


def recency_priority(created_at_us: np.ndarray) -> np.ndarray:
    """Priority of follows by time (``int64`` epoch microseconds): newest first."""
    seconds = np.asarray(created_at_us, dtype=np.int64) // 1_000_000
    return int(_LOW32) - np.clip(seconds, 0, int(_LOW32))


def popularity_priority(followee_in_degree: np.ndarray) -> np.ndarray:
    """Priority of follows by the followee's follower count: most-followed first."""
    return int(_LOW32) - np.clip(np.asarray(followee_in_degree, dtype=np.int64), 0, int(_LOW32))


def reciprocity_priority(reciprocated: np.ndarray) -> np.ndarray:
    """Priority of follows by whether they are followed back: those first."""
    return np.where(np.asarray(reciprocated, dtype=bool), 0, 1).astype(np.int64)


def pair_codes(src_dense: np.ndarray, dst_dense: np.ndarray) -> np.ndarray:
    """``uint64`` code of each (follower, followee) dense pair: ``src << 32 | dst``."""
    return (np.asarray(src_dense, dtype=np.uint64) << np.uint64(32)) | np.asarray(
        dst_dense, dtype=np.uint64
    )


def reciprocated(src_dense: np.ndarray, dst_dense: np.ndarray, sorted_codes: np.ndarray):
    """Whether each pair's reverse is in ``sorted_codes`` (sorted ``pair_codes`` of the active
    follows): ``bool`` array."""
    if len(sorted_codes) == 0:
        return np.zeros(len(src_dense), dtype=bool)
    reverse = pair_codes(dst_dense, src_dense)
    at = np.searchsorted(sorted_codes, reverse)
    at = np.minimum(at, len(sorted_codes) - 1)
    return sorted_codes[at] == reverse


def grouped_order(groups: np.ndarray, keys: np.ndarray, tie_breaks: np.ndarray) -> np.ndarray:
    """Permutation (``int64``) ordering edges by ``(group, key, tie_break)``: exactly
    ``np.lexsort((tie_breaks, keys, groups))``, ties included (both are stable).

    Fast path, when the edges come grouped by ``groups`` in ascending order and, within each
    group, in ascending ``tie_breaks`` (a snapshot partition is sorted by ``(follower_id,
    followee_id)`` and dense ids keep that order): each group's run is sorted by ``keys`` alone
    and stably, in one compiled pass, so the ties stay in ``tie_break`` order. That is
    O(n log run) instead of three stable sorts of all n (``bench/README.md``, "The night at
    scale": 68 % of ``build_graph`` at 1 M users was the lexsort). Otherwise it is the lexsort.
    ``groups`` and ``tie_breaks``: integer arrays; ``keys``: ``uint64`` (other keys, or
    arrays of unequal lengths, go to the lexsort, which orders or refuses them as it does).
    """
    n = len(groups)
    if keys.dtype != np.uint64 or len(keys) != n or len(tie_breaks) != n:
        return np.lexsort((tie_breaks, keys, groups))  # its order for other keys, its errors
    if n < 2:
        return np.arange(n, dtype=np.int64)
    same = groups[1:] == groups[:-1]
    if not (groups[1:] >= groups[:-1]).all() or not (
        tie_breaks[1:][same] >= tie_breaks[:-1][same]
    ).all():
        return np.lexsort((tie_breaks, keys, groups))
    starts = np.flatnonzero(np.r_[True, ~same, True]).astype(np.int64)
    return _sort_runs(starts, np.ascontiguousarray(keys))


@compiled
def _sort_runs(starts, keys):  # pragma: no cover - compiled; grouped_order's tests run it
    """The identity permutation with each run ``[starts[g], starts[g + 1])`` sorted stably by
    ``keys``."""
    order = np.arange(len(keys))
    for g in range(len(starts) - 1):
        lo = starts[g]
        hi = starts[g + 1]
        if hi - lo > 1:
            order[lo:hi] = np.argsort(keys[lo:hi], kind="mergesort") + lo
    return order
