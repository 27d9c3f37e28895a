"""The pure-Python reference (recs.reference) and the kernel checked against it."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from traversal_fixtures import AS_OF, Fixture, User, settings_for, write_run

from recs.sampling import capped_follows
from recs.testing.reference import (
    activity_recency,
    reference_recommendations,
    reference_shard,
    score,
)
from recs.traversal import traverse_shard
from recs.traversal.graph import build_graph

DAY = dt.timedelta(days=1)


def test_activity_recency_and_score_follow_the_design():
    """activity = 0.5 ** (days / 14): 1 at as_of (and for a future timestamp), 0.5 at 14
    days, 0.25 at 28; 0 when unknown. score = 0.7 * min(m / 25, 1) + 0.3 * activity:
    m=5, activity 0.5 -> 0.14 + 0.15 = 0.29; m=30 saturates -> 0.7 + 0.3 * 0.25 = 0.775."""
    assert activity_recency(AS_OF, AS_OF, 14.0) == 1.0
    assert activity_recency(AS_OF + DAY, AS_OF, 14.0) == 1.0
    assert activity_recency(AS_OF - 14 * DAY, AS_OF, 14.0) == 0.5
    assert activity_recency(AS_OF - 28 * DAY, AS_OF, 14.0) == 0.25
    assert activity_recency(None, AS_OF, 14.0) == 0.0
    settings = settings_for(Path("/nonexistent"))
    assert score(5, 0.5, settings) == pytest.approx(0.29, abs=1e-15)
    assert score(30, 0.25, settings) == pytest.approx(0.775, abs=1e-15)


def test_reference_on_a_hand_built_graph():
    """User 1 follows 10 and 11 (active) and 12 (pending). 10 -> 20, 21; 11 -> 20, 21, 22;
    12 -> 22 (not expanded). Counts: 20: 2, 21: 2, 22: 1 (pruned). 21 is blocked.
    20 active 28 days ago: 0.7 * 2/25 + 0.3 * 0.25 = 0.131. followed_by of 20 in user 1's
    sample order of (10, 11)."""
    settings = settings_for(Path("/nonexistent"))
    edges = [(1, 10, "active"), (1, 11, "active"), (1, 12, "pending"), (10, 20, "active"),
             (10, 21, "active"), (11, 20, "active"), (11, 21, "active"), (11, 22, "active"),
             (12, 22, "active")]
    profiles = {i: (True, AS_OF) for i in (10, 11, 12, 21, 22)}
    profiles[20] = (True, AS_OF - 28 * DAY)
    rows = reference_recommendations(
        [1], edges, [1, 10, 11, 12, 20, 21, 22], {1: {21}}, profiles, settings, AS_OF
    )
    assert rows == [{
        "user_id": 1, "candidate_id": 20, "mutual_count": 2,
        "score": pytest.approx(0.131, abs=1e-15), "rank": 1,
        "followed_by": capped_follows(1, [10, 11], 2, settings.sample_seed),
    }]


def random_fixture(seed: int, n_users: int = 3000) -> Fixture:
    """A heavy-tailed random graph with every complication the kernel handles: pending
    follows, edges to unknown accounts, self-follows, suspended / hidden / profile-less
    candidates, null or future activity, exact score ties, and blocks, mutes and dismissals."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(10 * n_users, n_users, replace=False)) + 1
    popularity = 1.0 / np.arange(1, n_users + 1) ** 1.1
    popularity /= popularity.sum()
    out_degree = np.minimum(rng.zipf(1.7, n_users) + 4, 300)
    edges = set()
    for follower, degree in zip(ids, out_degree, strict=True):
        targets = rng.choice(ids, size=degree, p=popularity)
        for target in targets:
            edges.add((int(follower), int(target)))
    unknown = [(int(rng.choice(ids)), int(10 * n_users + 5 + i)) for i in range(50)]
    edges = sorted(edges | set(unknown))
    status = ["pending" if rng.random() < 0.05 else "active" for _ in edges]
    users = []
    for user_id in ids:
        draw = rng.random()
        users.append(User(
            int(user_id),
            # whole days (and some in the future), so many scores tie exactly
            last_active_at=None if draw < 0.05 else AS_OF - int(rng.integers(-2, 40)) * DAY,
            account_status="suspended" if 0.05 <= draw < 0.10 else "active",
            is_discoverable=not (0.10 <= draw < 0.15),
            eligible=rng.random() < 0.7,
        ))
    reasons = ["blocked", "blocked_by", "muted", "dismissed"]
    exclusions = [
        (int(rng.choice(ids)), int(rng.choice(ids)), reasons[int(rng.integers(0, 4))])
        for _ in range(n_users)
    ]
    missing = {int(v) for v in rng.choice(ids, n_users // 50, replace=False)}
    return Fixture(
        users=users,
        edges=[(f, t, s) for (f, t), s in zip(edges, status, strict=True)],
        exclusions=exclusions,
        missing_profiles=missing,
    )


@pytest.mark.parametrize(
    "caps",
    [
        dict(hop1_cap=6, hop2_cap=4, min_mutual_count=2, max_candidates_to_score=3, top_k=2,
             followed_by_count=2),
        dict(hop1_cap=40, hop2_cap=15, min_mutual_count=2, max_candidates_to_score=8, top_k=5,
             followed_by_count=3, mutual_saturation=3.0),
        # the shipped ranking: Adamic-Adar paths, popularity term, hop2 by popularity, min 1
        dict(shipped=True, hop1_cap=6, hop2_cap=4, max_candidates_to_score=3, top_k=2,
             followed_by_count=2),
        dict(shipped=True, hop1_cap=40, hop2_cap=15, max_candidates_to_score=8, top_k=5,
             followed_by_count=3, mutual_saturation=3.0),
        dict(shipped=True, hop1_cap=40, hop2_cap=15, max_candidates_to_score=8, top_k=5,
             ranking="resource_allocation", hop1_order="popularity", hop2_order="sample",
             popularity_weight=0.2, mutual_weight=0.5),
    ],
    ids=["tight-caps", "wide-caps", "shipped-tight", "shipped-wide", "ra-popularity-hop1"],
)
def test_kernel_equals_reference_on_a_random_graph(tmp_path, caps):
    """Every shard of a 3,000-user random graph: the compiled kernel's output equals the
    pure-Python reference: ids, counts, ranks and followed_by exactly; the score to 1e-12
    (the kernel's activity term is evaluated by Polars, which may differ from Python's
    scalar ``0.5 ** x`` in the last bit)."""
    settings = settings_for(tmp_path, shard_count=3, **caps)
    paths = write_run(random_fixture(11), settings)
    build_graph(paths, settings)
    total = 0
    for shard_id in range(3):
        manifest = traverse_shard(paths, settings, shard_id)
        kernel = pl.read_parquet(paths.shard_output(shard_id))
        expected = reference_shard(paths, settings, shard_id)
        assert_frame_equal(kernel.drop("score"), expected.drop("score"), check_exact=True)
        assert_frame_equal(kernel.select("score"), expected.select("score"), abs_tol=1e-12)
        total += kernel.height
        assert manifest["rows"] == kernel.height
    assert total > 2000  # ~2,500 and ~6,000 rows
    # ... and not vacuous for the cuts either: without max_candidates_to_score (11-53 users
    # per shard have more survivors than it) the reference would rank differently.
    uncut = settings.model_copy(update={"max_candidates_to_score": 10**6})
    assert not reference_shard(paths, uncut, shard_id).equals(expected)


def test_kernel_output_is_byte_identical_on_rerun(tmp_path):
    settings = settings_for(tmp_path, shard_count=2, hop1_cap=20, hop2_cap=10)
    paths = write_run(random_fixture(12, n_users=1500), settings)
    build_graph(paths, settings)
    first = [traverse_shard(paths, settings, s) and paths.shard_output(s).read_bytes()
             for s in range(2)]
    build_graph(paths, settings)
    second = [traverse_shard(paths, settings, s) and paths.shard_output(s).read_bytes()
              for s in range(2)]
    assert first == second
    assert all(len(b) > 1000 for b in first)


def test_counts_only_reference_gives_the_same_rows(tmp_path):
    """followed_by_count=0 takes the reference's Counter.update path (what make bench times
    as "the design's loop, counts only"): the same rows, with empty followed_by.
    User 1 expands 10, 11, 12: 20 x3, 21 x2, 22 x2, 1 x1 (itself). Scores: 20: 0.7 * 3/25 +
    0.3 = 0.384; 21: 0.056 + 0.15 = 0.206; 22: 0.056 + 0 = 0.056. User 2 expands 11, 12:
    20 x2 (21, 22 and 1 once each)."""
    from recs.testing.reference import recommend_from_follows

    settings = settings_for(tmp_path, hop1_cap=6, hop2_cap=4)
    following = {1: [10, 11, 12], 10: [20, 21, 22], 11: [20, 21], 12: [22, 20, 1], 2: [11, 12]}
    activity = {20: 1.0, 21: 0.5, 22: 0.0, 11: 1.0, 1: 1.0}
    exclusions = {1: {10, 11, 12}, 2: {11, 12}}
    full = recommend_from_follows([1, 2], following, exclusions, activity, settings)
    counts_only = recommend_from_follows(
        [1, 2], following, exclusions, activity,
        settings.model_copy(update={"followed_by_count": 0}),
    )
    assert [(r["user_id"], r["candidate_id"], r["mutual_count"]) for r in full] == [
        (1, 20, 3), (1, 21, 2), (1, 22, 2), (2, 20, 2),
    ]
    assert [{**r, "followed_by": []} for r in full] == counts_only


def test_kernel_chunks_give_the_same_rows(tmp_path):
    """The kernel runs users in chunks with one set of reused output buffers: chunks of 7
    users give exactly the rows of one chunk (stale buffer contents never leak)."""
    from recs.traversal.graph import load_graph
    from recs.traversal.inputs import shard_inputs
    from recs.traversal.kernel import recommend_users

    settings = settings_for(tmp_path, shard_count=3, hop1_cap=40, hop2_cap=15)
    paths = write_run(random_fixture(13, n_users=800), settings)
    build_graph(paths, settings)
    graph = load_graph(paths.graph_dir)
    inputs = shard_inputs(paths, settings, 1, graph)
    whole = recommend_users(inputs, graph, settings)
    chunked = recommend_users(inputs, graph, settings, users_per_chunk=7)
    assert len(whole.rows.user) > 500
    for name in ("user", "candidate", "mutual_count", "score", "rank", "followed_by",
                 "followed_by_n"):
        assert np.array_equal(getattr(whole.rows, name), getattr(chunked.rows, name)), name
