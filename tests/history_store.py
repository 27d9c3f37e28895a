"""A live store with a history around 2026-11-01, for the point-in-time tests (unit and DAG).

The times, the rows and what a snapshot of 2026-11-01 (cut-off 2026-11-02 00:00 UTC) must
hold are derived by hand in ``tests/unit/nightly/test_point_in_time.py``'s docstring.
"""

from __future__ import annotations

import datetime as dt

from recs.config import Settings
from recs.store import schema
from recs.store.connections import engine_for

OCT = dt.datetime(2026, 10, 1)
NOV = dt.datetime(2026, 11, 1)
CUT_OFF = dt.datetime(2026, 11, 2)


def at(days: float) -> dt.datetime:
    """``days`` after 2026-11-01 00:00 (naive UTC)."""
    return NOV + dt.timedelta(days=days)


USERS = [(1, OCT, at(5)), (2, OCT, dt.datetime(2026, 10, 20)), (3, at(0.5), at(0.75)),
         (4, at(4), at(5))]  # fmt: skip
FOLLOWS = [(1, 2, OCT + dt.timedelta(days=1)), (2, 1, OCT + dt.timedelta(days=1)),
           (1, 3, at(20 / 24)), (3, 1, at(2)), (4, 1, at(4)), (2, 3, at(3))]  # fmt: skip


def build_store(settings: Settings) -> None:
    settings.home.mkdir(parents=True, exist_ok=True)
    engine = engine_for(settings.live_store_url)
    schema.create_schema(engine)
    with engine.begin() as connection:
        connection.execute(
            schema.users.insert(),
            [dict(user_id=u, created_at=c, last_active_at=a, account_status="active",
                  is_discoverable=True, is_private=False) for u, c, a in USERS],
        )  # fmt: skip
        connection.execute(
            schema.follow_edges.insert(),
            [dict(follower_id=a, followee_id=b, created_at=t, status="active")
             for a, b, t in FOLLOWS],
        )  # fmt: skip
        connection.execute(
            schema.blocks.insert(), [dict(blocker_id=2, blocked_id=3, created_at=at(2))]
        )
        connection.execute(
            schema.mutes.insert(),
            [dict(muter_id=1, muted_id=2, created_at=dt.datetime(2026, 10, 15))],
        )
        connection.execute(
            schema.dismissed_candidates.insert(),
            [dict(user_id=2, candidate_id=3, dismissed_at=at(21 / 24))],
        )
        connection.execute(
            schema.user_interests.insert(),
            [dict(user_id=1, tag="music"), dict(user_id=4, tag="sports")],
        )
    engine.dispose()


def add_mutual_friends(settings: Settings) -> None:
    """Users 5, 6, 7 (October) and follows 1->5, 1->6, 5->7, 6->7 (October): user 1 reaches 7
    through two of its follows, so every snapshot from November on gives user 1 the list [7]."""
    engine = engine_for(settings.live_store_url)
    with engine.begin() as connection:
        connection.execute(
            schema.users.insert(),
            [dict(user_id=u, created_at=OCT, last_active_at=at(0), account_status="active",
                  is_discoverable=True, is_private=False) for u in (5, 6, 7)],
        )  # fmt: skip
        connection.execute(
            schema.follow_edges.insert(),
            [dict(follower_id=a, followee_id=b, created_at=OCT, status="active")
             for a, b in ((1, 5), (1, 6), (5, 7), (6, 7))],
        )  # fmt: skip
    engine.dispose()
