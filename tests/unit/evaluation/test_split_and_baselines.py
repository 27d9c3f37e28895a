"""recs.evaluation.split and .baselines on graphs small enough to derive by hand."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from recs.errors import DatasetError
from recs.evaluation.baselines import baseline_lists
from recs.evaluation.edges import EDGE_SCHEMA, EdgeList, read_edge_list
from recs.evaluation.split import random_split, temporal_split


def edge_list(pairs, times=None) -> EdgeList:
    frame = pl.DataFrame(
        {"follower_id": [p[0] for p in pairs], "followee_id": [p[1] for p in pairs],
         "followed_at": times if times is not None else [None] * len(pairs)},
        schema=EDGE_SCHEMA,
    )
    return EdgeList("tiny", frame, 0, 0)


def test_random_split_hides_a_share_of_each_qualifying_user():
    """User 1 follows 20 accounts (round(0.1 * 20) = 2 hidden), user 2 follows 14 (1.4 -> 1),
    user 3 follows 5 (< 10: not a test user, nothing hidden). The same seed gives the same
    split; another seed another one."""
    pairs = [(1, 100 + i) for i in range(20)] + [(2, 200 + i) for i in range(14)]
    pairs += [(3, 300 + i) for i in range(5)]
    split = random_split(edge_list(pairs), share=0.1, min_follows=10, seed=7)
    hidden = split.test.group_by("user_id").len().sort("user_id")
    assert hidden.rows() == [(1, 2), (2, 1)]
    assert split.train.height == len(pairs) - 3
    assert split.test.join(split.train.rename({"follower_id": "user_id"}),
                           on=["user_id", "followee_id"]).height == 0
    assert split.test_users.tolist() == [1, 2]
    again = random_split(edge_list(pairs), share=0.1, min_follows=10, seed=7)
    assert again.test.equals(split.test)
    other = random_split(edge_list(pairs), share=0.1, min_follows=10, seed=8)
    assert not other.test.equals(split.test)


def test_temporal_split_cuts_at_the_quantile_and_drops_unknown_accounts():
    """Times 1..10: the 0.8 quantile (lower) is 8, so the follows at 9 and 10 are hidden.
    1 -> 9 at time 9 is kept (both accounts are in the training follows); 5 -> 99 at time 10
    is dropped (99 first appears after the cut)."""
    pairs = [(1, 2), (2, 3), (3, 1), (1, 4), (4, 5), (5, 1), (2, 9), (9, 1), (1, 9), (5, 99)]
    split = temporal_split(edge_list(pairs, [float(t) for t in range(1, 11)]), quantile=0.8)
    assert split.train.height == 8
    assert split.test.rows() == [(1, 9)]
    assert split.meta["later_edges_dropped_unknown_account"] == 1
    assert 99 not in split.user_ids.tolist()
    with pytest.raises(DatasetError, match="needs a time"):
        temporal_split(edge_list(pairs), quantile=0.8)


TRIANGLES = [
    # user 1 follows 2 and 3; 2 follows 4 and 5; 3 follows 4 and 6; 4 follows 1; 7 follows 4, 5
    (1, 2), (1, 3), (2, 4), (2, 5), (3, 4), (3, 6), (4, 1), (7, 4), (7, 5),
]


def lists_of(name, k=10):
    edges = edge_list(TRIANGLES).edges
    user_ids = np.array([1, 2, 3, 4, 5, 6, 7])
    frame = baseline_lists(name, edges, user_ids, np.array([1]), k)
    return list(zip(frame["candidate_id"].to_list(), frame["rank"].to_list(), strict=True))


def test_common_neighbours_count_two_hop_paths():
    """From 1: 4 via 2 and 3 (2 paths), 5 via 2, 6 via 3; never 1 itself (via nothing here)
    nor 2, 3 (followed). Ties by id: 4, 5, 6."""
    assert lists_of("common_neighbours") == [(4, 1), (5, 2), (6, 3)]


def test_adamic_adar_and_resource_allocation_weight_by_the_intermediate_degree():
    """Degrees (follows + followers): 2 -> 3 (follows 4, 5; followed by 1), 3 -> 3. Adamic-Adar
    of 4 = 2 / ln 3, of 5 and 6 = 1 / ln 3; resource allocation 2/3 and 1/3: same order as the
    counts here, and k = 2 cuts after 5."""
    assert lists_of("adamic_adar") == [(4, 1), (5, 2), (6, 3)]
    assert lists_of("resource_allocation", k=2) == [(4, 1), (5, 2)]


def test_jaccard_normalises_by_the_union_of_neighbourhoods():
    """Γ(1) = {2, 3}; Γ⁻(4) = {2, 3, 7}: 2 / 3; Γ⁻(5) = {2, 7}: 1 / 3; Γ⁻(6) = {3}: 1 / 2.
    So 4, 6, 5."""
    assert lists_of("jaccard") == [(4, 1), (6, 2), (5, 3)]


def test_global_popularity_excludes_self_and_followed():
    """In-degrees: 4 has 3 followers, 5 has 2, 1/2/3/6 one each, 7 none. User 1 follows 2, 3:
    4, 5, then 6 (1 follower; ties by id), then 7 (none, listed last); not 1, 2, 3."""
    assert lists_of("global_popularity") == [(4, 1), (5, 2), (6, 3), (7, 4)]


def test_an_edge_file_is_parsed_with_times_reversed_and_deduplicated(tmp_path):
    """Comma-separated 'followee,follower,time' with a repeated pair (earliest time kept) and a
    self-loop (dropped)."""
    path = tmp_path / "mine.csv"
    path.write_text("# a comment\n2,1,30.5\n2,1,10\n3,1,20\n4,4,1\n")
    parsed = read_edge_list(path, reverse=True, time_column=2)
    assert parsed.edges.rows() == [(1, 2, 10.0), (1, 3, 20.0)]
    assert (parsed.self_loops_dropped, parsed.duplicates_dropped) == (1, 1)
    assert parsed.has_times
    path.write_text("1 x\n")
    with pytest.raises(DatasetError, match="does not parse"):
        read_edge_list(path)


def test_degree_weights_reverse_the_common_neighbour_order():
    """1 follows 2, 3, 8; 2 and 8 follow 4, 3 follows 6; 9, 10, 11 follow 2 and 8. Common
    neighbours: 4 has 2 paths, 6 one -> 4, 6. Degrees: 2 and 8 -> 1 + 4 = 5, 3 -> 1 + 1 = 2.
    Adamic-Adar: 4 = 2 / ln 5 = 1.243, 6 = 1 / ln 2 = 1.443; resource allocation: 4 = 2/5,
    6 = 1/2 -> both 6, 4. Jaccard: Γ(1) = {2, 3, 8}, Γ⁻(4) = {2, 8}: 2/3, Γ⁻(6) = {3}: 1/3
    -> 4, 6."""
    pairs = [(1, 2), (1, 3), (1, 8), (2, 4), (8, 4), (3, 6)]
    pairs += [(f, hub) for f in (9, 10, 11) for hub in (2, 8)]
    user_ids = np.array([1, 2, 3, 4, 6, 8, 9, 10, 11])

    def order(name):
        frame = baseline_lists(name, edge_list(pairs).edges, user_ids, np.array([1]), 10)
        return frame["candidate_id"].to_list()

    assert order("common_neighbours") == [4, 6]
    assert order("adamic_adar") == [6, 4]
    assert order("resource_allocation") == [6, 4]
    assert order("jaccard") == [4, 6]
