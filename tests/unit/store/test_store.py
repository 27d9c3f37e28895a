"""recs.store: URLs, the per-backend table list, the mutual-follows view on both backends."""

from __future__ import annotations

import datetime as dt

import pytest

from recs.store import schema
from recs.store.connections import engine_for, libpq_url, normalize_url


@pytest.mark.parametrize(
    ("url", "normalized"),
    [
        ("postgresql://u:p@h:5432/recs", "postgresql+psycopg://u:p@h:5432/recs"),
        ("postgres://h/recs", "postgresql+psycopg://h/recs"),
        ("postgresql+psycopg2://u:p@postgres/recs", "postgresql+psycopg://u:p@postgres/recs"),
        ("postgresql+psycopg://h/recs", "postgresql+psycopg://h/recs"),
        ("sqlite:////tmp/live.db", "sqlite:////tmp/live.db"),
    ],
)
def test_postgres_urls_use_psycopg3_and_libpq_urls_drop_the_driver(url, normalized):
    assert normalize_url(url) == normalized
    if "postgres" in url:
        assert libpq_url(url).startswith("postgresql://")


def test_the_reverse_edge_table_exists_only_on_postgres():
    sqlite = {table.name for table in schema.tables_for("sqlite")}
    postgres = {table.name for table in schema.tables_for("postgresql")}
    assert postgres - sqlite == {"follow_edges_reverse"}
    assert {"user_follow_counts", "relationship_tombstones", "ingested_events"} <= sqlite


def test_sqlite_keeps_edges_and_pairs_in_their_key_order_without_a_rowid(tmp_path):
    """``WITHOUT ROWID`` (store README, "Tables"): the rows are the primary key's B-tree, so a
    bulk load writes two B-trees, not three; a table scan comes back in key order."""
    engine = engine_for(f"sqlite:///{tmp_path / 'live.db'}")
    schema.create_schema(engine)
    t0 = dt.datetime(2026, 10, 1)
    with engine.begin() as connection:
        connection.execute(
            schema.follow_edges.insert(),
            [{"follower_id": a, "followee_id": b, "created_at": t0} for a, b in [(3, 1), (1, 2)]],
        )
        scanned = connection.exec_driver_sql(
            "SELECT follower_id, followee_id, created_at FROM follow_edges"
        ).fetchall()
        plain = {
            name
            for (name,) in connection.exec_driver_sql(
                "SELECT name FROM sqlite_schema WHERE type = 'table' "
                "AND sql NOT LIKE '%WITHOUT ROWID%'"
            )
        }
    engine.dispose()
    assert [tuple(row[:2]) for row in scanned] == [(1, 2), (3, 1)]
    assert not plain & {"follow_edges", "blocks", "mutes", "dismissed_candidates"}


def test_mutual_follows_view_lists_both_directions_of_active_pairs_only(store_url):
    """1<->2 active both ways, 1->3 active but 3->1 pending, 4->1 one way: only (1, 2) and
    (2, 1) are mutual."""
    engine = engine_for(store_url)
    schema.create_schema(engine)
    t0 = dt.datetime(2026, 10, 1)
    with engine.begin() as connection:
        connection.execute(
            schema.users.insert(), [{"user_id": u, "created_at": t0} for u in (1, 2, 3, 4)]
        )
        connection.execute(
            schema.follow_edges.insert(),
            [
                {"follower_id": a, "followee_id": b, "created_at": t0, "status": s}
                for a, b, s in [
                    (1, 2, "active"),
                    (2, 1, "active"),
                    (1, 3, "active"),
                    (3, 1, "pending"),
                    (4, 1, "active"),
                ]
            ],
        )
        rows = connection.exec_driver_sql(
            "SELECT user_id, friend_id FROM mutual_follows ORDER BY 1, 2"
        ).fetchall()
    engine.dispose()
    assert [tuple(row) for row in rows] == [(1, 2), (2, 1)]


def test_urls_shown_in_messages_hide_every_secret():
    """The password in the userinfo and libpq's ?password= (and the other secret parameters)
    are masked in what messages show, and in a driver error that repeats them."""
    from recs.store.connections import display_url, one_line

    url = "postgresql://ro:pw1@db:5432/follows?password=pw2&sslpassword=pw3&sslmode=require"
    shown = display_url(url)
    assert shown == (
        "postgresql://ro:***@db:5432/follows?password=***&sslmode=require&sslpassword=***"
    )
    message = one_line(RuntimeError("auth failed: pw1 / pw2 / pw3\nretry"), url)
    assert message == "auth failed: *** / *** / *** retry"
