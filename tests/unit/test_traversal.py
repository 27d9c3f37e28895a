"""One shard's traversal, filters, ranking and output (recs.traversal), on hand-built graphs.

Every fixture is a snapshot + dbt exports written by ``traversal_fixtures.write_run``; the
expected rows are derived by hand in each docstring. Sample orders that matter are pinned in
test_sampling / asserted here with ``capped_follows`` (seed 20240601): user 1's follows
10, 11, 12 come in the order 10, 12, 11.
"""

from __future__ import annotations

import datetime as dt
import logging

import numpy as np
import polars as pl
import pytest
from traversal_fixtures import AS_OF, Fixture, User, settings_for, users_with, write_run

from recs.contracts import EXPORT_SCHEMAS, RECOMMENDATION_SCHEMA
from recs.files import read_json
from recs.graph import build_graph
from recs.nightly import pipeline
from recs.sampling import capped_follows
from recs.traversal import ShardMismatchError, StaleGraphError, traverse_shard

SEED = 20_240_601
DAY = dt.timedelta(days=1)


def run(fixture: Fixture, settings, shard_id: int = 0):
    paths = write_run(fixture, settings)
    build_graph(paths, settings)
    manifest = traverse_shard(paths, settings, shard_id)
    return paths, manifest, pl.read_parquet(paths.shard_output(shard_id))


def rows(frame: pl.DataFrame) -> list[tuple]:
    return [
        (r["user_id"], r["candidate_id"], r["mutual_count"], round(r["score"], 12), r["rank"],
         r["followed_by"])
        for r in frame.iter_rows(named=True)
    ]


def only_user_1(ids, **attributes) -> list[User]:
    """User 1 is the only eligible user; everyone else exists but is not refreshed tonight."""
    return [User(1)] + [User(i, eligible=False, **attributes) for i in ids]


def exclusion_graph() -> Fixture:
    follows = {
        10: [20, 21, 23, 13, 1, 11, 24, 27, 29, 31],
        11: [20, 21, 24, 25, 13, 1, 28, 29, 30],
        12: [20, 22, 25, 26, 11, 27, 28, 30, 31],
        13: [22, 23, 26],
    }
    edges = [(1, 10, "active"), (1, 11, "active"), (1, 12, "active"), (1, 13, "pending")]
    edges += [(f, t, "active") for f, targets in follows.items() for t in targets]
    users = only_user_1([10, 11, 12, 13, 20, 22, 23, 26, 27, 28, 29, 30, 31])
    users += [
        User(21, last_active_at=AS_OF - 14 * DAY, eligible=False),
        User(24, account_status="suspended", eligible=False),
        User(25, is_discoverable=False, eligible=False),
    ]
    exclusions = [(1, 27, "blocked"), (1, 28, "blocked_by"), (1, 29, "muted"),
                  (1, 30, "dismissed")]
    return Fixture(users=users, edges=edges, exclusions=exclusions, missing_profiles={31})


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
    assert {k: manifest[k] for k in ("users_in", "users_with_recommendations", "rows",
                                     "traversals", "first_hop_edges")} == {
        "users_in": 1, "users_with_recommendations": 1, "rows": 2, "traversals": 28,
        "first_hop_edges": 3,
    }
    assert read_json(paths.shard_manifest(0))["traversals"] == 28


def test_followed_by_keeps_the_first_in_sample_order(tmp_path):
    """followed_by_count=2: 20 was reached by 10, 12, 11 in sample order -> [10, 12];
    mutual_count still counts all three. followed_by_count=0 gives empty lists."""
    frame = run(exclusion_graph(), settings_for(tmp_path, followed_by_count=2))[2]
    assert rows(frame)[0] == (1, 20, 3, 0.384, 1, [10, 12])
    frame = run(exclusion_graph(), settings_for(tmp_path / "b", followed_by_count=0))[2]
    assert frame["followed_by"].to_list() == [[], []]


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
        (40, 3, 1.0, 1), (39, 2, 1.0, 2), (41, 2, 1.0, 3), (42, 2, 1.0, 4), (38, 2, 0.85, 5),
    ]
    frame = run(score_tie_graph(), settings_for(tmp_path / "k", mutual_saturation=2.0, top_k=2))[2]
    assert frame["candidate_id"].to_list() == [40, 39]


def test_max_candidates_to_score_cuts_by_mutual_count_before_scoring(tmp_path):
    """50 has 3 mutuals but was last active 70 days ago: 0.7 * 3/25 + 0.3 * 0.5**5 = 0.093375.
    51, 52, 53 have 2 mutuals and are active: 0.7 * 2/25 + 0.3 = 0.356 each.
    Without a cut the ranking is 51, 52, 53, 50. max_candidates_to_score=2 keeps the top two
    by (mutual_count desc, candidate_id asc) = 50, 51 before scoring, then ranks by score:
    51 (0.356), 50 (0.093375)."""
    edges = [(1, 10, "active"), (1, 11, "active"), (1, 12, "active")]
    reached_by = {50: [10, 11, 12], 51: [10, 11], 52: [11, 12], 53: [10, 12]}
    edges += [(f, c, "active") for c, friends in reached_by.items() for f in friends]
    users = only_user_1([10, 11, 12, 51, 52, 53])
    users.append(User(50, last_active_at=AS_OF - 70 * DAY, eligible=False))
    fixture = Fixture(users=users, edges=edges)
    frame = run(fixture, settings_for(tmp_path))[2]
    assert frame["candidate_id"].to_list() == [51, 52, 53, 50]
    frame = run(fixture, settings_for(tmp_path / "cut", max_candidates_to_score=2))[2]
    assert [(r[1], r[2], r[3]) for r in rows(frame)] == [(51, 2, 0.356), (50, 3, 0.093375)]


def test_caps_are_applied_in_sample_order(tmp_path):
    """User 1 follows 10, 11, 12; each of them follows 20, 21, 22. Uncapped, 20, 21 and 22
    would each have 3 mutuals. hop1_cap=2 expands the first two of user 1's sample order
    (10, 12, 11) -> 10, 12. hop2_cap=1 keeps the first of each row's sample order:
    10: (20, 21, 22) -> 20; 12: (22, 20, 21) -> 22. With min_mutual_count=1:
    20 (1 mutual, via 10) and 22 (1, via 12), both 0.7/25 + 0.3 = 0.328, tie -> id asc.
    Traversals = 2 (two rows of one entry)."""
    assert capped_follows(10, [20, 21, 22], 1, SEED) == [20]
    assert capped_follows(12, [20, 21, 22], 1, SEED) == [22]
    edges = [(1, 10, "active"), (1, 11, "active"), (1, 12, "active")]
    edges += [(f, c, "active") for f in (10, 11, 12) for c in (20, 21, 22)]
    fixture = Fixture(users=only_user_1([10, 11, 12, 20, 21, 22]), edges=edges)
    settings = settings_for(tmp_path, hop1_cap=2, hop2_cap=1, min_mutual_count=1)
    _, manifest, frame = run(fixture, settings)
    assert rows(frame) == [(1, 20, 1, 0.328, 1, [10]), (1, 22, 1, 0.328, 2, [12])]
    assert manifest["traversals"] == 2
    uncapped = run(fixture, settings_for(tmp_path / "u", min_mutual_count=1))[2]
    assert uncapped["mutual_count"].to_list() == [3, 3, 3]


def test_empty_shard_writes_an_empty_typed_file(tmp_path):
    """shard_count=2; users 1 and 4 are in shard 1 (shard_of), so shard 0 has no
    eligible_users folder at all: an empty file with exactly the contract's schema."""
    settings = settings_for(tmp_path, shard_count=2)
    fixture = Fixture(users=users_with([1, 4]), edges=[(1, 4, "active")])
    paths, manifest, frame = run(fixture, settings, shard_id=0)
    assert not (paths.exports_dir / "eligible_users" / "shard_id=0").exists()
    assert frame.height == 0
    assert dict(frame.schema) == RECOMMENDATION_SCHEMA
    assert list(frame.columns) == list(RECOMMENDATION_SCHEMA)
    assert {k: manifest[k] for k in ("users_in", "users_with_recommendations", "rows",
                                     "traversals")} == {
        "users_in": 0, "users_with_recommendations": 0, "rows": 0, "traversals": 0,
    }


def test_output_schema_and_run_columns(tmp_path):
    settings = settings_for(tmp_path)
    paths, _, frame = run(exclusion_graph(), settings)
    assert dict(frame.schema) == RECOMMENDATION_SCHEMA
    assert frame["generated_at"].unique().to_list() == [AS_OF]
    assert frame["run_id"].unique().to_list() == [paths.run_id]


def test_pipeline_stage_reads_frozen_settings_and_rerun_is_byte_identical(tmp_path, caplog):
    """pipeline.traverse_shard reads the settings frozen in the snapshot manifest; running
    the shard again rewrites exactly the same bytes."""
    settings = settings_for(tmp_path)
    paths = write_run(exclusion_graph(), settings)
    build_graph(paths, settings)
    with caplog.at_level(logging.INFO, logger="recs.traversal"):
        pipeline.traverse_shard(paths, 0)
    assert any("traversals" in r.getMessage() for r in caplog.records)
    first = paths.shard_output(0).read_bytes()
    traverse_shard(paths, settings, 0)
    assert paths.shard_output(0).read_bytes() == first


def test_stale_graph_is_refused(tmp_path):
    settings = settings_for(tmp_path, hop2_cap=5)
    paths = write_run(exclusion_graph(), settings)
    build_graph(paths, settings)
    with pytest.raises(StaleGraphError, match="hop2_cap=5"):
        traverse_shard(paths, settings_for(tmp_path, hop2_cap=6), 0)
    with pytest.raises(StaleGraphError):
        traverse_shard(paths, settings_for(tmp_path, hop2_cap=5, sample_seed=1), 0)
    # A graph built with a larger hop2_cap is fine: the smaller cap is a prefix of its rows,
    # so hop2_cap=3 on the hop2_cap=5 graph equals hop2_cap=3 on its own graph.
    smaller = settings_for(tmp_path, hop2_cap=3)
    assert traverse_shard(paths, smaller, 0)["traversals"] == 9  # 3 rows of 3
    reused = paths.shard_output(0).read_bytes()
    build_graph(paths, smaller)
    traverse_shard(paths, smaller, 0)
    assert paths.shard_output(0).read_bytes() == reused


def test_user_in_the_wrong_shard_folder_is_an_error(tmp_path):
    settings = settings_for(tmp_path, shard_count=2)
    paths = write_run(Fixture(users=users_with([1, 4]), edges=[]), settings)
    build_graph(paths, settings)
    wrong = paths.exports_dir / "eligible_users" / "shard_id=0"
    wrong.mkdir(parents=True)
    pl.DataFrame({"user_id": [1]}).write_parquet(wrong / "data_0.parquet")
    with pytest.raises(ShardMismatchError, match="shard 0"):
        traverse_shard(paths, settings, 0)


def test_kernel_scratch_is_reset_between_users(tmp_path):
    """Users 1 and 2 both follow 10 and 11, which both follow 20: each gets 20 with exactly
    2 mutuals (a leaked count would give user 2 four). User 2 also follows 20, so only user
    1 gets it; user 2 instead gets nothing."""
    edges = [(u, f, "active") for u in (1, 2) for f in (10, 11)]
    edges += [(10, 20, "active"), (11, 20, "active"), (2, 20, "active")]
    users = [User(1), User(2)] + [User(i, eligible=False) for i in (10, 11, 20)]
    frame = run(Fixture(users=users, edges=edges), settings_for(tmp_path))[2]
    assert [(r[0], r[1], r[2]) for r in rows(frame)] == [(1, 20, 2)]
    users = [User(1), User(3)] + [User(i, eligible=False) for i in (10, 11, 20)]
    edges = [(u, f, "active") for u in (1, 3) for f in (10, 11)]
    edges += [(10, 20, "active"), (11, 20, "active")]
    frame = run(Fixture(users=users, edges=edges), settings_for(tmp_path / "b"))[2]
    assert [(r[0], r[1], r[2]) for r in rows(frame)] == [(1, 20, 2), (3, 20, 2)]
    assert np.all(frame["rank"].to_numpy() == 1)


def test_first_hop_rows_order_by_key_then_id_and_drop_duplicates():
    """_capped_rows (the first-hop sampler) on hand-made keys. Row 0: (key, value) pairs
    (5, 7), (3, 9), (5, 2), (3, 9) [a duplicate], (1, 4) -> by (key, value): (1, 4), (3, 9),
    (5, 2), (5, 7); the duplicate (3, 9) is dropped; cap 3 -> [4, 9, 2]. Row 1 is empty.
    Row 2: (2, 1) -> [1]. A 40-entry row (the argsort path) with many equal keys and
    duplicates must equal Python's sorted() of the unique pairs, cut to the cap."""
    from recs.traversal import _capped_rows

    rows = np.array([0, 2, 0, 0, 0, 0], dtype=np.int64)
    keys = np.array([5, 2, 3, 5, 3, 1], dtype=np.uint64)
    values = np.array([7, 1, 9, 2, 9, 4], dtype=np.int32)
    ptr, out = _capped_rows(rows, keys, values, 3, 3)
    assert ptr.tolist() == [0, 3, 3, 4]
    assert out.tolist() == [4, 9, 2, 1]

    rng = np.random.default_rng(0)
    values = rng.integers(0, 25, 40).astype(np.int32)
    keys = (values.astype(np.uint64) * np.uint64(7)) % np.uint64(5)  # equal value -> equal key
    ptr, out = _capped_rows(np.zeros(40, dtype=np.int64), keys, values, 1, 12)
    expected = sorted(set(zip(keys.tolist(), values.tolist(), strict=True)))[:12]
    assert out.tolist() == [value for _, value in expected]


def test_packed_sort_path_equals_the_exact_order():
    """Groups longer than 32 are sorted as packed (key high bits, value) words. A 41-entry
    group: 38 random 64-bit keys, a duplicate pair, and two keys sharing their high 32 bits
    whose low bits disagree with their values' order: (H<<32 | 7, value 3) and (H<<32 | 2,
    value 30) must come out as 30 before 3 (by key), not 3 before 30 (by packed word), so the
    collision check must send the group to the exact path. Expected: Python's sorted() of the
    distinct (key, value) pairs, cut to the cap."""
    from recs.traversal import _capped_rows

    rng = np.random.default_rng(7)
    keys = [int(k) for k in rng.integers(0, 2**63, 38, dtype=np.int64)]
    values = [int(v) for v in rng.choice(10_000, 38, replace=False)]
    high = 12345 << 32
    keys += [keys[0], high | 7, high | 2]
    values += [values[0], 3, 30]
    expected = [value for _, value in sorted(set(zip(keys, values, strict=True)))]
    for cap in (41, 10):
        ptr, out = _capped_rows(
            np.zeros(41, dtype=np.int64), np.array(keys, dtype=np.uint64),
            np.array(values, dtype=np.int32), 1, cap,
        )
        assert out.tolist() == expected[:cap]
    assert expected.index(30) < expected.index(3)
    # without the colliding pair the packed path alone must give the same order
    ptr, out = _capped_rows(
        np.zeros(39, dtype=np.int64), np.array(keys[:39], dtype=np.uint64),
        np.array(values[:39], dtype=np.int32), 1, 50,
    )
    assert out.tolist() == [v for _, v in sorted(set(zip(keys[:39], values[:39], strict=True)))]


def test_shard_lists_builds_first_hop_and_exclusions_in_one_pass():
    """Users 1 (position 0) and 4 (position 1); dense ids 10->0, 11->1, 12->2, 1->3, 4->4,
    99 unknown (-1). Edges of the partition, in order: 1->10, 1->11, 1->12 (pending), 1->1
    (self), 1->99 (unknown), 1->10 (duplicate), 4->10, 7->10 (7 not eligible: position -1).
    Extras: 4 must not see 12; 7's and unknown extras are dropped.
    First hop of 1: its active, known, non-self, distinct follows 10 and 11 in sample order
    (capped_follows); of 4: [10]. Exclusions (every known follow, any status, then the
    extras, in input order): 1 -> 10, 11, 12, 1, 10 = [0, 1, 2, 3, 0]; 4 -> 10, 12 = [0, 2]."""
    from recs.traversal import shard_lists

    positions = np.array([0, 0, 0, 0, 0, 0, 1, -1])
    followers = np.array([1, 1, 1, 1, 1, 1, 4, 7])
    followees = np.array([10, 11, 12, 1, 99, 10, 10, 10])
    dense = np.array([0, 1, 2, 3, -1, 0, 0, 0])
    active = np.array([True, True, False, True, True, True, True, True])
    hop1_ptr, hop1_nodes, excl_ptr, excl_nodes = shard_lists(
        positions, followers, followees, dense, active,
        np.array([1, -1, 0]), np.array([2, 1, -1]), 2, 5, SEED,
    )
    first = [{10: 0, 11: 1}[f] for f in capped_follows(1, [10, 11], 5, SEED)]
    assert hop1_ptr.tolist() == [0, 2, 3]
    assert hop1_nodes.tolist() == first + [0]
    assert excl_ptr.tolist() == [0, 5, 7]
    assert excl_nodes.tolist() == [0, 1, 2, 3, 0, 0, 2]
    # hop1_cap=1 keeps the first of the sample order
    _, capped, _, _ = shard_lists(
        positions, followers, followees, dense, active, np.zeros(0, np.int64),
        np.zeros(0, np.int64), 2, 1, SEED,
    )
    assert capped.tolist() == [first[0], 0]


def test_kernel_memory_does_not_grow_with_the_graph():
    """One user follows accounts 0 and 1, which both follow 2 and 3 (2 mutuals each, so two
    rows). Its scratch is sized by its own bound (2 rows of 2 + itself = 5 -> a 16-slot table)
    and the output by its users, never by the graph: the traced peak of recommend_users is
    the same within 64 KB on graphs of 10 and 4,000,000 accounts (a dense int32 counter over
    the accounts would add 16 MB)."""
    import tracemalloc
    from types import SimpleNamespace

    from recs.config import Settings
    from recs.traversal import ShardInputs, recommend_users

    inputs = ShardInputs(
        user_ids=np.array([100]), user_dense=np.array([-1], np.int32),
        hop1_ptr=np.array([0, 2]), hop1_nodes=np.array([0, 1], np.int32),
        excl_ptr=np.array([0, 0]), excl_nodes=np.zeros(0, np.int32),
    )
    peaks = []
    for n_nodes in (10, 4_000_000):
        indptr = np.full(n_nodes + 1, 4, dtype=np.int64)
        indptr[:2] = [0, 2]
        graph = SimpleNamespace(
            indptr=indptr, indices=np.array([2, 3, 2, 3], np.int32),
            activity=np.ones(n_nodes), n_nodes=n_nodes,
        )
        recommend_users(inputs, graph, Settings())  # compile / load outside the trace
        tracemalloc.start()
        result = recommend_users(inputs, graph, Settings())
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert result.candidate.tolist() == [2, 3] and result.mutual_count.tolist() == [2, 2]
    assert abs(peaks[1] - peaks[0]) < 64 * 1024, peaks


def test_manifest_reports_rates_and_memory(tmp_path):
    manifest = run(exclusion_graph(), settings_for(tmp_path))[1]
    assert manifest["traversals_per_cpu_second"] > 0
    assert manifest["peak_rss_mb"] > 0 and manifest["rss_anon_mb"] > 0
    assert manifest["rss_file_mb"] > 0
    assert {"read_seconds", "kernel_seconds", "write_seconds", "exclusions"} <= set(manifest)
