"""Ranking metrics of top-k lists against the hidden follows, per user and summarised.

For a test user with hidden follows ``H`` (``|H| >= 1``) and a list ``L`` (best first, at most
``k`` long, possibly empty), with ``hit_i`` = 1 if ``L[i] ∈ H`` (ranks ``i = 1..``):

- ``recall@k = Σ hit_i / |H|``; ``precision@k = Σ hit_i / k`` (a short list is not rewarded);
- ``ndcg@k = Σ hit_i / log2(i + 1)`` over the ideal ``Σ_{i <= min(k, |H|)} 1 / log2(i + 1)``
  (Järvelin & Kekäläinen, "Cumulated gain-based evaluation of IR techniques", TOIS 2002);
- ``mrr@k = 1 / (rank of the first hit)``, 0 without a hit;
- ``has_list``: ``L`` is not empty (the mean of it is the user coverage).

Every test user counts, with zeros when their list is empty or missing. ``paired_difference``
gives the mean per-user difference of a metric between two methods on the same test users with
a percentile bootstrap confidence interval (users resampled with replacement) and the paired t
interval beside it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

PER_USER_METRICS = ("recall", "precision", "ndcg", "mrr", "has_list")


def per_user_metrics(lists: pl.DataFrame, test: pl.DataFrame, k: int) -> pl.DataFrame:
    """One row per test user (every ``user_id`` of ``test``, sorted): ``user_id`` Int64,
    ``hidden`` (|H|), ``listed`` (len(L)), ``hits``, and ``PER_USER_METRICS`` (Float64).

    ``lists``: ``user_id``, ``candidate_id``, ``rank`` (1-based, best first; ranks above ``k``
    are ignored); ``test``: ``user_id``, ``followee_id`` (distinct pairs)."""
    hidden = test.group_by("user_id").agg(pl.len().alias("hidden"))
    ranked = lists.filter(pl.col("rank") <= k).select(
        pl.col("user_id").cast(pl.Int64), pl.col("candidate_id").cast(pl.Int64),
        pl.col("rank").cast(pl.Int64),
    )
    hits = ranked.join(
        test.select("user_id", pl.col("followee_id").alias("candidate_id"), pl.lit(1).alias("hit")),
        on=["user_id", "candidate_id"], how="left",
    ).with_columns(pl.col("hit").fill_null(0))
    per_list = hits.group_by("user_id").agg(
        pl.len().alias("listed"),
        pl.col("hit").sum().alias("hits"),
        (pl.col("hit") / (pl.col("rank") + 1).cast(pl.Float64).log(2)).sum().alias("dcg"),
        pl.col("rank").filter(pl.col("hit") == 1).min().alias("first_hit"),
    )
    ideal = np.concatenate([[0.0], np.cumsum(1.0 / np.log2(np.arange(2, k + 2)))])
    frame = hidden.join(per_list, on="user_id", how="left").with_columns(
        pl.col("listed", "hits").fill_null(0), pl.col("dcg").fill_null(0.0)
    )
    ideal_dcg = pl.Series(ideal).gather(pl.Series(np.minimum(frame["hidden"].to_numpy(), k)))
    return frame.with_columns(
        recall=pl.col("hits") / pl.col("hidden"),
        precision=pl.col("hits") / float(k),
        ndcg=pl.col("dcg") / ideal_dcg,
        mrr=(1.0 / pl.col("first_hit").cast(pl.Float64)).fill_null(0.0),
        has_list=(pl.col("listed") > 0).cast(pl.Float64),
    ).select(
        "user_id", "hidden", "listed", "hits", *PER_USER_METRICS
    ).sort("user_id")


def summary(per_user: pl.DataFrame) -> dict[str, float]:
    """Means of ``PER_USER_METRICS`` over the users of ``per_user`` (``has_list`` reported as
    ``user_coverage``) and their count."""
    means = {m: float(per_user[m].mean()) if per_user.height else 0.0 for m in PER_USER_METRICS}
    means["user_coverage"] = means.pop("has_list")
    return {"users": per_user.height, **means}


def catalogue_coverage(lists: pl.DataFrame, catalogue_size: int) -> float:
    """Distinct recommended accounts / ``catalogue_size`` (the accounts that could be)."""
    return lists["candidate_id"].n_unique() / catalogue_size if catalogue_size else 0.0


def hub_share(lists: pl.DataFrame, hub_ids: np.ndarray) -> float:
    """Share of the recommended rows whose candidate is a hub (``hub_ids``)."""
    if lists.height == 0:
        return 0.0
    return float(lists["candidate_id"].is_in(pl.Series(hub_ids, dtype=pl.Int64)).mean())


def paired_difference(
    a: np.ndarray, b: np.ndarray, *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> dict[str, Any]:
    """Mean of ``a - b`` (per-user values of one metric, same users, same order) with a
    percentile bootstrap interval (``resamples`` resamples of the users, seeded) and the paired
    t interval (normal quantile; the users number in the hundreds at least). Returns ``{"mean",
    "ci_low", "ci_high", "t_low", "t_high", "users"}``."""
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n = len(diff)
    if n == 0:
        return {"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0, "t_low": 0.0, "t_high": 0.0,
                "users": 0}
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    batch = max(1, 4_000_000 // n)
    for start in range(0, resamples, batch):
        stop = min(resamples, start + batch)
        picks = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = diff[picks].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    z = _normal_quantile(1.0 - tail)
    half = z * diff.std(ddof=1) / math.sqrt(n) if n > 1 else 0.0
    mean = float(diff.mean())
    return {"mean": mean, "ci_low": float(low), "ci_high": float(high),
            "t_low": mean - half, "t_high": mean + half, "users": n}


def _normal_quantile(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)
