"""Ranking (recs.traversal.ranking): the design's blended score, both halves of it."""

from __future__ import annotations

import polars as pl
import pytest
from traversal_fixtures import AS_OF, DAY

from recs.config import Settings
from recs.traversal.kernel import KernelParams
from recs.traversal.ranking import activity_term, blended_score


def test_activity_term_halves_every_half_life():
    """0.5 ** (days_inactive / 14): 1 at as_of and for a future timestamp (days_inactive is
    clipped at 0), 0.5 at 14 days, 0.25 at 28, 0 for an unknown last_active_at."""
    frame = pl.DataFrame(
        {"last_active_at": [AS_OF, AS_OF + DAY, AS_OF - 14 * DAY, AS_OF - 28 * DAY, None]},
        schema={"last_active_at": pl.Datetime("us")},
    )
    activity = frame.select(activity_term(AS_OF, 14.0).alias("activity"))["activity"].to_list()
    assert activity == pytest.approx([1.0, 1.0, 0.5, 0.25, 0.0], abs=1e-15)


def test_blended_score_is_the_design_formula():
    """Defaults 0.7, 25, 0.3: 5 mutuals, activity 0.5 -> 0.7 * 5/25 + 0.3 * 0.5 = 0.29;
    30 mutuals saturate at 25 -> 0.7 + 0.3 * 0.25 = 0.775; mutual_saturation=2 with 3 mutuals
    -> 0.7 + 0.3 = 1.0. Bit for bit the scalar formula (the kernel evaluates it in float64)."""
    params = KernelParams.from_settings(Settings())
    assert blended_score(5, 0.5, params) == 0.7 * min(5 / 25.0, 1.0) + 0.3 * 0.5
    assert blended_score(5, 0.5, params) == pytest.approx(0.29, abs=1e-15)
    assert blended_score(30, 0.25, params) == pytest.approx(0.775, abs=1e-15)
    saturated = KernelParams.from_settings(Settings(mutual_saturation=2.0))
    assert blended_score(3, 1.0, saturated) == 1.0
