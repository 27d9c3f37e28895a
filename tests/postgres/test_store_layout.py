"""The PostgreSQL live store's layout: forward and reverse edge tables hash-partitioned by the
design's keys, the reverse copy kept identical by triggers, counts filled by a bulk load."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from sqlalchemy import text

from recs.config import Settings
from recs.demo.synthetic import generate_graph
from recs.ingest.reconcile import reconcile_counts
from recs.ingest.run import ingest_paths
from recs.store import schema
from recs.store.connections import engine_for


@pytest.fixture
def pg_settings(postgres_url, tmp_path) -> Settings:
    return Settings(home=tmp_path / "home", store_url=postgres_url)


def query(settings: Settings, sql: str) -> list[tuple]:
    engine = engine_for(settings.live_store_url)
    try:
        with engine.begin() as connection:
            result = connection.execute(text(sql))
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def assert_reverse_is_the_forward_copy(settings: Settings) -> None:
    forward = query(
        settings, "SELECT follower_id, followee_id, created_at, status FROM follow_edges"
    )
    reverse = query(
        settings, "SELECT follower_id, followee_id, created_at, status FROM follow_edges_reverse"
    )
    assert sorted(forward) == sorted(reverse)


def test_edge_tables_are_hash_partitioned_by_follower_and_by_followee(pg_settings):
    engine = engine_for(pg_settings.live_store_url)
    schema.create_schema(engine)
    engine.dispose()
    keys = query(
        pg_settings,
        "SELECT c.relname, p.partstrat, a.attname FROM pg_partitioned_table p "
        "JOIN pg_class c ON c.oid = p.partrelid "
        "JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0] "
        "ORDER BY c.relname",
    )
    assert keys == [
        ("follow_edges", "h", "follower_id"),
        ("follow_edges_reverse", "h", "followee_id"),
    ]
    partitions = query(
        pg_settings,
        "SELECT parent.relname, count(*) FROM pg_inherits i "
        "JOIN pg_class parent ON parent.oid = i.inhparent WHERE parent.relkind = 'p' "
        "GROUP BY parent.relname ORDER BY 1",
    )
    assert partitions == [
        ("follow_edges", schema.EDGE_PARTITIONS),
        ("follow_edges_reverse", schema.EDGE_PARTITIONS),
    ]
    # The reverse direction is its own table, not a partition-local index of follow_edges.
    assert query(pg_settings, "SELECT indexname FROM pg_indexes WHERE tablename = 'follow_edges'")
    assert not query(
        pg_settings, "SELECT 1 FROM pg_indexes WHERE indexname = 'ix_follow_edges_reverse'"
    )


def test_bulk_load_fills_both_directions_and_the_counts(pg_settings):
    """A synthetic graph loaded through ADBC COPY: every follower's edges sit in one
    forward partition, every followee's in one reverse partition, the reverse copy equals the
    forward table, and the counts equal the edges (no drift)."""
    summary = generate_graph(300, 3, pg_settings, avg_out_degree=8)
    assert summary["store"]["backend"] == "postgresql"
    assert query(pg_settings, "SELECT count(*) FROM follow_edges") == [
        (summary["follow_edges"] + summary["pending_follows"],)
    ]
    assert_reverse_is_the_forward_copy(pg_settings)
    for table, key in (("follow_edges", "follower_id"), ("follow_edges_reverse", "followee_id")):
        spread = query(
            pg_settings,
            f"SELECT {key} FROM {table} GROUP BY {key} HAVING count(DISTINCT tableoid) > 1",
        )
        assert spread == [], table
        used = query(pg_settings, f"SELECT count(DISTINCT tableoid) FROM {table}")[0][0]
        assert used > 1, f"{table}: every row in one partition"
    report = reconcile_counts(pg_settings)
    assert report["users_drifted"] == 0
    assert report["users_checked"] > 0


def test_triggers_mirror_inserts_updates_deletes_and_truncate(pg_settings, tmp_path):
    """Ingestion inserts (follow), updates (pending -> active) and deletes (unfollow) edges;
    after each file the reverse copy equals the forward table. TRUNCATE empties both."""
    t0 = dt.datetime(2026, 10, 1)

    def ev(event_id, kind, minute, actor, target=None, **fields):
        record = {
            "event_id": event_id,
            "event_type": kind,
            "event_time": (t0 + dt.timedelta(minutes=minute)).isoformat(),
            "actor_id": actor,
            **({} if target is None else {"target_id": target}),
            **fields,
        }
        return json.dumps(record)

    files = [
        [ev(f"u{u}", "user_upsert", 0, u, is_private=u == 3) for u in (1, 2, 3)],
        [ev("a", "follow", 1, 1, 2), ev("b", "follow", 2, 1, 3), ev("c", "follow", 3, 2, 1)],
        [ev("d", "follow_accept", 4, 3, 1), ev("e", "unfollow", 5, 1, 2)],
    ]
    for number, lines in enumerate(files):
        path = tmp_path / f"{number}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        ingest_paths([path], pg_settings)
        assert_reverse_is_the_forward_copy(pg_settings)
    assert query(
        pg_settings,
        "SELECT followee_id, follower_id, status FROM follow_edges_reverse ORDER BY 1, 2",
    ) == [(1, 2, "active"), (3, 1, "active")]
    query(pg_settings, "TRUNCATE follow_edges")
    assert query(pg_settings, "SELECT count(*) FROM follow_edges_reverse") == [(0,)]
