"""The compiled flow: candidate generation → pre-rank filters → ranking → filter-and-take.

``recommend_users`` runs ``_recommend`` (Numba, no per-user Python) over a shard's users chunk
by chunk. Per user, ``_recommend`` composes the stage functions, each inlined into it:
``predicates.flag_exclusions`` → ``candidates.count_candidates`` → ``predicates.prefilter`` →
``predicates.cut_to_max_candidates`` → ``ranking.ranked_score`` with ``take.insert_top_k`` →
``take.emit_rows``; the passing candidates reached once are kept apart from the others by the
filter and the cut and scored after them (``README.md``, "Candidates reached once"). Why one
compiled per-user counter for all of it: ``README.md`` here.

Contract: ``ShardInputs`` (``inputs``) and a ``CappedGraph`` (``graph``: ``indptr`` int64,
``indices`` int32, ``activity`` float64, NaN = not recommendable, ``path_weight`` float64,
``in_degree`` int32, ``recommendable`` uint8: ``predicates.recommendable_bits`` of
``activity``) in; ``KernelResult`` out,
rows in (user position, rank) order, with ``STAGE_COUNTS``: per-stage counts summed over users.
Memory: scratch bounded by the shard's largest user (``scratch``), output ``top_k`` rows per
user reserved; nothing O(n_nodes) is allocated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from recs.traversal.candidates import count_candidates
from recs.traversal.inputs import ShardInputs
from recs.traversal.jit import compiled
from recs.traversal.predicates import (
    DROP_REASONS,
    cut_to_max_candidates,
    flag_exclusions,
    prefilter,
)
from recs.traversal.ranking import ranked_score
from recs.traversal.scratch import (
    Scratch,
    key_node,
    key_slot,
    largest_user_bound,
    table_shape,
    user_bound,
)
from recs.traversal.take import OutputRows, emit_rows, insert_top_k

log = logging.getLogger("recs.traversal")

#: Users per kernel call: paces progress logging and the stage-count sums.
USERS_PER_CHUNK = 16_384
#: Per-stage counts, summed over a shard's users: distinct candidates counted; dropped by each
#: pre-rank filter (``predicates.DROP_REASONS``; slot = drop code); cut by
#: ``max_candidates_to_score``; scored; kept (= output rows). candidates = dropped + cut + scored.
STAGE_COUNTS = (
    "candidates", *(f"dropped_{reason}" for reason in DROP_REASONS),
    "cut_by_max_candidates_to_score", "scored", "kept",
)
_CANDIDATES = 0
_CUT = STAGE_COUNTS.index("cut_by_max_candidates_to_score")
_SCORED = STAGE_COUNTS.index("scored")
_KEPT = STAGE_COUNTS.index("kept")


class KernelParams(NamedTuple):
    """The settings the kernel reads (``recs.config.Settings``), typed for Numba."""

    hop2_cap: int
    min_mutual_count: int
    max_candidates_to_score: int
    top_k: int
    followed_by_count: int
    mutual_weight: float
    mutual_saturation: float
    activity_weight: float
    popularity_weight: float
    hub_damping: float
    hub_in_degree: int
    inverse_max_in_degree: float

    @classmethod
    def from_settings(cls, settings, graph_meta=None) -> KernelParams:
        """The settings' values; ``graph_meta`` (``CappedGraph.meta``) gives the run's largest
        follower count and smallest hub's (none: no popularity term, no hubs)."""
        meta = graph_meta or {}
        max_in_degree = int(meta.get("max_in_degree", 0))
        return cls(
            hop2_cap=int(settings.hop2_cap), min_mutual_count=int(settings.min_mutual_count),
            max_candidates_to_score=int(settings.max_candidates_to_score),
            top_k=int(settings.top_k), followed_by_count=int(settings.followed_by_count),
            mutual_weight=float(settings.mutual_weight),
            mutual_saturation=float(settings.mutual_saturation),
            activity_weight=float(settings.activity_weight),
            popularity_weight=float(settings.popularity_weight),
            hub_damping=float(settings.hub_damping),
            hub_in_degree=int(meta.get("hub_in_degree", 0)),
            inverse_max_in_degree=1.0 / max_in_degree if max_in_degree > 0 else 0.0,
        )


class Adjacency(NamedTuple):
    """The graph arrays the kernel reads (``CappedGraph``'s, memory-mapped)."""

    indptr: np.ndarray
    indices: np.ndarray
    activity: np.ndarray
    path_weight: np.ndarray
    in_degree: np.ndarray
    recommendable: np.ndarray


@compiled
def _recommend(
    user_begin, user_end, lists, graph, params, scratch, out, counts
):  # pragma: no cover - compiled; exercised through traverse_shard and the reference tests
    """The flow for users [begin, end) of ``lists`` (``ShardInputs``): writes their rows to
    ``out`` (``OutputRows``) in (user, rank) order, adds their stage counts to ``counts``
    (int64[len(STAGE_COUNTS)]); returns ``(rows, traversals)``."""
    n_rows = 0
    traversals = 0
    for user in range(user_begin, user_end):
        # the bound also brings the first hop's indptr entries into cache before counting
        shift, mask = table_shape(user_bound(user, lists, graph.indptr, params.hop2_cap))
        n_touched = flag_exclusions(user, lists, scratch, shift, mask)
        n_touched, user_traversals = count_candidates(
            user, lists, graph, params.hop2_cap, params.followed_by_count, scratch, shift, mask,
            n_touched,
        )
        n_multi, n_single, n_candidates, max_count = prefilter(
            n_touched, graph.recommendable, params.min_mutual_count, scratch, counts
        )
        scored_multi, scored_single = cut_to_max_candidates(
            n_multi, n_single, max_count, params.max_candidates_to_score, scratch
        )
        n_kept = 0
        # written out twice: the same loop through one inlined scoring stage ran the kernel
        # at half the speed (bench/README.md, issue 13)
        for i in range(scored_multi):
            node = scratch.pass_node[i]
            slot = scratch.pass_slot[i]
            score = ranked_score(
                scratch.table_weights[slot], graph.activity[node], graph.in_degree[node], params
            )
            n_kept = insert_top_k(
                node, scratch.pass_count[i], slot, score, n_kept, params.top_k, scratch
            )
        for i in range(scored_single):
            node = key_node(scratch.single_keys[i])
            slot = key_slot(scratch.single_keys[i])
            score = ranked_score(
                scratch.table_weights[slot], graph.activity[node], graph.in_degree[node], params
            )
            n_kept = insert_top_k(node, 1, slot, score, n_kept, params.top_k, scratch)
        n_rows = emit_rows(user, n_kept, params.followed_by_count, scratch, out, n_rows)
        n_scored = scored_multi + scored_single
        traversals += user_traversals
        counts[_CANDIDATES] += n_candidates
        counts[_CUT] += n_multi + n_single - n_scored
        counts[_SCORED] += n_scored
        counts[_KEPT] += n_kept
    return n_rows, traversals


@dataclass
class KernelResult:
    """The kernel's output: ``rows`` (``take.OutputRows``, one entry per output row in (user
    position, rank) order, ``followed_by`` shaped ``[rows, followed_by_count]``),
    ``traversals`` (second-hop entries counted) and ``stage_counts`` (``STAGE_COUNTS``)."""

    rows: OutputRows
    traversals: int
    stage_counts: dict[str, int]


def recommend_users(
    inputs: ShardInputs,
    graph,
    settings,
    users_per_chunk: int = USERS_PER_CHUNK,
) -> KernelResult:
    """Run the compiled flow over every user of ``inputs``, chunk by chunk.

    ``graph``: a ``CappedGraph`` (or anything with its ``indptr``, ``indices``, ``activity``,
    ``path_weight``, ``in_degree``, ``recommendable`` and optionally ``meta``).
    Scratch is sized by the shard's largest ``scratch.user_bound``, the output by
    ``top_k`` rows per user (only the rows written are touched). Logs progress per chunk on
    ``recs.traversal``.
    """
    n_users = len(inputs.user_ids)
    params = KernelParams.from_settings(settings, getattr(graph, "meta", None))
    fb = params.followed_by_count
    scratch = Scratch.allocate(
        bound=int(largest_user_bound(inputs, graph.indptr, params.hop2_cap)),
        max_count=int(np.diff(inputs.hop1_ptr).max()) if n_users else 0,
        top_k=params.top_k, followed_by_count=fb,
    )
    adjacency = Adjacency(
        graph.indptr, graph.indices, graph.activity, graph.path_weight, graph.in_degree,
        graph.recommendable,
    )
    out = OutputRows.allocate(n_users * params.top_k, fb)
    totals = np.zeros(len(STAGE_COUNTS), dtype=np.int64)
    counts = np.zeros(len(STAGE_COUNTS), dtype=np.int64)
    rows = 0
    traversals = 0
    for begin in range(0, n_users, users_per_chunk):
        end = min(n_users, begin + users_per_chunk)
        counts[:] = 0
        chunk_rows, chunk_traversals = _recommend(
            begin, end, inputs, adjacency, params, scratch, out.tail(rows, fb), counts
        )
        totals += counts
        rows += int(chunk_rows)
        traversals += int(chunk_traversals)
        log.info(
            "users %d-%d of %d: %d rows, %d traversals, %d candidates", begin, end, n_users,
            chunk_rows, chunk_traversals, counts[_CANDIDATES],
        )
    return KernelResult(
        rows=out.head(rows, fb), traversals=traversals,
        stage_counts=dict(zip(STAGE_COUNTS, totals.tolist(), strict=True)),
    )

