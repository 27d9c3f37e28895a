"""A tiny hand-built world for the read path: a live store (SQLite, WAL) and published versions
written directly in the ``recs.published`` layout (no pipeline run: fast, exact).

The clock is fixed at ``NOW`` = 2026-11-10 12:00 (naive UTC). Accounts (all ``active`` and
discoverable, created 2026-01-01, unless said otherwise)::

    1  established: follows 10 11 12 13 14 (5 active follows); tags music
    2  NEW: created NOW - 1 h; follows 10; tags music, sports
    3  thin: follows 10 11 (2); tags sports; has batch rows anyway
    4  follows 10 11 12 13 14 30; tags music; no batch rows
    5  suspended (a requester who gets no list)
    6  follows 10 11 12 13 14; batch rows [20] only
    10..14, 20..24, 30..35 ordinary accounts;
    40 suspended since the snapshot; 41 no longer discoverable since the snapshot

Version ``night_1`` (``V1_ROWS``; 4 shards): user 1 → 20 21 22 23 24 (ranks 1..5), user 3 →
20, user 6 → 20. Popularity index (``POPULARITY``; in-degree in brackets): music 30 (90),
31 (80), 2 (70), 40 (60); sports 32 (85), 33 (75); _global 30 32 31 33 2 40 41 34 35.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest
from sqlalchemy import insert, text

from recs.config import Settings
from recs.contracts import EXPORT_SCHEMAS, RECOMMENDATION_SCHEMA
from recs.published import shard_file
from recs.serving.auth import mint_token
from recs.sharding import shard_of
from recs.store import schema as live
from recs.store.connections import engine_for

SECRET = "test-secret-0123456789-abcdefghijklmnop"
NOW = dt.datetime(2026, 11, 10, 12, 0, 0)
OLD = dt.datetime(2026, 1, 1)
GENERATED_AT = dt.datetime(2026, 11, 2)

# user -> [(candidate_id, mutual_count, followed_by)] in rank order
V1_ROWS: dict[int, list[tuple[int, int, list[int]]]] = {
    1: [
        (20, 7, [10, 11, 12]),
        (21, 3, [11, 12, 13]),
        (22, 2, [12, 13]),
        (23, 2, [13, 14]),
        (24, 2, [10, 14]),
    ],
    3: [(20, 2, [10, 11])],
    6: [(20, 2, [10, 11])],
}
POPULARITY: dict[str, list[tuple[int, int]]] = {
    "music": [(30, 90), (31, 80), (2, 70), (40, 60)],
    "sports": [(32, 85), (33, 75)],
    "_global": [
        (30, 90), (32, 85), (31, 80), (33, 75), (2, 70), (40, 60), (41, 55), (34, 50), (35, 45),
    ],
}  # fmt: skip
IN_DEGREES = {30: 90, 32: 85, 31: 80, 33: 75, 2: 70, 40: 60, 41: 55, 34: 50, 35: 45, 20: 40,
              21: 39, 22: 38, 23: 37, 24: 36}  # fmt: skip


@dataclass
class World:
    home: Path
    settings: Settings
    engine: object

    @property
    def published(self) -> Path:
        return self.settings.published_dir

    def execute(self, sql: str, **params) -> None:
        with self.engine.begin() as connection:
            connection.execute(text(sql), params)

    def follow(self, follower: int, followee: int, status: str = "active") -> None:
        self._insert(live.follow_edges, follower_id=follower, followee_id=followee,
                     created_at=NOW, status=status)  # fmt: skip

    def block(self, blocker: int, blocked: int) -> None:
        self._insert(live.blocks, blocker_id=blocker, blocked_id=blocked, created_at=NOW)

    def mute(self, muter: int, muted: int) -> None:
        self._insert(live.mutes, muter_id=muter, muted_id=muted, created_at=NOW)

    def dismiss(self, user: int, candidate: int) -> None:
        self._insert(live.dismissed_candidates, user_id=user, candidate_id=candidate,
                     dismissed_at=NOW)  # fmt: skip

    def set_account(self, user: int, **values) -> None:
        with self.engine.begin() as connection:
            connection.execute(live.users.update().where(live.users.c.user_id == user), values)

    def _insert(self, table, **row) -> None:
        with self.engine.begin() as connection:
            connection.execute(insert(table), [row])

    def write_version(
        self,
        run_id: str,
        rows: dict[int, list[tuple[int, int, list[int]]]] = V1_ROWS,
        *,
        popularity: dict[str, list[tuple[int, int]]] = POPULARITY,
        in_degrees: dict[int, int] = IN_DEGREES,
        shard_count: int = 4,
        snapshot_date: str = "2026-11-01",
        current: bool = True,
    ) -> None:
        write_version(self.published, run_id, rows, popularity=popularity,
                      in_degrees=in_degrees, shard_count=shard_count,
                      snapshot_date=snapshot_date)  # fmt: skip
        if current:
            point_current(self.published, run_id)


def recommendation_frame(rows: dict[int, list[tuple[int, int, list[int]]]], run_id: str):
    records = [
        (user, candidate, mutual, 1.0 - rank / 10, rank, followed)
        for user, listed in rows.items()
        for rank, (candidate, mutual, followed) in enumerate(listed, start=1)
    ]
    return pl.DataFrame(
        {
            "user_id": [r[0] for r in records],
            "candidate_id": [r[1] for r in records],
            "mutual_count": [r[2] for r in records],
            "score": [r[3] for r in records],
            "rank": [r[4] for r in records],
            "followed_by": [r[5] for r in records],
            "generated_at": [GENERATED_AT] * len(records),
            "run_id": [run_id] * len(records),
        },
        schema=RECOMMENDATION_SCHEMA,
    )


def write_version(
    published: Path,
    run_id: str,
    rows: dict[int, list[tuple[int, int, list[int]]]],
    *,
    popularity: dict[str, list[tuple[int, int]]],
    in_degrees: dict[int, int],
    shard_count: int,
    snapshot_date: str,
) -> None:
    """One complete version in the published layout (manifest last, sizes recorded)."""
    root = published / run_id
    frame = recommendation_frame(rows, run_id)
    shards = []
    for shard_id in range(shard_count):
        mine = frame.filter(
            pl.col("user_id").map_elements(
                lambda u, s=shard_id: shard_of(u, shard_count) == s, return_dtype=pl.Boolean
            )
        ).sort("user_id", "rank")
        path = shard_file(published, run_id, shard_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        mine.write_parquet(path)
        shards.append({"shard_id": shard_id, "path": str(path.relative_to(root)),
                       "rows": mine.height, "users": mine["user_id"].n_unique(),
                       "bytes": path.stat().st_size})  # fmt: skip
    index = pl.DataFrame(
        [
            (tag, candidate, rank, degree)
            for tag, listed in popularity.items()
            for rank, (candidate, degree) in enumerate(listed, start=1)
        ],
        schema=EXPORT_SCHEMAS["popularity_index"],
        orient="row",
    )
    index.write_parquet(root / "popularity_index.parquet")
    profiles = pl.DataFrame(
        [(c, "active", OLD, True, d, True) for c, d in sorted(in_degrees.items())],
        schema=EXPORT_SCHEMAS["candidate_profiles"],
        orient="row",
    )
    profiles.write_parquet(root / "candidate_profiles.parquet")
    exports = [
        {"path": name, "bytes": (root / name).stat().st_size}
        for name in ("popularity_index.parquet", "candidate_profiles.parquet")
    ]
    manifest = {
        "run_id": run_id,
        "snapshot_date": snapshot_date,
        "generated_at": GENERATED_AT.isoformat(),
        "shard_count": shard_count,
        "rows": frame.height,
        "users": len(rows),
        "shards": shards,
        "exports": exports,
    }
    (root / "manifest.json").write_text(json.dumps(manifest))


def point_current(published: Path, run_id: str) -> None:
    tmp = published / ".CURRENT.tmp"
    tmp.write_text(f"{run_id}\n")
    tmp.replace(published / "CURRENT")


def make_store(settings: Settings):
    engine = engine_for(settings.live_store_url)
    live.create_schema(engine, drop_existing=STORE_URL is not None)
    ordinary = [10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 30, 31, 32, 33, 34, 35, 40, 41]
    created = {u: OLD for u in [1, 3, 4, 5, 6, *ordinary]} | {2: NOW - dt.timedelta(hours=1)}
    # Every row names every column: an executemany takes its columns from the first row.
    users = [
        dict(
            user_id=u,
            created_at=at,
            last_active_at=at,
            account_status="suspended" if u == 5 else "active",
            is_discoverable=True,
        )
        for u, at in sorted(created.items())
    ]
    follows = [(1, f) for f in (10, 11, 12, 13, 14)] + [(2, 10), (3, 10), (3, 11)]
    follows += [(4, f) for f in (10, 11, 12, 13, 14, 30)] + [(6, f) for f in (10, 11, 12, 13, 14)]
    interests = [(1, "music"), (2, "music"), (2, "sports"), (3, "sports"), (4, "music")]
    with engine.begin() as connection:
        connection.execute(insert(live.users), users)
        connection.execute(
            insert(live.follow_edges),
            [dict(follower_id=a, followee_id=b, created_at=OLD, status="active")
             for a, b in follows],
        )  # fmt: skip
        connection.execute(
            insert(live.user_interests), [dict(user_id=u, tag=t) for u, t in interests]
        )
        # Changed since the snapshot: 40 suspended, 41 hidden.
        connection.execute(
            live.users.update().where(live.users.c.user_id == 40), {"account_status": "suspended"}
        )
        connection.execute(
            live.users.update().where(live.users.c.user_id == 41), {"is_discoverable": False}
        )
    return engine


STORE_URL = os.environ.get("RECS_API_TEST_STORE_URL")
"""Run the suite against another live store (e.g. ``postgresql+psycopg://…/recs_api_test``,
an empty database this suite may drop tables in); default a SQLite file per test."""


def make_world(home: Path, store_url: str | None = STORE_URL) -> World:
    """The world above in ``home`` (created), its live store at ``store_url`` (default a
    SQLite file in ``home``), version ``night_1`` published."""
    settings = Settings(
        home=home,
        store_url=store_url,
        api_jwt_secret=SECRET,
        api_reload_interval_seconds=0.01,
        api_cold_start_pool=100,
    )
    settings.home.mkdir()
    settings.published_dir.mkdir()
    engine = make_store(settings)
    world = World(home, settings, engine)
    world.write_version("night_1")
    return world


@pytest.fixture
def world(tmp_path) -> World:
    world = make_world(tmp_path / "home")
    yield world
    world.engine.dispose()


def bearer(user_id: int, *, service: bool = False, secret: str = SECRET, **kwargs) -> dict:
    return {"Authorization": f"Bearer {mint_token(secret, user_id, service=service, **kwargs)}"}


@pytest.fixture
def client(world):
    """A TestClient over the app with the fixed clock; the version watcher is off (tests call
    ``app.state.versions.refresh()`` after changing ``CURRENT``)."""
    from fastapi.testclient import TestClient

    from recs.serving.api import create_app

    app = create_app(world.settings, clock=lambda: NOW, watch=False)
    with TestClient(app) as test_client:
        yield test_client


def candidates(response) -> list[int]:
    assert response.status_code == 200, response.text
    return [item["candidate_id"] for item in response.json()["items"]]


@contextmanager
def running_server(app) -> Iterator[int]:
    """A real uvicorn server for ``app`` on a free loopback port (yielded), in a thread;
    stopped on exit."""
    import uvicorn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
