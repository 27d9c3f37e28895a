"""Which follows the caps keep (recs.traversal.hop_order): priority first, then sample order."""

from __future__ import annotations

import numpy as np
from traversal_fixtures import Fixture, User, run, settings_for, write_run

from recs.sampling import capped_follows
from recs.traversal.graph import build_graph, load_graph
from recs.traversal.hop_order import (
    grouped_order,
    ordered_keys,
    pair_codes,
    popularity_priority,
    recency_priority,
    reciprocated,
)

SEED = 20_240_601


def test_ordered_keys_sort_by_priority_then_sample_key():
    """Priorities 1, 0, 1, 0: the two 0s first, each pair in the order of its sample keys."""
    keys = np.array([3 << 40, 9 << 40, 1 << 40, 2 << 40], dtype=np.uint64)
    order = np.argsort(ordered_keys(keys, np.array([1, 0, 1, 0])), kind="stable")
    assert order.tolist() == [3, 1, 2, 0]


def test_priorities_put_newer_more_followed_and_reciprocated_first():
    """Newer (larger µs) -> smaller priority; more followers -> smaller; reciprocated: pairs
    (0, 1) and (1, 0) both exist, (0, 2) has no reverse."""
    assert np.argsort(recency_priority(np.array([5_000_000, 9_000_000, 1_000_000]))).tolist() \
        == [1, 0, 2]
    assert np.argsort(popularity_priority(np.array([3, 10, 0]))).tolist() == [1, 0, 2]
    codes = np.sort(pair_codes(np.array([0, 1, 0]), np.array([1, 0, 2])))
    assert reciprocated(np.array([0, 1, 0]), np.array([1, 0, 2]), codes).tolist() == [
        True, True, False
    ]


def test_grouped_order_sorts_each_follower_by_key_then_followee():
    """Follower 0's edges to 5, 6, 7 have keys 9, 2, 2: (key, followee) gives 6, 7, 5, i.e.
    positions 1, 2, 0; follower 1's to 5, 8 have keys 1, 0: positions 4, 3."""
    groups = np.array([0, 0, 0, 1, 1])
    followees = np.array([5, 6, 7, 5, 8])
    keys = np.array([9, 2, 2, 1, 0], dtype=np.uint64)
    assert grouped_order(groups, keys, followees).tolist() == [1, 2, 0, 4, 3]


def test_grouped_order_equals_lexsort_presorted_or_not_ties_included(monkeypatch):
    """A partition's layout (grouped, followees ascending: the compiled path), with equal keys
    and duplicate pairs, and the same edges shuffled (the lexsort path): both give
    ``np.lexsort``'s permutation, which is stable too."""
    rng = np.random.default_rng(7)
    groups = rng.integers(0, 300, 20_000)
    followees = rng.integers(0, 2_000, 20_000)
    presorted = np.lexsort((followees, groups))
    groups, followees = groups[presorted], followees[presorted]
    keys = rng.integers(0, 40, 20_000).astype(np.uint64) << np.uint64(32)  # many equal keys
    expected = np.lexsort((followees, keys, groups))
    assert grouped_order(groups, keys, followees).tolist() == expected.tolist()
    # the presorted input takes the compiled path: with the lexsort gone it still sorts
    monkeypatch.setattr(np, "lexsort", None)
    assert grouped_order(groups, keys, followees).tolist() == expected.tolist()
    monkeypatch.undo()
    shuffled = rng.permutation(20_000)
    g, k, f = groups[shuffled], keys[shuffled], followees[shuffled]
    assert grouped_order(g, k, f).tolist() == np.lexsort((f, k, g)).tolist()
    assert grouped_order(groups[:1], keys[:1], followees[:1]).tolist() == [0]
    # grouped, but a followee going down under follower 1: not the fast path's input
    assert grouped_order(np.array([1, 1]), np.array([3, 3], np.uint64), np.array([9, 4])).tolist() \
        == [1, 0]
    # signed keys are not the compiled path's: -1 sorts first, as in the lexsort
    assert grouped_order(np.array([0, 0, 0]), np.array([5, -1, 0]), np.array([1, 2, 3])).tolist() \
        == [1, 2, 0]


FOLLOWS = {10: [20, 21, 22, 23]}  # 10's follows; 22 has 3 followers, 21 two, 20 and 23 one
EXTRA = [(30, 22), (31, 22), (30, 21), (21, 10)]  # 21 follows 10 back


def fixture() -> Fixture:
    edges = [(1, 10)] + [(10, t) for t in FOLLOWS[10]] + EXTRA
    ids = (10, 20, 21, 22, 23, 30, 31)
    return Fixture(users=[User(1)] + [User(i, eligible=False) for i in ids],
                   edges=[(f, t, "active") for f, t in edges])


def row_of_10(tmp_path, order):
    settings = settings_for(tmp_path / order, hop2_cap=2, hop2_order=order)
    paths = write_run(fixture(), settings)
    build_graph(paths, settings)
    return load_graph(paths.graph_dir).follows(10)


def test_hop2_order_chooses_which_follows_a_capped_row_keeps(tmp_path):
    """hop2_cap 2 over 10's follows 20, 21, 22, 23: sample keeps the first two of
    ``capped_follows``; popularity 22 (3 followers), 21 (2); reciprocity 21 (follows 10
    back), then the first of the rest in sample order."""
    sampled = capped_follows(10, FOLLOWS[10], 4, SEED)
    assert row_of_10(tmp_path, "sample") == sampled[:2]
    assert row_of_10(tmp_path, "popularity") == [22, 21]
    rest = [f for f in sampled if f != 21]
    assert row_of_10(tmp_path, "reciprocity") == [21, rest[0]]


def test_hop1_order_chooses_which_follows_are_expanded(tmp_path):
    """User 1 follows 10, 21 and 22, each following one account (40, 41, 42); hop1_cap 1.
    popularity expands 22 alone (3 followers: 1, 30, 31), so the one candidate is 42; sample
    expands the first of ``capped_follows`` and lists that one's follow."""
    edges = [(1, 10), (1, 21), (1, 22), (10, 40), (21, 41), (22, 42), (30, 22), (31, 22),
             (42, 1)]
    ids = (10, 21, 22, 30, 31, 40, 41, 42)
    fx = Fixture(users=[User(1)] + [User(i, eligible=False) for i in ids],
                 edges=[(f, t, "active") for f, t in edges])
    settings = settings_for(tmp_path / "pop", hop1_cap=1, hop1_order="popularity",
                            min_mutual_count=1)
    frame = run(fx, settings)[2]
    assert frame["candidate_id"].to_list() == [42]  # via 22, the most-followed of 1's follows
    sample_first = capped_follows(1, [10, 21, 22], 1, SEED)[0]
    settings = settings_for(tmp_path / "sample", hop1_cap=1, min_mutual_count=1)
    frame = run(fx, settings)[2]
    assert frame["candidate_id"].to_list() == [{10: 40, 21: 41, 22: 42}[sample_first]]
