"""Inputs of a shard task (recs.traversal.inputs): eligible users, first hop and exclusions.

Fixtures: ``traversal_fixtures``.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from traversal_fixtures import SEED, Fixture, build_graph, settings_for, users_with, write_run

from recs.sampling import capped_follows
from recs.traversal import ShardMismatchError, traverse_shard


def test_user_in_the_wrong_shard_folder_is_an_error(tmp_path):
    settings = settings_for(tmp_path, shard_count=2)
    paths = write_run(Fixture(users=users_with([1, 4]), edges=[]), settings)
    build_graph(paths, settings)
    wrong = paths.exports_dir / "eligible_users" / "shard_id=0"
    wrong.mkdir(parents=True)
    pl.DataFrame({"user_id": [1]}).write_parquet(wrong / "data_0.parquet")
    with pytest.raises(ShardMismatchError, match="shard 0"):
        traverse_shard(paths, settings, 0)


def test_a_follow_filed_under_another_shard_is_an_error(tmp_path):
    """A follow of user 1 (shard 1 of 2) filed under the snapshot partition of shard 0 (user
    2's) as a second file, after the graph was built: shard 0's task refuses its partition,
    naming how many rows, an example follower and its shard, before traversing (shard 1's task
    would never see that follow). What dbt's assert_snapshot_partitions_match_shard_id checked
    over every edge of the night in one process; here each shard task checks its own
    partition (and cap_graph the files it caps: test_graph)."""
    from recs.contracts import SNAPSHOT_SCHEMAS
    from recs.sharding import shard_of

    settings = settings_for(tmp_path, shard_count=2)
    assert (shard_of(1, 2), shard_of(2, 2)) == (1, 0)
    paths = write_run(Fixture(users=users_with([1, 2]), edges=[(2, 1, "active")]), settings)
    build_graph(paths, settings)
    traverse_shard(paths, settings, 0)  # as written: every follower of shard 0's files is 2
    wrong = pl.DataFrame(
        [(1, 2, None, "active")], schema=SNAPSHOT_SCHEMAS["follow_edges"], orient="row"
    )
    wrong.write_parquet(paths.snapshot_dir / "follow_edges" / "shard_id=000" / "part-9.parquet")
    with pytest.raises(ShardMismatchError) as caught:
        traverse_shard(paths, settings, 0)
    assert str(caught.value) == (
        f"{paths.snapshot_dir / 'follow_edges'}/shard_id=000: follow edges with a follower of "
        "another shard: 1 (e.g. follower 1, of shard 1 of 2): the partition is not as "
        "freeze_snapshot wrote it; make the date's snapshot again from the live store with "
        "--rebuild-snapshot (the DAG's rebuild_snapshot param)"
    )


def test_first_hop_rows_order_by_key_then_id_and_drop_duplicates():
    """_capped_rows (the first-hop sampler) on hand-made keys. Row 0: (key, value) pairs
    (5, 7), (3, 9), (5, 2), (3, 9) [a duplicate], (1, 4) -> by (key, value): (1, 4), (3, 9),
    (5, 2), (5, 7); the duplicate (3, 9) is dropped; cap 3 -> [4, 9, 2]. Row 1 is empty.
    Row 2: (2, 1) -> [1]. A 40-entry row (the argsort path) with many equal keys and
    duplicates must equal Python's sorted() of the unique pairs, cut to the cap."""
    from recs.traversal.inputs import _capped_rows

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
    from recs.traversal.inputs import _capped_rows

    rng = np.random.default_rng(7)
    keys = [int(k) for k in rng.integers(0, 2**63, 38, dtype=np.int64)]
    values = [int(v) for v in rng.choice(10_000, 38, replace=False)]
    high = 12345 << 32
    keys += [keys[0], high | 7, high | 2]
    values += [values[0], 3, 30]
    expected = [value for _, value in sorted(set(zip(keys, values, strict=True)))]
    for cap in (41, 10):
        ptr, out = _capped_rows(
            np.zeros(41, dtype=np.int64),
            np.array(keys, dtype=np.uint64),
            np.array(values, dtype=np.int32),
            1,
            cap,
        )
        assert out.tolist() == expected[:cap]
    assert expected.index(30) < expected.index(3)
    # without the colliding pair the packed path alone must give the same order
    ptr, out = _capped_rows(
        np.zeros(39, dtype=np.int64),
        np.array(keys[:39], dtype=np.uint64),
        np.array(values[:39], dtype=np.int32),
        1,
        50,
    )
    assert out.tolist() == [v for _, v in sorted(set(zip(keys[:39], values[:39], strict=True)))]


def test_shard_lists_builds_first_hop_and_exclusions_in_one_pass():
    """Users 1 (position 0) and 4 (position 1); dense ids 10->0, 11->1, 12->2, 1->3, 4->4,
    99 unknown (-1). Edges of the partition, in order: 1->10, 1->11, 1->12 (pending), 1->1
    (self), 1->99 (unknown), 1->10 (duplicate), 4->10, 7->10 (7 not eligible: position -1).
    Extras: 4 must not see 12; 7's and unknown extras are dropped.
    First hop of 1: its active, known, non-self, distinct follows 10 and 11 in sample order
    (capped_follows); of 4: [10]. Exclusions (every known follow, any status, then the
    extras, in input order): 1 -> 10, 11, 12, 1, 10 = [0, 1, 2, 3, 0]; 4 -> 10, 12 = [0, 2].
    Their drop codes: following, following, pending (1->12), following, following; 4's follow
    of 10 is following, its extra 12 is "muted" (given), or other_exclusion when not given."""
    from recs.traversal.inputs import shard_lists
    from recs.traversal.predicates import FOLLOWING, OTHER_EXCLUSION, PENDING, exclusion_codes

    positions = np.array([0, 0, 0, 0, 0, 0, 1, -1])
    followers = np.array([1, 1, 1, 1, 1, 1, 4, 7])
    followees = np.array([10, 11, 12, 1, 99, 10, 10, 10])
    dense = np.array([0, 1, 2, 3, -1, 0, 0, 0])
    active = np.array([True, True, False, True, True, True, True, True])
    args = (positions, followers, followees, dense, active, np.array([1, -1, 0]),
            np.array([2, 1, -1]), 2, 5, SEED)  # the shard's edges, extras, 2 users, hop1_cap 5
    hop1_ptr, hop1_nodes, excl_ptr, excl_nodes, excl_reasons = shard_lists(*args)
    first = [{10: 0, 11: 1}[f] for f in capped_follows(1, [10, 11], 5, SEED)]
    assert hop1_ptr.tolist() == [0, 2, 3]
    assert hop1_nodes.tolist() == first + [0]
    assert excl_ptr.tolist() == [0, 5, 7]
    assert excl_nodes.tolist() == [0, 1, 2, 3, 0, 0, 2]
    # hop1_cap=1 keeps the first of the sample order
    followed = [FOLLOWING, FOLLOWING, PENDING, FOLLOWING, FOLLOWING, FOLLOWING]
    assert excl_reasons.tolist() == followed + [OTHER_EXCLUSION]
    muted = exclusion_codes(pl.Series(["muted", "blocked", None]))
    assert muted.tolist() == [6, 4, OTHER_EXCLUSION]
    *_, excl_reasons = shard_lists(*args, extra_reasons=muted)
    assert excl_reasons.tolist() == followed + [muted[0]]
    _, capped, _, _, _ = shard_lists(
        positions,
        followers,
        followees,
        dense,
        active,
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
        2,
        1,
        SEED,
    )
    assert capped.tolist() == [first[0], 0]
