"""recs.nightly.in_degrees: active followers per account, counted shard by shard (dense or
sparse ids, on threads) or from a written snapshot, against hand counts and an independent
count."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import polars as pl
import pytest

from recs.contracts import IN_DEGREE_SCHEMA, SNAPSHOT_SCHEMAS, check_schema
from recs.nightly import in_degrees
from recs.nightly.in_degrees import InDegrees

T0 = dt.datetime(2026, 10, 1)


def edges(rows: list[tuple[int, int, str]]) -> pl.DataFrame:
    return pl.DataFrame(
        [(a, b, T0, status) for a, b, status in rows],
        schema=SNAPSHOT_SCHEMAS["follow_edges"],
        orient="row",
    )


@pytest.mark.parametrize("dense_ids", [0, 4, 7], ids=["sparse", "partly dense", "dense"])
def test_active_follows_count_and_requests_and_self_follows_do_not(dense_ids):
    """Two batches: 2, 3 and 4 follow 1 (3 in the second batch too: another pair, 3->5), 5
    asked to follow 1 (pending), 6 follows itself. So 1 has 3 followers, 5 has 1; 6 has no row
    (a self-follow is dropped by stg_follow_edges too), nor has anyone nobody follows. The same
    whether ids below ``dense_ids`` are counted in an array or all by a group-by."""
    counted = InDegrees(dense_ids)
    counted.count(edges([(2, 1, "active"), (3, 1, "active"), (5, 1, "pending")]))
    counted.count(edges([(4, 1, "active"), (3, 5, "active"), (6, 6, "active")]))
    counted.count(edges([]))
    frame = counted.frame()
    check_schema(frame.schema, IN_DEGREE_SCHEMA, "in_degrees")
    assert frame.rows() == [(1, 3), (5, 1)]
    assert InDegrees(dense_ids).frame().rows() == []


def test_dense_counters_only_for_ids_close_to_the_number_of_accounts(monkeypatch):
    """``for_accounts``: ids 0..max counted in an array when max < 8 x accounts + 2**20."""
    monkeypatch.setattr(in_degrees, "DENSE_SLACK", 0)
    assert len(InDegrees.for_accounts(pl.Series([0, 5, 23]))._dense) == 24  # 23 < 24
    assert len(InDegrees.for_accounts(pl.Series([0, 5, 24]))._dense) == 0
    assert len(InDegrees.for_accounts(pl.Series([], dtype=pl.Int64))._dense) == 0


@pytest.mark.parametrize("dense_ids", [0, 30, 60])
@pytest.mark.parametrize("compact_rows", [1, 7, 1_000_000])
def test_shards_counted_on_threads_equal_one_count_of_every_edge(
    tmp_path, monkeypatch, compact_rows, dense_ids
):
    """3,000 random follows (a fifth pending, some self-follows) in 8 shards counted on 4
    threads, with the group-by's running count compacted after every batch, every few or
    never, and none, half or all of the ids dense: the same counts as ``collections.Counter``
    over the rows, and as ``from_follow_edges`` of the same edges written as two files."""
    monkeypatch.setattr(in_degrees, "COMPACT_ROWS", compact_rows)
    rng = random.Random(7)
    pairs = sorted({(rng.randrange(200), rng.randrange(60)) for _ in range(3_000)})
    rows = [(a, b, "pending" if rng.random() < 0.2 else "active") for a, b in pairs]
    expected = sorted(Counter(b for a, b, status in rows if status == "active" and a != b).items())
    counted = InDegrees(dense_ids)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(counted.count, [edges(rows[i::8]) for i in range(8)]))
    assert counted.frame().rows() == expected
    for shard_id, half in enumerate((rows[::2], rows[1::2])):
        folder = tmp_path / "follow_edges" / f"shard_id={shard_id:03d}"
        folder.mkdir(parents=True)
        edges(half).write_parquet(folder / "part-0.parquet")
    assert in_degrees.from_follow_edges(tmp_path).rows() == expected
