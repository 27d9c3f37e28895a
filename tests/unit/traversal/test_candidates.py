"""Candidate generation (recs.traversal.candidates): the capped two-hop count.

Fixtures and the hand derivations: ``traversal_fixtures``.
"""

from __future__ import annotations

from traversal_fixtures import SEED, Fixture, only_user_1, rows, run, settings_for

from recs.sampling import capped_follows


def caps_graph() -> Fixture:
    """User 1 follows 10, 11, 12; each of them follows 20, 21, 22."""
    edges = [(1, 10, "active"), (1, 11, "active"), (1, 12, "active")]
    edges += [(f, c, "active") for f in (10, 11, 12) for c in (20, 21, 22)]
    return Fixture(users=only_user_1([10, 11, 12, 20, 21, 22]), edges=edges)


def test_caps_are_applied_in_sample_order(tmp_path):
    """User 1 follows 10, 11, 12; each of them follows 20, 21, 22. Uncapped, 20, 21 and 22
    would each have 3 mutuals. hop1_cap=2 expands the first two of user 1's sample order
    (10, 12, 11) -> 10, 12. hop2_cap=1 keeps the first of each row's sample order:
    10: (20, 21, 22) -> 20; 12: (22, 20, 21) -> 22. With min_mutual_count=1:
    20 (1 mutual, via 10) and 22 (1, via 12), both 0.7/25 + 0.3 = 0.328, tie -> id asc.
    Traversals = 2 (two rows of one entry)."""
    assert capped_follows(10, [20, 21, 22], 1, SEED) == [20]
    assert capped_follows(12, [20, 21, 22], 1, SEED) == [22]
    fixture = caps_graph()
    settings = settings_for(tmp_path, hop1_cap=2, hop2_cap=1, min_mutual_count=1)
    _, manifest, frame = run(fixture, settings)
    assert rows(frame) == [(1, 20, 1, 0.328, 1, [10]), (1, 22, 1, 0.328, 2, [12])]
    assert manifest["traversals"] == 2
    uncapped = run(fixture, settings_for(tmp_path / "u", min_mutual_count=1))[2]
    assert uncapped["mutual_count"].to_list() == [3, 3, 3]


def test_candidates_are_the_distinct_accounts_counted(tmp_path):
    """caps_graph with hop1_cap=2, hop2_cap=1: two rows of one entry (20 via 10, 22 via 12),
    2 candidates for 2 traversals. Uncapped: 9 traversals onto 3 distinct candidates."""
    settings = settings_for(tmp_path, hop1_cap=2, hop2_cap=1, min_mutual_count=1)
    manifest = run(caps_graph(), settings)[1]
    assert (manifest["traversals"], manifest["stage_counts"]["candidates"]) == (2, 2)
    manifest = run(caps_graph(), settings_for(tmp_path / "u", min_mutual_count=1))[1]
    assert (manifest["traversals"], manifest["stage_counts"]["candidates"]) == (9, 3)
