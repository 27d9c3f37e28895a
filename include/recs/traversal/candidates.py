"""Candidate generation: the bounded two-hop count of one user (ARCHITECTURE §1, §3).

``mutual_count`` of a candidate = the number of the user's expanded first-hop follows (at most
``hop1_cap``, ``inputs.ShardInputs``) whose capped CSR row (at most ``hop2_cap`` entries,
``graph``) contains it. Each first-hop row is counted into the user's table (``scratch``), which
also sums, per candidate, the path weight of the follows that reached it (``graph.path_weight``,
``ranking.path_weights``: 1 each for the design's blend) and keeps the first
``followed_by_count`` of them (in the user's sample order) for the "followed by" explanation.
Rows sit at random places of the CSR, so while counting one row the loop prefetches the row
``PREFETCH_DISTANCE`` follows ahead.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from recs.traversal.jit import stage
from recs.traversal.scratch import claim_slot

#: The kernel prefetches the second-hop row of the first-hop follow this many places ahead
#: (``bench/README.md``: distances 2-8 measured alike).
PREFETCH_DISTANCE = 4
_CACHE_LINE_INT32 = 16


@intrinsic
def _prefetch(typingctx, array, index):  # pragma: no cover - compiled
    """``llvm.prefetch`` (read, high locality) of ``array[index]``: a hint, never a fault.
    Numba has no prefetch of its own."""
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
        builder.call(
            function,
            [
                builder.bitcast(pointer, byte_pointer),
                ir.Constant(int32, 0),  # read
                ir.Constant(int32, 3),  # keep in all cache levels
                ir.Constant(int32, 1),  # data cache
            ],
        )
        return context.get_dummy_value()

    return signature, codegen


@stage
def prefetch_row(graph, friend, hop2_cap):  # pragma: no cover - compiled
    """Ask for the capped row of ``friend``, one cache line at a time."""
    start = graph.indptr[friend]
    end = min(graph.indptr[friend + 1], start + hop2_cap)
    for q in range(start, end, _CACHE_LINE_INT32):
        _prefetch(graph.indices, q)


@stage
def count_row(graph, friend, hop2_cap, followed_by_count, scratch, shift, mask, n_touched):
    # pragma: no cover - compiled
    """Count ``friend``'s capped row into the table, adding ``friend``'s path weight to each
    entry's sum (the first count of a slot overwrites its sum, so sums are never reset);
    returns ``(slots used, row length)``."""
    fb = followed_by_count
    indices, table_counts, reached_by = graph.indices, scratch.table_counts, scratch.reached_by
    table_weights = scratch.table_weights
    weight = graph.path_weight[friend]
    start = graph.indptr[friend]
    end = min(graph.indptr[friend + 1], start + hop2_cap)
    for q in range(np.uint64(start), np.uint64(end)):
        h, n_touched = claim_slot(
            scratch.table_nodes, scratch.touched, indices[q], shift, mask, n_touched
        )
        k = table_counts[h]
        if k < fb:
            reached_by[h * np.uint64(fb) + np.uint64(k)] = friend
        table_counts[h] = k + 1
        table_weights[h] = weight if k == 0 else table_weights[h] + weight
    return n_touched, end - start


@stage
def count_candidates(
    user, lists, graph, hop2_cap, followed_by_count, scratch, shift, mask, n_touched
):  # pragma: no cover - compiled
    """Count every expanded first-hop row of ``user`` (prefetching ahead) into a table holding
    ``n_touched`` slots (uint64); returns ``(slots used, traversals)``, traversals = second-hop
    entries counted."""
    traversals = 0
    first = lists.hop1_ptr[user]
    last = lists.hop1_ptr[user + 1]
    for p in range(first, last):
        if p + PREFETCH_DISTANCE < last:
            prefetch_row(graph, lists.hop1_nodes[p + PREFETCH_DISTANCE], hop2_cap)
        n_touched, length = count_row(
            graph,
            lists.hop1_nodes[p],
            hop2_cap,
            followed_by_count,
            scratch,
            shift,
            mask,
            n_touched,
        )
        traversals += length
    return n_touched, traversals
