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

from recs import ingest, store
from recs.config import Settings
from recs.ingest import IngestInputError

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
        result = ingest.ingest_paths([path], self.settings, **kwargs)
        assert result["balanced"], result
        return result

    def query(self, sql: str) -> list[tuple]:
        engine = store.engine_for(self.settings.live_store_url)
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
    assert ingest.mutual_follows(live.settings, 1) == [2]
    assert ingest.mutual_follows(live.settings, 2) == [1]
    assert ingest.mutual_follows(live.settings, 3) == []
    assert ingest.follow_counts(live.settings, 1) == {"follower_count": 2, "following_count": 1}
    assert ingest.reconcile_counts(live.settings)["users_drifted"] == 0


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
    assert ingest.mutual_follows(live.settings, 4) == []
    accepted = live.ingest([event("ok", "follow_accept", 3, 4, 1)])
    assert accepted["effects"] == {"follows_accepted": 1}
    assert live.edges() == {(1, 4): "active", (4, 1): "active"}
    assert ingest.mutual_follows(live.settings, 4) == [1]
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
    assert ingest.reconcile_counts(live.settings)["users_drifted"] == 0
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
    engine = store.engine_for(live.settings.live_store_url)
    with engine.begin() as connection:
        connection.execute(
            text("UPDATE user_follow_counts SET follower_count = 5 WHERE user_id = 1")
        )
        connection.execute(text("DELETE FROM user_follow_counts WHERE user_id = 3"))
        connection.execute(text("INSERT INTO user_follow_counts VALUES (6, 0, 4)"))
    engine.dispose()
    report = ingest.reconcile_counts(live.settings)
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
    assert ingest.reconcile_counts(live.settings, repair=True)["repaired"] is True
    assert ingest.reconcile_counts(live.settings)["users_drifted"] == 0
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
    result = ingest.ingest_paths([path], live.settings)
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
    result = ingest.ingest_paths([path], live.settings)
    assert result["balanced"]
    assert result["quarantine_reasons"] == {"unreadable_file": 1}
    [(line_number, reason)] = live.query("SELECT line_number, reason FROM quarantined_events")
    assert line_number == 0 and reason.startswith("unreadable_file: ")


def test_apply_events_is_the_single_event_write_path(live):
    """The live follow/unfollow write: one event per transaction through ``apply_events``."""
    session = ingest.StoreSession(live.settings.live_store_url)
    try:
        assert ingest.apply_events(session, [event("w1", "follow", 1, 5, 6)]).applied == 1
        assert ingest.apply_events(session, [event("w2", "unfollow", 2, 5, 6)]).applied == 1
        assert ingest.apply_events(session, [event("w1", "follow", 1, 5, 6)]).duplicates == 1
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
        result = ingest.ingest_paths([path], settings, batch_events=50, parse_in_worker=in_worker)
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
            commit = ingest.StoreSession.commit

            def slow_commit(self, commit=commit):
                time.sleep(0.05)
                commit(self)

            monkeypatch.setattr(ingest.StoreSession, "commit", slow_commit)
        settings = Settings(home=tmp_path / f"home-{in_worker}")
        ingest.ingest_paths([path], settings, batch_events=40, parse_in_worker=in_worker)
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
    result = ingest.ingest_paths([folder], sqlite_live.settings)
    assert [Path(f["path"]).name for f in result["files"]] == ["a.jsonl", "b.jsonl"]
    with pytest.raises(IngestInputError, match="no such file or folder"):
        ingest.ingest_paths([tmp_path / "missing.jsonl"], sqlite_live.settings)
    with pytest.raises(IngestInputError, match="is not an event file"):
        ingest.ingest_paths([folder / "notes.txt"], sqlite_live.settings)


def test_landing_folder_files_are_ingested_once_and_archived(sqlite_live):
    settings = sqlite_live.settings
    landing = ingest.landing_dir(settings)
    landing.mkdir(parents=True)
    write_jsonl(landing / "001.jsonl", [event("a", "follow", 1, 1, 2)])
    write_jsonl(landing / "002.jsonl", [event("b", "follow", 2, 2, 1)])
    assert [p.name for p in ingest.pending_files(settings)] == ["001.jsonl", "002.jsonl"]
    result = ingest.ingest_landing(settings)
    assert result["applied"] == 2
    assert ingest.pending_files(settings) == []
    assert sorted(p.name for p in (landing / "ingested").iterdir()) == ["001.jsonl", "002.jsonl"]
    assert ingest.ingest_landing(settings)["read"] == 0


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
    result = ingest.ingest_paths([path], live.settings)
    assert counted(result) == (3, 1, 0, 0, 2)
    lines = live.query("SELECT line_number, line FROM quarantined_events ORDER BY 1")
    assert lines == [(1, '{"event_id": "x\ufffd"'), (3, '{"a": "\ufffd"}')]


def test_a_store_from_before_ingestion_is_upgraded_in_place(store_url, tmp_path):
    """A store as the loaders wrote it before ingestion existed (no version columns on the
    relationship tables, no bookkeeping tables): the first ingest adds them and applies."""
    engine = store.engine_for(store_url)
    store.create_schema(engine)
    with engine.begin() as connection:
        for table in ("follow_edges", "blocks", "mutes", "dismissed_candidates"):
            for column in ("event_id", "event_time_us"):
                connection.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        connection.exec_driver_sql("DROP TABLE ingested_events")
    assert not store.schema_is_current(engine)
    engine.dispose()
    live = Store(Settings(home=tmp_path / "home", store_url=store_url), tmp_path)
    live.ingest(USERS + [event("f", "follow", 1, 1, 2)])
    assert live.edges() == {(1, 2): "active"}
    engine = store.engine_for(store_url)
    assert store.schema_is_current(engine)
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

        result = ingest.ingest_paths(
            [path], settings, batch_events=2, parse_in_worker=in_worker, progress=external_write
        )
        assert len(batches) == 5 and result["applied"] == 10
        results.append(Store(settings, tmp_path).edges())
    # User 4 is private: 3 -> 4 stays pending.
    assert results[0] == results[1] == {(3, 4): "pending", (4, 3): "active", (5, 6): "active"}
