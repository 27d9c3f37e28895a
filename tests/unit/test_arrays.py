"""recs.arrays: ``sorted_unique`` against ``np.unique`` (the slow but plain reference)."""

from __future__ import annotations

import numpy as np
import pytest

from recs.arrays import sorted_unique


@pytest.mark.parametrize("size", [0, 1, 2, 1_000])
def test_sorted_unique_is_np_unique(size):
    values = np.random.default_rng(size).integers(-50, 50, size)
    got = sorted_unique(values)
    assert got.dtype == np.int64 and got.tolist() == np.unique(values).tolist()


def test_sorted_unique_keeps_codes_that_use_the_top_bit_in_order():
    codes = np.array([2**63 + 5, 7, 2**63 + 5, 2**64 - 1, 7], dtype=np.uint64)
    got = sorted_unique(codes, np.uint64)
    assert got.dtype == np.uint64 and got.tolist() == [7, 2**63 + 5, 2**64 - 1]
