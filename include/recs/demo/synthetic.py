"""Synthetic power-law follow graphs for tests and benchmarks, written to the live store.

The model (vectorised NumPy, generated in chunks of ``CHUNK_USERS`` followers):

- **Out-degree** is lognormal (sigma ``OUT_DEGREE_SIGMA``), rescaled so the mean is exactly
  ``avg_out_degree``: a heavy tail (a few users follow thousands) and a thin-graph head (~5 %
  follow fewer than 5 at a mean of 50, so cold start is exercised).
- **Followees**: a share ``LOCAL_SHARE`` of each user's follows goes to neighbours on a random
  ring (offset ~ geometric, mean ``LOCAL_WINDOW``): communities, so friends-of-friends with
  several mutual follows exist and many follows are reciprocated. The rest is drawn by
  popularity, ``P(rank r) ~ r ** -POPULARITY_EXPONENT`` over a random popularity order (Zipf):
  a heavy-tailed **in-degree** with hubs (in the thousands at 50 k users, above 100 k at 1 M).
- Self-loops are removed and duplicate pairs collapsed, then each user's shortfall is redrawn
  (``TOP_UP_ROUNDS`` rounds from the model, then up to ``UNIFORM_ROUNDS`` uniform ones), so
  the edge count is exactly ``round(avg_out_degree * n_users)``.

User ids are ``0 .. n_users-1``; every other field comes from ``recs.demo.generated`` (as for
the real datasets). Deterministic for a seed: each chunk has its own random stream ``(seed,
GRAPH, chunk)``. How the constants were tuned, measured degrees and speeds: ``bench/README.md``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from recs.arrays import sorted_unique
from recs.config import Settings
from recs.demo.follow_graph import FollowGraph, position_dtype
from recs.demo.generated import RandomStream, load_graph, rng_for
from recs.errors import DatasetError
from recs.store.bulk import ProgressCallback

log = logging.getLogger("recs.demo.synthetic")

OUT_DEGREE_SIGMA = 1.1
LOCAL_SHARE = 0.5
LOCAL_WINDOW = 200
POPULARITY_EXPONENT = 0.8
CHUNK_USERS = 1 << 16
TOP_UP_ROUNDS = 8
UNIFORM_ROUNDS = 8
MAX_USERS = 2**31 - 1


def out_degrees(n_users: int, avg_out_degree: float, rng: np.random.Generator) -> np.ndarray:
    """Lognormal out-degrees (int64) with mean exactly ``avg_out_degree``, each <= n_users-1.

    The draws are scaled to the target total, floored, and the remainder handed out one by one
    to the users with the largest fractional parts (largest-remainder rounding).
    """
    if n_users < 2:
        return np.zeros(n_users, dtype=np.int64)
    raw = rng.lognormal(0.0, OUT_DEGREE_SIGMA, n_users)
    target = min(round(avg_out_degree * n_users), n_users * (n_users - 1))
    scaled = raw * (target / raw.sum())
    degree = np.floor(scaled).astype(np.int64)
    remainder = target - int(degree.sum())
    if remainder > 0:
        degree[np.argsort(degree - scaled, kind="stable")[:remainder]] += 1
    return np.minimum(degree, n_users - 1)


def synthetic_follow_graph(
    n_users: int,
    seed: int,
    *,
    avg_out_degree: float = 50,
    progress: ProgressCallback | None = None,
) -> FollowGraph:
    """The synthetic follow graph (see the module docstring) as a ``FollowGraph``.

    Memory: the CSR keeps int32 followee positions (4 bytes per edge: 200 MB for 50 M edges);
    one chunk of ``CHUNK_USERS`` followers is expanded at a time. Raises ``DatasetError`` for
    ``n_users < 1`` or a negative degree.
    """
    if not 1 <= n_users <= MAX_USERS:
        raise DatasetError(f"--users must be between 1 and {MAX_USERS:,}, got {n_users}")
    if avg_out_degree < 0:
        raise DatasetError(f"average out-degree must be >= 0, got {avg_out_degree}")
    setup = rng_for(seed, RandomStream.GRAPH)
    degree = out_degrees(n_users, avg_out_degree, setup)
    ring = setup.permutation(n_users)  # ring[k]: the user at ring slot k
    ring_slot = np.empty(n_users, dtype=np.int64)
    ring_slot[ring] = np.arange(n_users)
    popularity_order = setup.permutation(n_users)  # popularity_order[r]: the user of rank r
    weights = np.arange(1, n_users + 1, dtype=np.float64) ** -POPULARITY_EXPONENT
    popularity_cdf = np.cumsum(weights)
    popularity_cdf /= popularity_cdf[-1]
    del weights

    total = int(degree.sum())
    indices_parts: list[np.ndarray] = []
    counts = np.zeros(n_users, dtype=np.int64)
    done = 0
    for chunk, start in enumerate(range(0, n_users, CHUNK_USERS)):
        stop = min(start + CHUNK_USERS, n_users)
        rng = rng_for(seed, RandomStream.GRAPH, chunk + 1)
        keys = np.zeros(0, dtype=np.int64)
        wanted = degree[start:stop]
        missing = wanted
        for _round in range(TOP_UP_ROUNDS + UNIFORM_ROUNDS):
            if not missing.any():
                break
            src = np.repeat(np.arange(start, stop, dtype=np.int64), missing)
            if _round < TOP_UP_ROUNDS:
                dst = _draw_followees(
                    src, n_users, rng, ring, ring_slot, popularity_order, popularity_cdf
                )
            else:  # the last few follows of very high-degree users: uniform, rarely a repeat
                dst = rng.integers(0, n_users, len(src))
            keys = _merge_sorted_unique(keys, sorted_unique((src * n_users + dst)[src != dst]))
            have = np.bincount(keys // n_users - start, minlength=stop - start)
            missing = np.maximum(wanted - have, 0)
        counts[start:stop] = np.bincount(keys // n_users - start, minlength=stop - start)
        indices_parts.append((keys % n_users).astype(position_dtype(n_users)))
        done += len(keys)
        log.info("generated followers %d..%d: %d/%d edges", start, stop - 1, done, total)
        if progress is not None:
            progress(f"generated {done:,}/{total:,} follows")
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = (
        np.concatenate(indices_parts) if indices_parts else np.zeros(0, position_dtype(n_users))
    )
    return FollowGraph(np.arange(n_users, dtype=np.int64), indptr, indices)


def _merge_sorted_unique(keys: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """Union of two sorted, distinct int64 arrays in O(len) (no re-sort of ``keys``)."""
    if not len(keys):
        return fresh
    at = np.searchsorted(keys, fresh)
    present = keys[np.minimum(at, len(keys) - 1)] == fresh
    return np.insert(keys, at[~present], fresh[~present])


def _draw_followees(
    src: np.ndarray,
    n_users: int,
    rng: np.random.Generator,
    ring: np.ndarray,
    ring_slot: np.ndarray,
    popularity_order: np.ndarray,
    popularity_cdf: np.ndarray,
) -> np.ndarray:
    """One followee per entry of ``src``: a ring neighbour or a popularity draw."""
    draws = len(src)
    local = rng.random(draws) < LOCAL_SHARE
    offset = rng.geometric(1.0 / LOCAL_WINDOW, draws) * np.where(rng.random(draws) < 0.5, -1, 1)
    neighbour = ring[(ring_slot[src] + offset) % n_users]
    rank = np.searchsorted(popularity_cdf, rng.random(draws), side="right")
    popular = popularity_order[np.minimum(rank, n_users - 1)]
    return np.where(local, neighbour, popular).astype(np.int64)


def generate_graph(
    n_users: int,
    seed: int,
    settings: Settings,
    *,
    avg_out_degree: float = 50,
    replace: bool = False,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Generate a synthetic graph of ``n_users`` and load it (plus generated fields) into the store.

    Returns the ``recs.demo.generated.load_graph`` summary plus ``dataset`` (``synthetic``),
    ``avg_out_degree`` (target), degree statistics (``max_in_degree``, ``max_out_degree``,
    ``mean_out_degree``, ``in_degree_p999``), ``seconds`` (wall) and ``timings`` (seconds per
    step: ``graph``, ``generate``, ``write``). Raises ``DatasetError`` for bad arguments or a
    non-empty store without ``replace``.
    """
    started = time.perf_counter()
    graph = synthetic_follow_graph(n_users, seed, avg_out_degree=avg_out_degree, progress=progress)
    graph_seconds = time.perf_counter() - started
    in_degree = graph.in_degree()
    out_degree = graph.out_degree()
    stats = {
        "max_in_degree": int(in_degree.max(initial=0)),
        "in_degree_p999": float(np.quantile(in_degree, 0.999)) if n_users else 0.0,
        "max_out_degree": int(out_degree.max(initial=0)),
        "mean_out_degree": round(graph.n_edges / max(n_users, 1), 3),
    }
    del in_degree, out_degree
    log.info("synthetic graph: %d users, %d edges, %s", n_users, graph.n_edges, stats)
    summary = load_graph(graph, settings, seed=seed, replace=replace, progress=progress)
    summary["timings"] = {"graph": round(graph_seconds, 3), **summary["timings"]}
    return {
        "dataset": "synthetic",
        "avg_out_degree": avg_out_degree,
        **stats,
        **summary,
        "seconds": round(time.perf_counter() - started, 3),
    }
