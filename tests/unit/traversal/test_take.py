"""Filter-and-take (recs.traversal.take): top_k, deterministic ties and "followed by".

Fixtures and the hand derivations: ``traversal_fixtures``.
"""

from __future__ import annotations

from traversal_fixtures import (
    AS_OF,
    DAY,
    SEED,
    Fixture,
    User,
    exclusion_graph,
    only_user_1,
    rows,
    run,
    settings_for,
)

from recs.sampling import capped_follows
from recs.traversal.take import ranks_before


def test_followed_by_keeps_the_first_in_sample_order(tmp_path):
    """followed_by_count=2: 20 was reached by 10, 12, 11 in sample order -> [10, 12];
    mutual_count still counts all three. followed_by_count=0 gives empty lists."""
    frame = run(exclusion_graph(), settings_for(tmp_path, followed_by_count=2))[2]
    assert rows(frame)[0] == (1, 20, 3, 0.384, 1, [10, 12])
    frame = run(exclusion_graph(), settings_for(tmp_path / "b", followed_by_count=0))[2]
    assert frame["followed_by"].to_list() == [[], []]


def score_tie_graph() -> Fixture:
    edges = [(1, 10, "active"), (1, 11, "active"), (1, 12, "active")]
    reached_by = {40: [10, 11, 12], 39: [10, 12], 41: [10, 11], 42: [11, 12], 38: [11, 12]}
    edges += [(f, c, "active") for c, friends in reached_by.items() for f in friends]
    users = only_user_1([10, 11, 12, 39, 40, 41, 42])
    users.append(User(38, last_active_at=AS_OF - 14 * DAY, eligible=False))
    return Fixture(users=users, edges=edges)


def test_score_ties_break_by_mutual_count_then_candidate_id(tmp_path):
    """mutual_saturation=2, so 2 and 3 mutuals both give the full mutual term 0.7.
    40 (3 mutuals), 39, 41 and 42 (2 each), all active at as_of: score 0.7 + 0.3 = 1.0 each.
    38 (2 mutuals, 14 days inactive): 0.7 + 0.15 = 0.85.
    Ranks: 40 (tie won on mutual_count 3), then 39, 41, 42 (tie on both, candidate_id asc),
    then 38 despite its smallest id (lower score). The kernel meets 39 before 40 (user 1's
    first hop is 10, 12, 11 and 10's row is 39, 40, 41), so 40 must overtake an equal score.
    top_k=2 keeps 40, 39."""
    assert capped_follows(10, [39, 40, 41], 3, SEED) == [39, 40, 41]
    frame = run(score_tie_graph(), settings_for(tmp_path, mutual_saturation=2.0))[2]
    assert [(r[1], r[2], r[3], r[4]) for r in rows(frame)] == [
        (40, 3, 1.0, 1),
        (39, 2, 1.0, 2),
        (41, 2, 1.0, 3),
        (42, 2, 1.0, 4),
        (38, 2, 0.85, 5),
    ]
    frame = run(score_tie_graph(), settings_for(tmp_path / "k", mutual_saturation=2.0, top_k=2))[2]
    assert frame["candidate_id"].to_list() == [40, 39]


def test_ranks_before_is_score_then_mutual_count_then_candidate_id():
    """(score, mutual_count, node): a higher score wins whatever the rest; on equal scores the
    larger mutual_count; on both equal the smaller node; a candidate does not rank before
    itself."""
    assert ranks_before(0.5, 2, 9, 0.4, 3, 1)
    assert not ranks_before(0.4, 3, 1, 0.5, 2, 9)
    assert ranks_before(0.5, 3, 9, 0.5, 2, 1)
    assert ranks_before(0.5, 2, 1, 0.5, 2, 9)
    assert not ranks_before(0.5, 2, 9, 0.5, 2, 1)
    assert not ranks_before(0.5, 2, 1, 0.5, 2, 1)
