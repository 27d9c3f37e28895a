"""Ranking (recs.traversal.ranking): the design's blend, the path weights, the popularity term
and the hub damping, each derived by hand, and the shipped default through the whole flow."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from traversal_fixtures import AS_OF, DAY, Fixture, User, rows, run, settings_for

from recs.config import Settings
from recs.traversal.kernel import KernelParams
from recs.traversal.ranking import activity_term, path_weights, ranked_score

DESIGN = {"ranking": "blend", "mutual_weight": 0.7, "activity_weight": 0.3,
          "popularity_weight": 0.0}


def test_activity_term_halves_every_half_life():
    """0.5 ** (days_inactive / 14): 1 at as_of and for a future timestamp (days_inactive is
    clipped at 0), 0.5 at 14 days, 0.25 at 28, 0 for an unknown last_active_at."""
    frame = pl.DataFrame(
        {"last_active_at": [AS_OF, AS_OF + DAY, AS_OF - 14 * DAY, AS_OF - 28 * DAY, None]},
        schema={"last_active_at": pl.Datetime("us")},
    )
    activity = frame.select(activity_term(AS_OF, 14.0).alias("activity"))["activity"].to_list()
    assert activity == pytest.approx([1.0, 1.0, 0.5, 0.25, 0.0], abs=1e-15)


def test_the_design_blend_is_the_design_formula():
    """ranking=blend (W = mutual_count), 0.7, 25, 0.3: 5 mutuals, activity 0.5 -> 0.7 * 5/25 +
    0.3 * 0.5 = 0.29; 30 mutuals saturate at 25 -> 0.7 + 0.3 * 0.25 = 0.775; mutual_saturation=2
    with 3 mutuals -> 0.7 + 0.3 = 1.0. Bit for bit the scalar formula (the popularity term adds
    an exact 0.0)."""
    params = KernelParams.from_settings(Settings(**DESIGN))
    assert ranked_score(5.0, 0.5, 7, params) == 0.7 * min(5 / 25.0, 1.0) + 0.3 * 0.5
    assert ranked_score(5.0, 0.5, 7, params) == pytest.approx(0.29, abs=1e-15)
    assert ranked_score(30.0, 0.25, 7, params) == pytest.approx(0.775, abs=1e-15)
    saturated = KernelParams.from_settings(Settings(**DESIGN, mutual_saturation=2.0))
    assert ranked_score(3.0, 1.0, 0, saturated) == 1.0


def test_path_weights_by_the_intermediate_accounts_degree():
    """Degree = follows + followers, at least 2. blend: 1 each. Adamic-Adar 1 / log2(d):
    d = 2 -> 1, d = 8 -> 1/3, d = 1 (counted as 2) -> 1. Resource allocation 2 / d: 1, 1/4, 1."""
    follows, followers = np.array([1, 5, 1]), np.array([1, 3, 0])
    assert path_weights("blend", follows, followers).tolist() == [1.0, 1.0, 1.0]
    assert path_weights("adamic_adar", follows, followers) == pytest.approx([1.0, 1 / 3, 1.0])
    assert path_weights("resource_allocation", follows, followers) == pytest.approx(
        [1.0, 0.25, 1.0]
    )
    with pytest.raises(ValueError, match="unknown ranking"):
        path_weights("pagerank", follows, followers)


def test_popularity_term_and_hub_damping():
    """Shipped weights 0.68 / 0.3 / 0.02, the most-followed account has 200 followers, the
    smallest hub 50. W = 2.5 (-> 0.1 of saturation), activity 1:
    - 20 followers (no hub): 0.68 * 0.1 + 0.3 + 0.02 * 20/200 = 0.37;
    - 200 followers, hub_damping 0: 0.068 + 0.3 + 0.02 = 0.388;
    - 200 followers, hub_damping 1: the mutual term * 50/200 -> 0.017 + 0.32 = 0.337;
      hub_damping 2: * (1/4)^2 -> 0.00425 + 0.32."""
    meta = {"max_in_degree": 200, "hub_in_degree": 50}
    params = KernelParams.from_settings(Settings(), meta)
    assert ranked_score(2.5, 1.0, 20, params) == pytest.approx(0.37, abs=1e-12)
    assert ranked_score(2.5, 1.0, 200, params) == pytest.approx(0.388, abs=1e-12)
    damped = KernelParams.from_settings(Settings(hub_damping=1.0), meta)
    assert ranked_score(2.5, 1.0, 20, damped) == pytest.approx(0.37, abs=1e-12)
    assert ranked_score(2.5, 1.0, 200, damped) == pytest.approx(0.337, abs=1e-12)
    squared = KernelParams.from_settings(Settings(hub_damping=2.0), meta)
    assert ranked_score(2.5, 1.0, 200, squared) == pytest.approx(0.00425 + 0.32, abs=1e-12)
    assert KernelParams.from_settings(Settings()).inverse_max_in_degree == 0.0


def test_the_shipped_default_through_the_flow(tmp_path):
    """User 1 follows 10 and 11; 10 follows 20, 21; 11 follows 20, 22, 23, 24; 30 follows 22
    and 24 (a second follower each, not reached by user 1). Degrees: 10 = 2 follows + 1
    follower = 3, 11 = 4 + 1 = 5, so Adamic-Adar weights 1/log2 3 and 1/log2 5. Followers:
    20 -> 2, 22 and 24 -> 2, 21 and 23 -> 1; the most-followed has 2. Everyone active now
    (activity 1). min_mutual_count 1 keeps every candidate:

    - 20: W = 1/log2 3 + 1/log2 5 = 1.0616, score 0.68 * W/25 + 0.3 + 0.02 * 2/2 = 0.3489;
    - 21: W = 1/log2 3 = 0.6309, followers 1: 0.68 * W/25 + 0.3 + 0.01 = 0.3272;
    - 22, 24: W = 1/log2 5 = 0.4307, followers 2: 0.68 * W/25 + 0.3 + 0.02 = 0.3317;
    - 23: W = 0.4307, followers 1: 0.3217.

    Ranks: 20, 22, 24 (the tie by id), 21 (more path weight than 22, fewer followers), 23. The
    design's blend (min_mutual_count 2) lists 20 alone."""
    a, b = 1 / math.log2(3), 1 / math.log2(5)
    edges = [(1, 10), (1, 11), (10, 20), (10, 21), (11, 20), (11, 22), (11, 23), (11, 24),
             (30, 22), (30, 24)]
    users = [User(1)] + [User(i, eligible=False) for i in (10, 11, 20, 21, 22, 23, 24, 30)]
    fixture = Fixture(users=users, edges=[(f, t, "active") for f, t in edges])
    frame = run(fixture, settings_for(tmp_path, shipped=True))[2]
    expected = [
        (20, 2, 0.68 * (a + b) / 25 + 0.3 + 0.02),
        (22, 1, 0.68 * b / 25 + 0.3 + 0.02),
        (24, 1, 0.68 * b / 25 + 0.3 + 0.02),
        (21, 1, 0.68 * a / 25 + 0.3 + 0.01),
        (23, 1, 0.68 * b / 25 + 0.3 + 0.01),
    ]
    got = [(r[1], r[2], r[3]) for r in rows(frame)]
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    assert [g[2] for g in got] == pytest.approx([e[2] for e in expected], abs=1e-12)
    assert frame["rank"].to_list() == [1, 2, 3, 4, 5]
    design = run(fixture, settings_for(tmp_path / "design"))[2]
    assert design["candidate_id"].to_list() == [20]


def test_score_max_bounds_every_term_and_the_weights_are_validated():
    """The gate's bound is the weights' sum (each term is in 0..1): 0.68 + 0.3 + 0.02 = 1.0
    shipped, 0.7 + 0.3 the design; weights summing past 1 are refused."""
    from pydantic import ValidationError

    assert Settings().score_max == pytest.approx(1.0)
    assert Settings(**DESIGN).score_max == pytest.approx(1.0)
    assert Settings(popularity_weight=0.0, mutual_weight=0.5).score_max == pytest.approx(0.8)
    with pytest.raises(ValidationError, match="must not exceed 1.0"):
        Settings(popularity_weight=0.1)
