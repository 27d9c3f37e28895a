"""Pre-rank filters (predicates): which counted candidates may be scored (ARCHITECTURE §1).

A candidate is dropped, under the first reason that applies, in this order (``DROP_REASONS``):
the user itself; the user's own follow (``contracts.FOLLOW_REASONS``: from the snapshot partition
the task reads anyway); another exclusion of the user (reasons of ``follow_exclusions``, in
``contracts.EXCLUSION_REASONS`` order, then any other reason); ``mutual_count <
min_mutual_count``; not recommendable (``recommendable_profiles`` false, or no candidate
profile: ``graph/activity.npy`` is NaN). The rest are cut to the top
``max_candidates_to_score`` by ``(mutual_count desc, candidate_id asc)`` before ranking.
Candidates reached once (most of them under ``min_mutual_count`` 1) are only listed while
filtering, one word each (``scratch.node_key``): the cut takes the fewest ids among them only
when fewer than ``max_candidates_to_score`` passing candidates were reached more often, by a
selection, not a sort (``select_smallest``).

A drop reason's code is its position in ``DROP_REASONS`` + 1 (0: not dropped) and is also the
candidate's slot in the kernel's stage counts. A new exclusion is a new dbt reason (counted under
``other_exclusion`` until it is named here), or a new code here and a line in ``drop_reason``.
"""

from __future__ import annotations

import numpy as np

from recs.contracts import EXCLUSION_REASONS, FOLLOW_REASONS
from recs.traversal.jit import stage
from recs.traversal.scratch import claim_slot, key_node, key_slot, node_key

#: Why a candidate is not scored, in the order the flow tries them; code = position + 1.
DROP_REASONS = (
    "self",
    *FOLLOW_REASONS,
    *EXCLUSION_REASONS,
    "other_exclusion",
    "below_min_mutual_count",
    "not_recommendable",
)
SELF = 1
FOLLOWING = DROP_REASONS.index("following") + 1
PENDING = DROP_REASONS.index("pending") + 1
OTHER_EXCLUSION = DROP_REASONS.index("other_exclusion") + 1
BELOW_MIN_MUTUAL_COUNT = DROP_REASONS.index("below_min_mutual_count") + 1
NOT_RECOMMENDABLE = DROP_REASONS.index("not_recommendable") + 1
def exclusion_codes(reasons) -> np.ndarray:
    """Drop codes (``uint8``) of ``follow_exclusions`` reasons (a Polars string Series);
    a reason this module does not name, or none, is ``OTHER_EXCLUSION``."""
    import polars as pl

    codes = {reason: DROP_REASONS.index(reason) + 1 for reason in EXCLUSION_REASONS}
    return (
        reasons.replace_strict(codes, default=OTHER_EXCLUSION, return_dtype=pl.UInt8)
        .fill_null(OTHER_EXCLUSION)
        .to_numpy()
        .astype(np.uint8, copy=False)
    )


def recommendable_profiles():
    """Polars predicate on ``candidate_profiles`` rows: the accounts that may be recommended
    (``is_recommendable``: active and discoverable; null counts as false). ``build_graph`` gives
    every other account a NaN activity, and a clear bit in ``recommendable_bits``, which
    ``is_recommendable`` reads back."""
    import polars as pl

    return pl.col("is_recommendable").fill_null(False)


def recommendable_bits(activity: np.ndarray) -> np.ndarray:
    """One bit per node, set where ``activity`` (float64[n_nodes]) is not NaN (see
    ``recommendable_profiles``): ``uint8[ceil(n_nodes / 8)]``, node ``v`` at bit ``v % 8``
    of byte ``v // 8``. The pre-rank filter reads it for every candidate counted: 1/64 of the
    activity's bytes, so it stays in cache far longer (``bench/README.md``, issue 13)."""
    return np.packbits(~np.isnan(np.asarray(activity, dtype=np.float64)), bitorder="little")


@stage
def is_recommendable(bits, node):  # pragma: no cover - compiled
    """The node's bit of ``recommendable_bits``."""
    return (bits[node >> 3] >> (node & 7)) & 1 == 1


@stage
def follow_reason(active):  # pragma: no cover - compiled
    """Drop code of one of the user's own follow edges: ``following`` if active, else
    ``pending``."""
    return FOLLOWING if active else PENDING


@stage
def flag_exclusions(user, lists, scratch, shift, mask):  # pragma: no cover - compiled
    """Put the user (``SELF``) and its exclusions into its empty table, each with its drop code;
    an account excluded for several reasons keeps the smallest code. Returns the slots used
    (uint64, ``scratch.claim_slot``)."""
    n_touched = np.uint64(0)
    first = lists.excl_ptr[user]
    for e in range(first - 1, lists.excl_ptr[user + 1]):
        if e < first:
            node = lists.user_dense[user]
            reason = SELF
        else:
            node = lists.excl_nodes[e]
            reason = lists.excl_reasons[e]
        if node < 0:
            continue
        h, n_touched = claim_slot(
            scratch.table_nodes, scratch.touched, node, shift, mask, n_touched
        )
        held = scratch.table_reasons[h]
        if held == 0 or reason < held:
            scratch.table_reasons[h] = reason
    return n_touched


@stage
def drop_reason(flagged, count, min_mutual_count, recommendable, node):  # pragma: no cover
    """Code of the first pre-rank filter that drops a counted candidate, 0 if it passes.
    ``flagged``: its code from ``flag_exclusions`` (0 if none); ``recommendable``: the graph's
    ``recommendable_bits``."""
    if flagged:
        return flagged
    if count < min_mutual_count:
        return BELOW_MIN_MUTUAL_COUNT
    if not is_recommendable(recommendable, node):  # read last: a random read per candidate
        return NOT_RECOMMENDABLE
    return 0


@stage
def prefilter(n_touched, recommendable, min_mutual_count, scratch, counts):  # pragma: no cover
    """Apply ``drop_reason`` to every candidate of the user's table, resetting the table on the
    way. Passing candidates reached at least twice go to ``pass_slot`` / ``pass_node`` /
    ``pass_count``, those reached once to ``single_keys`` (``node_key``); each dropped one adds
    1 to ``counts[code]``. Returns ``(passing reached more than once, passing reached once,
    candidates, max mutual_count)``; ``candidates`` = distinct accounts counted (a flagged
    account nobody reached is none)."""
    n_multi = 0
    n_single = 0
    n_candidates = 0
    n_below = 0
    max_count = 0
    for i in range(n_touched):
        h = np.uint64(scratch.touched[i])
        node = scratch.table_nodes[h]
        c = scratch.table_counts[h]
        flagged = scratch.table_reasons[h]
        scratch.table_nodes[h] = -1
        scratch.table_counts[h] = 0
        scratch.table_reasons[h] = 0
        if c == 0:
            continue
        n_candidates += 1
        reason = drop_reason(flagged, c, min_mutual_count, recommendable, node)
        if reason == BELOW_MIN_MUTUAL_COUNT:
            n_below += 1  # the common drop: a register, not a store per candidate
            continue
        if reason:
            counts[reason] += 1
            continue
        if c == 1:
            scratch.single_keys[n_single] = node_key(node, h)
            n_single += 1
            continue
        scratch.pass_slot[n_multi] = h
        scratch.pass_node[n_multi] = node
        scratch.pass_count[n_multi] = c
        n_multi += 1
        if c > max_count:
            max_count = c
    counts[BELOW_MIN_MUTUAL_COUNT] += n_below
    return n_multi, n_single, n_candidates, max_count


@stage
def select_smallest(keys, n, m):  # pragma: no cover - compiled
    """Reorder ``keys[:n]`` (distinct ``uint64``) in place so that ``keys[:m]`` are its ``m``
    smallest, in no particular order. Quickselect (Hoare's FIND, CACM 4(7), 1961) with a
    median-of-3 pivot and a branch-free Lomuto partition (``bench/README.md``: 0.1-0.15 s less
    per shard than Hoare's partition, whose branches mispredict); expected O(n), and after
    ``2 log2 n`` rounds the range left is sorted instead, so never worse than O(n log n)."""
    if m <= 0 or m >= n:
        return
    lo = 0
    hi = n - 1
    k = m - 1
    limit = 0
    size = n
    while size > 0:  # 2 log2 n
        size >>= 1
        limit += 2
    while lo < hi:
        limit -= 1
        if limit < 0:
            keys[lo : hi + 1].sort()
            return
        mid = (lo + hi) >> 1
        a, b, c = keys[lo], keys[mid], keys[hi]
        pivot = max(min(a, b), min(max(a, b), c))
        if keys[mid] == pivot:  # the pivot to the end of the range
            keys[mid], keys[hi] = keys[hi], keys[mid]
        elif keys[lo] == pivot:
            keys[lo], keys[hi] = keys[hi], keys[lo]
        store = lo
        for i in range(lo, hi):  # keys[lo:store] < pivot <= keys[store:i]
            key = keys[i]
            keys[i] = keys[store]
            keys[store] = key
            store += 1 if key < pivot else 0
        keys[hi] = keys[store]
        keys[store] = pivot
        if store == k:
            return
        if k < store:
            hi = store - 1
        else:
            lo = store + 1


@stage
def cut_to_max_candidates(n_multi, n_single, max_count, max_candidates, scratch):
    # pragma: no cover - compiled
    """Keep the top ``max_candidates`` passing candidates by ``(mutual_count desc, node asc)``
    (dense order is id order): the ``n_multi`` of the pass buffers (reached more than once)
    rank before the ``n_single`` of ``single_keys``. Returns ``(kept of the pass buffers,
    compacted to their front; kept of single_keys, moved to its front)``.

    The singles are cut as a whole (some of the others are) or not at all (they all fit), or
    the fewest ids of them fill the places the others leave (``select_smallest``); among the
    others a histogram of the counts finds the threshold, and ties at it are taken by node."""
    if n_multi + n_single <= max_candidates:
        return n_multi, n_single
    if n_multi < max_candidates:
        fill = max_candidates - n_multi
        select_smallest(scratch.single_keys, n_single, fill)
        return n_multi, fill
    histogram = scratch.histogram
    for c in range(max_count + 1):
        histogram[c] = 0
    for i in range(n_multi):
        histogram[scratch.pass_count[i]] += 1
    threshold = max_count
    above = 0
    while above + histogram[threshold] < max_candidates:
        above += histogram[threshold]
        threshold -= 1
    n_selected = 0
    n_ties = 0
    for i in range(n_multi):
        c = scratch.pass_count[i]
        if c > threshold:
            scratch.pass_slot[n_selected] = scratch.pass_slot[i]
            scratch.pass_node[n_selected] = scratch.pass_node[i]
            scratch.pass_count[n_selected] = c
            n_selected += 1
        elif c == threshold:
            scratch.tie_keys[n_ties] = node_key(scratch.pass_node[i], scratch.pass_slot[i])
            n_ties += 1
    need = max_candidates - n_selected
    select_smallest(scratch.tie_keys, n_ties, need)
    for j in range(need):
        key = scratch.tie_keys[j]
        scratch.pass_slot[n_selected] = key_slot(key)
        scratch.pass_node[n_selected] = key_node(key)
        scratch.pass_count[n_selected] = threshold
        n_selected += 1
    return n_selected, 0
