"""recs.ingest: event semantics on SQLite and on a real PostgreSQL (``store_url`` runs each twice).

Every test derives the expected store state by hand in its docstring. Users 1..6 exist from
``USERS`` (user 4 private); times are minutes after ``T0``.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path

import pytest
from sqlalchemy import text

from recs.config import Settings
from recs.errors import IngestInputError
from recs.ingest.events import Rejected, TimeWindow, time_window, validate_event
from recs.ingest.quarantine import MAX_QUARANTINED_LINE_CHARS
from recs.ingest.reconcile import follow_counts, mutual_follows, reconcile_counts
from recs.ingest.resolution import apply_events
from recs.ingest.run import ingest_landing, ingest_paths, landing_dir, pending_files
from recs.ingest.session import StoreSession
from recs.store import schema
from recs.store.connections import engine_for

T0 = dt.datetime(2026, 10, 1, 12, 0)


def when(minute: float) -> str:
    return (T0 + dt.timedelta(minutes=minute)).isoformat() + "Z"


def event(event_id, event_type, minute, actor, target=None, **fields) -> dict:
    record = {
        "event_id": event_id,
        "event_type": event_type,
        "event_time": when(minute),
        "actor_id": actor,
    }
    if target is not None:
        record["target_id"] = target
    record.update(fields)
    return record


USERS = [event(f"user-{u}", "user_upsert", 0, u, is_private=(u == 4)) for u in range(1, 7)]


def write_jsonl(path: Path, events: list) -> Path:
    lines = [e if isinstance(e, str) else json.dumps(e) for e in events]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


class Store:
    """The live store of one test: ingest files, read state back."""

    def __init__(self, settings: Settings, folder: Path) -> None:
        self.settings = settings
        self.folder = folder
        self.files = 0

    def ingest(self, events: list, **kwargs) -> dict:
        self.files += 1
        path = write_jsonl(self.folder / f"events-{self.files:02d}.jsonl", events)
        result = ingest_paths([path], self.settings, **kwargs)
        assert result["balanced"], result
        return result

    def query(self, sql: str) -> list[tuple]:
        engine = engine_for(self.settings.live_store_url)
        try:
            with engine.connect() as connection:
                return [tuple(row) for row in connection.execute(text(sql))]
        finally:
            engine.dispose()

    def edges(self) -> dict[tuple[int, int], str]:
        rows = self.query("SELECT follower_id, followee_id, status FROM follow_edges")
        return {(a, b): status for a, b, status in rows}

    def counts(self) -> dict[int, tuple[int, int]]:
        """user -> (followers, following), users with a non-zero count."""
        rows = self.query("SELECT user_id, follower_count, following_count FROM user_follow_counts")
        return {
            user: (followers, following)
            for user, followers, following in rows
            if followers or following
        }

    def pairs(self, table: str) -> set[tuple[int, int]]:
        left, right = {
            "blocks": ("blocker_id", "blocked_id"),
            "mutes": ("muter_id", "muted_id"),
            "dismissed_candidates": ("user_id", "candidate_id"),
        }[table]
        return set(self.query(f"SELECT {left}, {right} FROM {table}"))  # noqa: S608


@pytest.fixture
def live(store_url: str, tmp_path: Path) -> Store:
    settings = Settings(home=tmp_path / "home", store_url=store_url)
    live = Store(settings, tmp_path)
    result = live.ingest(USERS)
    assert result["applied"] == 6
    return live


def counted(result: dict) -> tuple[int, int, int, int, int]:
    return tuple(result[k] for k in ("read", "applied", "duplicates", "superseded", "quarantined"))


def test_follow_unfollow_counts_and_mutual_follows(live):
    """1->2, 2->1, 1->3, 3->1, then 1 unfollows 3.

    Edges left: 1->2, 2->1, 3->1 (all active). Counts (followers, following): user 1 (2, 1)
    (followed by 2 and 3, follows 2); user 2 (1, 1); user 3 (0, 1). Mutual: only 1<->2.
    """
    result = live.ingest(
        [
            event("a", "follow", 1, 1, 2),
            event("b", "follow", 2, 2, 1),
            event("c", "follow", 3, 1, 3),
            event("d", "follow", 4, 3, 1),
            event("e", "unfollow", 5, 1, 3),
        ]
    )
    assert counted(result) == (5, 5, 0, 0, 0)
    assert result["effects"] == {"follows_added": 4, "follows_removed": 1}
    assert live.edges() == {(1, 2): "active", (2, 1): "active", (3, 1): "active"}
    assert live.counts() == {1: (2, 1), 2: (1, 1), 3: (0, 1)}
    assert mutual_follows(live.settings, 1) == [2]
    assert mutual_follows(live.settings, 2) == [1]
    assert mutual_follows(live.settings, 3) == []
    assert follow_counts(live.settings, 1) == {"follower_count": 2, "following_count": 1}
    assert reconcile_counts(live.settings)["users_drifted"] == 0


def test_duplicates_within_a_file_and_across_files_change_nothing(live):
    """File: a (1->2), a again, b (2->3), then a third "a" that is an unfollow.

    The first copy of an event id wins: the two later "a" lines are duplicates, whatever they
    say. First run: read 4 = applied 2 + duplicates 2. Second run of the same file: all 4 are
    duplicates (both ids are already recorded). Edges 1->2 and 2->3 either way.
    """
    events = [
        event("a", "follow", 1, 1, 2),
        event("a", "follow", 1, 1, 2),
        event("b", "follow", 2, 2, 3),
        event("a", "unfollow", 3, 1, 2),
    ]
    assert counted(live.ingest(events)) == (4, 2, 2, 0, 0)
    after_first = (live.edges(), live.counts())
    assert after_first == ({(1, 2): "active", (2, 3): "active"}, {1: (0, 1), 2: (1, 1), 3: (1, 0)})
    assert counted(live.ingest(events)) == (4, 0, 4, 0, 0)
    assert (live.edges(), live.counts()) == after_first


def test_out_of_order_follow_and_unfollow_resolve_by_event_time(live):
    """File 1: unfollow 1->2 at m10 (nothing to delete: leaves a tombstone at m10) and
    follow 1->3 at m20. File 2, later: follow 1->2 at m5 (older than the tombstone:
    superseded), unfollow 1->3 at m15 (older than the follow: superseded, the newer follow
    stays), follow 1->2 at m12 (newer than the tombstone: applied).

    File 3 lists an unfollow 2->3 at m31 before the follow 2->3 at m30: applied in time order,
    so the edge ends deleted. Edges left: 1->2, 1->3.
    """
    first = live.ingest([event("x1", "unfollow", 10, 1, 2), event("x2", "follow", 20, 1, 3)])
    assert counted(first) == (2, 2, 0, 0, 0)
    assert first["effects"] == {"follows_added": 1, "noop": 1}
    second = live.ingest(
        [
            event("x3", "follow", 5, 1, 2),
            event("x4", "unfollow", 15, 1, 3),
            event("x5", "follow", 12, 1, 2),
        ]
    )
    assert counted(second) == (3, 1, 0, 2, 0)
    assert live.edges() == {(1, 2): "active", (1, 3): "active"}
    third = live.ingest([event("y2", "unfollow", 31, 2, 3), event("y1", "follow", 30, 2, 3)])
    assert counted(third) == (2, 2, 0, 0, 0)
    assert live.edges() == {(1, 2): "active", (1, 3): "active"}
    assert live.counts() == {1: (0, 2), 2: (1, 0), 3: (1, 0)}


def test_pending_request_then_accept_and_pending_then_reject(live):
    """User 4 is private. 1 requests 4 (m1): pending, counted nowhere. 4 follows 1 (m2;
    1 is public): active, but 1<->4 is not mutual while 1->4 is pending. 4 accepts 1 (m3,
    actor 4, target 1): 1->4 active, now mutual. 2 follows 4 (m4): pending; 4 rejects 2
    (m5): deleted. Counts: user 1 (1, 1), user 4 (1, 1); user 2 none.
    """
    live.ingest([event("r1", "follow_request", 1, 1, 4), event("f1", "follow", 2, 4, 1)])
    assert live.edges() == {(1, 4): "pending", (4, 1): "active"}
    assert live.counts() == {1: (1, 0), 4: (0, 1)}
    assert mutual_follows(live.settings, 4) == []
    accepted = live.ingest([event("ok", "follow_accept", 3, 4, 1)])
    assert accepted["effects"] == {"follows_accepted": 1}
    assert live.edges() == {(1, 4): "active", (4, 1): "active"}
    assert mutual_follows(live.settings, 4) == [1]
    rejected = live.ingest([event("r2", "follow", 4, 2, 4), event("no", "follow_reject", 5, 4, 2)])
    assert rejected["effects"] == {"follow_requests_pending": 1, "follows_removed": 1}
    assert live.edges() == {(1, 4): "active", (4, 1): "active"}
    assert live.counts() == {1: (1, 1), 4: (1, 1)}


def test_block_removes_follows_both_ways_and_refuses_new_ones_until_unblocked(live):
    """1<->2 follow each other (m1, m2). 1 blocks 2 (m3): both follows deleted. While the
    block stands, 2 follows 1 (m4), 1 follows 2 (m5), 2 requests 1 (m6): refused (applied, no
    effect). 1 unblocks 2 (m7): nothing is restored. 2 follows 1 (m8): active.
    Left: edge 2->1 only; counts user 1 (1, 0), user 2 (0, 1); no block.
    """
    live.ingest([event("f1", "follow", 1, 1, 2), event("f2", "follow", 2, 2, 1)])
    blocked = live.ingest(
        [
            event("b1", "block", 3, 1, 2),
            event("f3", "follow", 4, 2, 1),
            event("f4", "follow", 5, 1, 2),
            event("f5", "follow_request", 6, 2, 1),
        ]
    )
    assert counted(blocked) == (4, 4, 0, 0, 0)
    assert blocked["effects"] == {
        "blocks_added": 1,
        "follows_removed_by_block": 2,
        "follows_refused_blocked": 3,
    }
    assert live.edges() == {}
    assert live.counts() == {}
    assert live.pairs("blocks") == {(1, 2)}
    live.ingest([event("u1", "unblock", 7, 1, 2)])
    assert live.pairs("blocks") == set()
    assert live.edges() == {}
    live.ingest([event("f6", "follow", 8, 2, 1)])
    assert live.edges() == {(2, 1): "active"}
    assert live.counts() == {1: (1, 0), 2: (0, 1)}


def test_a_late_block_deletes_only_older_follows(live):
    """Follows 1->2 at m10 and 2->1 at m2 are applied; then a block 1->2 at m5 arrives late.

    The block acts on each direction like an unfollow at m5: 2->1 (m2) is deleted, 1->2 (m10,
    newer: the follow service accepted it after the block, so an unblock must have come
    between) stays. A follow 2->1 at m3 arriving even later is older than the block's
    tombstone: superseded.
    """
    live.ingest([event("f1", "follow", 10, 1, 2), event("f2", "follow", 2, 2, 1)])
    late = live.ingest([event("b", "block", 5, 1, 2)])
    assert late["effects"] == {"blocks_added": 1, "follows_removed_by_block": 1}
    assert live.edges() == {(1, 2): "active"}
    assert counted(live.ingest([event("f3", "follow", 3, 2, 1)])) == (1, 0, 0, 1, 0)
    assert live.counts() == {1: (0, 1), 2: (1, 0)}


def test_a_block_arriving_after_its_unblock_still_removes_the_older_follows(live):
    """1<->2 follow each other (m1, m2). 1 blocks 2 at m3 and unblocks at m7, but the unblock
    reaches ingestion first (one call) and the block later (another call): the block is
    superseded as a block (the unblock is newer: no block is left), yet it happened, so it
    still acts on both follow directions like an unfollow at m3: both follows (older) go.
    A follow 2->1 at m8 (after the unblock) then stands. The same end state as in order.
    """
    live.ingest([event("f1", "follow", 1, 1, 2), event("f2", "follow", 2, 2, 1)])
    live.ingest([event("u1", "unblock", 7, 1, 2)])
    late = live.ingest([event("b1", "block", 3, 1, 2)])
    assert counted(late) == (1, 0, 0, 1, 0)  # read, applied, duplicates, superseded, quarantined
    assert late["effects"] == {"follows_removed_by_block": 2}
    assert live.pairs("blocks") == set()
    assert live.edges() == {}
    assert live.counts() == {}
    live.ingest([event("f3", "follow", 8, 2, 1)])
    assert live.edges() == {(2, 1): "active"}


def test_a_late_block_does_not_remove_follows_made_after_its_unblock(live):
    """Unblock at m7 first, follow 1->2 at m8 (not blocked: applied), then the block at m3
    arrives: the follow is newer than the block, so it stays."""
    live.ingest([event("u1", "unblock", 7, 1, 2), event("f1", "follow", 8, 1, 2)])
    late = live.ingest([event("b1", "block", 3, 1, 2)])
    assert late["effects"] == {}
    assert live.edges() == {(1, 2): "active"}


def test_dismissal_and_mute_last_writer_wins(live):
    """1 dismisses 5 (m1), undismisses (m3); a stale dismiss at m2 arrives after: superseded.
    1 dismisses 6 (m4). 2 mutes 3 (m1). Left: dismissed {(1, 6)}, muted {(2, 3)}.
    """
    live.ingest(
        [
            event("d1", "dismiss", 1, 1, 5),
            event("d2", "undismiss", 3, 1, 5),
            event("m1", "mute", 1, 2, 3),
        ]
    )
    stale = live.ingest([event("d3", "dismiss", 2, 1, 5), event("d4", "dismiss", 4, 1, 6)])
    assert counted(stale) == (2, 1, 0, 1, 0)
    assert live.pairs("dismissed_candidates") == {(1, 6)}
    assert live.pairs("mutes") == {(2, 3)}


MIXED = [
    json.dumps(event("m1", "follow", 5, 1, 2)),  # 1 applied
    '{"event_id": "m2", "event_type": "follow", "event_time": ',  # 2 malformed (truncated)
    '["not", "an", "object"]',  # 3 malformed
    json.dumps(event("m3", "poke", 5, 1, 2)),  # 4 unknown type
    json.dumps({"event_id": "m4", "event_type": "follow", "actor_id": 1, "target_id": 3}),  # 5
    json.dumps(event("m5", "follow", 5, "3", 1)),  # 6 non-integer id
    json.dumps(event("m6", "follow", 5, 1, -5)),  # 7 negative id
    json.dumps(event("m7", "follow", 5, 2, 2)),  # 8 self-follow
    json.dumps(event("m8", "follow", 5, 1, 99)),  # 9 unknown user
    "",  # 10 blank: skipped, not read
    json.dumps(event("m1", "follow", 5, 1, 2)),  # 11 duplicate of line 1
    json.dumps(event("m9", "user_upsert", -1, 1, is_private=True)),  # 12 older: superseded
    json.dumps(event("m10", "follow", 6, 3, 1)),  # 13 applied
]


def test_mixed_file_quarantines_bad_lines_and_the_counts_add_up(live):
    """13 lines, one blank: read 12 = applied 2 (lines 1, 13) + duplicates 1 (line 11) +
    superseded 1 (line 12: sets user 1's is_private as of m-1, older than its m0 upsert) +
    quarantined 8 (lines 2-9, each with its reason, its original text, the file and the line
    number). The rest of the file is applied regardless.
    """
    result = live.ingest(MIXED)
    assert counted(result) == (12, 2, 1, 1, 8)
    assert result["quarantine_reasons"] == {
        "bad_id": 2,
        "malformed": 2,
        "missing_field": 1,
        "self_relationship": 1,
        "unknown_type": 1,
        "unknown_user": 1,
    }
    source = str((live.folder / "events-02.jsonl").resolve())
    rows = live.query(
        "SELECT source, line_number, reason, line, event_id FROM quarantined_events "
        "ORDER BY line_number"
    )
    assert [(r[0], r[1]) for r in rows] == [(source, n) for n in range(2, 10)]
    assert [r[3] for r in rows] == MIXED[1:9]  # the original lines, byte for byte
    reasons = [r[2] for r in rows]
    assert reasons[0].startswith("malformed: ")
    assert reasons[1] == "malformed: not a JSON object"
    assert reasons[2] == "unknown_type: 'poke'"
    assert reasons[3] == "missing_field: event_time"
    assert reasons[4] == "bad_id: actor_id is not an integer: '3'"
    assert reasons[5] == "bad_id: target_id is negative: -5"
    assert reasons[6] == "self_relationship: self-follow (actor_id = target_id = 2)"
    assert reasons[7] == "unknown_user: target_id 99 does not exist"
    assert [r[4] for r in rows] == [None, None, "m3", "m4", "m5", "m6", "m7", "m8"]
    assert live.edges() == {(1, 2): "active", (3, 1): "active"}
    assert live.counts() == {1: (1, 1), 2: (1, 0), 3: (0, 1)}
    assert reconcile_counts(live.settings)["users_drifted"] == 0
    audit = live.query(
        "SELECT read, applied, duplicates, superseded, quarantined FROM ingested_files "
        f"WHERE source = '{source}'"
    )
    assert audit == [(12, 2, 1, 1, 8)]


def test_an_event_for_a_missing_user_applies_once_resent_after_the_user_exists(live):
    """1 follows 7 before user 7 exists: quarantined, not recorded as seen. After user 7's
    upsert, the same event (same id) applies."""
    follow = event("late", "follow", 3, 1, 7)
    assert counted(live.ingest([follow])) == (1, 0, 0, 0, 1)
    live.ingest([event("user-7", "user_upsert", 1, 7)])
    assert counted(live.ingest([follow])) == (1, 1, 0, 0, 0)
    assert live.edges() == {(1, 7): "active"}


def test_reconcile_reports_drift_and_repairs_it(live):
    """Edges 1->2, 2->1, 3->1: true counts user 1 (2, 1), user 2 (1, 1), user 3 (0, 1).
    Tampered: user 1 stored as (5, 1) (+3 followers), user 3's row deleted (-1 following),
    user 6 given (0, 4) though it has no edges (+4 following). Drift: 3 users, follower drift
    3, following drift 1 + 4 = 5. After repair: none.
    """
    live.ingest(
        [
            event("a", "follow", 1, 1, 2),
            event("b", "follow", 2, 2, 1),
            event("c", "follow", 3, 3, 1),
        ]
    )
    engine = engine_for(live.settings.live_store_url)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE user_follow_counts SET follower_count = 5 WHERE user_id = 1")
        )
        connection.execute(text("DELETE FROM user_follow_counts WHERE user_id = 3"))
        connection.execute(text("INSERT INTO user_follow_counts VALUES (6, 0, 4)"))
    engine.dispose()
    report = reconcile_counts(live.settings)
    assert {k: report[k] for k in ("users_drifted", "follower_drift", "following_drift")} == {
        "users_drifted": 3,
        "follower_drift": 3,
        "following_drift": 5,
    }
    assert report["examples"][0] == {
        "user_id": 1,
        "follower_count": 5,
        "actual_follower_count": 2,
        "following_count": 1,
        "actual_following_count": 1,
    }
    assert report["repaired"] is False
    assert reconcile_counts(live.settings, repair=True)["repaired"] is True
    assert reconcile_counts(live.settings)["users_drifted"] == 0
    assert live.counts() == {1: (2, 1), 2: (1, 1), 3: (0, 1)}


def test_user_upsert_is_last_writer_wins_per_field(live):
    """User 7 is created at m10 (created_at defaults to the event time) with last_active_at
    m10 and interests {b, a}. A stale upsert at m5 sets last_active_at m5 (older than m10:
    skipped) and is_private (never set: applied). At m20 interests become {c}; a stale
    upsert at m15 of only last_active_at is superseded as a whole.
    """
    live.ingest([event("u7a", "user_upsert", 10, 7, last_active_at=when(10), interests=["b", "a"])])
    stale = live.ingest(
        [event("u7b", "user_upsert", 5, 7, last_active_at=when(5), is_private=True)]
    )
    assert counted(stale) == (1, 1, 0, 0, 0)
    assert live.query("SELECT tag FROM user_interests WHERE user_id = 7 ORDER BY tag") == [
        ("a",),
        ("b",),
    ]
    live.ingest([event("u7c", "user_upsert", 20, 7, interests=["c"])])
    assert counted(live.ingest([event("u7d", "user_upsert", 15, 7, interests=["x"])])) == (
        1,
        0,
        0,
        1,
        0,
    )
    [(created, last_active, private)] = live.query(
        "SELECT created_at, last_active_at, is_private FROM users WHERE user_id = 7"
    )

    def as_time(value):
        return dt.datetime.fromisoformat(value) if isinstance(value, str) else value

    assert as_time(created) == T0 + dt.timedelta(minutes=10)
    assert as_time(last_active) == T0 + dt.timedelta(minutes=10)
    assert bool(private) is True
    assert live.query("SELECT tag FROM user_interests WHERE user_id = 7") == [("c",)]


def test_bad_user_fields_are_quarantined(live):
    """An unknown status, a non-boolean flag and a non-list of tags: three quarantined lines."""
    result = live.ingest(
        [
            event("s", "user_upsert", 1, 1, status="banned"),
            event("p", "user_upsert", 1, 1, is_private="yes"),
            event("i", "user_upsert", 1, 1, interests="music"),
        ]
    )
    assert counted(result) == (3, 0, 0, 0, 3)
    assert result["quarantine_reasons"] == {"bad_field": 3}


def test_a_user_upsert_active_before_its_creation_is_quarantined(live):
    """As an import refuses such a row (``active_before_created``): last activity a minute
    before creation is quarantined naming both times; the same time, or no activity, is
    applied."""
    result = live.ingest(
        [
            event("inverted", "user_upsert", 1, 7, created_at=when(5), last_active_at=when(4)),
            event("same", "user_upsert", 1, 8, created_at=when(5), last_active_at=when(5)),
            event("never", "user_upsert", 1, 9, created_at=when(5), last_active_at=None),
        ]
    )
    assert result["quarantine_reasons"] == {"bad_field": 1}
    assert live.query("SELECT reason FROM quarantined_events") == [(
        f"bad_field: last_active_at '{when(4)}' is before created_at '{when(5)}'",
    )]  # fmt: skip
    assert live.query("SELECT user_id FROM users WHERE user_id >= 7 ORDER BY 1") == [(8,), (9,)]


def test_parquet_input_gives_the_same_store_as_json_lines(live, tmp_path):
    """The events of the first test, as a Parquet file: same edges and counts."""
    import polars as pl

    events = [
        event("a", "follow", 1, 1, 2),
        event("b", "follow", 2, 2, 1),
        event("c", "follow", 3, 1, 3),
        event("d", "follow", 4, 3, 1),
        event("e", "unfollow", 5, 1, 3),
    ]
    path = tmp_path / "events.parquet"
    pl.DataFrame(events).write_parquet(path)
    result = ingest_paths([path], live.settings)
    assert counted(result) == (5, 5, 0, 0, 0)
    assert live.edges() == {(1, 2): "active", (2, 1): "active", (3, 1): "active"}


def test_unreadable_file_is_one_quarantined_entry(live, tmp_path):
    """A gzip file cut in half: the lines before the cut apply, the rest is one quarantine
    row at line 0 (reason unreadable_file)."""
    lines = "".join(
        json.dumps(event(f"g{i}", "follow", i, 1, 2 + i % 4)) + "\n" for i in range(400)
    )
    whole = gzip.compress(lines.encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    result = ingest_paths([path], live.settings)
    assert result["balanced"]
    assert result["quarantine_reasons"] == {"unreadable_file": 1}
    [(line_number, reason)] = live.query("SELECT line_number, reason FROM quarantined_events")
    assert line_number == 0 and reason.startswith("unreadable_file: ")


def test_apply_events_is_the_single_event_write_path(live):
    """The live follow/unfollow write: one event per transaction through ``apply_events``."""
    session = StoreSession(live.settings.live_store_url)
    try:
        assert apply_events(session, [event("w1", "follow", 1, 5, 6)]).applied == 1
        assert apply_events(session, [event("w2", "unfollow", 2, 5, 6)]).applied == 1
        assert apply_events(session, [event("w1", "follow", 1, 5, 6)]).duplicates == 1
    finally:
        session.close()
    assert live.edges() == {}


# --- SQLite only: paths, the landing folder, the parser process, the CLI ---------------------


@pytest.fixture
def sqlite_live(tmp_path: Path) -> Store:
    settings = Settings(home=tmp_path / "home")
    live = Store(settings, tmp_path)
    live.ingest(USERS)
    return live


def test_parsing_in_a_worker_process_gives_the_same_result(tmp_path):
    """The same file ingested with and without the parser process: same counts, same rows."""
    kinds = ("follow", "unfollow", "block")
    events = USERS + [
        json.dumps(event(f"e{i}", kinds[i % 3], i + 1, 1 + i % 6, 1 + (i + 1 + i // 6 % 5) % 6))
        for i in range(300)
    ]
    events += MIXED
    dumps = []
    for in_worker in (False, True):
        settings = Settings(home=tmp_path / f"home-{in_worker}")
        path = write_jsonl(tmp_path / "same.jsonl", events)
        result = ingest_paths([path], settings, batch_events=50, parse_in_worker=in_worker)
        live = Store(settings, tmp_path)
        dumps.append(
            (
                {k: v for k, v in result.items() if k not in ("seconds", "events_per_second")},
                live.edges(),
                live.query("SELECT line_number, reason, line FROM quarantined_events ORDER BY 1"),
            )
        )
    assert dumps[0] == dumps[1]
    assert dumps[0][0]["quarantined"] == 8


def test_read_ahead_state_is_brought_up_to_date_with_the_previous_batch(tmp_path, monkeypatch):
    """Every commit is delayed 50 ms, so the parser reads batch K's state before batch K-1 has
    committed: the read-ahead lacks K-1's writes, and only updating it with them (pairs touched
    by consecutive batches: follows, unfollows and blocks among 6 users) gives the store the
    plain path gives."""
    import time

    # A pair recurs every 30 events, with another kind (7 kinds): with 40 events a batch,
    # consecutive batches rewrite the same pairs.
    kinds = ("follow", "unfollow", "block", "unblock", "follow", "mute", "follow_request")
    events = USERS + [
        event(f"e{i}", kinds[i % 7], i + 1, 1 + i % 6, 1 + (i + 1 + i // 6 % 5) % 6)
        for i in range(300)
    ]
    path = write_jsonl(tmp_path / "events.jsonl", events)
    stores = []
    for in_worker in (False, True):
        if in_worker:
            commit = StoreSession.commit

            def slow_commit(self, commit=commit):
                time.sleep(0.05)
                commit(self)

            monkeypatch.setattr(StoreSession, "commit", slow_commit)
        settings = Settings(home=tmp_path / f"home-{in_worker}")
        ingest_paths([path], settings, batch_events=40, parse_in_worker=in_worker)
        live = Store(settings, tmp_path)
        stores.append((live.edges(), live.counts(), live.pairs("blocks"), live.pairs("mutes")))
    assert stores[0] == stores[1]
    assert stores[0][2] and stores[0][3]  # blocks and mutes left (blocks removed the follows)


def test_folders_and_bad_paths(sqlite_live, tmp_path):
    folder = tmp_path / "drop"
    folder.mkdir()
    write_jsonl(folder / "b.jsonl", [event("b", "follow", 2, 2, 1)])
    write_jsonl(folder / "a.jsonl", [event("a", "follow", 1, 1, 2)])
    (folder / ".partial.jsonl").write_text("ignored")
    (folder / "notes.txt").write_text("ignored")
    result = ingest_paths([folder], sqlite_live.settings)
    assert [Path(f["path"]).name for f in result["files"]] == ["a.jsonl", "b.jsonl"]
    with pytest.raises(IngestInputError, match="no such file or folder"):
        ingest_paths([tmp_path / "missing.jsonl"], sqlite_live.settings)
    with pytest.raises(IngestInputError, match="is not an event file"):
        ingest_paths([folder / "notes.txt"], sqlite_live.settings)


def test_landing_folder_files_are_ingested_once_and_archived(sqlite_live):
    settings = sqlite_live.settings
    landing = landing_dir(settings)
    landing.mkdir(parents=True)
    write_jsonl(landing / "001.jsonl", [event("a", "follow", 1, 1, 2)])
    write_jsonl(landing / "002.jsonl", [event("b", "follow", 2, 2, 1)])
    assert [p.name for p in pending_files(settings)] == ["001.jsonl", "002.jsonl"]
    result = ingest_landing(settings)
    assert result["applied"] == 2
    assert pending_files(settings) == []
    assert sorted(p.name for p in (landing / "ingested").iterdir()) == ["001.jsonl", "002.jsonl"]
    assert ingest_landing(settings)["read"] == 0


def test_cli_ingest_json_prints_one_object_and_errors_are_one_line(sqlite_live, tmp_path):
    import subprocess
    import sys

    env_home = str(sqlite_live.settings.home)
    path = write_jsonl(tmp_path / "cli.jsonl", MIXED)
    command = [sys.executable, "-m", "recs.cli", "ingest", str(path), "--json"]
    done = subprocess.run(
        command, capture_output=True, text=True, env={"RECS_HOME": env_home, "PATH": ""}
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert counted(document) == (12, 2, 1, 1, 8)
    missing = subprocess.run(
        [sys.executable, "-m", "recs.cli", "ingest", str(tmp_path / "nope.jsonl")],
        capture_output=True,
        text=True,
        env={"RECS_HOME": env_home, "PATH": ""},
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"recs: error: no such file or folder: {tmp_path / 'nope.jsonl'}"
    ]


def test_a_broken_line_with_control_bytes_and_bad_utf8_is_quarantined(live, tmp_path):
    """A NUL byte (PostgreSQL text cannot hold it: stored as U+FFFD) and invalid UTF-8: two
    quarantined lines, the valid line between them applies."""
    path = tmp_path / "binary.jsonl"
    good = json.dumps(event("ok", "follow", 1, 1, 2)).encode()
    path.write_bytes(b'{"event_id": "x\x00"\n' + good + b"\n" + b'{"a": "\xff"}\n')
    result = ingest_paths([path], live.settings)
    assert counted(result) == (3, 1, 0, 0, 2)
    lines = live.query("SELECT line_number, line FROM quarantined_events ORDER BY 1")
    assert lines == [(1, '{"event_id": "x\ufffd"'), (3, '{"a": "\ufffd"}')]


def test_a_store_from_before_ingestion_is_upgraded_in_place(store_url, tmp_path):
    """A store as the loaders wrote it before ingestion existed (no version columns on the
    relationship tables, no bookkeeping tables): the first ingest adds them and applies."""
    engine = engine_for(store_url)
    schema.create_schema(engine)
    with engine.begin() as connection:
        for table in ("follow_edges", "blocks", "mutes", "dismissed_candidates"):
            for column in ("event_id", "event_time_us"):
                connection.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        connection.exec_driver_sql("DROP TABLE ingested_events")
    assert not schema.schema_is_current(engine)
    engine.dispose()
    live = Store(Settings(home=tmp_path / "home", store_url=store_url), tmp_path)
    live.ingest(USERS + [event("f", "follow", 1, 1, 2)])
    assert live.edges() == {(1, 2): "active"}
    engine = engine_for(store_url)
    assert schema.schema_is_current(engine)
    engine.dispose()


def test_read_ahead_is_discarded_when_another_connection_writes_between_batches(tmp_path):
    """Batches of 2 events, parsed (and their state read ahead) by the parser process: the
    6 users are batches 1-3, then (a, b), then (c, d). Right after batch 4 commits, and after
    the parser has had time to read batch 5's state, another connection adds the follow
    1 -> 2. Batch 5 unfollows 1 -> 2: it must see the external row and delete it (the
    read-ahead predates the write, so it is thrown away and read again). The same file
    ingested without the parser process gives the same store.
    """
    import sqlite3
    import time

    events = USERS + [
        event("a", "follow", 1, 3, 4),
        event("b", "follow", 2, 4, 3),  # batch 4 (lines 7-8) ...
        event("c", "unfollow", 10, 1, 2),  # ... holds the unfollow
        event("d", "follow", 11, 5, 6),
    ]
    path = write_jsonl(tmp_path / "events.jsonl", events)
    results = []
    for in_worker in (True, False):
        settings = Settings(home=tmp_path / f"home-{in_worker}")
        batches = []

        def external_write(message, settings=settings, batches=batches):
            batches.append(message)
            if len(batches) == 4:
                time.sleep(0.5)  # the parser reads batch 5's state meanwhile
                with sqlite3.connect(settings.home / "live.db") as connection:
                    connection.execute(
                        "INSERT INTO follow_edges (follower_id, followee_id, created_at, status)"
                        " VALUES (1, 2, '2026-10-01 12:05:00.000000', 'active')"
                    )

        result = ingest_paths(
            [path], settings, batch_events=2, parse_in_worker=in_worker, progress=external_write
        )
        assert len(batches) == 5 and result["applied"] == 10
        results.append(Store(settings, tmp_path).edges())
    # User 4 is private: 3 -> 4 stays pending.
    assert results[0] == results[1] == {(3, 4): "pending", (4, 3): "active", (5, 6): "active"}


# --- hostile input: nesting, control characters, huge lines, clocks, ids, Parquet values -------


def raw_event(event_id_json: str, event_type: str, minute: float, actor: int, target: int) -> str:
    """A JSON line whose ``event_id`` is the literal JSON text ``event_id_json``."""
    return (
        f'{{"event_id": {event_id_json}, "event_type": "{event_type}", '
        f'"event_time": "{when(minute)}", "actor_id": {actor}, "target_id": {target}}}'
    )


@pytest.mark.parametrize("in_worker", [False, True], ids=["in-process", "parser-process"])
def test_lines_nested_thousands_deep_are_quarantined_and_the_rest_applies(live, in_worker):
    """Line 1 is 20,000 ``[``, line 2 is ``{"a":`` 5,000 times (no closing brackets either):
    the decoder recurses once per level and runs out of Python's recursion limit long before
    the end of the line, which used to raise ``RecursionError`` out of ``recs ingest`` and drop
    the whole file. Line 3 is a follow 1->2.

    Expected: read 3 = applied 1 (line 3) + quarantined 2 (lines 1 and 2, reason ``malformed:
    JSON nested too deep``, their original text kept); edge 1->2 active. Same in the parser
    process (``parse_in_worker``) as in-process.
    """
    deep = ["[" * 20_000, '{"a":' * 5_000]
    result = live.ingest([*deep, event("ok", "follow", 1, 1, 2)], parse_in_worker=in_worker)
    assert counted(result) == (3, 1, 0, 0, 2)
    rows = live.query("SELECT line_number, reason, line FROM quarantined_events ORDER BY 1")
    assert rows == [
        (1, "malformed: JSON nested too deep", deep[0]),
        (2, "malformed: JSON nested too deep", deep[1]),
    ]
    assert live.edges() == {(1, 2): "active"}


def test_a_huge_line_is_quarantined_with_its_stored_text_cut(live):
    """Line 1: 100,000 ``x`` (not JSON). Line 2: a follow 1->2. The quarantine row keeps the
    first ``MAX_QUARANTINED_LINE_CHARS`` (65,536) characters of the line and says so in its
    reason, so one runaway line cannot put megabytes (or, past 1 GB, a value the database
    refuses, failing the run) into ``quarantined_events``.

    Expected: read 2 = applied 1 + quarantined 1; stored line = 65,536 ``x``; reason =
    ``malformed: <decoder message> (line cut to its first 65,536 of 100,000 characters)``.
    """
    result = live.ingest(["x" * 100_000, event("ok", "follow", 1, 1, 2)])
    assert counted(result) == (2, 1, 0, 0, 1)
    [(reason, line)] = live.query("SELECT reason, line FROM quarantined_events")
    assert len(line) == 65_536
    assert line == "x" * MAX_QUARANTINED_LINE_CHARS
    assert reason.startswith("malformed: ")
    assert reason.endswith(" (line cut to its first 65,536 of 100,000 characters)")
    assert live.edges() == {(1, 2): "active"}


def test_an_event_from_year_9999_is_quarantined_and_does_not_pin_its_relationship(live):
    """File 1: follow 1->2 dated 9999-12-31T23:59:59Z. File 2: follow 1->2 at m5, unfollow
    1->2 at m10 (real times, in the past of any clock running this test).

    Before the time window, file 1 applied and its version (year 9999) superseded everything
    after it: the edge could never be removed. Expected now: file 1 read 1 = quarantined 1
    (``bad_time``: more than ``ingest_max_future_seconds`` ahead of the clock); file 2 read 2
    = applied 2; no edge left.
    """
    doomsday = {**event("z", "follow", 0, 1, 2), "event_time": "9999-12-31T23:59:59Z"}
    first = live.ingest([doomsday])
    assert counted(first) == (1, 0, 0, 0, 1)
    assert first["quarantine_reasons"] == {"bad_time": 1}
    second = live.ingest([event("f", "follow", 5, 1, 2), event("u", "unfollow", 10, 1, 2)])
    assert counted(second) == (2, 2, 0, 0, 0)
    assert live.edges() == {}


def test_event_time_window_bounds_are_exact(live):
    """The ingesting machine's clock is fixed at ``NOW`` = T0 + 1 day = 2026-10-02T12:00Z;
    ``ingest_max_future_seconds`` 3600 (default), ``ingest_min_event_time`` 2000-01-01
    (default). One line each (users 1..6 exist already):

    1. follow 1->2 at NOW + 3600 s exactly: not *more* than the limit: applied.
    2. follow 1->3 at NOW + 3601 s: quarantined, reason names the limit.
    3. follow 2->3 at 9999-12-31T23:59:59Z: quarantined the same way.
    4. follow 3->1 at 1999-12-31T23:59:59Z: quarantined, before the lower bound.
    5. follow 3->2 at 2000-01-01T00:00:00Z, the lower bound itself: applied.
    6. follow 5->6 at 0001-01-01T00:00:00+05:00 (before year 1 in UTC: a ``datetime`` cannot
       hold it, which used to raise ``OverflowError`` out of the run): quarantined.

    read 6 = applied 2 + quarantined 4; edges 1->2 and 3->2.
    """
    now = T0 + dt.timedelta(days=1)
    lines = [
        {**event("edge", "follow", 0, 1, 2), "event_time": "2026-10-02T13:00:00Z"},
        {**event("ahead", "follow", 0, 1, 3), "event_time": "2026-10-02T13:00:01Z"},
        {**event("doom", "follow", 0, 2, 3), "event_time": "9999-12-31T23:59:59Z"},
        {**event("old", "follow", 0, 3, 1), "event_time": "1999-12-31T23:59:59Z"},
        {**event("min", "follow", 0, 3, 2), "event_time": "2000-01-01T00:00:00Z"},
        {**event("year0", "follow", 0, 5, 6), "event_time": "0001-01-01T00:00:00+05:00"},
    ]
    result = live.ingest(lines, now=now)
    assert counted(result) == (6, 2, 0, 0, 4)
    reasons = [
        r[0] for r in live.query("SELECT reason FROM quarantined_events ORDER BY line_number")
    ]
    future = (
        "bad_time: event_time {} is more than 3600 s after this machine's clock "
        "(2026-10-02T12:00:00Z; ingest_max_future_seconds): a future event would win over "
        "every later event of its relationship"
    )
    assert reasons == [
        future.format("2026-10-02T13:00:01Z"),
        future.format("9999-12-31T23:59:59Z"),
        "bad_time: event_time 1999-12-31T23:59:59Z is before 2000-01-01T00:00:00Z "
        "(ingest_min_event_time): no real event is that old (an unset or zeroed clock)",
        "bad_time: event_time is out of range: '0001-01-01T00:00:00+05:00'",
    ]
    assert live.edges() == {(1, 2): "active", (3, 2): "active"}


def test_the_time_window_comes_from_the_settings(store_url, tmp_path, monkeypatch):
    """``RECS_INGEST_MAX_FUTURE_SECONDS=60`` and ``RECS_INGEST_MIN_EVENT_TIME=2026-01-01``:
    with the clock at T0, a user_upsert at T0 + 61 s and one at 2025-12-31 are quarantined,
    one at T0 + 60 s applies (read 3 = applied 1 + quarantined 2). ``apply_events`` (the single
    event write path) applies the same window: a follow dated year 9999 is quarantined.
    """
    monkeypatch.setenv("RECS_INGEST_MAX_FUTURE_SECONDS", "60")
    monkeypatch.setenv("RECS_INGEST_MIN_EVENT_TIME", "2026-01-01T00:00:00")
    settings = Settings(home=tmp_path / "home", store_url=store_url)
    assert settings.ingest_max_future_seconds == 60
    assert settings.ingest_min_event_time == dt.datetime(2026, 1, 1)
    live = Store(settings, tmp_path)
    upserts = [
        {**event("late", "user_upsert", 0, 1), "event_time": "2026-10-01T12:01:01Z"},
        {**event("early", "user_upsert", 0, 2), "event_time": "2025-12-31T23:59:59Z"},
        {**event("edge", "user_upsert", 0, 3), "event_time": "2026-10-01T12:01:00Z"},
    ]
    assert counted(live.ingest(upserts, now=T0)) == (3, 1, 0, 0, 2)
    assert live.query("SELECT user_id FROM users") == [(3,)]
    session = StoreSession(store_url)
    try:
        doomsday = {**event("d", "user_upsert", 0, 4), "event_time": "9999-01-01T00:00:00Z"}
        counts = apply_events(session, [doomsday], now=T0, settings=settings)
        assert (counts.read, counts.applied, counts.quarantined) == (1, 0, 1)
    finally:
        session.close()


def test_event_ids_are_opaque_strings_and_bad_ones_have_their_own_reasons(live):
    """``event_id`` is an opaque string; a JSON integer is taken as its decimal text, so 7 and
    "7" are the same event id (the first copy wins, the other is a duplicate), while "007" is
    another id. Lines (users exist; times in minutes):

    1. id 7, follow 1->2 (m1): applied as id "7".
    2. id "7", follow 1->3 (m2): duplicate of line 1, whatever it says.
    3. id "007", follow 1->3 (m3): applied.
    4-12. ids "", 7.0, true, {"k": 1}, [1], 129 x "a", an integer of 130 digits, "a<NUL>b",
       "tab<TAB>": quarantined, each with its own reason (below).
    13. no event_id: quarantined ``missing_field: event_id``.

    read 13 = applied 2 + duplicates 1 + quarantined 10. Edges 1->2 and 1->3. The
    quarantine rows carry no event_id (none of them has a valid one). A later file with id
    "7" again is a duplicate.
    """
    big = "1" + "0" * 129
    lines = [
        raw_event("7", "follow", 1, 1, 2),
        raw_event('"7"', "follow", 2, 1, 3),
        raw_event('"007"', "follow", 3, 1, 3),
        raw_event('""', "follow", 4, 2, 3),
        raw_event("7.0", "follow", 4, 2, 3),
        raw_event("true", "follow", 4, 2, 3),
        raw_event('{"k": 1}', "follow", 4, 2, 3),
        raw_event("[1]", "follow", 4, 2, 3),
        raw_event(json.dumps("a" * 129), "follow", 4, 2, 3),
        raw_event(big, "follow", 4, 2, 3),
        raw_event('"a\\u0000b"', "follow", 4, 2, 3),
        raw_event('"tab\\t"', "follow", 4, 2, 3),
        json.dumps({k: v for k, v in event("x", "follow", 4, 2, 3).items() if k != "event_id"}),
    ]
    result = live.ingest(lines)
    assert counted(result) == (13, 2, 1, 0, 10)
    rows = live.query("SELECT reason, event_id FROM quarantined_events ORDER BY line_number")
    assert [r[0] for r in rows] == [
        "bad_field: event_id is empty",
        "bad_field: event_id is a float, not a string or an integer: 7.0",
        "bad_field: event_id is a boolean, not a string or an integer: True",
        "bad_field: event_id is an object, not a string or an integer",
        "bad_field: event_id is an array, not a string or an integer",
        "bad_field: event_id is longer than 128 characters (129)",
        "bad_field: event_id is longer than 128 characters (130)",
        "bad_field: event_id has a control or non-printable character: 'a\\x00b'",
        "bad_field: event_id has a control or non-printable character: 'tab\\t'",
        "missing_field: event_id",
    ]
    assert [r[1] for r in rows] == [None] * 10
    assert live.edges() == {(1, 2): "active", (1, 3): "active"}
    seen = live.query("SELECT event_id FROM ingested_events WHERE event_id LIKE '%7'")
    assert sorted(seen) == [("007",), ("7",)]
    assert counted(live.ingest([raw_event('"7"', "unfollow", 9, 1, 2)])) == (1, 0, 1, 0, 0)


def test_interest_tags_with_control_characters_are_quarantined(live):
    """A user_upsert whose tags include "a<NUL>" (PostgreSQL text cannot hold NUL: the batch
    used to fail there) is quarantined on both backends; one with tags ["jazz"] applies.
    read 2 = applied 1 + quarantined 1."""
    result = live.ingest(
        [
            event("t1", "user_upsert", 1, 1, interests=["ok", "a\u0000"]),
            event("t2", "user_upsert", 1, 2, interests=["jazz"]),
        ]
    )
    assert counted(result) == (2, 1, 0, 0, 1)
    [(reason,)] = live.query("SELECT reason FROM quarantined_events")
    assert reason == (
        "bad_field: interests is not a list of 1-64 character printable strings: ['ok', 'a\\x00']"
    )
    assert live.query("SELECT user_id, tag FROM user_interests") == [(2, "jazz")]


def test_parquet_values_python_cannot_represent_quarantine_only_their_row(live, tmp_path):
    """A Parquet file whose ``event_time`` column is ``timestamp[s]``; row 1 holds 10**12 s
    (year 33658: no Python ``datetime``, so converting the batch raised ``OverflowError`` and
    ended the run), row 2 is 9999-12-31T23:59:59 (representable, but outside the time window),
    rows 3 and 4 follow 1->2 and 1->3 at T0 + 1 and 2 minutes.

    Expected: read 4 = applied 2 + quarantined 2 (row 1 ``malformed``: the column cannot be
    converted; row 2 ``bad_time``); edges 1->2 and 1->3.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = int((T0 - dt.datetime(1970, 1, 1)).total_seconds())
    table = pa.table(
        {
            "event_id": ["p1", "p2", "p3", "p4"],
            "event_type": ["follow"] * 4,
            "event_time": pa.array(
                [10**12, 253_402_300_799, base + 60, base + 120], pa.timestamp("s")
            ),
            "actor_id": [1, 1, 1, 1],
            "target_id": [5, 6, 2, 3],
        }
    )
    path = tmp_path / "weird.parquet"
    pq.write_table(table, path)
    result = ingest_paths([path], live.settings)
    assert counted(result) == (4, 2, 0, 0, 2)
    rows = live.query("SELECT line_number, reason, line FROM quarantined_events ORDER BY 1")
    assert [r[0] for r in rows] == [1, 2]
    assert (
        rows[0][1]
        == "malformed: event_time (timestamp[ms]) cannot be converted: date value out of range"
    )
    assert json.loads(rows[0][2])["event_id"] == "p1"
    assert rows[1][1].startswith("bad_time: event_time 9999-12-31T23:59:59Z is more than ")
    assert live.edges() == {(1, 2): "active", (1, 3): "active"}


# --- second adversarial review: window overflow, rescued duplicates, quarantine keys, CLI ---------


@pytest.mark.parametrize("value", ["inf", "1e400", "-inf", "nan", "315360001"])
def test_the_future_window_setting_is_finite_and_at_most_ten_years(monkeypatch, value):
    """``RECS_INGEST_MAX_FUTURE_SECONDS=inf`` (or ``1e400``, which parses to inf) used to pass
    validation and end ``recs ingest`` in ``OverflowError: cannot convert float infinity to
    integer``. The setting is finite, 0 .. 315,360,000 s (10 years of 365 days): each value
    here is refused by ``Settings``; the bound itself is accepted."""
    from pydantic import ValidationError

    monkeypatch.setenv("RECS_INGEST_MAX_FUTURE_SECONDS", value)
    with pytest.raises(ValidationError, match="ingest_max_future_seconds"):
        Settings()
    monkeypatch.setenv("RECS_INGEST_MAX_FUTURE_SECONDS", "315360000")
    assert Settings().ingest_max_future_seconds == 315_360_000


def test_cli_refuses_an_infinite_future_window_in_one_line(tmp_path, monkeypatch, capsys):
    """``RECS_INGEST_MAX_FUTURE_SECONDS=inf recs ingest f.jsonl``: exit 2, one line naming the
    setting (it was an ``OverflowError`` traceback)."""
    from recs import cli
    from recs.config import get_settings

    monkeypatch.setenv("RECS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RECS_INGEST_MAX_FUTURE_SECONDS", "inf")
    monkeypatch.delenv("RECS_STORE_URL", raising=False)
    path = write_jsonl(tmp_path / "f.jsonl", USERS)
    get_settings.cache_clear()
    try:
        code = cli.main(["ingest", str(path)])
    finally:
        get_settings.cache_clear()
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "recs: error: invalid setting RECS_INGEST_MAX_FUTURE_SECONDS: Input should be a finite "
        "number"
    ]


@pytest.mark.parametrize("in_worker", [False, True], ids=["in-process", "parser-process"])
def test_event_times_outside_years_1_to_9999_utc_are_quarantined_whatever_the_window(
    live, in_worker
):
    """The clock is at 9999-12-31T23:00Z and the window as wide as the settings allow around
    it (``ingest_max_future_seconds`` 86,400, ``ingest_min_event_time`` 0001-01-01), so the
    window reaches past 9999-12-31T23:59:59.999999, the last UTC time the store can hold:

    1. follow 1->2 at ``9999-12-31T23:59:59-05:00`` = 10000-01-01T04:59:59 UTC: inside the
       window, outside what a ``datetime`` holds (it used to end the whole run in
       ``OverflowError: date value out of range``): quarantined, ``bad_time`` out of range.
    2. follow 1->3 at ``0001-01-01T00:00:00+05:00`` (before year 1 in UTC): quarantined alike.
    3. follow 2->3 at ``9999-12-31T23:59:59Z``: in range and in the window: applied.

    read 3 = applied 1 + quarantined 2; edge 2->3.
    """
    settings = Settings(
        home=live.settings.home,
        store_url=live.settings.store_url,
        ingest_max_future_seconds=86_400,
        ingest_min_event_time=dt.datetime(1, 1, 1),
    )
    live.settings = settings
    lines = [
        {**event("y10k", "follow", 0, 1, 2), "event_time": "9999-12-31T23:59:59-05:00"},
        {**event("y0", "follow", 0, 1, 3), "event_time": "0001-01-01T00:00:00+05:00"},
        {**event("last", "follow", 0, 2, 3), "event_time": "9999-12-31T23:59:59Z"},
    ]
    result = live.ingest(lines, now=dt.datetime(9999, 12, 31, 23, 0), parse_in_worker=in_worker)
    assert counted(result) == (3, 1, 0, 0, 2)
    assert live.query("SELECT reason FROM quarantined_events ORDER BY line_number") == [
        ("bad_time: event_time is out of range: '9999-12-31T23:59:59-05:00'",),
        ("bad_time: event_time is out of range: '0001-01-01T00:00:00+05:00'",),
    ]
    assert live.edges() == {(2, 3): "active"}


def test_a_time_window_never_reaches_past_what_a_datetime_holds():
    """``time_window`` at 9999-12-31T23:00 with 10 years ahead: the upper bound is
    9999-12-31T23:59:59.999999 (``datetime.max``) in epoch µs, not 10 years later; a
    hand-built wider window given to ``validate_event`` still quarantines year 10000 UTC."""
    settings = Settings(ingest_max_future_seconds=315_360_000)
    window = time_window(settings, dt.datetime(9999, 12, 31, 23, 0))
    assert window.highest_us == (dt.datetime.max - dt.datetime(1970, 1, 1)) // dt.timedelta(
        microseconds=1
    )
    wide = TimeWindow(0, window.highest_us * 2, window.now_us)
    record = {**event("y10k", "follow", 0, 1, 2), "event_time": "9999-12-31T23:59:59-05:00"}
    with pytest.raises(Rejected, match="bad_time: event_time is out of range"):
        validate_event(record, 1, "", wide)


@pytest.mark.parametrize("in_worker", [False, True], ids=["in-process", "parser-process"])
def test_a_quarantined_copy_of_an_event_id_is_not_seen_and_a_later_copy_applies(live, in_worker):
    """A quarantined event is not recorded as seen, so a later line with the same id is not
    its duplicate: the copies of an id are tried in file order, the first one that is not
    quarantined wins, and a copy is tried at its own place in (event_time, event_id) order
    (at once if that place is already past). Users 1..6 exist; 7 does not, yet.

    ====  ======================================  ==========================================
    line  event                                    outcome
    ====  ======================================  ==========================================
    1     X follow 1->99 at m1                     quarantined (no user 99)
    2     X follow 1->2 at m2                      applied (X was not seen): edge 1->2
    3     X follow 1->3 at m3                      duplicate (X applied on line 2)
    4     Y follow 2->98 at m1                     quarantined
    5     Y follow 2->98 at m1 (line 4 again)      quarantined too: nothing was seen to repeat
    6     Z follow 3->97 at m5                     quarantined
    7     Z follow 3->1 at m0.5                    applied late (its place, m0.5, is past when
                                                   line 6 fails at m5): edge 3->1
    8     Q follow 5->7 at m1                      quarantined: user 7 is created at m4
    9     user_upsert 7 at m4                      applied: creates user 7
    10    Q follow 5->7 at m10                     applied at its own place, m10, after user 7
                                                   exists (at line 8's place it would fail)
    ====  ======================================  ==========================================

    read 10 = applied 4 (lines 2, 7, 9, 10) + duplicates 1 (line 3) + quarantined 5 (lines 1,
    4, 5, 6, 8). Edges 1->2, 3->1, 5->7; X, Z and Q recorded in ``ingested_events``, Y not.
    (Before: line 2 was counted a duplicate of line 1, and X never applied.)
    """
    lines = [
        event("X", "follow", 1, 1, 99),
        event("X", "follow", 2, 1, 2),
        event("X", "follow", 3, 1, 3),
        event("Y", "follow", 1, 2, 98),
        event("Y", "follow", 1, 2, 98),
        event("Z", "follow", 5, 3, 97),
        event("Z", "follow", 0.5, 3, 1),
        event("Q", "follow", 1, 5, 7),
        event("user-7", "user_upsert", 4, 7),
        event("Q", "follow", 10, 5, 7),
    ]
    result = live.ingest(lines, parse_in_worker=in_worker)
    assert counted(result) == (10, 4, 1, 0, 5)
    assert live.edges() == {(1, 2): "active", (3, 1): "active", (5, 7): "active"}
    quarantined = live.query("SELECT line_number FROM quarantined_events ORDER BY 1")
    assert quarantined == [(1,), (4,), (5,), (6,), (8,)]
    recorded = live.query(
        "SELECT event_id FROM ingested_events WHERE event_id IN ('X', 'Y', 'Z', 'Q') ORDER BY 1"
    )
    assert recorded == [("Q",), ("X",), ("Z",)]
    assert reconcile_counts(live.settings)["users_drifted"] == 0
    # The same file again: 8 duplicates (every copy of X, Z, Q and user-7: all recorded) and
    # lines 4 and 5 quarantined again (Y was never seen; there is still no user 98).
    again = live.ingest(lines, parse_in_worker=in_worker)
    assert counted(again) == (10, 0, 8, 0, 2)


def test_a_new_file_under_an_old_name_keeps_the_old_files_quarantine_rows(live):
    """Two days drop ``events.jsonl`` into the landing folder, each with a bad line 1 and a
    follow on line 2. Quarantine rows are keyed by (source, sha256, line_number): day 2's
    line 1 (``unknown_type``) does not overwrite day 1's (``missing_field``); each row's sha256
    is its file's in ``ingested_files``. Re-ingesting day 2's exact bytes (same source, same
    hash) replaces its own row: still 2 rows. ``apply_events`` keys its rows by the hash of
    its lines: two calls with a bad first event leave two ``<api>`` rows.
    """
    landing = landing_dir(live.settings)
    landing.mkdir(parents=True)
    days = [
        ['{"event_id": "d1"}', event("f1", "follow", 1, 1, 2)],
        [event("d2", "poke", 2, 1, 2), event("f2", "follow", 2, 2, 1)],
    ]
    for lines in days:
        write_jsonl(landing / "events.jsonl", lines)
        assert counted(ingest_landing(live.settings)) == (2, 1, 0, 0, 1)
    source = str((landing / "events.jsonl").resolve())
    assert live.query("SELECT source, line_number, reason FROM quarantined_events ORDER BY 3") == [
        (source, 1, "missing_field: event_type"),
        (source, 1, "unknown_type: 'poke'"),
    ]
    rows = live.query(
        "SELECT q.source, q.line_number, q.reason, f.read FROM quarantined_events AS q "
        "INNER JOIN ingested_files AS f ON f.source = q.source AND f.sha256 = q.sha256 "
        "ORDER BY q.reason"
    )
    assert rows == [
        (source, 1, "missing_field: event_type", 2),
        (source, 1, "unknown_type: 'poke'", 2),
    ]
    archived = sorted((landing / "ingested").iterdir())
    assert len(archived) == 2
    replay = archived[1] if "poke" in archived[1].read_text() else archived[0]
    (landing / "events.jsonl").write_bytes(replay.read_bytes())
    assert counted(ingest_landing(live.settings)) == (2, 0, 1, 0, 1)
    assert live.query("SELECT COUNT(*) FROM quarantined_events") == [(2,)]
    session = StoreSession(live.settings.live_store_url)
    try:
        for target in (97, 96):
            bad = event(f"api-{target}", "follow", 3, 1, target)
            assert apply_events(session, [bad]).quarantined == 1
    finally:
        session.close()
    api_rows = live.query(
        "SELECT line_number, reason FROM quarantined_events WHERE source = '<api>' ORDER BY 2"
    )
    assert api_rows == [
        (1, "unknown_user: target_id 96 does not exist"),
        (1, "unknown_user: target_id 97 does not exist"),
    ]


def test_a_quarantine_table_keyed_the_old_way_is_rekeyed_in_place(store_url, tmp_path):
    """A store whose ``quarantined_events`` has no ``sha256`` column and the old key (source,
    line_number), holding one row: the first ingest rebuilds the table with the new key, keeps
    that row (sha256 ``''``: recorded before files were told apart by hash) and adds its own
    (a bad line 1 of a file with the old row's source: no conflict)."""
    engine = engine_for(store_url)
    schema.create_schema(engine)
    with engine.begin() as connection:
        connection.exec_driver_sql("DROP TABLE quarantined_events")
        connection.exec_driver_sql(
            "CREATE TABLE quarantined_events (source VARCHAR(1024) NOT NULL, line_number BIGINT "
            "NOT NULL, reason VARCHAR(512) NOT NULL, line TEXT NOT NULL, event_id VARCHAR(128), "
            "CONSTRAINT pk_quarantined_events PRIMARY KEY (source, line_number))"
        )
    assert not schema.schema_is_current(engine)
    live = Store(Settings(home=tmp_path / "home", store_url=store_url), tmp_path)
    source = str((tmp_path / "events-01.jsonl").resolve())
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO quarantined_events VALUES (:source, 1, 'malformed: old', 'x', NULL)"),
            {"source": source},
        )
    engine.dispose()
    live.ingest(['{"event_id": "bad"}', *USERS])
    rows = live.query("SELECT sha256, line_number, reason FROM quarantined_events ORDER BY 3")
    assert [(r[0] == "", r[1], r[2]) for r in rows] == [
        (True, 1, "malformed: old"),
        (False, 1, "missing_field: event_type"),
    ]
    engine = engine_for(store_url)
    assert schema.schema_is_current(engine)
    engine.dispose()


def test_cli_ingest_into_an_unreachable_store_is_one_line_without_the_password(
    tmp_path, monkeypatch, capsys
):
    """``RECS_STORE_URL=postgresql://postgres:s3cretpw@127.0.0.1:1/x recs ingest f.jsonl``
    (nothing listens on port 1): exit 2 and one line ``recs: error: cannot connect to the live
    store postgresql://postgres:***@127.0.0.1:1/x: ...``, the password masked (it was a
    ``sqlalchemy.exc.OperationalError`` traceback)."""
    from recs import cli
    from recs.config import get_settings

    monkeypatch.setenv("RECS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RECS_STORE_URL", "postgresql://postgres:s3cretpw@127.0.0.1:1/x")
    path = write_jsonl(tmp_path / "f.jsonl", USERS)
    get_settings.cache_clear()
    try:
        code = cli.main(["ingest", str(path)])
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    errors = [line for line in err if line.startswith("recs: error: ")]
    assert len(errors) == 1 and len(err) == 1, err
    assert errors[0].startswith(
        "recs: error: cannot connect to the live store postgresql://postgres:***@127.0.0.1:1/x: "
    )
    assert "s3cretpw" not in errors[0]


def test_cli_ingest_landing_honours_batch_events(sqlite_live, monkeypatch, capsys):
    """``recs ingest --landing --batch-events 1``: the size reaches the ingest (it used to be
    ignored). Observable: line 1 follows 1->7 at m2, line 2 creates user 7 at m1. In one batch
    the upsert applies first (time order) and so does the follow: read 2 = applied 2. In
    batches of one event the follow comes first, before user 7 exists: read 2 = applied 1 +
    quarantined 1."""
    from recs import cli
    from recs.config import get_settings

    lines = [event("late", "follow", 2, 1, 7), event("user-7", "user_upsert", 1, 7)]
    landing = landing_dir(sqlite_live.settings)
    landing.mkdir(parents=True)
    monkeypatch.setenv("RECS_HOME", str(sqlite_live.settings.home))
    monkeypatch.delenv("RECS_STORE_URL", raising=False)
    get_settings.cache_clear()
    try:
        write_jsonl(landing / "001.jsonl", lines)
        assert cli.main(["ingest", "--landing", "--batch-events", "1", "--json"]) == 0
    finally:
        get_settings.cache_clear()
    document = json.loads(capsys.readouterr().out)
    assert counted(document) == (2, 1, 0, 0, 1)
