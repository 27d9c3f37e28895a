"""Pre-rank filters (recs.traversal.predicates): what is dropped before ranking, and the counts.

Fixtures and the hand derivations: ``traversal_fixtures`` (user 1's sample order of 10, 11, 12
is 10, 12, 11).
"""

from __future__ import annotations

import polars as pl
from traversal_fixtures import (
    AS_OF,
    DAY,
    SEED,
    Fixture,
    User,
    build_graph,
    exclusion_graph,
    only_user_1,
    rows,
    run,
    settings_for,
    traverse_shard,
    write_run,
)

from recs.contracts import EXPORT_SCHEMAS
from recs.files import read_json
from recs.sampling import capped_follows
from recs.traversal.kernel import STAGE_COUNTS

NO_DROPS = {name: 0 for name in STAGE_COUNTS}


def test_mutual_counts_and_every_pre_rank_filter(tmp_path):
    """User 1 follows 10, 11, 12 (active) and has a pending request to 13.

    Expanding 10, 11, 12 (13 is pending, so not expanded) gives mutual counts
    20: 3 (10, 11, 12); 21: 2 (10, 11); 22, 23, 26: 1 each (they would be 2 if the pending 13
    were expanded) -> pruned by min_mutual_count=2.
    Reached twice but excluded: 1 (self, via 10, 11), 11 (already followed, via 10, 12),
    13 (pending request, via 10, 11), 24 (suspended), 25 (not discoverable), 27 (user blocked
    it), 28 (it blocked the user), 29 (muted), 30 (dismissed), 31 (no candidate profile).
    Scores (as_of = 2026-11-02): 20 active at as_of -> 0.7 * 3/25 + 0.3 * 1 = 0.384;
    21 inactive 14 days -> 0.7 * 2/25 + 0.3 * 0.5 = 0.206.
    followed_by in user 1's sample order (10, 12, 11): 20 -> [10, 12, 11]; 21 -> [10, 11].
    Traversals = row lengths of 10, 11, 12 = 10 + 9 + 9 = 28.
    """
    assert capped_follows(1, [10, 11, 12], 3, SEED) == [10, 12, 11]
    settings = settings_for(tmp_path)
    paths, manifest, frame = run(exclusion_graph(), settings)
    assert rows(frame) == [
        (1, 20, 3, 0.384, 1, [10, 12, 11]),
        (1, 21, 2, 0.206, 2, [10, 11]),
    ]
    assert {
        k: manifest[k]
        for k in ("users_in", "users_with_recommendations", "rows", "traversals", "first_hop_edges")
    } == {
        "users_in": 1,
        "users_with_recommendations": 1,
        "rows": 2,
        "traversals": 28,
        "first_hop_edges": 3,
    }
    assert read_json(paths.shard_manifest(0))["traversals"] == 28


def test_snapshot_follows_are_excluded_even_if_the_export_misses_them(tmp_path):
    """With an empty follow_exclusions export, the follow (11) and the pending request (13)
    are still excluded, from the snapshot partition. Blocks, mutes and dismissals come only
    from the export, so 27, 28, 29, 30 (2 mutuals each, active: 0.7 * 2/25 + 0.3 = 0.356)
    reappear between 20 (0.384) and 21 (0.206): ranks 20, 27, 28, 29, 30, 21."""
    settings = settings_for(tmp_path)
    paths = write_run(exclusion_graph(), settings)
    export = paths.exports_dir / "follow_exclusions" / "shard_id=0" / "data_0.parquet"
    pl.DataFrame(schema=EXPORT_SCHEMAS["follow_exclusions"]).write_parquet(export)
    build_graph(paths, settings)
    traverse_shard(paths, settings, 0)
    frame = pl.read_parquet(paths.shard_output(0))
    assert frame["candidate_id"].to_list() == [20, 27, 28, 29, 30, 21]


def test_max_candidates_to_score_cuts_by_mutual_count_before_scoring(tmp_path):
    """50 has 3 mutuals but was last active 70 days ago: 0.7 * 3/25 + 0.3 * 0.5**5 = 0.093375.
    51, 52, 53 have 2 mutuals and are active: 0.7 * 2/25 + 0.3 = 0.356 each.
    Without a cut the ranking is 51, 52, 53, 50. max_candidates_to_score=2 keeps the top two
    by (mutual_count desc, candidate_id asc) = 50, 51 before scoring, then ranks by score:
    51 (0.356), 50 (0.093375)."""
    fixture = cut_graph()
    frame = run(fixture, settings_for(tmp_path))[2]
    assert frame["candidate_id"].to_list() == [51, 52, 53, 50]
    frame = run(fixture, settings_for(tmp_path / "cut", max_candidates_to_score=2))[2]
    assert [(r[1], r[2], r[3]) for r in rows(frame)] == [(51, 2, 0.356), (50, 3, 0.093375)]


def test_stage_counts_of_every_pre_rank_filter(tmp_path):
    """exclusion_graph, counted by hand from its rows (10: 20 21 23 13 1 11 24 27 29 31;
    11: 20 21 24 25 13 1 28 29 30; 12: 20 22 25 26 11 27 28 30 31): 15 distinct accounts
    reached. 10 and 12 are followed but nobody reaches them: no candidates, counted nowhere.
    Dropped: self 1; following 11; pending 13; blocked 27; blocked_by 28; muted 29;
    dismissed 30; below min_mutual_count (1 mutual) 23, 22, 26; not recommendable 24
    (suspended), 25 (not discoverable), 31 (no profile). Scored and kept: 20, 21.
    1 + 1 + 1 + 1 + 1 + 1 + 1 + 3 + 3 + 2 = 15."""
    paths, manifest, frame = run(exclusion_graph(), settings_for(tmp_path))
    expected = {
        **NO_DROPS,
        "candidates": 15,
        "dropped_self": 1,
        "dropped_following": 1,
        "dropped_pending": 1,
        "dropped_blocked": 1,
        "dropped_blocked_by": 1,
        "dropped_muted": 1,
        "dropped_dismissed": 1,
        "dropped_below_min_mutual_count": 3,
        "dropped_not_recommendable": 3,
        "scored": 2,
        "kept": 2,
    }
    assert manifest["stage_counts"] == expected
    assert read_json(paths.shard_manifest(0))["stage_counts"] == expected
    assert list(manifest["stage_counts"]) == list(STAGE_COUNTS)
    assert frame.height == expected["kept"]


def test_an_account_excluded_for_several_reasons_counts_under_the_first(tmp_path):
    """exclusion_graph plus: 11 also muted (followed first: counts as following); 27 also
    dismissed (blocked first); 23 muted (1 mutual, but the exclusion comes before
    min_mutual_count: muted); 20 under a reason this version does not name ("reported":
    other_exclusion, so 20 is no longer recommended); 10 dismissed (nobody reaches it: counted
    nowhere). So muted 2 (29, 23), below min_mutual_count 2 (22, 26), other_exclusion 1 (20),
    scored and kept 1 (21); still 15 candidates."""
    fixture = exclusion_graph()
    fixture.exclusions += [
        (1, 11, "muted"),
        (1, 27, "dismissed"),
        (1, 23, "muted"),
        (1, 20, "reported"),
        (1, 10, "dismissed"),
    ]
    _, manifest, frame = run(fixture, settings_for(tmp_path))
    assert frame["candidate_id"].to_list() == [21]
    assert manifest["stage_counts"] == {
        **NO_DROPS,
        "candidates": 15,
        "dropped_self": 1,
        "dropped_following": 1,
        "dropped_pending": 1,
        "dropped_blocked": 1,
        "dropped_blocked_by": 1,
        "dropped_muted": 2,
        "dropped_dismissed": 1,
        "dropped_other_exclusion": 1,
        "dropped_below_min_mutual_count": 2,
        "dropped_not_recommendable": 3,
        "scored": 1,
        "kept": 1,
    }


def cut_graph() -> Fixture:
    """User 1 follows 10, 11, 12; 50 is reached by all three, 51, 52, 53 by two each."""
    edges = [(1, 10, "active"), (1, 11, "active"), (1, 12, "active")]
    reached_by = {50: [10, 11, 12], 51: [10, 11], 52: [11, 12], 53: [10, 12]}
    edges += [(f, c, "active") for c, friends in reached_by.items() for f in friends]
    users = only_user_1([10, 11, 12, 51, 52, 53])
    users.append(User(50, last_active_at=AS_OF - 70 * DAY, eligible=False))
    return Fixture(users=users, edges=edges)


def test_stage_counts_of_the_cut_and_the_take(tmp_path):
    """cut_graph: 4 candidates (50-53), none dropped. max_candidates_to_score=2 cuts 2 and
    scores 2 (50, 51); top_k=1 keeps 1 (51). Without the cut: 4 scored, all 4 kept."""
    _, manifest, frame = run(
        cut_graph(), settings_for(tmp_path, max_candidates_to_score=2, top_k=1)
    )
    assert frame["candidate_id"].to_list() == [51]
    assert manifest["stage_counts"] == {
        **NO_DROPS,
        "candidates": 4,
        "cut_by_max_candidates_to_score": 2,
        "scored": 2,
        "kept": 1,
    }
    _, manifest, _ = run(cut_graph(), settings_for(tmp_path / "all"))
    assert manifest["stage_counts"] == {**NO_DROPS, "candidates": 4, "scored": 4, "kept": 4}


def test_an_account_that_is_not_active_is_no_ones_first_hop(tmp_path):
    """User 1 follows 10, 11 (active) and 12 (suspended) and 13 (deactivated); each of them
    follows 20. Only 10 and 11 are expanded: 20's mutual_count is 2 (not 4), "followed by" is
    10 and 11 in user 1's sample order (10, 11 of [10, 11]), and 12 and 13 appear nowhere.
    Traversals = row lengths of 10 and 11 = 1 + 1 = 2. Score: 0.7 * 2/25 + 0.3 * 1 = 0.356."""
    users = [User(1), *only_user_1([10, 11, 20])[1:], User(12, account_status="suspended",
             eligible=False), User(13, account_status="deactivated", eligible=False)]  # fmt: skip
    edges = [(1, f, "active") for f in (10, 11, 12, 13)] + [
        (f, 20, "active") for f in (10, 11, 12, 13)
    ]
    order = capped_follows(1, [10, 11], 2, SEED)
    paths, manifest, frame = run(Fixture(users, edges), settings_for(tmp_path))
    assert rows(frame) == [(1, 20, 2, 0.356, 1, order)]
    assert (manifest["traversals"], manifest["first_hop_edges"]) == (2, 2)


def test_traversals_through_hubs_are_counted(tmp_path):
    """User 1 follows 10 and 11; 10 follows 20 21 22 (3 entries), 11 follows 20 (1). With 10 a
    hub, 3 of the shard's 4 traversals go through a hub; with no hub, 0."""
    users = only_user_1([10, 11, 20, 21, 22])
    edges = [(1, 10, "active"), (1, 11, "active"), (10, 20, "active"), (10, 21, "active"),
             (10, 22, "active"), (11, 20, "active")]  # fmt: skip
    _, with_hub, _ = run(Fixture(users, edges, hubs=[10]), settings_for(tmp_path / "a"))
    _, without, _ = run(Fixture(users, edges), settings_for(tmp_path / "b"))
    assert (with_hub["traversals"], with_hub["hub_traversals"]) == (4, 3)
    assert without["hub_traversals"] == 0


def test_select_smallest_moves_the_m_smallest_keys_to_the_front():
    """The ``max_candidates_to_score`` cut takes the fewest ids by a selection: after
    ``select_smallest(keys, n, m)`` the first ``m`` keys are the ``m`` smallest of the first
    ``n`` (any order), nothing is lost, and ``m`` <= 0 or >= ``n`` leaves the keys as they are.
    Random keys, and sorted and reversed ones (the quickselect's worst pivots)."""
    import numpy as np

    from recs.traversal.predicates import select_smallest

    rng = np.random.default_rng(3)
    cases = [rng.choice(10**6, int(n), replace=False).astype(np.uint64)
             for n in rng.integers(2, 400, 300)]
    cases += [np.arange(3000, dtype=np.uint64), np.arange(3000, dtype=np.uint64)[::-1].copy()]
    for keys in cases:
        n = len(keys)
        for m in (1, n // 3, n // 2, n - 1):
            selected = keys.copy()
            select_smallest(selected, n, m)
            assert np.array_equal(np.sort(selected[:m]), np.sort(keys)[:m]), (n, m)
            assert np.array_equal(np.sort(selected), np.sort(keys))
    for m in (0, 5, 6):
        keys = np.array([5, 3, 9, 1, 7], dtype=np.uint64)
        select_smallest(keys, 5, m)
        assert keys.tolist() == [5, 3, 9, 1, 7]


def test_recommendable_bits_are_one_bit_per_node_not_nan():
    """Nodes 0, 2 and 8 have an activity, the rest NaN: byte 0 is 0b00000101, byte 1 is 1;
    the compiled reader gives the same answer node by node."""
    import numpy as np

    from recs.traversal.predicates import is_recommendable, recommendable_bits

    nan = float("nan")
    activity = np.array([0.5, nan, 1.0, nan, nan, nan, nan, nan, 2.0, nan])
    bits = recommendable_bits(activity)
    assert bits.dtype == np.uint8 and bits.tolist() == [0b101, 0b1]
    assert [is_recommendable(bits, node) for node in range(10)] == [
        True, False, True, False, False, False, False, False, True, False,
    ]  # fmt: skip
    assert recommendable_bits(np.zeros(0)).tolist() == []
