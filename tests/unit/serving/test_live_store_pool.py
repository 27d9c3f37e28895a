"""The read path's live-store connections: bounded, returned after each use, the store's
identity checked at checkout.

A small SQLite live store (schema of ``recs.store``; users 1 and 2, 1 follows 2).
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import threading

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import event, insert

from recs.errors import StoreUnavailableError, UnknownUserError
from recs.serving.live_store import LiveStore
from recs.store import schema as live
from recs.store.connections import engine_for

OLD = dt.datetime(2026, 1, 1)


@pytest.fixture
def url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    engine = engine_for(url)
    live.create_schema(engine)
    with engine.begin() as connection:
        connection.execute(
            insert(live.users),
            [dict(user_id=u, created_at=OLD, last_active_at=OLD, account_status="active",
                  is_discoverable=True) for u in (1, 2)],
        )  # fmt: skip
        connection.execute(
            insert(live.follow_edges),
            [dict(follower_id=1, followee_id=2, created_at=OLD, status="active")],
        )
    engine.dispose()
    return url


def test_threads_that_come_and_go_never_exhaust_the_pool(url):
    """Pool of 2, 40 threads one after another (each reads, then ends, as a thread pool
    retires idle threads): every read succeeds and no connection stays checked out. (Held
    per thread, the third thread would wait 300 ms and fail.)"""
    store = LiveStore(url, timeout_ms=300, pool_size=2)
    results = []
    for _ in range(40):
        thread = threading.Thread(target=lambda: results.append(store.follows(1, None, 64)))
        thread.start()
        thread.join()
    assert results == [{2: "active"}] * 40
    assert store.checked_out() == 0
    store.close()


def test_a_session_holds_one_connection_until_it_ends(url):
    store = LiveStore(url, timeout_ms=300, pool_size=2)
    with store.session():
        assert store.account(1, 5).following == 1
        assert store.follows(1, [2]) == {2: "active"}
        assert store.checked_out() == 1
    assert store.checked_out() == 0
    store.close()


def test_all_connections_busy_is_503_after_the_timeout(url):
    """Two threads hold the two connections (open sessions); a third read fails after 300 ms
    with a message naming the cause."""
    store = LiveStore(url, timeout_ms=300, pool_size=2)
    holding, release = threading.Barrier(3), threading.Event()

    def hold():
        with store.session():
            store.interests(1)
            holding.wait()
            release.wait()

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for thread in threads:
        thread.start()
    holding.wait()
    try:
        with pytest.raises(StoreUnavailableError) as raised:
            store.interests(1)
    finally:
        release.set()
        for thread in threads:
            thread.join()
    assert str(raised.value) == (
        "live store unavailable (interests): all 2 connections busy for 300 ms "
        "(RECS_API_STORE_CONNECTIONS)"
    )
    assert store.interests(1) == []
    store.close()


def test_a_replaced_file_is_reopened(url, tmp_path):
    """A copy where user 1 follows nobody is renamed over the store: the next read is the
    copy's, and the reconnect is counted."""
    path = tmp_path / "live.db"
    store = LiveStore(url, timeout_ms=300, pool_size=2)
    assert store.follows(1, None, 64) == {2: "active"}
    copy = tmp_path / "copy.db"
    with sqlite3.connect(path) as source, sqlite3.connect(copy) as target:
        source.backup(target)  # a consistent copy, as `sqlite3 live.db .backup copy.db` makes
        target.execute("DELETE FROM follow_edges")
        target.commit()
        target.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = (
        REGISTRY.get_sample_value("recs_api_store_reconnects_total", {"reason": "replaced"}) or 0.0
    )
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"live.db{suffix}").unlink(missing_ok=True)
    os.replace(copy, path)
    assert store.follows(1, None, 64) == {}
    after = REGISTRY.get_sample_value("recs_api_store_reconnects_total", {"reason": "replaced"})
    assert after == before + 1
    store.close()


def test_a_deleted_file_is_503_and_a_write_is_refused(url, tmp_path):
    store = LiveStore(url, timeout_ms=300, pool_size=2)
    assert store.follows(1, None, 64) == {2: "active"}
    for path in tmp_path.glob("live.db*"):
        path.unlink()
    with pytest.raises(StoreUnavailableError, match="no SQLite file at"):
        store.follows(1, None, 64)
    with pytest.raises(StoreUnavailableError, match="no SQLite file at"):
        store.add_dismissal(1, 2, OLD)
    assert not (tmp_path / "live.db").exists()  # never recreated empty
    store.close()


def test_writes_that_wait_for_a_commit_are_committed_together(url, tmp_path):
    """Another writer holds SQLite's write lock while dismissal (1, 2) waits for it; three more
    arrive meanwhile: (2, 1) twice and (1, 99) (no user 99). Released, (1, 2) commits alone and
    the three queued behind it go in one transaction: 2 COMMITs (one per write: 3). Each is
    answered as alone: (2, 1) created once and then already there, at OLD; (1, 99) refused on
    its own (its savepoint rolled back) without undoing the others."""
    store = LiveStore(url, timeout_ms=5000, pool_size=2)
    statements: list[str] = []
    event.listen(
        store._engine, "connect", lambda dbapi, _record: dbapi.set_trace_callback(statements.append)
    )
    holder = sqlite3.connect(tmp_path / "live.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    outcomes: list[tuple[tuple[int, int], object]] = []

    def dismiss(user_id, candidate_id):
        try:
            outcome = store.add_dismissal(user_id, candidate_id, OLD)
        except UnknownUserError as error:
            outcome = str(error)
        outcomes.append(((user_id, candidate_id), outcome))

    first = threading.Thread(target=dismiss, args=(1, 2))
    first.start()
    while not store._group._busy:  # (1, 2) leads, waiting for the lock
        threading.Event().wait(0.001)
    queued = [threading.Thread(target=dismiss, args=pair) for pair in ((2, 1), (2, 1), (1, 99))]
    for thread in queued:
        thread.start()
    while len(store._group._waiting) < 3:  # all three behind it
        threading.Event().wait(0.001)
    holder.execute("COMMIT")
    for thread in (first, *queued):
        thread.join()
    assert sorted(outcomes, key=repr) == sorted(
        [
            ((1, 2), (True, OLD)),
            ((2, 1), (True, OLD)),
            ((2, 1), (False, OLD)),
            ((1, 99), "unknown candidate 99: not in the live store"),
        ],
        key=repr,
    )
    assert statements.count("COMMIT") == 2
    kept = holder.execute("SELECT user_id, candidate_id FROM dismissed_candidates").fetchall()
    assert sorted(kept) == [(1, 2), (2, 1)]
    holder.close()
    store.close()
