"""The live store deleted, replaced and restored under a running ``recs serve --workers 2``.

While a reader thread keeps asking for user 3's list, the store disappears: every answer is
503 naming the cause (never a 200 from a store that is gone), a dismissal is refused (never a
201 for a write nobody can keep), ``/healthz`` stays 200. The store comes back as another file
or database: answers are 200 again and come from it (a dismissal made there is honoured).

World (``api_fixtures``): user 1's list is 20 21 22 23 24; user 3's is 20.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from api_fixtures import bearer, make_world
from servers import BIN, served
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

pytestmark = pytest.mark.slow

WTF = "/v1/users/{}/who-to-follow"


class Reader(threading.Thread):
    """GETs user 3's list in a loop; records (monotonic time, status)."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base, self.stop, self.seen = base, threading.Event(), []

    def run(self) -> None:
        with httpx.Client(base_url=self.base, headers=bearer(3), timeout=10) as client:
            while not self.stop.is_set():
                status = client.get(WTF.format(3)).status_code
                self.seen.append((time.monotonic(), status))

    def statuses(self, start: float, end: float = float("inf")) -> set[int]:
        return {status for at, status in self.seen if start <= at <= end}


def _items(client: httpx.Client, user: int) -> list[int]:
    response = client.get(WTF.format(user), headers=bearer(user))
    assert response.status_code == 200, response.text
    return [item["candidate_id"] for item in response.json()["items"]]


def _wait_for(predicate, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _ingest_dismiss(world, user: int, candidate: int) -> None:
    """A dismiss event through ``recs ingest`` (a separate process, as upstream delivers it)."""
    event = {
        "event_id": f"test-dismiss-{user}-{candidate}",
        "event_type": "dismiss",
        "event_time": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "actor_id": user,
        "target_id": candidate,
    }
    path = world.home / f"events-{user}-{candidate}.jsonl"
    path.write_text(json.dumps(event) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECS_")}
    env["RECS_HOME"] = str(world.home)
    if world.settings.store_url:
        env["RECS_STORE_URL"] = world.settings.store_url
    done = subprocess.run(
        [str(BIN / "recs"), "ingest", str(path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_sqlite_store_deleted_then_restored_from_a_copy(tmp_path):
    """``rm live.db*`` under load: 503 "no SQLite file" for reads and the dismissal; then a copy
    taken before is renamed into place and a dismissal of 20 by user 1 ingested into it: the
    API serves from the copy (200) and drops 20; a dismissal posted now is in that file."""
    world = make_world(tmp_path / "home")
    world.engine.dispose()
    live = world.home / "live.db"
    spare = world.home / "spare.db"
    with sqlite3.connect(live) as source, sqlite3.connect(spare) as target:
        source.backup(target)
    with served(world, workers=2) as server, httpx.Client(base_url=server.base) as client:
        assert _items(client, 1) == [20, 21, 22, 23, 24]
        reader = Reader(server.base)
        reader.start()
        time.sleep(0.3)
        gone = time.monotonic()
        for path in world.home.glob("live.db*"):
            path.unlink()
        time.sleep(0.05)  # a request in flight when the file went may still finish
        settled = time.monotonic()
        response = client.get(WTF.format(1), headers=bearer(1))
        assert response.status_code == 503
        assert f"no SQLite file at {live}" in response.json()["detail"]
        post = client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=bearer(1))
        assert post.status_code == 503, post.text
        assert client.get("/healthz").status_code == 200
        time.sleep(0.3)
        back = time.monotonic()
        os.rename(spare, live)
        _wait_for(lambda: client.get(WTF.format(1), headers=bearer(1)).status_code == 200)
        recovered = time.monotonic()
        _ingest_dismiss(world, 1, 20)
        for _ in range(10):  # both workers, whichever answers
            assert _items(client, 1) == [21, 22, 23, 24]
        post = client.post("/v1/users/1/dismissals", json={"candidate_id": 22}, headers=bearer(1))
        assert post.status_code == 201, post.text
        time.sleep(0.5)  # the reader's answers after the recovery, however fast it came
        reader.stop.set()
        reader.join(timeout=10)
    assert reader.statuses(0, gone) == {200}
    assert reader.statuses(settled, back) == {503}
    assert recovered - back < 1.0
    # From the recovery on, not from a fixed time after `back`: when the rest of the test takes
    # under a second (a quiet machine), such a window is empty.
    assert reader.statuses(recovered + 0.1) == {200}
    with sqlite3.connect(live) as connection:
        kept = connection.execute(
            "SELECT candidate_id FROM dismissed_candidates WHERE user_id = 1 ORDER BY 1"
        ).fetchall()
    assert kept == [(20,), (22,)]  # 21 was refused while the store was gone


def test_sqlite_store_replaced_by_another_file(tmp_path):
    """A copy where user 1 already dismissed 23 is renamed over live.db: the next answers come
    from the copy (23 dropped) on both workers, with no error."""
    world = make_world(tmp_path / "home")
    world.engine.dispose()
    live = world.home / "live.db"
    other = world.home / "other.db"
    with sqlite3.connect(live) as source, sqlite3.connect(other) as target:
        source.backup(target)
    with sqlite3.connect(other) as connection:
        connection.execute(
            "INSERT INTO dismissed_candidates (user_id, candidate_id, dismissed_at) "
            "VALUES (1, 23, '2026-11-10 12:00:00.000000')"
        )
        connection.commit()
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with served(world, workers=2) as server, httpx.Client(base_url=server.base) as client:
        assert _items(client, 1) == [20, 21, 22, 23, 24]
        reader = Reader(server.base)
        reader.start()
        time.sleep(0.3)
        for path in (world.home / "live.db-wal", world.home / "live.db-shm"):
            path.unlink(missing_ok=True)
        os.replace(other, live)
        for _ in range(10):
            assert _items(client, 1) == [20, 21, 22, 24]
        reader.stop.set()
        reader.join(timeout=10)
    assert {status for _, status in reader.seen} == {200}


def test_postgres_database_dropped_and_recreated(tmp_path, postgres_url):
    """``DROP DATABASE … WITH (FORCE)`` under load: 503 while it is gone (the dismissal too),
    then the same name is created again with user 1 having dismissed 24: 200 again, from the
    new database, without a restart."""
    world = make_world(tmp_path / "home", postgres_url)
    world.engine.dispose()
    url = make_url(postgres_url)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with served(world, workers=2) as server, httpx.Client(base_url=server.base) as client:
        assert _items(client, 1) == [20, 21, 22, 23, 24]
        reader = Reader(server.base)
        reader.start()
        time.sleep(0.3)
        gone = time.monotonic()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE "{url.database}" WITH (FORCE)'))
        settled = time.monotonic()
        assert client.get(WTF.format(1), headers=bearer(1)).status_code == 503
        post = client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=bearer(1))
        assert post.status_code == 503
        assert client.get("/healthz").status_code == 200
        time.sleep(0.3)
        back = time.monotonic()
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{url.database}" TEMPLATE template0'))
        fresh = make_world(tmp_path / "again", postgres_url)
        fresh.dismiss(1, 24)
        fresh.engine.dispose()
        _wait_for(lambda: client.get(WTF.format(1), headers=bearer(1)).status_code == 200)
        recovered = time.monotonic()
        for _ in range(10):
            assert _items(client, 1) == [20, 21, 22, 23]
        time.sleep(0.5)
        reader.stop.set()
        reader.join(timeout=10)
    admin.dispose()
    assert reader.statuses(0, gone) == {200}
    assert reader.statuses(settled + 0.1, back) == {503}
    assert recovered - back < 5.0
    assert reader.statuses(recovered + 0.1) == {200}


def test_helpers_are_importable():
    """The server helper runs the installed ``recs`` of this interpreter."""
    assert Path(BIN / "recs").exists() and Path(sys.executable).exists()
