"""Ranking: the score of a candidate that survived the pre-rank filters (ARCHITECTURE §1).

    score = mutual_weight * min(W / mutual_saturation, 1) * damping
            + activity_weight * 0.5 ** (days_inactive / half_life_days)
            + popularity_weight * followers / max followers

``W`` sums a weight over the expanded first-hop follows ``z`` that reach the candidate
(``Settings.ranking``, ``path_weights``), with ``d(z)`` = z's active follows plus followers (its
degree; at least 2 on a path, all of them, not only the capped row): ``blend`` 1 (W =
``mutual_count``: the design's ``score_candidate``, defaults 0.7, 25, 0.3, 14, no popularity
term), ``adamic_adar`` ``1 / log2 d(z)`` (Adamic & Adar, "Friends and neighbors on the Web",
Social Networks 2003, scaled by ln 2 so a path weighs at most 1) or ``resource_allocation``
``2 / d(z)`` (Zhou, Lü & Zhang, EPJ B 2009, scaled by 2). ``damping`` is the audience-relative
damping of hub candidates: ``(smallest hub's followers / the candidate's) ** hub_damping`` for a
hub, 1 otherwise. Each term is in 0..1, so the weights' sum bounds the score (``score_max``).

Per-account inputs are computed once per run by ``build_graph``: the activity term in Polars
(``activity_term``, ``graph/activity.npy``), the path weights (``path_weight.npy``) and the
followers (``in_degree.npy``); the kernel sums ``W`` while counting and scores only the
candidates left after the ``max_candidates_to_score`` cut (``ranked_score``).
"""

from __future__ import annotations

import numpy as np

from recs.traversal.jit import stage

_MICROS_PER_DAY = 86_400_000_000
RANKINGS = ("blend", "adamic_adar", "resource_allocation")


def activity_term(as_of, half_life_days: float):
    """Polars expression over ``candidate_profiles`` rows: ``0.5 ** (days_inactive /
    half_life_days)`` (Float64), 0.0 for a null ``last_active_at`` (Datetime("us"), naive UTC;
    ``as_of`` naive UTC). Polars evaluates it (division by a literal as a multiplication by its
    reciprocal, its own ``pow``), so it may differ from a scalar ``0.5 ** x`` in the last bit;
    reruns are bit-identical."""
    import polars as pl

    days_inactive = (
        (pl.lit(as_of, dtype=pl.Datetime("us")) - pl.col("last_active_at")).dt.total_microseconds()
        / _MICROS_PER_DAY
    ).clip(lower_bound=0.0)
    return pl.lit(0.5).pow(days_inactive / half_life_days).fill_null(0.0)


def path_weights(ranking: str, follows: np.ndarray, followers: np.ndarray) -> np.ndarray:
    """``float64`` weight of a mutual path through each account with ``follows`` active follows
    and ``followers`` (module docstring; a degree below 2 counts as 2: such an account is on no
    path). Raises ``ValueError`` for an unknown ranking."""
    degree = np.maximum(
        np.asarray(follows, dtype=np.float64) + np.asarray(followers, dtype=np.float64), 2.0
    )
    if ranking == "blend":
        return np.ones(len(degree), dtype=np.float64)
    if ranking == "adamic_adar":
        return 1.0 / np.log2(degree)
    if ranking == "resource_allocation":
        return 2.0 / degree
    raise ValueError(f"unknown ranking {ranking!r}: one of {', '.join(RANKINGS)}")


@stage
def ranked_score(weight, activity, followers, params):  # pragma: no cover - compiled
    """The score (float64) of a candidate with path-weight sum ``weight``, activity term
    ``activity`` and ``followers``; ``params``: ``kernel.KernelParams``."""
    mutual = min(weight / params.mutual_saturation, 1.0)
    if params.hub_damping > 0.0 and params.hub_in_degree > 0 and followers >= params.hub_in_degree:
        mutual *= (params.hub_in_degree / followers) ** params.hub_damping
    return (
        params.mutual_weight * mutual + params.activity_weight * activity
        + params.popularity_weight * (followers * params.inverse_max_in_degree)
    )
