"""Deterministic capped sampling (recs.sampling)."""

from __future__ import annotations

import numpy as np
import pytest

from recs.sampling import (
    GOLDEN_GAMMA,
    capped_follows,
    mix64_int,
    rank_within_groups,
    sample_key_int,
    sample_keys,
    sample_order,
)

SEED = 20_240_601


def test_mix64_is_splitmix64():
    """The mixer is SplitMix64's output function: with state 0 the reference generator
    (Vigna's splitmix64.c) returns 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F;
    its k-th output is mix64 of (k-1) * GOLDEN_GAMMA."""
    assert mix64_int(0) == 0xE220A8397B1DCDAF
    assert mix64_int(GOLDEN_GAMMA) == 0x6E789E6AA1B965F4
    assert mix64_int(2 * GOLDEN_GAMMA % 2**64) == 0x06C45D188009454F


def test_sample_keys_are_pinned():
    """Golden values: the keys must never change between versions, or a rerun of an old
    snapshot would sample differently. Values computed once with the pure-int definition
    ``mix64(mix64(follower + mix64(seed)) ^ followee)``."""
    keys = sample_keys(np.array([0, 1, 5]), np.array([7, 3, 9]), SEED)
    assert keys.dtype == np.uint64
    assert keys.tolist() == [11874334380919555018, 8051611460420301670, 12872244292815763532]


def test_numpy_equals_pure_python():
    """The vectorised keys equal the pure-int keys, including huge and negative ids."""
    rng = np.random.default_rng(1)
    followers = np.r_[rng.integers(0, 2**62, 200), [0, 2**63 - 1, -1]]
    followees = np.r_[rng.integers(0, 2**40, 200), [2**63 - 1, 0, 5]]
    keys = sample_keys(followers, followees, SEED)
    pairs = zip(followers, followees, strict=True)
    expected = [sample_key_int(int(a), int(b), SEED) for a, b in pairs]
    assert keys.tolist() == expected


def test_keys_depend_on_seed_follower_and_followee():
    base = sample_keys(np.array([1]), np.array([2]), SEED)[0]
    assert sample_keys(np.array([1]), np.array([2]), SEED + 1)[0] != base
    assert sample_keys(np.array([2]), np.array([2]), SEED)[0] != base
    assert sample_keys(np.array([1]), np.array([3]), SEED)[0] != base
    assert sample_keys(np.array([1]), np.array([2]), SEED)[0] == base


def test_scalar_follower_broadcasts_and_shapes_must_match():
    assert sample_keys(1, np.array([10, 11]), SEED).tolist() == sample_keys(
        np.array([1, 1]), np.array([10, 11]), SEED
    ).tolist()
    with pytest.raises(ValueError):
        sample_keys(np.array([1, 2]), np.array([1, 2, 3]), SEED)


def test_capped_follows_is_a_prefix_of_one_order():
    """User 1 follows 10..14. By key (see test_sample_keys_are_pinned for the definition) the
    order is 10, 14, 12, 11, 13: keys 8.36e18, 1.24e19, 1.60e19, 1.72e19, 1.74e19. So the
    hop-2 list (cap 2) [10, 14] is a prefix of the hop-1 list (cap 4) [10, 14, 12, 11]."""
    follows = [13, 11, 10, 12, 14, 12]  # order and a duplicate must not matter
    assert capped_follows(1, follows, 5, SEED) == [10, 14, 12, 11, 13]
    assert capped_follows(1, follows, 4, SEED) == [10, 14, 12, 11]
    assert capped_follows(1, follows, 2, SEED) == [10, 14]
    assert capped_follows(1, [], 2, SEED) == []


def test_sample_order_groups_followers_then_sorts_by_key():
    """Edges of followers 2 and 1 interleaved; the order groups follower 1 first and within
    it follows capped_follows' order."""
    followers = np.array([2, 1, 2, 1, 1, 1, 1])
    followees = np.array([10, 13, 11, 10, 12, 14, 11])
    order = sample_order(followers, followees, SEED)
    assert followers[order].tolist() == [1, 1, 1, 1, 1, 2, 2]
    assert followees[order][:5].tolist() == capped_follows(1, [10, 11, 12, 13, 14], 5, SEED)
    assert followees[order][5:].tolist() == capped_follows(2, [10, 11], 2, SEED)


def test_rank_within_groups():
    """Runs [5,5,5], [7], [9,9] give ranks 0,1,2 / 0 / 0,1."""
    assert rank_within_groups(np.array([5, 5, 5, 7, 9, 9])).tolist() == [0, 1, 2, 0, 0, 1]
    assert rank_within_groups(np.array([], dtype=np.int64)).tolist() == []


def test_samples_are_roughly_uniform():
    """Each of 10 follows should be in a 3-of-10 sample for ~30% of 20,000 followers; with a
    good hash the share is within 0.30 +- 0.02 (about 5 standard deviations)."""
    followers = np.repeat(np.arange(20_000), 10)
    followees = np.tile(np.arange(10), 20_000)
    order = sample_order(followers, followees, SEED)
    chosen = followees[order][rank_within_groups(followers[order]) < 3]
    share = np.bincount(chosen, minlength=10) / 20_000
    assert np.all(np.abs(share - 0.3) < 0.02), share


def test_numba_blas_check_is_skipped_without_hiding_scipy():
    """recs.sampling loads numba's math support with scipy's BLAS module hidden (numba then
    skips its slow BLAS probe), and must leave no trace: scipy.linalg imports normally."""
    import sys

    import scipy.linalg

    assert sys.modules.get("scipy.linalg.cython_blas", 0) is not None
    assert scipy.linalg.norm([3.0, 4.0]) == 5.0
