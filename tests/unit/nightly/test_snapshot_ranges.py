"""The freeze reads follow_edges in key ranges, one connection and thread each, in one snapshot.

``Settings.snapshot_read_connections`` (2 by default) connections read disjoint ranges of
``follower_id`` (``recs.store.readers``, ``iter_ranges``); ``retained.read_follow_edges``
partitions each on a thread of its own. That the ranges all see one instant is
``test_snapshot.py::test_snapshot_is_one_read_transaction_that_never_blocks_writers``; that a
NULL key is still read (and refused) is its ``test_a_store_that_breaks_the_pair_rule...``.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from recs.config import Settings
from recs.nightly import retained
from recs.nightly.runs import RunPaths
from recs.nightly.snapshot import freeze_snapshot
from recs.store import connections, readers
from recs.store.readers import open_reader
from tests.unit.nightly.test_snapshot import (
    FOLLOWS,
    PENDING,
    SNAPSHOT_DATE,
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
    the same files; the ranges cover every edge once, in ascending follower_id."""
    frozen = {}
    for count in (1, 2, 3, 16):
        run = RunPaths.create(settings.home, SNAPSHOT_DATE, "test-run")
        freeze_snapshot(run, settings.model_copy(update={"snapshot_read_connections": count}),
                        rebuild=True)  # fmt: skip
        frozen[count] = snapshot_bytes(run)
        assert read_edges(run).height == len(FOLLOWS) + len(PENDING)
    assert frozen[2] == frozen[1] and frozen[3] == frozen[1] and frozen[16] == frozen[1]
    with open_reader(settings.live_store_url, 3) as reader:
        ranges = reader.iter_ranges("follow_edges", "follower_id")
        assert len(ranges) == 3
        followers = [sorted(set(f["follower_id"].to_list()) - {None}) for r in ranges for f in r]
    # ids 1..6 in three equal spans: [1, 3), [3, 5), [5, 7); each range's frames, then the
    # first range's (empty) read of NULL keys
    assert [ids for ids in followers if ids] == [[1, 2], [3, 4], [5, 6]]


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
    """The second range's spill fails at its first chunk (a full disk); the first range, which
    waits for that failure and then a second, takes no further chunk (2-row chunks: it has 3),
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
    assert taken == [0]
    assert not run.snapshot_dir.exists()
    assert not retained.is_complete(retained.folder(run.home, run.snapshot_date))
