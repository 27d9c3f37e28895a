"""recs.nightly.in_degrees: active followers per account, tallied chunk by chunk or counted from
a written snapshot, against hand counts and an independent count."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter

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


def test_active_follows_count_and_requests_and_self_follows_do_not():
    """Two chunks: 2, 3 and 4 follow 1 (3 in the second chunk too: another pair, 3->5), 5
    asked to follow 1 (pending), 6 follows itself. So 1 has 3 followers, 5 has 1; 6 has no row
    (a self-follow is dropped by stg_follow_edges too), nor has anyone nobody follows."""
    counted = InDegrees()
    first = edges([(2, 1, "active"), (3, 1, "active"), (5, 1, "pending")])
    assert counted.tally(first) is first  # handed on unchanged: it sits inside a stream
    counted.tally(edges([(4, 1, "active"), (3, 5, "active"), (6, 6, "active")]))
    counted.tally(edges([]))
    frame = counted.frame()
    check_schema(frame.schema, IN_DEGREE_SCHEMA, "in_degrees")
    assert frame.rows() == [(1, 3), (5, 1)]
    assert InDegrees().frame().rows() == []


@pytest.mark.parametrize("compact_rows", [1, 7, 1_000_000])
def test_ranges_tallied_apart_and_added_equal_one_count_of_every_edge(
    tmp_path, monkeypatch, compact_rows
):
    """3,000 random follows (a fifth pending, some self-follows) read as 3 ranges of chunks,
    tallied per range with compaction after every chunk, every few or never, then added: the
    same counts as ``collections.Counter`` over the rows, and as ``from_follow_edges`` of the
    same edges written as two shard files."""
    monkeypatch.setattr(in_degrees, "COMPACT_ROWS", compact_rows)
    rng = random.Random(7)
    pairs = sorted({(rng.randrange(200), rng.randrange(60)) for _ in range(3_000)})
    rows = [(a, b, "pending" if rng.random() < 0.2 else "active") for a, b in pairs]
    expected = Counter(b for a, b, status in rows if status == "active" and a != b)
    ranges = [rows[i::3] for i in range(3)]
    tallies = []
    for piece in ranges:
        tally = InDegrees()
        for start in range(0, len(piece), 97):
            tally.tally(edges(piece[start : start + 97]))
        tallies.append(tally)
    total = tallies[0]
    for other in tallies[1:]:
        total.add(other)
    assert total.frame().rows() == sorted(expected.items())
    for shard_id, half in enumerate((rows[::2], rows[1::2])):
        folder = tmp_path / "follow_edges" / f"shard_id={shard_id:03d}"
        folder.mkdir(parents=True)
        edges(half).write_parquet(folder / "part-0.parquet")
    assert in_degrees.from_follow_edges(tmp_path).rows() == sorted(expected.items())
