"""Ranking: the design's blended score of a candidate (ARCHITECTURE §1, ``score_candidate``).

    score = mutual_weight * min(mutual_count / mutual_saturation, 1)
            + activity_weight * 0.5 ** (days_inactive / half_life_days)

Defaults 0.7, 25, 0.3, 14 (``recs.config``). The activity term depends on the account only, so
it is computed once per run, in Polars, by ``build_graph`` (``activity_term``, stored as
``graph/activity.npy``); the kernel blends it with the mutual term (``blended_score``) for the
candidates that survive the pre-rank filters and the ``max_candidates_to_score`` cut, so it
emits only the kept rows. ``days_inactive = max(0, as_of - last_active_at)`` in days; an unknown
``last_active_at`` gives an activity of 0.
"""

from __future__ import annotations

from recs.traversal.jit import stage

_MICROS_PER_DAY = 86_400_000_000


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


@stage
def blended_score(mutual_count, activity, params):  # pragma: no cover - compiled
    """The score (float64) of a candidate with ``mutual_count`` mutuals and the per-account
    ``activity`` term; ``params``: ``kernel.KernelParams``."""
    mutual = min(mutual_count / params.mutual_saturation, 1.0)
    return params.mutual_weight * mutual + params.activity_weight * activity
