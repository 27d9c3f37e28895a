"""Dismissals written through the API take part in ingestion's last-writer-wins by event_time.

A dismissal relationship (user -> candidate) keeps the time and id of the last write applied
to it, on its ``dismissed_candidates`` row or, once deleted, as a ``relationship_tombstones``
row (``recs.ingest``). An API dismissal is a ``dismiss`` event and an API undismissal an
``undismiss`` event at the request's clock time, so an ingested event older than it is
superseded and a newer one wins, whichever arrives first.

The ``store_url`` tests run on SQLite and on a real PostgreSQL (``tests/conftest.py``); users
1..3 exist. Times are minutes after ``T0`` = 2026-10-01 12:00 UTC.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from api_fixtures import NOW, bearer
from sqlalchemy import text

from recs.config import Settings
from recs.errors import DismissalNotFoundError
from recs.ingest import run as ingest
from recs.serving import read_path
from recs.serving.live_store import LiveStore
from recs.store import connections as store

T0 = dt.datetime(2026, 10, 1, 12, 0)


def at(minute: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minute)


def event(event_id: str, event_type: str, moment: dt.datetime, actor: int, target=None) -> dict:
    record = {
        "event_id": event_id,
        "event_type": event_type,
        "event_time": moment.isoformat() + "Z",
        "actor_id": actor,
    }
    if target is not None:
        record["target_id"] = target
    return record


class Live:
    """A live store with users 1..3 (ingested at T0), its API store and an ingest helper."""

    def __init__(self, settings: Settings, folder: Path) -> None:
        self.settings = settings
        self.folder = folder
        self.files = 0
        self.ingest([event(f"user-{u}", "user_upsert", T0, u) for u in (1, 2, 3)])
        self.api = LiveStore(settings.live_store_url)

    def ingest(self, events: list[dict]) -> tuple[int, int, int, int, int]:
        """(read, applied, duplicates, superseded, quarantined) of one file of ``events``."""
        self.files += 1
        path = self.folder / f"events-{self.files:02d}.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
        result = ingest.ingest_paths([path], self.settings)
        assert result["balanced"], result
        return tuple(
            result[k] for k in ("read", "applied", "duplicates", "superseded", "quarantined")
        )

    def query(self, sql: str) -> list[tuple]:
        engine = store.engine_for(self.settings.live_store_url)
        try:
            with engine.connect() as connection:
                return [tuple(row) for row in connection.execute(text(sql))]
        finally:
            engine.dispose()

    def dismissed(self) -> set[tuple[int, int]]:
        return set(self.query("SELECT user_id, candidate_id FROM dismissed_candidates"))


@pytest.fixture
def live(store_url: str, tmp_path: Path):
    live = Live(Settings(home=tmp_path / "home", store_url=store_url), tmp_path)
    yield live
    live.api.close()


def micros(moment: dt.datetime) -> int:
    return (moment - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


def test_api_dismissal_at_10_supersedes_an_ingested_undismiss_at_5(live):
    """API dismiss 1->2 at m10, then an ingested undismiss 1->2 at m5 arrives (late): it is
    older than the dismissal, so it is superseded (read 1 = superseded 1) and 1->2 stays
    dismissed. An undismiss at m15 is newer: applied, the dismissal is gone.
    Before the fix the API row had no version and the m5 undismiss deleted it."""
    created = read_path.record_dismissal(live.api, 1, 2, at(10))
    assert created["created"] is True
    assert live.ingest([event("u5", "undismiss", at(5), 1, 2)]) == (1, 0, 0, 1, 0)
    assert live.dismissed() == {(1, 2)}
    assert live.ingest([event("u15", "undismiss", at(15), 1, 2)]) == (1, 1, 0, 0, 0)
    assert live.dismissed() == set()


def test_api_undismissal_at_10_supersedes_an_ingested_dismiss_at_5(live):
    """Ingested dismiss 1->2 at m1; API undismiss at m10 removes it and leaves a tombstone at
    m10; an ingested dismiss at m5 arriving after that is superseded (read 1 = superseded 1),
    1->2 stays undismissed. A dismiss at m20 is newer: applied, dismissed again.
    Before the fix the API delete left no tombstone and the m5 dismiss resurrected the row."""
    assert live.ingest([event("d1", "dismiss", at(1), 1, 2)]) == (1, 1, 0, 0, 0)
    read_path.remove_dismissal(live.api, 1, 2, at(10))
    assert live.dismissed() == set()
    assert live.ingest([event("d5", "dismiss", at(5), 1, 2)]) == (1, 0, 0, 1, 0)
    assert live.dismissed() == set()
    assert live.ingest([event("d20", "dismiss", at(20), 1, 2)]) == (1, 1, 0, 0, 0)
    assert live.dismissed() == {(1, 2)}


def test_api_writes_leave_the_versions_ingestion_reads(live):
    """API dismiss 1->3 at m10: row version (m10 in µs, "api:dismiss"). A second API dismiss
    at m20 changes nothing visible (created False, dismissed_at still m10) but re-affirms it:
    version (m20, "api:dismiss"), as an ingested dismiss of an existing dismissal does. An
    API undismiss at m30: row deleted, tombstone (dismiss, 1, 3, m30, "api:undismiss").
    """
    read_path.record_dismissal(live.api, 1, 3, at(10))
    rows = live.query("SELECT event_time_us, event_id FROM dismissed_candidates")
    assert rows == [(micros(at(10)), "api:dismiss")]
    again = read_path.record_dismissal(live.api, 1, 3, at(20))
    assert again == {
        "user_id": 1,
        "candidate_id": 3,
        "dismissed_at": "2026-10-01T12:10:00Z",
        "created": False,
    }
    rows = live.query("SELECT event_time_us, event_id FROM dismissed_candidates")
    assert rows == [(micros(at(20)), "api:dismiss")]
    read_path.remove_dismissal(live.api, 1, 3, at(30))
    assert live.dismissed() == set()
    tombstones = live.query(
        "SELECT relation, source_id, target_id, event_time_us, event_id "
        "FROM relationship_tombstones"
    )
    assert tombstones == [("dismiss", 1, 3, micros(at(30)), "api:undismiss")]


def test_undismissing_nothing_is_404_and_writes_nothing(live):
    """API undismiss of 1->2 at m10 with no dismissal, and of 4242->2 (no such user):
    ``DismissalNotFoundError`` (404) and no row anywhere (review: recording a tombstone per
    request let any token holder grow the table without bound). A dismiss at m5 that arrives
    afterwards therefore applies (read 1 = applied 1)."""
    with pytest.raises(DismissalNotFoundError, match="user 1 has not dismissed 2"):
        read_path.remove_dismissal(live.api, 1, 2, at(10))
    with pytest.raises(DismissalNotFoundError, match="user 4242 has not dismissed 2"):
        read_path.remove_dismissal(live.api, 4242, 2, at(10))
    assert live.query("SELECT count(*) FROM relationship_tombstones") == [(0,)]
    assert live.ingest([event("d5", "dismiss", at(5), 1, 2)]) == (1, 1, 0, 0, 0)
    assert live.dismissed() == {(1, 2)}


def test_an_api_write_is_ordered_after_the_version_it_replaces(live):
    """An upstream producer's clock runs 20 minutes ahead: its undismiss 1->2 is dated m30
    and ingested first. The API then dismisses 1->2 with its own clock at m10. The user acted
    after seeing the state the m30 event left, so the dismissal must take effect: it is
    recorded 1 µs after that version (m30 + 1 µs, "api:dismiss"), not at m10 (where it would
    be superseded and silently lost). An ingested undismiss at m20 is then superseded.
    """
    assert live.ingest([event("u30", "undismiss", at(30), 1, 2)]) == (1, 1, 0, 0, 0)
    assert read_path.record_dismissal(live.api, 1, 2, at(10))["created"] is True
    rows = live.query("SELECT event_time_us, event_id FROM dismissed_candidates")
    assert rows == [(micros(at(30)) + 1, "api:dismiss")]
    assert live.ingest([event("u20", "undismiss", at(20), 1, 2)]) == (1, 0, 0, 1, 0)
    assert live.dismissed() == {(1, 2)}


# --- through HTTP (the api_fixtures world: SQLite, clock fixed at NOW) -------------------------


def ingest_into(world, name: str, events: list[dict]) -> dict:
    path = world.home.parent / name
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    result = ingest.ingest_paths([path], world.settings)
    assert result["balanced"], result
    return result


def test_http_dismissal_is_not_undone_by_an_older_ingested_undismiss(client, world):
    """POST dismissal 1 -> 21 at NOW (the API's clock); an undismiss dated NOW - 5 min is
    ingested afterwards: superseded, and 21 stays out of user 1's list (20 22 23 24)."""
    response = client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=bearer(1))
    assert response.status_code == 201
    stale = event("late", "undismiss", NOW - dt.timedelta(minutes=5), 1, 21)
    assert ingest_into(world, "late.jsonl", [stale])["superseded"] == 1
    listed = client.get("/v1/users/1/who-to-follow", headers=bearer(1)).json()["items"]
    assert [item["candidate_id"] for item in listed] == [20, 22, 23, 24]


def test_http_undismissal_is_not_undone_by_an_older_ingested_dismiss(client, world):
    """POST then DELETE dismissal 1 -> 21, both at the API's clock NOW (the DELETE is ordered
    after the POST's version: NOW + 1 us); a dismiss dated NOW - 1 min, older than the DELETE,
    is ingested afterwards: superseded, and 21 is back in user 1's list (20 21 22 23 24)."""
    client.post("/v1/users/1/dismissals", json={"candidate_id": 21}, headers=bearer(1))
    assert client.delete("/v1/users/1/dismissals/21", headers=bearer(1)).status_code == 204
    stale = event("late", "dismiss", NOW - dt.timedelta(minutes=1), 1, 21)
    assert ingest_into(world, "late.jsonl", [stale])["superseded"] == 1
    listed = client.get("/v1/users/1/who-to-follow", headers=bearer(1)).json()["items"]
    assert [item["candidate_id"] for item in listed] == [20, 21, 22, 23, 24]
