"""The read side of published versions (recs.published), on versions written by hand.

The layout is the contract of ``recs.published`` (not produced by ``recs.nightly.publish`` here):
``<run_id>/manifest.json`` + ``<run_id>/shard_id=NNN/recommendations.parquet``, ``CURRENT``.

Shards of the users used, by ``shard_of``: with 4 shards 2 and 3 -> 2, 6 -> 0, 1 -> 3,
4 -> 1; with 2 shards 2 -> 0, 3 -> 0, 1 -> 1 (so a version's own shard count matters).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from recs.contracts import RECOMMENDATION_SCHEMA
from recs.errors import RunNotFoundError, UnknownUserError
from recs.published import check_version, current_version, list_versions, shard_file
from recs.sharding import shard_of
from recs.testing.published import recommendations_for

GENERATED_AT = dt.datetime(2026, 11, 2)

# (user_id, candidate_id, rank): user 2 is written out of rank order on purpose.
ROWS = [
    (2, 12, 2),
    (2, 11, 1),
    (2, 13, 3),
    (3, 20, 1),
    (6, 21, 1),
    (6, 22, 2),
    (1, 30, 1),
    (4, 31, 1),
]


def frame_of(rows, run_id):
    return pl.DataFrame(
        {
            "user_id": [r[0] for r in rows],
            "candidate_id": [r[1] for r in rows],
            "mutual_count": [5 - r[2] for r in rows],
            "score": [1.0 - r[2] / 10 for r in rows],
            "rank": [r[2] for r in rows],
            "followed_by": [[100 + r[1]] for r in rows],
            "generated_at": [GENERATED_AT] * len(rows),
            "run_id": [run_id] * len(rows),
        },
        schema=RECOMMENDATION_SCHEMA,
    )


def write_version(
    published: Path, run_id: str, snapshot_date: str, shard_count: int, rows=ROWS, **write_opts
) -> dict:
    """One version: every shard file (rows of its users, in the order given) and a manifest."""
    shards = []
    for shard_id in range(shard_count):
        mine = [r for r in rows if shard_of(r[0], shard_count) == shard_id]
        path = shard_file(published, run_id, shard_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        frame_of(mine, run_id).write_parquet(path, **write_opts)
        shards.append(
            {
                "shard_id": shard_id,
                "path": str(path.relative_to(published / run_id)),
                "rows": len(mine),
                "users": len({r[0] for r in mine}),
                "bytes": path.stat().st_size,
            }
        )
    manifest = {
        "run_id": run_id,
        "snapshot_date": snapshot_date,
        "generated_at": GENERATED_AT.isoformat(),
        "shard_count": shard_count,
        "rows": len(rows),
        "users": len({r[0] for r in rows}),
        "shards": shards,
        "exports": [],
    }
    (published / run_id / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def point_current(published: Path, run_id: str) -> None:
    (published / "CURRENT").write_text(f"{run_id}\n")


@pytest.fixture
def published(tmp_path) -> Path:
    folder = tmp_path / "published"
    write_version(folder, "night_1", "2026-11-01", shard_count=4)
    point_current(folder, "night_1")
    return folder


def test_one_users_rows_in_rank_order(published):
    """User 2 shares shard 2 with user 3; written ranks 2, 1, 3 come back 1, 2, 3."""
    frame = recommendations_for(published, 2)
    assert frame.schema == pl.Schema(RECOMMENDATION_SCHEMA)
    assert frame.select("user_id", "candidate_id", "rank").rows() == [
        (2, 11, 1),
        (2, 12, 2),
        (2, 13, 3),
    ]
    assert frame["followed_by"].to_list() == [[111], [112], [113]]
    assert frame["run_id"].unique().to_list() == ["night_1"]


def test_reads_only_the_users_shard_file(published):
    """Garbage in shards 0, 1 and 3 does not matter for user 2 (shard 2); garbage in shard 2
    does, which shows that file is the one read."""
    for shard_id in (0, 1, 3):
        shard_file(published, "night_1", shard_id).write_bytes(b"garbage")
    assert recommendations_for(published, 2)["candidate_id"].to_list() == [11, 12, 13]
    shard_file(published, "night_1", 2).write_bytes(b"garbage")
    with pytest.raises(Exception):  # noqa: B017 - any read error proves the file was read
        recommendations_for(published, 2)


def test_row_groups_of_other_users_are_skipped(tmp_path):
    """A shard of 4000 users x 5 rows in row groups of 1000 rows (200 users each): the data
    pages of every row group but the one holding user 2 are overwritten with zeros, and the
    lookup still succeeds, because the user_id min/max statistics exclude those groups."""
    folder = tmp_path / "published"
    users = [u for u in range(1, 60_000) if shard_of(u, 1) == 0][:4000]
    rows = [(u, 1_000_000 + u * 10 + r, r) for u in users for r in range(1, 6)]
    write_version(folder, "big", "2026-11-01", shard_count=1, rows=rows, row_group_size=1000)
    point_current(folder, "big")
    path = shard_file(folder, "big", 0)
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_row_groups == 20
    target = next(
        i
        for i in range(metadata.num_row_groups)
        if metadata.row_group(i).column(0).statistics.min
        <= 2
        <= metadata.row_group(i).column(0).statistics.max
    )
    content = bytearray(path.read_bytes())
    for i in range(metadata.num_row_groups):
        if i == target:
            continue
        for j in range(metadata.num_columns):
            column = metadata.row_group(i).column(j)
            start = column.dictionary_page_offset or column.data_page_offset
            content[start : start + column.total_compressed_size] = bytes(
                column.total_compressed_size
            )
    path.write_bytes(bytes(content))

    frame = recommendations_for(folder, 2)
    assert frame.select("candidate_id", "rank").rows() == [
        (1_000_000 + 20 + r, r) for r in range(1, 6)
    ]
    with pytest.raises(Exception):  # noqa: B017 - a user in a zeroed row group cannot be read
        recommendations_for(folder, users[-1])


def test_user_without_a_list_gets_an_empty_frame(published):
    frame = recommendations_for(published, 999)
    assert frame.height == 0
    assert frame.schema == pl.Schema(RECOMMENDATION_SCHEMA)


def test_negative_user_id_is_a_clear_error(published):
    with pytest.raises(UnknownUserError, match="invalid user id -1"):
        recommendations_for(published, -1)


def test_nothing_published_is_a_clear_error(tmp_path):
    empty = tmp_path / "published"
    assert current_version(empty) is None
    assert list_versions(empty) == []
    with pytest.raises(RunNotFoundError, match="nothing is published under"):
        recommendations_for(empty, 2)


def test_missing_shard_file_is_a_clear_error(published):
    shard_file(published, "night_1", 2).unlink()
    with pytest.raises(RunNotFoundError, match="'night_1' is incomplete: missing"):
        recommendations_for(published, 2)


@pytest.mark.parametrize("damage", [{"path": None}, {"bytes": None}, "not an entry"])
def test_a_manifest_entry_without_its_fields_is_damaged_not_a_keyerror(published, damage):
    """(Seen as a KeyError traceback under `recs summary` of a hand-made version.)"""
    manifest_path = published / "night_1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    entry = manifest["shards"][0]
    manifest["shards"][0] = damage if isinstance(damage, str) else {
        k: v for k, v in entry.items() if k not in damage
    }
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(RunNotFoundError, match="'night_1' is damaged"):
        check_version(published, "night_1")


def test_unknown_version_names_the_published_ones(published):
    with pytest.raises(RunNotFoundError, match=r"no published version 'night_9'.*night_1"):
        recommendations_for(published, 2, version="night_9")


def test_a_version_is_read_with_its_own_shard_count(published):
    """night_2 has 2 shards: user 1 is in its shard 1 (in night_1, shard 3 of 4)."""
    write_version(published, "night_2", "2026-11-02", shard_count=2, rows=[(1, 40, 1), (2, 41, 1)])
    assert recommendations_for(published, 1, version="night_2")["candidate_id"].to_list() == [40]
    assert recommendations_for(published, 1)["candidate_id"].to_list() == [30]  # still night_1
    point_current(published, "night_2")
    assert recommendations_for(published, 1)["candidate_id"].to_list() == [40]


def test_list_versions_sees_complete_versions_only(published):
    """night_0 (older snapshot) sorts first; a staging folder (even one whose manifest is
    written, just before its rename) and a folder without a manifest are not versions."""
    write_version(published, "night_0", "2026-10-31", shard_count=2)
    write_version(published, ".night_3.staging", "2026-11-03", shard_count=2)
    (published / "half_copied" / "shard_id=000").mkdir(parents=True)
    assert list_versions(published) == [
        {
            "run_id": "night_0",
            "snapshot_date": "2026-10-31",
            "generated_at": "2026-11-02T00:00:00",
            "shard_count": 2,
            "rows": 8,
            "users": 5,
            "carried_over": [],
            "is_current": False,
        },
        {
            "run_id": "night_1",
            "snapshot_date": "2026-11-01",
            "generated_at": "2026-11-02T00:00:00",
            "shard_count": 4,
            "rows": 8,
            "users": 5,
            "carried_over": [],
            "is_current": True,
        },
    ]


def test_check_version_finds_missing_and_damaged_files(published):
    assert check_version(published, "night_1")["shard_count"] == 4
    path = shard_file(published, "night_1", 1)
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(RunNotFoundError, match="damaged"):
        check_version(published, "night_1")
    path.unlink()
    with pytest.raises(RunNotFoundError, match="incomplete: missing"):
        check_version(published, "night_1")
