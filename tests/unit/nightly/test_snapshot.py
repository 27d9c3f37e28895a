"""recs.nightly.snapshot: consistent, lock-free, byte-stable Parquet copy of the live store.

Tests taking ``settings`` run on both backends (``store_url`` in tests/conftest.py): a SQLite
file and a database on a real PostgreSQL server. ``sqlite_settings`` tests cover the SQLite
reader's own details (ADBC batch typing, text timestamps, WAL).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
from contextlib import closing
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from recs.config import Settings
from recs.contracts import SNAPSHOT_SCHEMAS, check_schema
from recs.errors import CorruptFileError, LiveStoreError
from recs.files import read_json
from recs.nightly import follow_pairs, in_degrees, point_in_time, retained
from recs.nightly.runs import RunPaths
from recs.nightly.snapshot import freeze_snapshot
from recs.sharding import shard_of
from recs.store import read_ahead, readers, schema
from recs.store.connections import engine_for
from recs.store.readers import open_reader

T0 = dt.datetime(2026, 10, 1, 12, 0, 0)
SNAPSHOT_DATE = "2026-11-01"

# A hand-built store: 6 users, 8 active follows + 1 pending, one of everything else.
USERS = [
    # user_id, created_at, last_active_at, status, discoverable, private
    (1, T0, T0 + dt.timedelta(days=1, microseconds=250), "active", True, False),
    (2, T0, None, "active", True, False),  # never active: NULL last_active_at
    (3, T0, T0, "suspended", True, False),
    (4, T0, T0, "active", False, True),
    (5, T0, T0, "deactivated", True, False),
    (6, T0 - dt.timedelta(days=400), T0, "active", True, False),
]
FOLLOWS = [(1, 2), (1, 3), (2, 3), (2, 4), (3, 1), (4, 5), (5, 6), (6, 1)]
PENDING = [(1, 4)]


def build_store(settings: Settings) -> None:
    engine = engine_for(settings.live_store_url)
    settings.home.mkdir(parents=True, exist_ok=True)
    schema.create_schema(engine)
    with engine.begin() as connection:
        connection.execute(
            schema.users.insert(),
            [
                dict(
                    user_id=u,
                    created_at=c,
                    last_active_at=a,
                    account_status=s,
                    is_discoverable=d,
                    is_private=p,
                )
                for u, c, a, s, d, p in USERS
            ],
        )
        connection.execute(
            schema.follow_edges.insert(),
            # Reverse key order: the snapshot itself must sort (PostgreSQL scans in insert order).
            [
                dict(follower_id=a, followee_id=b, created_at=T0, status="active")
                for a, b in reversed(FOLLOWS)
            ]
            + [
                dict(follower_id=a, followee_id=b, created_at=T0, status="pending")
                for a, b in PENDING
            ],
        )
        connection.execute(
            schema.blocks.insert(), [dict(blocker_id=4, blocked_id=1, created_at=T0)]
        )
        connection.execute(schema.mutes.insert(), [dict(muter_id=1, muted_id=6, created_at=T0)])
        connection.execute(
            schema.dismissed_candidates.insert(),
            [dict(user_id=2, candidate_id=1, dismissed_at=T0)],
        )
        connection.execute(
            schema.user_interests.insert(),
            [
                dict(user_id=1, tag="music"),
                dict(user_id=1, tag="books"),
                dict(user_id=2, tag="food"),
            ],
        )
    engine.dispose()


def backend_of(settings: Settings) -> str:
    return "sqlite" if settings.live_store_url.startswith("sqlite") else "postgresql"


@pytest.fixture
def settings(store_url: str, tmp_path: Path) -> Settings:
    """The hand-built store on SQLite (``<home>/live.db``) or on PostgreSQL."""
    url = None if store_url.startswith("sqlite") else store_url
    settings = Settings(home=tmp_path / "home", shard_count=4, store_url=url)
    build_store(settings)
    return settings


@pytest.fixture
def sqlite_settings(tmp_path: Path) -> Settings:
    settings = Settings(home=tmp_path / "home", shard_count=4)
    build_store(settings)
    return settings


@pytest.fixture
def paths(settings: Settings) -> RunPaths:
    return RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")


def snapshot_bytes(paths: RunPaths) -> dict[str, bytes]:
    root = paths.snapshot_dir
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def read_edges(paths: RunPaths) -> pl.DataFrame:
    return pl.read_parquet(
        paths.snapshot_dir / "follow_edges" / "*" / "*.parquet", hive_partitioning=False
    )


def test_layout_contract_and_partitioning(settings, paths):
    """Shards of the follower ids (shard_count 4, recs.sharding): every shard folder exists.

    Each partition holds exactly the edges whose follower hashes to it, sorted by
    (follower_id, followee_id), with the contract's columns and no shard_id column.
    """
    result = freeze_snapshot(paths, settings)
    root = paths.snapshot_dir
    for name in ("users", "blocks", "mutes", "dismissed_candidates", "user_interests"):
        frame = pl.read_parquet(root / f"{name}.parquet")
        check_schema(frame.schema, SNAPSHOT_SCHEMAS[name], name)
    assert sorted(p.name for p in (root / "follow_edges").iterdir()) == [
        "shard_id=000",
        "shard_id=001",
        "shard_id=002",
        "shard_id=003",
    ]
    seen = []
    for shard_id in range(4):
        part = pl.read_parquet(root / retained.shard_path(shard_id))
        check_schema(part.schema, SNAPSHOT_SCHEMAS["follow_edges"], f"shard {shard_id}")
        pairs = list(zip(part["follower_id"], part["followee_id"], strict=True))
        assert pairs == sorted(pairs)
        assert all(shard_of(follower, 4) == shard_id for follower, _ in pairs)
        seen += part.rows()
    assert sorted((a, b, s) for a, b, _, s in seen) == sorted(
        [(a, b, "active") for a, b in FOLLOWS] + [(a, b, "pending") for a, b in PENDING]
    )
    assert result["row_counts"] == {
        "users": 6,
        "follow_edges": 9,
        "blocks": 1,
        "mutes": 1,
        "dismissed_candidates": 1,
        "user_interests": 3,
    }


def test_values_survive_the_copy(settings, paths):
    """Timestamps keep microseconds, NULL stays NULL, booleans and statuses are unchanged."""
    freeze_snapshot(paths, settings)
    users = pl.read_parquet(paths.snapshot_dir / "users.parquet")
    assert users.rows() == [tuple(row) for row in USERS]
    interests = pl.read_parquet(paths.snapshot_dir / "user_interests.parquet")
    assert interests.rows() == [(1, "books"), (1, "music"), (2, "food")]  # sorted by key


def test_manifest_counts_and_settings_round_trip(settings, paths):
    freeze_snapshot(paths, settings)
    manifest = read_json(paths.snapshot_manifest)
    assert manifest["snapshot_date"] == SNAPSHOT_DATE
    assert manifest["run_id"] == "test-run"
    assert manifest["as_of"] == "2026-11-02T00:00:00+00:00"
    assert manifest["shard_count"] == 4
    assert manifest["store"]["backend"] == backend_of(settings)
    assert manifest["follow_edges_by_status"] == {"active": 8, "pending": 1}
    assert manifest["follow_edges_naming_unknown_accounts"] == {"rows": 0, "example": None}
    shards = manifest["follow_edges_shards"]
    assert [s["shard_id"] for s in shards] == [0, 1, 2, 3]
    assert sum(s["rows"] for s in shards) == manifest["row_counts"]["follow_edges"] == 9
    for shard in shards:
        expected = sum(shard_of(a, 4) == shard["shard_id"] for a, _ in FOLLOWS + PENDING)
        assert shard["rows"] == expected
    rebuilt = Settings.model_validate(manifest["settings"])
    assert rebuilt.model_dump() == settings.model_dump()  # every run-defining field
    assert "store_url" not in manifest["settings"]  # a connection (may hold a password)
    assert isinstance(rebuilt.home, Path) and isinstance(rebuilt.datasets_dir, Path)


def test_rerun_writes_identical_bytes_and_replaces_old_outputs(settings, paths):
    freeze_snapshot(paths, settings)
    first = snapshot_bytes(paths)
    (paths.snapshot_dir / "stale.parquet").write_bytes(b"left over")
    freeze_snapshot(paths, settings)
    assert snapshot_bytes(paths) == first
    other_run = RunPaths.create(settings.home, SNAPSHOT_DATE, "other-run")
    freeze_snapshot(other_run, settings)
    differs = {k for k, v in snapshot_bytes(other_run).items() if first[k] != v}
    assert differs == {"manifest.json"}  # only the run id differs


def test_read_chunk_size_does_not_change_the_bytes(sqlite_settings, monkeypatch, caplog):
    """Follow edges are partitioned chunk by chunk as they are read; 2-row chunks (5 chunks
    for the 9 edges, read in 1-row driver batches) must give the same files as one chunk. The
    second rebuild, replacing a retained snapshot, warns (a newcomer's went without a word);
    the first, with none retained, does not."""
    settings = sqlite_settings
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
    replacing = f"rebuilding the retained snapshot of {SNAPSHOT_DATE} from the live store"
    freeze_snapshot(paths, settings, rebuild=True)
    assert replacing not in caplog.text
    whole = snapshot_bytes(paths)
    monkeypatch.setattr(readers, "READ_BATCH_ROWS", 1)
    monkeypatch.setattr(readers, "READ_CHUNK_ROWS", 2)
    with open_reader(settings.live_store_url) as reader:
        assert [chunk.height for chunk in reader.iter_table("follow_edges")] == [2, 2, 2, 2, 1]
    freeze_snapshot(paths, settings, rebuild=True)  # read from the store again, in chunks
    assert snapshot_bytes(paths) == whole
    assert replacing in caplog.text


def test_the_read_ahead_keeps_order_raises_at_the_failed_batch_and_stops_when_closed():
    """``read_ahead.ReadAhead`` one batch ahead: every batch in order; a driver error after two
    batches comes after those two; a consumer that stops after one batch and closes it leaves
    no reading thread behind (the connection is idle again)."""

    def batches(count, fail_after=None):
        for number in range(count):
            if number == fail_after:
                raise OSError("disk I/O error")
            yield number

    assert list(read_ahead.ReadAhead(batches(50), depth=1)) == list(range(50))
    seen = []
    with pytest.raises(OSError, match="disk I/O error"):
        for batch in read_ahead.ReadAhead(batches(5, fail_after=2), depth=1):
            seen.append(batch)
    assert seen == [0, 1]
    stream = read_ahead.ReadAhead(batches(10**6), depth=1)
    assert next(stream) == 0
    stream.close()
    assert not [t for t in threading.enumerate() if t.name == "recs-store-read"]
    assert list(stream) == []


class _WatchedCursor:
    """An ADBC cursor that records, at each ``ROLLBACK``, whether a read-ahead thread was still
    running (it would be calling the driver beside it)."""

    def __init__(self, cursor, seen: list[bool]) -> None:
        self._cursor, self._seen = cursor, seen

    def execute(self, sql, *args, **kwargs):
        if sql == "ROLLBACK":
            self._seen.append(any(t.name == "recs-store-read" for t in threading.enumerate()))
        return self._cursor.execute(sql, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._cursor, name)


def test_an_error_while_the_edges_are_partitioned_stops_the_read_ahead_before_the_rollback(
    sqlite_settings, monkeypatch
):
    """The spill fails (a full disk) on the second chunk while the driver's thread is a batch
    ahead: the freeze raises that error, and the reader's ``ROLLBACK`` comes after the thread
    has stopped (a ``ROLLBACK`` beside a fetching thread crashed the process: SIGSEGV)."""
    settings = sqlite_settings
    monkeypatch.setattr(readers, "READ_BATCH_ROWS", 1)
    monkeypatch.setattr(readers, "READ_CHUNK_ROWS", 2)
    monkeypatch.setattr(readers._AdbcReader, "_prefetch_batches", 1)
    rollbacks: list[bool] = []
    begin = readers._AdbcSqliteReader._begin

    def watched_begin(self):
        present = begin(self)
        self._cursor = _WatchedCursor(self._cursor, rollbacks)
        return present

    monkeypatch.setattr(readers._AdbcSqliteReader, "_begin", watched_begin)
    partition = retained.partition_by_shard

    def failing(chunks, shard_count, spill, origin):
        def until_full():
            for number, chunk in enumerate(chunks):
                if number == 1:
                    raise OSError(28, "No space left on device")
                yield chunk

        return partition(until_full(), shard_count, spill, origin)

    monkeypatch.setattr(retained, "partition_by_shard", failing)
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
    with pytest.raises(OSError, match="No space left"):
        freeze_snapshot(paths, settings, rebuild=True)
    assert rollbacks == [False]


def test_follow_edges_are_sorted_unless_already_in_pair_order():
    """``follow_pairs.pair_order``: (1, 2) (1, 5) (3, 1) is in strict order; (1, 2) twice is in
    order but repeated; a followee going down under one follower or a follower going down is
    unsorted. ``checked`` sorts an unsorted partition, then refuses a repeat found only after
    the sort, and a NULL id, naming the origin, the shard and the remedy."""

    def frame(followers, followees):
        return pl.DataFrame(
            {"follower_id": followers, "followee_id": followees},
            schema={"follower_id": pl.Int64, "followee_id": pl.Int64},
        )

    assert follow_pairs.pair_order(frame([1, 1, 3], [2, 5, 1])) == "strict"
    assert follow_pairs.pair_order(frame([1, 1, 3], [2, 2, 1])) == "repeated"
    assert follow_pairs.pair_order(frame([1, 1, 3], [5, 2, 1])) == "unsorted"
    assert follow_pairs.pair_order(frame([3, 1], [1, 2])) == "unsorted"
    assert follow_pairs.pair_order(frame([7], [1])) == "strict"
    live = follow_pairs.LIVE_STORE
    assert follow_pairs.checked(frame([3, 1, 1], [1, 5, 2]), 0, live).rows() == [
        (1, 2),
        (1, 5),
        (3, 1),
    ]
    with pytest.raises(LiveStoreError, match=r"live store holds 2 .* \(shard 007; e.g. \(1, 2\)"):
        follow_pairs.checked(frame([1, 3, 1], [2, 1, 2]), 7, live)
    with pytest.raises(
        LiveStoreError, match=r"NULL follower_id .* \(1 in one read; e.g. \(None, 2\)"
    ):
        follow_pairs.checked(frame([1, None], [1, 2]), 0, live)
    with pytest.raises(LiveStoreError, match=r"NULL"):
        follow_pairs.checked(frame([1, 2], [None, 2]), 0, live)


WRITER = textwrap.dedent(
    """
    import sys, time
    from recs.store.connections import engine_for
    started = time.monotonic()
    engine = engine_for(sys.argv[1])
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":  # fail instead of waiting, like busy_timeout
            connection.exec_driver_sql(f"SET lock_timeout = '{sys.argv[2]}s'")
        connection.exec_driver_sql(
            "INSERT INTO follow_edges (follower_id, followee_id, created_at, status) "
            "VALUES (6, 5, '2026-10-30 00:00:00.000000', 'active')"
        )
    engine.dispose()
    print(time.monotonic() - started)
    """
)


def test_snapshot_is_one_read_transaction_that_never_blocks_writers(settings, paths, monkeypatch):
    """While the snapshot's read transaction is open (after reading `users`, before reading
    `follow_edges`), another process inserts and commits the follow 6 -> 5.

    The writer must succeed at once (no lock it waits for: SQLite would wait up to its busy
    timeout and then fail with "database is locked", PostgreSQL up to its lock_timeout), and
    the snapshot must not contain the edge (every table read as of one instant), while the
    store afterwards does. The edges are read in two ranges of follower_id on two connections
    (``snapshot_read_connections``): 6 -> 5 falls in the second one's, whose transaction must
    see the same instant as the first's.
    """
    writes = []
    ranges = []
    assert settings.snapshot_read_connections == 2

    class InsertingReader:
        def __init__(self, inner):
            self.inner = inner
            self.backend = inner.backend

        def iter_table(self, name):
            return self.inner.iter_table(name)

        def iter_ranges(self, name, column):
            parts = self.inner.iter_ranges(name, column)
            ranges.append(len(parts))
            return parts

        def read_table(self, name):
            frame = self.inner.read_table(name)
            if name == "users":
                done = subprocess.run(
                    [sys.executable, "-c", WRITER, settings.live_store_url, "5"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                writes.append(done)
            return frame

    real_open_reader = retained.open_reader

    def open_inserting_reader(url, connections=1):
        class Context:
            def __enter__(self):
                self.context = real_open_reader(url, connections)
                return InsertingReader(self.context.__enter__())

            def __exit__(self, *exc):
                return self.context.__exit__(*exc)

        return Context()

    monkeypatch.setattr(retained, "open_reader", open_inserting_reader)
    freeze_snapshot(paths, settings)
    [write] = writes
    assert ranges == [2]
    assert write.returncode == 0, write.stderr
    assert float(write.stdout) < 2.0
    edges = read_edges(paths)
    assert (6, 5) not in set(zip(edges["follower_id"], edges["followee_id"], strict=True))
    assert edges.height == len(FOLLOWS) + len(PENDING)
    engine = engine_for(settings.live_store_url)
    with engine.connect() as connection:
        assert connection.exec_driver_sql(
            "SELECT count(*) FROM follow_edges WHERE follower_id = 6 AND followee_id = 5"
        ).fetchall() == [(1,)]
    engine.dispose()


def test_nulls_after_a_full_batch_of_text_and_text_after_nulls(tmp_path, monkeypatch):
    """The ADBC driver types a column from its first batch; 1,500 NULL last_active_at rows
    then 1,500 text ones must still read (NULLs are read as '' and turned back into NULL)."""
    monkeypatch.setattr(readers, "READ_BATCH_ROWS", 1024)
    settings = Settings(home=tmp_path)
    engine = engine_for(settings.live_store_url)
    schema.create_schema(engine)
    with engine.begin() as connection:
        connection.execute(
            schema.users.insert(),
            [
                dict(user_id=i, created_at=T0, last_active_at=None if i < 1500 else T0)
                for i in range(3000)
            ],
        )
    engine.dispose()
    with open_reader(settings.live_store_url) as reader:
        users = reader.read_table("users")
    assert users.height == 3000
    assert users["last_active_at"].null_count() == 1500
    assert users["last_active_at"].drop_nulls().unique().to_list() == [T0]


def test_iso_t_separator_and_utc_suffix_are_read_as_naive_utc(tmp_path):
    settings = Settings(home=tmp_path)
    engine = engine_for(settings.live_store_url)
    schema.create_schema(engine)
    engine.dispose()
    with closing(sqlite3.connect(tmp_path / "live.db")) as connection, connection:
        connection.executemany(
            "INSERT INTO mutes (muter_id, muted_id, created_at) VALUES (?, ?, ?)",
            [(1, 2, "2026-10-01T12:00:00"), (1, 3, "2026-10-01 12:00:00.5+00:00")],
        )
    with open_reader(settings.live_store_url) as reader:
        mutes = reader.read_table("mutes").sort("muted_id")
    assert mutes["created_at"].to_list() == [T0, T0 + dt.timedelta(milliseconds=500)]


def test_sqlalchemy_reader_reads_what_the_adbc_reader_reads(settings, monkeypatch):
    with open_reader(settings.live_store_url) as reader:
        assert reader.backend == backend_of(settings)
        adbc_frames = {name: reader.read_table(name) for name in SNAPSHOT_SCHEMAS}
    monkeypatch.setattr(readers, "sqlite_file", lambda url: None)
    monkeypatch.setattr(readers, "is_postgres", lambda url: False)
    with open_reader(settings.live_store_url) as reader:
        assert isinstance(reader, readers._SqlAlchemyReader)
        for name, frame in adbc_frames.items():
            generic = reader.read_table(name)
            assert generic.schema == frame.schema
            key = retained.SORT_KEYS[name]
            assert generic.sort(key).equals(frame.sort(key)), name


def test_store_without_tables_is_a_clear_error(store_url, tmp_path):
    """An empty database (PostgreSQL) or a new SQLite file in WAL mode: no table users."""
    if store_url.startswith("sqlite"):
        engine = engine_for(store_url)  # creates the file in WAL mode, no tables
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
        engine.dispose()
    settings = Settings(home=tmp_path / "home", store_url=store_url)
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, None)
    with pytest.raises(LiveStoreError, match="has no table users"):
        freeze_snapshot(paths, settings)
    assert not paths.snapshot_dir.exists()


def test_unreachable_postgres_is_a_clear_error(tmp_path):
    settings = Settings(home=tmp_path, store_url="postgresql://nobody@127.0.0.1:1/none")
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, None)
    with pytest.raises(LiveStoreError, match="cannot connect to the live store"):
        freeze_snapshot(paths, settings)


def test_missing_store_or_table_is_a_clear_error(tmp_path):
    settings = Settings(home=tmp_path / "empty")
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, None)
    with pytest.raises(LiveStoreError, match="no live store at .*recs load-dataset"):
        freeze_snapshot(paths, settings)
    settings.home.mkdir(exist_ok=True)  # the refused run may have made its (empty) folders
    connection = sqlite3.connect(settings.home / "live.db")
    connection.execute("PRAGMA journal_mode=WAL")
    connection.close()
    with pytest.raises(LiveStoreError, match="has no table users"):
        freeze_snapshot(paths, settings)
    assert not paths.snapshot_dir.exists()


def test_failed_snapshot_keeps_the_previous_one(settings, paths, monkeypatch):
    freeze_snapshot(paths, settings)
    before = snapshot_bytes(paths)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(retained, "write_follow_edges", broken)
    retained_before = retained.manifest(retained.folder(paths.home, paths.snapshot_date))
    with pytest.raises(OSError, match="disk full"):
        freeze_snapshot(paths, settings, rebuild=True)  # forced back to the live store
    assert snapshot_bytes(paths) == before
    assert retained.manifest(retained.folder(paths.home, paths.snapshot_date)) == retained_before
    assert not list(retained.folder(paths.home, paths.snapshot_date).parent.glob(".*.partial"))


def test_gc_cannot_remove_a_snapshot_a_run_is_linking_and_one_it_removed_is_made_again(
    sqlite_settings, monkeypatch, caplog
):
    """A second run of 2026-11-01 reuses the snapshot a first run retained. While it links the
    files into its own folder, a gc that judges the date old tries to remove it: it must leave
    it (busy; on de50639 it removed it and the next link failed: RunNotFoundError, missing
    users.parquet), and the run
    gets the first run's tables. A third run finds the snapshot, then gc removes it before the
    run holds it: the run freezes the date again from the live store (still within the lag)
    and gets the same tables."""
    from recs.nightly import snapshot, snapshot_removal

    home = sqlite_settings.home
    first = RunPaths.create(home, SNAPSHOT_DATE, "first")
    freeze_snapshot(first, sqlite_settings)
    tables = {k: v for k, v in snapshot_bytes(first).items() if k != "manifest.json"}
    later = dt.datetime.now(dt.UTC).timestamp() + 3600  # gc judges everything older than this
    outcomes = []
    link = snapshot.link_or_copy

    def link_while_gc_runs(source, target):
        if not outcomes:
            outcomes.append(snapshot_removal.remove(home, SNAPSHOT_DATE, unchanged_since=later))
        link(source, target)

    monkeypatch.setattr(snapshot, "link_or_copy", link_while_gc_runs)
    second = RunPaths.create(home, SNAPSHOT_DATE, "second")
    assert freeze_snapshot(second, sqlite_settings)["source"] == "retained"
    assert outcomes == [snapshot_removal.BUSY]
    assert {k: v for k, v in snapshot_bytes(second).items() if k != "manifest.json"} == tables
    monkeypatch.setattr(snapshot, "link_or_copy", link)

    hold = retained.reading

    def removed_before_the_run_holds_it(folder):
        if len(outcomes) == 1:
            outcomes.append(snapshot_removal.remove(home, SNAPSHOT_DATE, unchanged_since=later))
        return hold(folder)

    monkeypatch.setattr(retained, "reading", removed_before_the_run_holds_it)
    third = RunPaths.create(home, SNAPSHOT_DATE, "third")
    assert freeze_snapshot(third, sqlite_settings)["source"] == "live_store"
    assert outcomes == [snapshot_removal.BUSY, snapshot_removal.REMOVED]
    assert "was removed (recs gc) before this run could read it (attempt 1 of 3)" in caplog.text
    assert {k: v for k, v in snapshot_bytes(third).items() if k != "manifest.json"} == tables
    assert retained.is_complete(retained.folder(home, dt.date.fromisoformat(SNAPSHOT_DATE)))


BREAK_THE_PAIR_RULE = {
    "repeat": "INSERT INTO follow_edges SELECT * FROM follow_edges "
    "WHERE follower_id = 2 AND followee_id = 3",
    "null": "UPDATE follow_edges SET follower_id = NULL WHERE follower_id = 2 AND followee_id = 3",
}


def add_an_account_created_after_the_cut_off(settings: Settings) -> None:
    """User 99, created 60 days after T0 (past SNAPSHOT_DATE's cut-off): the freeze leaves it
    out, and every row naming it; the store is then newer than the lag allows (rebuild)."""
    engine = engine_for(settings.live_store_url)
    with engine.begin() as connection:
        connection.execute(
            schema.users.insert(),
            [dict(user_id=99, created_at=T0 + dt.timedelta(days=60), last_active_at=None,
                  account_status="active", is_discoverable=True, is_private=False)],
        )  # fmt: skip
    engine.dispose()


@pytest.mark.parametrize(
    ("broken", "error"),
    [
        ("repeat", r"live store holds 2 follow-edge rows .* more than once .*\(2, 3\)"),
        ("null", r"live store holds follow-edge rows with a NULL .* e.g. \(None, 3\)"),
    ],
)
def test_a_store_that_breaks_the_pair_rule_is_refused_and_nothing_is_written(
    sqlite_settings, broken, error
):
    """A store whose follow_edges lost its primary key and NOT NULL constraints holds (2, 3)
    twice, or (NULL, 3) instead of it: the freeze names the rule, how many rows break it and
    one, and leaves no snapshot (dbt counts follows with ``count(*)`` on the rule that a pair
    is one row; stg_follow_edges would drop a NULL id's row unseen by dbt's not_null tests).
    An account created after the cut-off (as on any night) makes the freeze leave out rows
    naming it: a NULL id must be refused before that filter, not left out by it."""
    settings = sqlite_settings
    add_an_account_created_after_the_cut_off(settings)
    with closing(sqlite3.connect(settings.home / "live.db")) as connection, connection:
        connection.executescript(
            "PRAGMA legacy_alter_table = ON;"
            "CREATE TABLE keyless AS SELECT * FROM follow_edges;"
            "DROP TABLE follow_edges;"
            "ALTER TABLE keyless RENAME TO follow_edges;" + BREAK_THE_PAIR_RULE[broken]
        )
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
    with pytest.raises(LiveStoreError, match=error):
        freeze_snapshot(paths, settings, rebuild=True)
    assert not paths.snapshot_dir.exists()
    assert not retained.is_complete(retained.folder(paths.home, paths.snapshot_date))


def test_edges_naming_an_account_the_users_lack_are_kept_and_counted(settings, caplog):
    """(2, 77) and (88, 1) name accounts that never existed (the store has no foreign keys):
    both are kept (9 + 2 edges) and counted, the smaller pair as the example (whatever order
    the store reads them in), in the retained and the run's manifest and in a warning; an
    account created after the cut-off (99) is not unknown: its edge is left out, as before."""
    add_an_account_created_after_the_cut_off(settings)
    engine = engine_for(settings.live_store_url)
    with engine.begin() as connection:
        connection.execute(
            schema.follow_edges.insert(),
            [
                dict(follower_id=a, followee_id=b, created_at=T0, status="active")
                for a, b in [(88, 1), (2, 77), (1, 99)]
            ],
        )
    engine.dispose()
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
    with caplog.at_level("WARNING", logger="recs.nightly.retained"):
        freeze_snapshot(paths, settings, rebuild=True)  # 99 is newer than the allowed lag
    expected = {"rows": 2, "example": [2, 77]}
    assert read_json(paths.snapshot_manifest)["follow_edges_naming_unknown_accounts"] == expected
    frozen = retained.manifest(retained.folder(paths.home, paths.snapshot_date))
    assert frozen["follow_edges_naming_unknown_accounts"] == expected
    assert read_edges(paths).height == len(FOLLOWS) + len(PENDING) + 2
    assert "2 follow edges of the snapshot name an account its users table lacks" in caplog.text


def test_unknown_accounts_are_counted_chunk_by_chunk_without_self_follows():
    """Users 1-3: (1, 9) and (8, 2) name unknown accounts (two chunks, the smaller pair the
    example); (7, 7) does not count (stg_follow_edges drops self-follows); (1, 2) is known."""
    tally = follow_pairs.UnknownAccounts(pl.Series([1, 2, 3]))
    for pairs in ([(8, 2), (1, 2)], [(7, 7), (1, 9)]):
        tally.tally(pl.DataFrame(pairs, schema=follow_pairs.KEYS, orient="row"))
    assert tally.as_dict() == {"rows": 2, "example": [1, 9]}


def as_an_earlier_version_froze_it(settings: Settings, *, repeat: bool) -> Path:
    """The retained snapshot of SNAPSHOT_DATE as a version before ``follow_pairs`` left it: no
    ``follow_edges_pairs`` in its manifest and, with ``repeat``, shard 0 holding a pair twice
    (still in key order: dbt's unique test was the rule's home then)."""
    freeze_snapshot(RunPaths.create(settings.home, SNAPSHOT_DATE, "first"), settings)
    target = retained.folder(settings.home, dt.date.fromisoformat(SNAPSHOT_DATE))
    document = read_json(target / retained.MANIFEST)
    del document["follow_edges_pairs"]
    if repeat:
        path = target / retained.shard_path(0)
        part = pl.read_parquet(path)
        part = pl.concat([part, part.head(1)]).sort(follow_pairs.KEYS)
        path.unlink()  # hard-linked into the first run's snapshot: a new file, not a rewrite
        part.write_parquet(path)
        document["follow_edges_shards"][0]["rows"] = part.height  # as that version counted it
    (target / retained.MANIFEST).write_text(json.dumps(document))
    return target


@pytest.mark.parametrize("shard_count", [4, 8], ids=["reused", "re-partitioned"])
def test_a_retained_snapshot_that_repeats_a_pair_is_refused_with_the_rebuild_remedy(
    sqlite_settings, shard_count
):
    """An earlier version's retained snapshot (no mark that its pairs were checked) with a pair
    twice in shard 0: reusing it as is (same plan: hard links) or re-partitioning it (8 shards)
    refuses it, naming the retained snapshot and --rebuild-snapshot, not the live store; the
    same snapshot without the repeat is reused."""
    settings = sqlite_settings.model_copy(update={"shard_count": shard_count})
    target = as_an_earlier_version_froze_it(sqlite_settings, repeat=True)
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "second")
    with pytest.raises(LiveStoreError, match=r"retained snapshot .* more than once .*--rebuild-"):
        freeze_snapshot(paths, settings)
    assert not paths.snapshot_dir.exists()
    shutil.rmtree(target)
    as_an_earlier_version_froze_it(sqlite_settings, repeat=False)
    freeze_snapshot(paths, settings)
    assert read_edges(paths).height == len(FOLLOWS) + len(PENDING)


@pytest.mark.parametrize(
    "relative", ["users.parquet", retained.shard_path(0), in_degrees.FILE, "swapped"]
)
def test_a_damaged_retained_snapshot_is_refused_naming_the_file_and_the_rebuild(
    sqlite_settings, relative
):
    """(From a newcomer's run.) The run's snapshot files are hard links to the date's retained
    ones: one cut in half in the run's folder damages the date, and the next run of it failed in
    dbt with a data test's name. Now that run stops at the freeze naming the retained file and
    --rebuild-snapshot, which makes it again. "swapped": shard 0 replaced by a readable file of
    one row fewer."""
    settings = sqlite_settings
    first = RunPaths.create(settings.home, SNAPSHOT_DATE, "first")
    freeze_snapshot(first, settings)
    target = retained.folder(settings.home, dt.date.fromisoformat(SNAPSHOT_DATE))
    if relative == "swapped":
        relative = retained.shard_path(0)
        shorter = pl.read_parquet(target / relative).head(-1)
        (target / relative).unlink()
        shorter.write_parquet(target / relative)
        problem = f"{shorter.height:,} rows, not {shorter.height + 1:,}"
    else:
        size = (first.snapshot_dir / relative).stat().st_size
        os.truncate(first.snapshot_dir / relative, size // 2)  # in place: the link's inode
        problem = "Parquet magic bytes not found"
    second = RunPaths.create(settings.home, SNAPSHOT_DATE, "second")
    with pytest.raises(CorruptFileError) as refused:
        freeze_snapshot(second, settings)
    assert str(refused.value).startswith(
        f"the retained snapshot's {target / relative} is damaged ("
    ) and str(refused.value).endswith(
        f"): with a run store that holds the date, remove {target} and run again (the store's "
        "copy is downloaded); without one, make it again from the live store with "
        "--rebuild-snapshot (the DAG's rebuild_snapshot param)"
    )
    assert problem in str(refused.value)
    assert freeze_snapshot(second, settings, rebuild=True)["source"] == "rebuilt"
    third = RunPaths.create(settings.home, SNAPSHOT_DATE, "third")
    assert freeze_snapshot(third, settings)["source"] == "retained"
    assert read_edges(third).height == len(FOLLOWS) + len(PENDING)


def test_a_damaged_retained_snapshot_does_not_reach_the_run_store(
    sqlite_settings, tmp_path, monkeypatch
):
    """(From a review.) A run store that lacks the date is given this machine's retained
    snapshot when a run reuses it. A damaged one was pushed before its files were checked, so
    every worker would have downloaded it; now the freeze refuses it and pushes nothing. Once
    rebuilt, the good copy is pushed."""
    from recs.nightly.artifacts import RunStore

    settings = sqlite_settings
    freeze_snapshot(RunPaths.create(settings.home, SNAPSHOT_DATE, "first"), settings)
    target = retained.folder(settings.home, dt.date.fromisoformat(SNAPSHOT_DATE))
    os.truncate(target / "users.parquet", (target / "users.parquet").stat().st_size // 2)
    store = RunStore((tmp_path / "run-store").as_uri())
    monkeypatch.setattr(retained, "run_store", lambda: store)
    second = RunPaths.create(settings.home, SNAPSHOT_DATE, "second")
    with pytest.raises(CorruptFileError, match="users.parquet is damaged"):
        freeze_snapshot(second, settings)
    assert store.folders("snapshots") == []
    freeze_snapshot(second, settings, rebuild=True)
    assert store.folders("snapshots") == [SNAPSHOT_DATE]


def test_a_rebuild_that_fails_after_its_freeze_is_still_the_run_stores(
    sqlite_settings, tmp_path, monkeypatch
):
    """(From a review.) A rebuild whose run then fails (a full disk while linking it into the
    run) had not been pushed yet, so the next plain run downloaded the run store's older copy
    over it. The rebuilt copy is pushed as soon as it is frozen: the next run keeps it."""
    from recs.nightly import snapshot
    from recs.nightly.artifacts import RunStore

    settings = sqlite_settings
    store = RunStore((tmp_path / "run-store").as_uri())
    monkeypatch.setattr(retained, "run_store", lambda: store)
    freeze_snapshot(RunPaths.create(settings.home, SNAPSHOT_DATE, "first"), settings)
    second = RunPaths.create(settings.home, SNAPSHOT_DATE, "second")
    materialize = snapshot._materialize

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snapshot, "_materialize", full_disk)
    with pytest.raises(OSError, match="No space left"):
        freeze_snapshot(second, settings, rebuild=True)
    monkeypatch.setattr(snapshot, "_materialize", materialize)
    assert freeze_snapshot(second, settings)["source"] == "retained"
    target = retained.folder(settings.home, dt.date.fromisoformat(SNAPSHOT_DATE))
    assert retained.manifest(target)["frozen_by_run_id"] == "second"
    assert retained.manifest(target)["rebuilt"] is True


IN_DEGREES = [(1, 2), (2, 1), (3, 2), (4, 1), (5, 1), (6, 1)]
"""The hand-built store's in-degrees: 1 is followed by 3 and 6, 2 by 1, 3 by 1 and 2, 4 by 2
(1's request to 4 is pending: no follower), 5 by 4, 6 by 5; 8 active follows in all."""


def test_in_degrees_are_counted_as_the_edges_are_written(settings, paths):
    """The freeze writes the in-degrees it counted beside the edges, in the retained snapshot
    and the run's, with their entry in both manifests (dbt reads them: stg_in_degrees)."""
    freeze_snapshot(paths, settings)
    target = retained.folder(settings.home, dt.date.fromisoformat(SNAPSHOT_DATE))
    for folder in (paths.snapshot_dir, target):
        assert pl.read_parquet(folder / in_degrees.FILE).rows() == IN_DEGREES
    entry = {"path": in_degrees.FILE, "rows": 6, "active_follows": 8}
    assert read_json(paths.snapshot_manifest)["in_degrees"] == entry
    assert read_json(target / retained.MANIFEST)["in_degrees"] == entry


@pytest.mark.parametrize("shard_count", [4, 8], ids=["reused", "re-partitioned"])
def test_a_retained_snapshot_without_in_degrees_gets_them_counted_from_its_edges(
    sqlite_settings, shard_count
):
    """A snapshot retained by a version before ``in_degrees`` has no in_degrees.parquet and no
    manifest entry: a run reusing it (as is, or re-partitioned into 8 shards) counts them from
    the edges, the same rows the freeze counts; the retained folder is left as it was."""
    target = as_an_earlier_version_froze_it(sqlite_settings, repeat=False)
    document = read_json(target / retained.MANIFEST)
    del document["in_degrees"]
    (target / retained.MANIFEST).write_text(json.dumps(document))
    (target / in_degrees.FILE).unlink()
    settings = sqlite_settings.model_copy(update={"shard_count": shard_count})
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "second")
    assert freeze_snapshot(paths, settings)["source"] == "retained"
    assert pl.read_parquet(paths.snapshot_dir / in_degrees.FILE).rows() == IN_DEGREES
    assert read_json(paths.snapshot_manifest)["in_degrees"]["active_follows"] == 8
    assert not (target / in_degrees.FILE).exists()


def test_timing_is_not_in_the_manifest(settings, paths):
    result = freeze_snapshot(paths, settings)
    assert result["seconds"] >= 0 and set(result) >= {"snapshot_dir", "manifest", "row_counts"}
    assert "seconds" not in paths.snapshot_manifest.read_text()


def test_follow_edges_are_spilled_chunk_by_chunk_and_the_spill_is_removed(
    sqlite_settings, monkeypatch
):
    """With 2-row chunks, each chunk's piece of each shard is a record batch appended to that
    shard's Arrow stream on disk while the store is read (memory holds one chunk, not the
    table): one stream per shard and range of the read, the 9 edges of 5 chunks in at least 5
    batches and at most 9, the partitions hold all 9 edges, and the spill folder is gone after
    the freeze, after a failed freeze, and when a killed attempt left one behind."""
    settings = sqlite_settings
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
    monkeypatch.setattr(readers, "READ_CHUNK_ROWS", 2)
    monkeypatch.setattr(readers, "READ_BATCH_ROWS", 1)
    target = retained.folder(paths.home, paths.snapshot_date)
    killed = target.with_name(f".{target.name}.999-dead.spill")
    killed.mkdir(parents=True)
    (killed / "000").mkdir()
    seen: list[dict[int, list[int]]] = []
    real = retained.write_follow_edges

    def watching(parts, shard_count, staging, origin, counted):
        batches = {}
        for shard_id, files in parts.items():
            assert all(path.is_file() and path.suffix == ".arrows" for path in files)
            assert len({path.parent for path in files}) == len(files)  # one per range
            batches[shard_id] = [
                len(list(pa.ipc.open_stream(path.read_bytes()))) for path in files
            ]
        seen.append(batches)
        return real(parts, shard_count, staging, origin, counted)

    monkeypatch.setattr(retained, "write_follow_edges", watching)
    freeze_snapshot(paths, settings, rebuild=True)
    streams = [count for counts in seen[0].values() for count in counts]
    assert len(streams) <= 2 * settings.shard_count  # two ranges, as read
    assert 5 <= sum(streams) <= 9
    edges = pl.read_parquet(paths.snapshot_dir / "follow_edges" / "*" / "*.parquet")
    assert edges.height == len(FOLLOWS) + len(PENDING)
    assert not list(target.parent.glob(".*.spill"))

    def broken(parts, shard_count, staging, origin, counted):
        raise OSError("disk full")

    monkeypatch.setattr(retained, "write_follow_edges", broken)
    with pytest.raises(OSError, match="disk full"):
        freeze_snapshot(paths, settings, rebuild=True)
    assert not list(target.parent.glob(".*.spill"))


def test_a_failed_spill_leaves_no_stream_open(tmp_path):
    """The read fails at its third chunk: the error reaches the caller, and while it (and its
    traceback, which holds the function's writers) is alive, no file of the spill is open;
    the streams written so far hold the two chunks read."""
    def chunks():
        for number in range(3):
            if number == 2:
                raise OSError(28, "No space left on device")
            yield pl.DataFrame(
                {"follower_id": [10 * number + 1, 10 * number + 2], "followee_id": [7, 8],
                 "created_at": [None, None], "status": ["active", "active"]},
                schema=SNAPSHOT_SCHEMAS["follow_edges"],
            )  # fmt: skip

    spill = tmp_path / "spill"
    # ``failed`` holds the error and its traceback (so the function's frame) until the end
    with pytest.raises(OSError, match="No space left") as failed:  # noqa: F841
        retained.partition_by_shard(chunks(), 4, spill, follow_pairs.LIVE_STORE)
    open_files = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")]  # fmt: skip
    assert not [path for path in open_files if path.startswith(str(spill))]
    rows = sum(pl.read_ipc_stream(path).height for path in spill.glob("*.arrows"))
    assert rows == 4


def test_a_repartition_removes_what_a_killed_one_left(sqlite_settings):
    """A run with another shard count re-partitions the retained snapshot through a spill
    folder beside the run's snapshot/; one left by a killed attempt (SIGKILL: no cleanup runs)
    is removed by the next, and the new plan's partitions hold every edge."""
    settings = sqlite_settings
    freeze_snapshot(RunPaths.create(settings.home, SNAPSHOT_DATE, "four"), settings)
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, "eight")
    killed = paths.snapshot_dir.with_name(".snapshot.999-dead.spill")
    (killed / "000").mkdir(parents=True)
    (killed / "000" / "000000.arrow").write_bytes(b"x" * 1000)
    eight = settings.model_copy(update={"shard_count": 8})
    freeze_snapshot(paths, eight)
    assert not killed.exists() and not list(paths.run_dir.glob(".*.spill"))
    assert len(list((paths.snapshot_dir / "follow_edges").glob("shard_id=*"))) == 8
    edges = pl.read_parquet(paths.snapshot_dir / "follow_edges" / "*" / "*.parquet")
    assert edges.height == len(FOLLOWS) + len(PENDING)


def test_a_freeze_removes_the_staging_a_killed_one_left(sqlite_settings):
    """A freeze killed part-way (SIGKILL: no cleanup runs) leaves its staging folder beside the
    retained snapshot, holding the tables it had written; the next freeze of that date removes
    it and writes the retained snapshot whole."""
    settings = sqlite_settings
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, None)
    target = retained.folder(paths.home, paths.snapshot_date)
    killed = target.with_name(f".{target.name}.999-dead.partial")
    killed.mkdir(parents=True)
    (killed / "users.parquet").write_bytes(b"x" * 1000)
    freeze_snapshot(paths, settings)
    assert not killed.exists() and not list(target.parent.glob(".*.partial"))
    assert retained.is_complete(target)
    assert (target / "users.parquet").read_bytes()[:4] == b"PAR1"


def test_a_full_disk_while_writing_is_not_blamed_on_the_store(sqlite_settings, monkeypatch):
    """Writing users.parquet fails with ENOSPC while the store is being read: the error is the
    disk's, said as such (not "reading the live store failed"), and nothing is left behind."""
    import errno

    settings = sqlite_settings
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, None)
    real = retained.pq.write_table

    def full(table, where, **options):
        if Path(where).name == "users.parquet":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, **options)

    monkeypatch.setattr(retained.pq, "write_table", full)
    with pytest.raises(OSError, match="No space left") as raised:
        freeze_snapshot(paths, settings)
    assert not isinstance(raised.value, LiveStoreError)
    target = retained.folder(paths.home, paths.snapshot_date)
    assert not target.exists() and not list(target.parent.glob(".*.partial"))


@pytest.mark.parametrize(
    "user_ids",
    [[1, 2, 3, 5], [0, 1 << 40, 3, 7], [-4, 2, 3, 9]],
    ids=["dense (bitmap)", "sparse (is_in)", "negative (is_in)"],
)
def test_unknown_accounts_by_bitmap_or_hash_count_the_same_rows(user_ids):
    """The bitmap's answer equals Polars' is_in for ids inside, above and below the bitmap:
    random pairs over ids -5..12 and two far ones, counted with an is_in written here."""
    rng = np.random.default_rng(3)
    pool = np.concatenate([np.arange(-5, 13), [1 << 40, 1 << 62]])
    pairs = [*map(tuple, rng.choice(pool, size=(400, 2))), (1, 4), (2, 3), (4, 4)]
    chunk = pl.DataFrame(pairs, schema=follow_pairs.KEYS, orient="row")
    tally = follow_pairs.UnknownAccounts(pl.Series(user_ids))
    assert (tally._bitmap is not None) == (user_ids == [1, 2, 3, 5])
    for piece in (chunk.head(150), chunk.slice(150, 250), chunk.tail(3)):  # last: ids 1..4 only
        tally.tally(piece)
    known = set(user_ids)
    expected = sorted(
        (int(a), int(b)) for a, b in pairs if a != b and (a not in known or b not in known)
    )
    assert tally.as_dict() == {"rows": len(expected), "example": list(expected[0])}


@pytest.mark.parametrize("another_row_fails", [False, True])
def test_a_null_account_id_is_left_out_whether_or_not_other_rows_are(another_row_fails):
    """(From a review.) With an account created after the cut-off, a block naming a NULL
    account is left out (and counted) the same whether another row fails the cut-off or not:
    the shortcut that keeps a frame whole must not read a NULL as a pass."""
    cut_off = dt.datetime(2026, 11, 2)
    late = cut_off + dt.timedelta(hours=1) if another_row_fails else cut_off - dt.timedelta(days=1)
    blocks = pl.DataFrame(
        {"blocker_id": [1, 2], "blocked_id": [None, 3],
         "created_at": [cut_off - dt.timedelta(days=1), late]},
        schema={"blocker_id": pl.Int64, "blocked_id": pl.Int64, "created_at": pl.Datetime("us")},
    )  # fmt: skip
    excluded: dict[str, int] = {}
    kept = point_in_time.as_of(blocks, "blocks", cut_off, pl.Series([9]), excluded)
    assert kept["blocker_id"].to_list() == ([] if another_row_fails else [2])
    assert excluded == {"blocks": 2 if another_row_fails else 1}
