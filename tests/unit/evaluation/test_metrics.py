"""recs.evaluation.metrics on lists small enough to score by hand."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from recs.evaluation.metrics import (
    catalogue_coverage,
    hub_share,
    paired_difference,
    per_user_metrics,
    summary,
)


def frame(rows, columns):
    return pl.DataFrame(rows, schema=columns, orient="row")


LISTS = frame(
    [(1, 10, 1), (1, 11, 2), (1, 12, 3), (2, 20, 1), (2, 21, 2), (4, 40, 1)],
    {"user_id": pl.Int64, "candidate_id": pl.Int64, "rank": pl.Int32},
)
TEST = frame(
    [(1, 11), (1, 13), (2, 20), (3, 30), (4, 41)],
    {"user_id": pl.Int64, "followee_id": pl.Int64},
)


def test_per_user_metrics_by_hand():
    """k = 3. User 1: hidden {11, 13}, list 10 11 12 -> 1 hit at rank 2: recall 1/2, precision
    1/3, DCG 1/log2(3), ideal 1 + 1/log2(3), MRR 1/2. User 2: hidden {20}, list 20 21 -> hit at
    rank 1: recall 1, precision 1/3 (a short list is not rewarded), NDCG 1, MRR 1. User 3: no
    list -> zeros, has_list 0. User 4: list 40, hidden 41 -> zeros but has_list 1."""
    per_user = per_user_metrics(LISTS, TEST, k=3)
    assert per_user["user_id"].to_list() == [1, 2, 3, 4]
    assert per_user["hidden"].to_list() == [2, 1, 1, 1]
    assert per_user["listed"].to_list() == [3, 2, 0, 1]
    assert per_user["hits"].to_list() == [1, 1, 0, 0]
    assert per_user["recall"].to_list() == pytest.approx([0.5, 1.0, 0.0, 0.0])
    assert per_user["precision"].to_list() == pytest.approx([1 / 3, 1 / 3, 0.0, 0.0])
    ndcg_1 = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert per_user["ndcg"].to_list() == pytest.approx([ndcg_1, 1.0, 0.0, 0.0])
    assert per_user["mrr"].to_list() == pytest.approx([0.5, 1.0, 0.0, 0.0])
    assert per_user["has_list"].to_list() == [1.0, 1.0, 0.0, 1.0]


def test_ranks_beyond_k_are_not_scored():
    """At k = 1 user 1's hit at rank 2 no longer counts; user 2's at rank 1 does."""
    per_user = per_user_metrics(LISTS, TEST, k=1)
    assert per_user["recall"].to_list() == [0.0, 1.0, 0.0, 0.0]
    assert per_user["listed"].to_list() == [1, 1, 0, 1]


def test_summary_means_over_every_test_user():
    """Means over the 4 users (user 3's zeros included): recall (0.5 + 1) / 4 = 0.375, MRR
    0.375, user coverage 3/4."""
    result = summary(per_user_metrics(LISTS, TEST, k=3))
    assert result["users"] == 4
    assert result["recall"] == pytest.approx(0.375)
    assert result["mrr"] == pytest.approx(0.375)
    assert result["user_coverage"] == pytest.approx(0.75)


def test_catalogue_coverage_and_hub_share():
    """6 distinct accounts listed of a catalogue of 12 -> 0.5; hubs {10, 20}: 2 of 6 rows."""
    assert catalogue_coverage(LISTS, 12) == 0.5
    assert hub_share(LISTS, np.array([10, 20])) == pytest.approx(2 / 6)
    assert hub_share(LISTS.head(0), np.array([10])) == 0.0


def test_paired_difference_of_a_constant_shift_has_a_zero_width_interval():
    """b = a - 0.1 for every user: mean difference 0.1, every resample too."""
    a = np.linspace(0, 1, 50)
    result = paired_difference(a, a - 0.1, resamples=200, seed=1)
    assert result["mean"] == pytest.approx(0.1)
    assert result["ci_low"] == pytest.approx(0.1) and result["ci_high"] == pytest.approx(0.1)
    assert result["users"] == 50


def test_paired_difference_interval_matches_the_paired_t_interval():
    """Noisy differences around 0.05 (sd 0.2, n 4000): the bootstrap's 95 % interval agrees
    with mean ± 1.96 sd / sqrt(n) to within a few thousandths and covers the true 0.05."""
    rng = np.random.default_rng(3)
    a = rng.random(4000)
    b = a - 0.05 + rng.normal(0, 0.2, 4000)
    result = paired_difference(a, b, resamples=2000, seed=4)
    assert result["ci_low"] < 0.05 < result["ci_high"]
    assert result["ci_low"] == pytest.approx(result["t_low"], abs=0.002)
    assert result["ci_high"] == pytest.approx(result["t_high"], abs=0.002)


def test_ndcg_ideal_is_cut_at_k_and_hits_add_up():
    """k = 2. User 1: hidden {10, 11, 12}, list 10 13 -> one hit at rank 1: recall 1/3,
    precision 1/2, DCG 1, ideal DCG over min(k, |H|) = 2 ranks 1 + 1/log2(3), MRR 1. User 2:
    hidden {20, 21}, list 22 21 20 -> rank 3 is beyond k, one hit at rank 2: recall 1/2, DCG
    1/log2(3), ideal 1 + 1/log2(3), MRR 1/2."""
    lists = frame(
        [(1, 10, 1), (1, 13, 2), (2, 22, 1), (2, 21, 2), (2, 20, 3)],
        {"user_id": pl.Int64, "candidate_id": pl.Int64, "rank": pl.Int32},
    )
    test = frame(
        [(1, 10), (1, 11), (1, 12), (2, 20), (2, 21)],
        {"user_id": pl.Int64, "followee_id": pl.Int64},
    )
    per_user = per_user_metrics(lists, test, k=2)
    ideal = 1 + 1 / math.log2(3)
    assert per_user["hits"].to_list() == [1, 1]
    assert per_user["recall"].to_list() == pytest.approx([1 / 3, 1 / 2])
    assert per_user["precision"].to_list() == pytest.approx([1 / 2, 1 / 2])
    assert per_user["ndcg"].to_list() == pytest.approx([1 / ideal, (1 / math.log2(3)) / ideal])
    assert per_user["mrr"].to_list() == pytest.approx([1.0, 0.5])


def test_paired_difference_by_hand():
    """a = 1 0 1 1, b = 0 0 0 1: differences 1 0 1 0, mean 0.5, sample sd sqrt(1/3); the t
    interval is 0.5 ± 1.959964 · sqrt(1/3) / 2 = 0.5 ± 0.565792. A resample's mean is j/4 with
    j ~ Binomial(4, 1/2): P(j = 0) = P(j = 4) = 1/16 > 2.5 %, so the bootstrap's 95 % bounds
    are 0 and 1."""
    result = paired_difference(
        np.array([1.0, 0.0, 1.0, 1.0]), np.array([0.0, 0.0, 0.0, 1.0]), resamples=2000, seed=5
    )
    assert result["mean"] == pytest.approx(0.5)
    assert result["t_low"] == pytest.approx(0.5 - 0.565792, abs=1e-6)
    assert result["t_high"] == pytest.approx(0.5 + 0.565792, abs=1e-6)
    assert (result["ci_low"], result["ci_high"]) == (0.0, 1.0)
    assert result["users"] == 4
