"""Deterministic capped sampling of follow lists (ARCHITECTURE §5, "Sampling").

The design document caps fan-out with ``random.sample``; a nightly batch must instead sample the
same way on every retry, single-shard rerun and backfill of a snapshot. Every follow edge
``(follower_id, followee_id)`` gets a 64-bit pseudo-random *sample key*; a user's follows are
ordered by ``(key, followee_id)`` and the capped list is a prefix of that order:

- the first ``hop1_cap`` are the user's expanded first hop (``recs.traversal``),
- the first ``hop2_cap`` are the user's row in the capped CSR graph (``recs.graph``).

So the hop-2 list is a prefix of the same order as the hop-1 list, and a sample is a uniformly
random subset (the key is a good hash) that depends only on the snapshot and ``sample_seed``.

The key is SplitMix64's finaliser (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014; constants as in Vigna's public-domain ``splitmix64.c``) applied twice::

    key = mix64(mix64(follower_id + mix64(seed)) ^ followee_id)        (all mod 2**64)

computed in plain ``uint64`` arithmetic (multiplication wraps mod 2**64), so it does not depend
on any engine's built-in hash, on the library version or on the platform. The formula is written
once as compiled scalar functions (``mix64`` / ``sample_key``, Numba), which the vectorised
``sample_keys`` and the traversal's first-hop sampler both call; ``mix64_int`` /
``sample_key_int`` restate it in Python integers to cross-check it (tests,
``recs.testing.reference``). One compiled pass beats the NumPy expression's 7 temporary arrays
(``bench/README.md``).
"""

from __future__ import annotations

import sys

import numpy as np
from numba import njit


def _load_numba_math_without_blas_check() -> None:
    """Import ``numba.np.arraymath`` with ``scipy.linalg.cython_blas`` hidden.

    On the first dispatch of any compiled function, Numba imports ``numba.np.arraymath``, whose
    import-time BLAS check imports ``scipy.linalg`` (installed for Great Expectations): 0.2 s of
    CPU on an idle core, up to 0.9 s under load, paid by every shard task process. recs's
    compiled code uses no BLAS (no ``np.dot``, no ``np.linalg``), so the check may fail: the
    module is imported once with the BLAS module hidden (a ``None`` entry in ``sys.modules``
    makes that one import fail at once), then the entry is removed, so a later
    ``import scipy.linalg`` (validation, in the same process) works as usual. Skipped if either
    module is already loaded.
    """
    if "numba.np.arraymath" in sys.modules or "scipy.linalg.cython_blas" in sys.modules:
        return
    sys.modules["scipy.linalg.cython_blas"] = None
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if sys.modules.get("scipy.linalg.cython_blas", 0) is None:
            del sys.modules["scipy.linalg.cython_blas"]


_load_numba_math_without_blas_check()

GOLDEN_GAMMA = 0x9E3779B97F4A7C15
MIX_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
MIX_MULTIPLIER_2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1
# uint64 constants for the compiled code (a Python int would make Numba mix signed and unsigned
# integers, which it promotes to float64)
_GAMMA64 = np.uint64(GOLDEN_GAMMA)
_M1_64 = np.uint64(MIX_MULTIPLIER_1)
_M2_64 = np.uint64(MIX_MULTIPLIER_2)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@njit(cache=True, nogil=True)
def mix64(z):  # pragma: no cover - compiled
    """SplitMix64's output function of one ``uint64`` (wraps mod 2**64)."""
    z = z + _GAMMA64
    z = (z ^ (z >> _S30)) * _M1_64
    z = (z ^ (z >> _S27)) * _M2_64
    return z ^ (z >> _S31)


@njit(cache=True, nogil=True)
def sample_key(follower, followee, seed_mix):  # pragma: no cover - compiled
    """The key of one edge: ``follower`` / ``followee`` as ``uint64`` (two's complement of the
    ids), ``seed_mix`` = ``seed_mixer(seed)``."""
    return mix64(mix64(follower + seed_mix) ^ followee)


@njit(cache=True, nogil=True)
def _sample_keys(followers, followees, seed_mix):  # pragma: no cover - compiled
    keys = np.empty(len(followers), dtype=np.uint64)
    for i in range(len(followers)):
        keys[i] = sample_key(followers[i], followees[i], seed_mix)
    return keys


def seed_mixer(seed: int) -> np.uint64:
    """``mix64(seed)`` as a ``uint64``: the per-run constant of ``sample_key``."""
    return np.uint64(mix64_int(int(seed) & _MASK64))


def mix64_int(value: int) -> int:
    """The same SplitMix64 output function on one Python int (reference and tests)."""
    z = (value + GOLDEN_GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * MIX_MULTIPLIER_1) & _MASK64
    z = ((z ^ (z >> 27)) * MIX_MULTIPLIER_2) & _MASK64
    return z ^ (z >> 31)


def mix64_array(values) -> np.ndarray:
    """``mix64`` of each of an integer array's values: ``uint64``, the same length; negative
    values are taken modulo 2**64 (two's complement). The compiled ``mix64`` itself, given the
    whole array (Numba compiles and caches that form once, about 1 s)."""
    return mix64(np.asarray(values).astype(np.uint64))


def sample_keys(follower_ids, followee_ids, seed: int) -> np.ndarray:
    """Sample key of each edge: ``uint64`` array, same length as the inputs.

    ``follower_ids`` / ``followee_ids``: integer arrays (or sequences) of original user ids,
    equal length (one may be a scalar, broadcast). ``seed``: ``Settings.sample_seed``
    (``0 <= seed < 2**63``). Negative ids are taken modulo 2**64 (two's complement).
    Raises ``ValueError`` if the lengths differ.
    """
    followers = np.asarray(follower_ids).astype(np.int64, copy=False)
    followees = np.asarray(followee_ids).astype(np.int64, copy=False)
    if followers.ndim and followees.ndim and followers.shape != followees.shape:
        raise ValueError(
            f"follower_ids and followee_ids differ in shape: {followers.shape} != {followees.shape}"
        )
    followers, followees = np.broadcast_arrays(followers, followees)
    shape = followers.shape
    keys = _sample_keys(
        np.ascontiguousarray(followers.ravel()).view(np.uint64),
        np.ascontiguousarray(followees.ravel()).view(np.uint64),
        seed_mixer(seed),
    )
    return keys.reshape(shape)


def sample_key_int(follower_id: int, followee_id: int, seed: int) -> int:
    """``sample_keys`` for one edge, in pure Python integers (used to cross-check NumPy)."""
    inner = mix64_int(((follower_id & _MASK64) + mix64_int(seed & _MASK64)) & _MASK64)
    return mix64_int(inner ^ (followee_id & _MASK64))


def sample_order(follower_ids, followee_ids, seed: int) -> np.ndarray:
    """Permutation (``int64``) sorting edges by ``(follower_id, key, followee_id)``.

    Within each follower the edges come out in sample order, so "the first ``cap`` of a
    follower" after applying it is that follower's capped sample.
    """
    followers = np.asarray(follower_ids, dtype=np.int64)
    followees = np.asarray(followee_ids, dtype=np.int64)
    keys = sample_keys(followers, followees, seed)
    return np.lexsort((followees, keys, followers))


def rank_within_groups(sorted_groups: np.ndarray) -> np.ndarray:
    """0-based position of each element inside its run of equal values (``int64``).

    ``sorted_groups`` must be grouped (equal values adjacent), e.g. follower ids after
    ``sample_order``; ``rank < cap`` then selects each group's capped prefix.
    """
    n = len(sorted_groups)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    lengths = np.diff(np.r_[starts, n])
    return np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)


def capped_follows(follower_id: int, followee_ids, cap: int, seed: int) -> list[int]:
    """One user's follows in sample order, cut to ``cap`` (duplicates dropped).

    The pure-Python view used by ``recs.testing.reference``: ``followee_ids`` any iterable of ints;
    returns a list of at most ``cap`` ints, ordered by ``(key, followee_id)``.
    """
    unique = sorted(set(int(v) for v in followee_ids))
    ordered = sorted(unique, key=lambda v: (sample_key_int(int(follower_id), v, seed), v))
    return ordered[:cap]
