"""freeze_snapshot from a PostgreSQL hot standby (``Settings.snapshot_store_url``).

A primary and a streaming standby of it (``recs.testing.pgserver.start_standby``: ``pg_basebackup``
then WAL streaming) run for this module. The primary holds the hand-built store of
tests/unit/nightly/test_snapshot.py (6 users, 8 active follows + 1 pending).
"""

from __future__ import annotations

import datetime as dt
import filecmp
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import psycopg
import pytest

from recs.config import Settings
from recs.errors import LiveStoreError
from recs.files import read_json
from recs.nightly.runs import RunPaths
from recs.nightly.snapshot import freeze_snapshot
from recs.store.connections import libpq_url
from recs.store.standby import wait_for_standby
from recs.testing import pgserver
from tests.needs import need
from tests.unit.nightly.test_snapshot import FOLLOWS, PENDING, SNAPSHOT_DATE, build_store


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[pgserver.LocalPostgres, pgserver.LocalPostgres]]:
    need(
        pgserver.find_bindir(),
        "no PostgreSQL server binaries (make test installs Debian's postgresql)",
        "RECS_REQUIRE_POSTGRES",
    )
    primary = pgserver.start(durable=False)
    try:
        standby = pgserver.start_standby(primary)
        try:
            yield primary, standby
        finally:
            standby.stop()
    finally:
        primary.stop()


@pytest.fixture(scope="module")
def other_primary(servers) -> Iterator[pgserver.LocalPostgres]:
    """A second, unrelated cluster (its own system identifier)."""
    server = pgserver.start(durable=False)
    try:
        yield server
    finally:
        server.stop()


def _settings(tmp_path: Path, primary_url: str, standby_url: str | None, **extra) -> Settings:
    return Settings(
        home=tmp_path / "home",
        store_url=primary_url,
        snapshot_store_url=standby_url,
        shard_count=4,
        **extra,
    )


def _edges(paths: RunPaths) -> list[tuple[int, int]]:
    frame = pl.read_parquet(paths.snapshot_dir / "follow_edges" / "**" / "*.parquet")
    return sorted(zip(frame["follower_id"], frame["followee_id"], strict=True))


def _follow_on_primary(primary_url: str, follower_id: int, followee_id: int) -> None:
    with psycopg.connect(libpq_url(primary_url), autocommit=True) as connection:
        connection.execute(
            "INSERT INTO follow_edges (follower_id, followee_id, created_at, status) "
            "VALUES (%s, %s, %s, 'active')",
            (follower_id, followee_id, dt.datetime(2026, 10, 2)),
        )


def test_snapshot_from_the_standby_equals_the_primary_and_sees_the_last_commit(
    servers, tmp_path
):
    """The follow 3 -> 6 is committed on the primary immediately before the freeze (the primary
    runs ``synchronous_commit = off``, so its WAL may not even be flushed yet): the snapshot read
    from the standby must still contain it, because the freeze waits for the standby to replay
    up to the primary's WAL insert position. Expected edges: FOLLOWS + PENDING + (3, 6), the
    same 10 rows, and the same Parquet bytes, as a snapshot of the primary itself."""
    primary, standby = servers
    name = "standby_equal"
    primary_url = primary.create_database(name)
    build_store(_settings(tmp_path, primary_url, None))
    _follow_on_primary(primary_url, 3, 6)

    settings = _settings(tmp_path, primary_url, standby.url_for(name))
    from_standby = RunPaths.create(settings.home, SNAPSHOT_DATE, "standby")
    result = freeze_snapshot(from_standby, settings)
    from_primary = RunPaths.create(settings.home, SNAPSHOT_DATE, "primary")
    # rebuild: read the primary itself, not the date's snapshot the standby read retained
    freeze_snapshot(from_primary, _settings(tmp_path, primary_url, None), rebuild=True)

    expected = sorted([*FOLLOWS, *PENDING, (3, 6)])
    assert _edges(from_standby) == expected
    assert _edges(from_primary) == expected
    assert result["standby"]["replayed_lsn"] is not None
    manifest = read_json(from_standby.snapshot_manifest)
    assert manifest["store"]["read_from"] == "standby"
    assert manifest["row_counts"]["follow_edges"] == 10
    shards = [f"follow_edges/shard_id={s:03d}/part-0.parquet" for s in range(4)]
    for relative in ("users.parquet", "blocks.parquet", *shards):
        ours, theirs = from_standby.snapshot_dir / relative, from_primary.snapshot_dir / relative
        same = filecmp.cmp(ours, theirs, shallow=False)
        assert same, relative


def test_a_standby_that_stopped_replaying_fails_the_freeze_with_both_positions(
    servers, tmp_path
):
    """Replay paused on the standby (``pg_wal_replay_pause``), then a follow committed on the
    primary: the standby can never reach the primary's position, so the freeze must fail after
    ``snapshot_standby_wait_seconds`` (0.5 s here) naming both positions, and write no
    snapshot; it must not silently publish a graph missing the newest follows."""
    primary, standby = servers
    name = "standby_paused"
    primary_url = primary.create_database(name)
    build_store(_settings(tmp_path, primary_url, None))
    # The standby must have replayed the new database before replay stops, or the freeze
    # fails on a database the standby does not have yet instead of on the lag under test.
    wait_for_standby(primary_url, standby.url_for(name), timeout_seconds=60)
    with psycopg.connect(standby.url, autocommit=True) as connection:
        connection.execute("SELECT pg_wal_replay_pause()")
    try:
        _follow_on_primary(primary_url, 3, 6)
        settings = _settings(
            tmp_path, primary_url, standby.url_for(name), snapshot_standby_wait_seconds=0.5
        )
        paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "paused")
        with pytest.raises(LiveStoreError, match=r"has replayed up to \S+, behind the primary"):
            freeze_snapshot(paths, settings)
        assert not paths.snapshot_manifest.exists()
    finally:
        with psycopg.connect(standby.url, autocommit=True) as connection:
            connection.execute("SELECT pg_wal_replay_resume()")


def test_store_url_naming_a_standby_is_refused(servers, tmp_path):
    """``store_url`` must be the primary: with the standby in both places the freeze refuses
    (one line naming the setting) instead of waiting on itself."""
    primary, standby = servers
    settings = _settings(tmp_path, standby.url, primary.url)
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "swapped")
    with pytest.raises(LiveStoreError, match="is a standby: it must name the primary"):
        freeze_snapshot(paths, settings)


def test_a_transaction_left_open_on_the_primary_does_not_delay_the_freeze(servers, tmp_path):
    """A session on the primary inserts a follow and stays idle in its transaction, so its WAL
    sits unflushed on a partly filled page (review measured ~13 s until the next flush when the
    cut-off was the WAL insert position). The cut-off is a synchronously committed marker, so
    the freeze must succeed within a 3 s budget, and must not contain the uncommitted follow
    (3 -> 5): 9 edges, FOLLOWS + PENDING."""
    primary, standby = servers
    name = "standby_open_xact"
    primary_url = primary.create_database(name)
    build_store(_settings(tmp_path, primary_url, None))
    with psycopg.connect(libpq_url(primary_url)) as holder:  # not autocommit: stays open
        holder.execute(
            "INSERT INTO follow_edges (follower_id, followee_id, created_at, status) "
            "VALUES (3, 5, now(), 'active')"
        )
        settings = _settings(
            tmp_path, primary_url, standby.url_for(name), snapshot_standby_wait_seconds=3
        )
        paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "open-xact")
        result = freeze_snapshot(paths, settings)
        holder.rollback()
    assert result["standby"]["waited_seconds"] < 3
    assert _edges(paths) == sorted([*FOLLOWS, *PENDING])


def test_a_standby_of_another_cluster_is_refused(servers, other_primary, tmp_path):
    """store_url on an unrelated primary that has the same database name: the standby's
    system identifier differs from the primary's, so the freeze refuses (one line) instead of
    snapshotting another cluster's graph."""
    primary, standby = servers
    name = "standby_other_cluster"
    build_store(_settings(tmp_path, primary.create_database(name), None))
    elsewhere = other_primary.create_database(name)
    settings = _settings(tmp_path, elsewhere, standby.url_for(name))
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "other-cluster")
    with pytest.raises(LiveStoreError, match=r"is not a standby of store_url .*system identifier"):
        freeze_snapshot(paths, settings)


def test_the_primary_under_another_url_is_not_taken_for_a_standby(servers, tmp_path):
    """snapshot_store_url naming the primary itself (spelled postgres://) is refused: it is not
    in recovery, and reading it would put the batch's load on the primary while the manifest
    claimed a standby."""
    primary, _ = servers
    name = "standby_same_primary"
    primary_url = primary.create_database(name)
    build_store(_settings(tmp_path, primary_url, None))
    spelled = primary_url.replace("postgresql://", "postgres://")
    settings = _settings(tmp_path, primary_url, spelled)
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "same-primary")
    with pytest.raises(LiveStoreError, match=r"is not a standby \(pg_is_in_recovery"):
        freeze_snapshot(paths, settings)


@pytest.mark.parametrize(
    ("store_url", "snapshot_store_url", "needle"),
    [
        ("sqlite:///{tmp}/live.db", "postgresql://x@127.0.0.1:1/recs", "must name a PostgreSQL"),
        ("postgresql://x@127.0.0.1:1/recs", "sqlite:///{tmp}/other.db", "must name a PostgreSQL"),
    ],
)
def test_a_snapshot_store_url_that_cannot_be_a_standby_is_refused_before_connecting(
    tmp_path, store_url, snapshot_store_url, needle
):
    """A standby only exists for a PostgreSQL primary: any other pairing, or a malformed URL,
    is one ``LiveStoreError`` line before anything is contacted (port 1 is never opened)."""
    settings = Settings(
        home=tmp_path / "home",
        store_url=store_url.format(tmp=tmp_path),
        snapshot_store_url=snapshot_store_url.format(tmp=tmp_path),
    )
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "pairing")
    with pytest.raises(LiveStoreError, match=needle):
        freeze_snapshot(paths, settings)


def test_a_malformed_snapshot_store_url_is_refused_when_the_settings_are_read(tmp_path):
    """A snapshot store URL that is not a database URL fails before any stage runs: the
    settings check it (``Settings._a_database_url``), one line naming the setting."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"snapshot_store_url\n.*not a database URL"):
        Settings(
            home=tmp_path / "home",
            store_url="postgresql://x@127.0.0.1:1/recs",
            snapshot_store_url="not a url",
        )
