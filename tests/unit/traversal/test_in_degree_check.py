"""The snapshot's in-degrees checked against its follow edges at the graph's assembly
(recs.traversal.in_degree_check).

The tiny graph's edges (``test_graph.EDGES``; 99 is not an account): active and not self-follows
1->2, 1->3, 1->4, 1->5, 2->3, 2->99, 99->1, 5->1 (2->4 is pending, 3->3 a self-follow). So the
in-degrees, by hand: 1: 2, 2: 1, 3: 2, 4: 1, 5: 1, 99: 1; 8 follows; ids weighted by them
2 + 2 + 6 + 4 + 5 + 99 = 118.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_graph import tiny_graph

from recs.contracts import IN_DEGREE_SCHEMA, IN_DEGREES_FILE
from recs.errors import RunNotFoundError
from recs.sampling import mix64_int
from recs.traversal.graph import build_graph
from recs.traversal.in_degree_check import InDegreeMismatchError, followee_sums, in_degree_sums

BY_HAND = [(1, 2), (2, 1), (3, 2), (4, 1), (5, 1), (99, 1)]
MASK = (1 << 64) - 1


def hashed(rows) -> int:
    return sum(mix64_int(user_id & MASK) * degree for user_id, degree in rows) & MASK


def test_the_freezes_in_degrees_weigh_up_to_the_hand_counts(tmp_path):
    """The fixture's file (counted as the freeze does) is the hand count, and its sums are the
    docstring's, the hashed one computed with the reference mixer on Python ints."""
    paths, _ = tiny_graph(tmp_path)
    assert pl.read_parquet(paths.snapshot_dir / IN_DEGREES_FILE).rows() == BY_HAND
    assert in_degree_sums(paths.snapshot_dir) == (8, 118, hashed(BY_HAND))


def test_followee_sums_leave_out_self_follows_and_wrap_like_python_ints():
    """Against Python's unbounded ints reduced mod 2**64: negative and 63-bit ids (two's
    complement), repeats, and self-follows left out."""
    rng = np.random.default_rng(5)
    followers = rng.integers(-(2**62), 2**63 - 1, 2_000, dtype=np.int64)
    followees = np.concatenate([
        rng.integers(-(2**62), 2**63 - 1, 1_500, dtype=np.int64), followers[1_500:]
    ])  # the last 500 are self-follows
    followees[:10] = followees[10]  # one account followed 11 times
    kept = [int(b) for a, b in zip(followers, followees, strict=True) if a != b]
    assert len(kept) == 1_500
    assert followee_sums(followers, followees) == (
        1_500, sum(kept) & MASK, sum(mix64_int(b & MASK) for b in kept) & MASK
    )


@pytest.mark.parametrize(
    ("damage", "rows", "differ"),
    [
        ("a row lost", [r for r in BY_HAND if r[0] != 99], "follows 7 against 8, id-weighted 19 "
         "against 118, hash-weighted"),
        ("emptied", [], "follows 0 against 8, id-weighted 0 against 118, hash-weighted 0 against"),
        # the same total; 1's and 2's counts traded: the id-weighted sum differs
        ("counts traded", [(1, 1), (2, 2), (3, 2), (4, 1), (5, 1), (99, 1)],
         "(id-weighted 119 against 118, hash-weighted"),
        # the same total and id-weighted sum (+1 at 1, -2 at 3, +1 at 5): only the hash differs
        ("same id sum", [(1, 3), (2, 1), (4, 1), (5, 2), (99, 1)], "(hash-weighted"),
    ],
)
def test_in_degrees_that_do_not_match_the_edges_stop_the_graph_build(
    tmp_path, damage, rows, differ
):
    """Seen failing four ways, each naming the sums that differ and the remedy, before the
    graph is written (no meta.json: it does not look built)."""
    paths, settings = tiny_graph(tmp_path)
    pl.DataFrame(rows, schema=IN_DEGREE_SCHEMA, orient="row").write_parquet(
        paths.snapshot_dir / IN_DEGREES_FILE
    )
    with pytest.raises(InDegreeMismatchError) as caught:
        build_graph(paths, settings)
    message = str(caught.value)
    assert message.startswith(
        f"the in-degrees of run test_run ({paths.snapshot_dir / IN_DEGREES_FILE}) do not match "
        "its follow edges' active follows ("
    )
    assert differ in message and "\n" not in message
    assert message.endswith(
        "from the live store: `recs run --snapshot-date "
        f"{paths.snapshot_date.isoformat()} --run-id test_run --rebuild-snapshot` (the DAG's "
        "rebuild_snapshot param)"
    )
    assert f"against {hashed(BY_HAND):,})" in message
    assert not (paths.graph_dir / "meta.json").exists()


def test_a_snapshot_without_in_degrees_is_named(tmp_path):
    """(build_models refuses such a run first: an earlier version's freeze.)"""
    paths, settings = tiny_graph(tmp_path)
    (paths.snapshot_dir / IN_DEGREES_FILE).unlink()
    with pytest.raises(RunNotFoundError, match="in_degrees.parquet: freeze the snapshot again"):
        build_graph(paths, settings)
