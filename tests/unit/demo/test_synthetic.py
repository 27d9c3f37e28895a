"""recs.demo.synthetic: a power-law follow graph, deterministic, loaded like a real dataset."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from recs.config import Settings
from recs.demo.synthetic import generate_graph, out_degrees, synthetic_follow_graph
from recs.errors import DatasetError


def edge_keys(graph) -> np.ndarray:
    follower = np.repeat(np.arange(graph.n_users), graph.out_degree())
    return follower * graph.n_users + graph.indices


def test_degrees_are_heavy_tailed_without_self_loops_or_duplicates():
    """20,000 users x 30 follows = exactly 600,000 edges (largest-remainder rounding).

    A power law shows as a maximum far above the mean: in-degree (Zipf popularity) and
    out-degree (lognormal) both have their maximum >> 10x their mean (30), and the head of
    thin-graph users (< 5 follows) the cold-start path needs is there.
    """
    graph = synthetic_follow_graph(20_000, seed=3, avg_out_degree=30)
    assert graph.n_edges == 600_000
    in_degree, out_degree = graph.in_degree(), graph.out_degree()
    assert in_degree.max() > 50 * in_degree.mean()
    assert out_degree.max() > 10 * out_degree.mean()
    assert (out_degree < 5).mean() > 0.02
    keys = edge_keys(graph)
    assert (np.diff(keys) > 0).all()  # sorted by (follower, followee), no duplicate pair
    follower = np.repeat(np.arange(graph.n_users), out_degree)
    assert not (follower == graph.indices).any()  # no self-loop


def test_hubs_have_in_degrees_in_the_thousands_at_50k_users():
    graph = synthetic_follow_graph(50_000, seed=1, avg_out_degree=50)
    top = np.sort(graph.in_degree())[::-1]
    assert top[9] >= 1_000  # at least ten hubs with >= 1,000 followers
    assert top[0] >= 10_000


def test_same_seed_same_graph_other_seed_other_graph():
    first = synthetic_follow_graph(5_000, seed=9, avg_out_degree=20)
    again = synthetic_follow_graph(5_000, seed=9, avg_out_degree=20)
    other = synthetic_follow_graph(5_000, seed=10, avg_out_degree=20)
    assert np.array_equal(first.indptr, again.indptr)
    assert np.array_equal(first.indices, again.indices)
    assert not np.array_equal(first.indices, other.indices)


def test_out_degrees_hit_the_mean_exactly_and_fit_the_graph():
    rng = np.random.default_rng(0)
    degrees = out_degrees(1_000, 7.5, rng)
    assert degrees.sum() == 7_500
    assert out_degrees(4, 50, rng).max() <= 3  # at most n - 1 follows each


def test_bad_sizes_are_dataset_errors():
    with pytest.raises(DatasetError, match="--users"):
        synthetic_follow_graph(0, seed=1)
    with pytest.raises(DatasetError, match="out-degree"):
        synthetic_follow_graph(10, seed=1, avg_out_degree=-1)


def test_generate_graph_loads_the_store_like_a_dataset(tmp_path):
    settings = Settings(home=tmp_path)
    summary = generate_graph(800, seed=4, settings=settings, avg_out_degree=12)
    assert summary["users"] == 800
    assert summary["follow_edges"] == 9_600
    assert summary["mean_out_degree"] == 12.0
    connection = sqlite3.connect(tmp_path / "live.db")
    try:
        by_status = dict(
            connection.execute("SELECT status, count(*) FROM follow_edges GROUP BY status")
        )
        users = connection.execute("SELECT min(user_id), max(user_id), count(*) FROM users")
        assert users.fetchone() == (0, 799, 800)
        interests = connection.execute("SELECT count(*) FROM user_interests").fetchone()[0]
    finally:
        connection.close()
    assert by_status == {"active": 9_600, "pending": summary["pending_follows"]}
    assert summary["pending_follows"] == 4  # round(0.005 * 800)
    assert 800 <= interests <= 2_400
    with pytest.raises(DatasetError, match="not empty"):
        generate_graph(10, seed=4, settings=settings)
