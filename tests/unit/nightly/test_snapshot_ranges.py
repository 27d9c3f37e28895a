"""The freeze reads follow_edges in parts, one connection and thread each, in one snapshot.

``Settings.snapshot_read_connections`` (2 by default) connections read disjoint parts of the
table (``recs.store.readers``, ``iter_ranges``: ranges of ``follower_id``; on PostgreSQL its
partitions); ``retained.read_follow_edges`` partitions each on a thread of its own. That a NULL
key is still read (and refused) is ``test_snapshot.py::test_a_store_that_breaks_the_pair_rule...``.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from recs.config import Settings
from recs.nightly import retained
from recs.nightly.runs import RunPaths
from recs.nightly.snapshot import freeze_snapshot
from recs.store import connections, readers
from recs.store.connections import engine_for
from recs.store.readers import open_reader
from tests.unit.nightly.test_snapshot import (
    FOLLOWS,
    PENDING,
    SNAPSHOT_DATE,
    WRITER,
    build_store,
    read_edges,
    snapshot_bytes,
)


@pytest.fixture
def settings(store_url: str, tmp_path) -> Settings:
    url = None if store_url.startswith("sqlite") else store_url
    settings = Settings(home=tmp_path / "home", shard_count=4, store_url=url)
    build_store(settings)
    return settings


def test_any_number_of_connections_writes_the_same_bytes(settings):
    """1, 2, 3 and 16 connections (16 > the 6 follower ids: at most one range per id) give
    the same files; the parts cover every edge once: on SQLite ranges of follower_id, on
    PostgreSQL the table's hash partitions dealt out to the connections."""
    frozen = {}
    for count in (1, 2, 3, 16):
        run = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
        freeze_snapshot(run, settings.model_copy(update={"snapshot_read_connections": count}),
                        rebuild=True)  # fmt: skip
        frozen[count] = snapshot_bytes(run)
        assert read_edges(run).height == len(FOLLOWS) + len(PENDING)
    assert frozen[2] == frozen[1] and frozen[3] == frozen[1] and frozen[16] == frozen[1]
    with open_reader(settings.live_store_url, 3) as reader:
        parts = reader.iter_ranges("follow_edges", "follower_id")
        assert len(parts) == 3
        followers = [sorted({i for f in part for i in f["follower_id"]}) for part in parts]
    if settings.live_store_url.startswith("sqlite"):
        # ids 1..6 in three equal spans: [1, 3), [3, 5), [5, 7) (and no NULL key)
        assert followers == [[1, 2], [3, 4], [5, 6]]
    else:  # the 16 hash partitions dealt out to 3 connections: disjoint follower sets
        assert sorted(i for ids in followers for i in ids) == [1, 2, 3, 4, 5, 6]


def test_a_commit_between_the_connections_opening_is_in_none_of_them(settings, monkeypatch):
    """A writer commits the follow 6 -> 5 after the first connection has begun its read and
    before the second begins (the test holds the second back 1.5 s): neither may see it.
    SQLite: the writer waits for the write lock the freeze holds while its connections open,
    then commits; PostgreSQL: it commits at once, and the second connection reads the first
    one's exported snapshot. Without either, the second connection (whose part holds
    follower 6) reads the edge."""
    writer: list[subprocess.Popen] = []
    opened = []
    for reader_class in (readers._AdbcSqliteReader, readers._AdbcPostgresReader):
        begin_one = reader_class._begin_one

        def begin_and_commit_between(self, begin_one=begin_one):
            opened.append(self)
            if len(opened) == 2:  # the second connection, the first one's read begun
                writer.append(subprocess.Popen(
                    [sys.executable, "-c", WRITER, settings.live_store_url, "30"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                ))  # fmt: skip
                time.sleep(1.5)
            return begin_one(self)

        monkeypatch.setattr(reader_class, "_begin_one", begin_and_commit_between)
    run = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
    freeze_snapshot(run, settings)
    [process] = writer
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    edges = read_edges(run)
    assert (6, 5) not in set(zip(edges["follower_id"], edges["followee_id"], strict=True))
    assert edges.height == len(FOLLOWS) + len(PENDING)


def test_a_failed_snapshot_export_reads_with_one_connection(
    postgres_url, tmp_path, monkeypatch, caplog
):
    """PostgreSQL: ``pg_export_snapshot()`` fails (here a call the server refuses, in the same
    transaction), which aborts the first connection's transaction: the reader begins a new one
    and reads everything on it alone, saying so."""
    settings = Settings(home=tmp_path / "home", shard_count=4, store_url=postgres_url)
    build_store(settings)
    rows = readers._AdbcPostgresReader._rows

    def refused_export(self, sql):
        return rows(self, sql.replace("pg_export_snapshot()", "pg_export_snapshot(1)"))

    monkeypatch.setattr(readers._AdbcPostgresReader, "_rows", refused_export)
    with caplog.at_level(logging.WARNING, logger="recs.store.readers"):
        run = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
        freeze_snapshot(run, settings)
    assert read_edges(run).height == len(FOLLOWS) + len(PENDING)
    assert "the snapshot reads with one connection" in caplog.text


LOCK_HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    connection = sqlite3.connect(sys.argv[1], isolation_level=None)
    connection.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.read()  # until the test closes the pipe
    connection.execute("ROLLBACK")
    """
)


def test_a_held_write_lock_makes_the_freeze_read_with_one_connection(tmp_path, monkeypatch, caplog):
    """Another process holds SQLite's write lock (a bulk load): the freeze cannot pause writers,
    so after its busy timeout (shortened to 0.2 s) it reads with one connection, says so, and
    still freezes every edge."""
    settings = Settings(home=tmp_path / "home", shard_count=4)
    build_store(settings)
    monkeypatch.setitem(connections.SQLITE_PRAGMAS, "snapshot", (("busy_timeout", 200),))
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(settings.home / "live.db")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        with open_reader(settings.live_store_url, 2) as reader:
            assert len(reader.iter_ranges("follow_edges", "follower_id")) == 1
        run = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
        with caplog.at_level(logging.WARNING, logger="recs.store.readers"):
            freeze_snapshot(run, settings, rebuild=True)
    finally:
        holder.communicate("", timeout=30)
    assert read_edges(run).height == len(FOLLOWS) + len(PENDING)
    assert "reads" in caplog.text and "with one connection: the write lock was not free" in (
        caplog.text
    )


def test_a_range_that_fails_stops_the_others_and_its_error_is_raised(tmp_path, monkeypatch):
    """The second range's spill fails at its first chunk (a full disk); the first range (if its
    first chunk is read before the failure, it waits for it and then a second) takes no further
    chunk (2-row chunks: it has 3),
    and the freeze raises the second range's error and leaves no snapshot."""
    settings = Settings(home=tmp_path / "home", shard_count=4)
    build_store(settings)
    monkeypatch.setattr(readers, "READ_BATCH_ROWS", 1)
    monkeypatch.setattr(readers, "READ_CHUNK_ROWS", 2)
    failed = threading.Event()
    taken: list[int] = []
    partition = retained.partition_by_shard

    def partition_one_range(chunks, shard_count, spill, origin):
        def watched():
            for number, chunk in enumerate(chunks):
                if spill.name == "range-01":
                    failed.set()
                    raise OSError(28, "No space left on device")
                if number == 0:
                    assert failed.wait(30)
                    time.sleep(1.0)  # the freeze sees the failure and stops the others
                taken.append(number)
                yield chunk

        return partition(watched(), shard_count, spill, origin)

    monkeypatch.setattr(retained, "partition_by_shard", partition_one_range)
    run = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
    with pytest.raises(OSError, match="No space left"):
        freeze_snapshot(run, settings, rebuild=True)
    assert taken in ([], [0])  # at most the chunk it held when the other failed, not 3
    assert not run.snapshot_dir.exists()
    assert not retained.is_complete(retained.folder(run.home, run.snapshot_date))


def test_an_interrupt_while_waiting_stops_every_range(tmp_path, monkeypatch):
    """The freeze's thread is interrupted (Ctrl-C) while it waits for the ranges: they stop at
    their next chunk rather than reading on (2-row chunks, 3 a range, 0.3 s each), and the
    interrupt is raised."""
    settings = Settings(home=tmp_path / "home", shard_count=4)
    build_store(settings)
    monkeypatch.setattr(readers, "READ_BATCH_ROWS", 1)
    monkeypatch.setattr(readers, "READ_CHUNK_ROWS", 2)
    taken: list[str] = []
    partition = retained.partition_by_shard

    def slow(chunks, shard_count, spill, origin):
        def each():
            for chunk in chunks:
                taken.append(spill.name)
                time.sleep(0.3)
                yield chunk

        return partition(each(), shard_count, spill, origin)

    def interrupted(futures, return_when):
        time.sleep(0.1)
        raise KeyboardInterrupt

    monkeypatch.setattr(retained, "partition_by_shard", slow)
    monkeypatch.setattr(retained, "wait", interrupted)
    run = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
    with pytest.raises(KeyboardInterrupt):
        freeze_snapshot(run, settings, rebuild=True)
    assert taken.count("range-00") <= 1 and taken.count("range-01") <= 1


def test_a_refused_second_connection_reads_with_those_that_opened(postgres_url, tmp_path, caplog):
    """PostgreSQL: the store's role may open one connection (``CONNECTION LIMIT 1``), so the
    second one is refused ("too many connections for role"): the freeze reads with the first
    alone, says so, and freezes every edge."""
    from sqlalchemy import make_url

    settings = Settings(home=tmp_path / "home", shard_count=4, store_url=postgres_url)
    build_store(settings)
    role = f"recs_one_{uuid.uuid4().hex[:8]}"
    engine = engine_for(postgres_url)
    with engine.begin() as connection:
        database = connection.exec_driver_sql("SELECT current_database()").scalar()
        for statement in (
            f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 1",
            f"GRANT CONNECT ON DATABASE {database} TO {role}",
            f"GRANT USAGE ON SCHEMA public TO {role}",
            f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}",
        ):
            connection.exec_driver_sql(statement)
    engine.dispose()
    limited = make_url(postgres_url).set(username=role).render_as_string(hide_password=False)
    settings = settings.model_copy(update={"store_url": limited})
    with caplog.at_level(logging.WARNING, logger="recs.store.readers"):
        run = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
        freeze_snapshot(run, settings)
    assert read_edges(run).height == len(FOLLOWS) + len(PENDING)
    assert "the snapshot reads with 1 connection(s): another could not join" in caplog.text
