"""recs.store.relationships: the (event_time_us, event_id) order every writer applies, and
the SQLite settings of each connection role."""

from __future__ import annotations

import pytest

from recs.store.connections import sqlite_pragmas, sqlite_timestamp_text
from recs.store.relationships import PAIR_TABLES, RELATIONS, supersedes, write_time_after
from recs.store.schema import metadata


def test_a_write_supersedes_only_a_strictly_older_version():
    """Ordered by time, then by event id as text; no version (a bulk-loaded row) loses to any."""
    assert supersedes((10, "a"), None)
    assert supersedes((11, "a"), (10, "z"))
    assert supersedes((10, "b"), (10, "a"))
    assert not supersedes((10, "a"), (10, "a"))  # the same event again
    assert not supersedes((10, "a"), (10, "b"))
    assert not supersedes((9, "z"), (10, "a"))


def test_a_write_that_must_win_goes_one_microsecond_after_a_newer_version():
    """An API dismissal at 100 µs: itself over an older version or none; 1 µs after a version
    that is not older (a producer's clock ahead of ours, or a tie won by the event id)."""
    assert write_time_after(100, "api:dismiss", None) == 100
    assert write_time_after(100, "api:dismiss", (99, "zzz")) == 100
    assert write_time_after(100, "api:dismiss", (100, "b")) == 101
    assert write_time_after(100, "api:dismiss", (250, "e-1")) == 251
    assert supersedes((251, "api:dismiss"), (250, "e-1"))


def test_every_relation_names_a_table_of_the_schema():
    assert set(PAIR_TABLES) == set(RELATIONS)
    for table, source, target, at in PAIR_TABLES.values():
        columns = metadata.tables[table].columns
        assert {source, target, at, "event_time_us", "event_id"} <= set(columns.keys())


def test_sqlite_settings_by_role_with_overrides():
    assert sqlite_pragmas("store") == [
        "PRAGMA journal_mode=WAL",
        "PRAGMA synchronous=NORMAL",
        "PRAGMA busy_timeout=10000",
        "PRAGMA foreign_keys=ON",
    ]
    assert sqlite_pragmas("read_api", busy_timeout=500)[0] == "PRAGMA busy_timeout=500"
    with pytest.raises(KeyError):
        sqlite_pragmas("read_api", journal_mode="DELETE")


def test_sqlite_timestamp_text_is_what_sqlalchemy_stores():
    """1 µs after midnight of 2026-11-01 UTC (1,793,491,200 s after the epoch)."""
    assert sqlite_timestamp_text(1_793_491_200_000_001) == "2026-11-01 00:00:00.000001"
    assert sqlite_timestamp_text(None) is None
