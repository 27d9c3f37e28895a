"""Follower/following counts and mutual follows, as ingestion maintains them.

``user_follow_counts`` changes with every transition into or out of ``active``, in the same
transaction as the edge; ``reconcile_counts`` (``recs reconcile``, the design's periodic
reconciliation job) recomputes the counts from the edges and reports, or repairs, any drift.
"""

from __future__ import annotations

from recs.config import Settings
from recs.ingest.session import StoreSession
from recs.store import schema
from recs.store.connections import engine_for


def reconcile_counts(settings: Settings, *, repair: bool = False, examples: int = 10):
    """Recompute follower/following counts from the active edges and compare with
    ``user_follow_counts`` (the design's periodic reconciliation job).

    Returns ``users_checked`` (users with a stored or actual count), ``users_drifted``,
    ``follower_drift`` / ``following_drift`` (sums of absolute differences), ``examples`` (up to
    ``examples`` drifted users: ``user_id``, stored and actual counts), ``repaired``. With
    ``repair`` the stored counts are replaced by the actual ones in the same transaction (a
    write transaction: concurrent ingestion waits).
    """
    compared = f"""
        WITH actual AS ({schema.FOLLOW_COUNTS_SQL}),
        stored AS (SELECT user_id, follower_count, following_count FROM user_follow_counts),
        keys AS (SELECT user_id FROM actual UNION SELECT user_id FROM stored)
        SELECT keys.user_id,
               COALESCE(stored.follower_count, 0) AS follower_count,
               COALESCE(actual.follower_count, 0) AS actual_follower_count,
               COALESCE(stored.following_count, 0) AS following_count,
               COALESCE(actual.following_count, 0) AS actual_following_count
        FROM keys
        LEFT JOIN actual ON actual.user_id = keys.user_id
        LEFT JOIN stored ON stored.user_id = keys.user_id
    """
    session = StoreSession(settings.live_store_url)
    try:
        session.begin(write=repair)
        checked, drifted_count, follower_drift, following_drift = session.execute(
            f"SELECT COUNT(*), "  # noqa: S608 - fixed SQL
            "COALESCE(SUM(CASE WHEN follower_count <> actual_follower_count "
            "OR following_count <> actual_following_count THEN 1 ELSE 0 END), 0), "
            "COALESCE(SUM(ABS(follower_count - actual_follower_count)), 0), "
            f"COALESCE(SUM(ABS(following_count - actual_following_count)), 0) FROM ({compared}) "
            "AS compared"
        ).fetchone()
        drifted = session.execute(
            f"SELECT * FROM ({compared}) AS compared WHERE "  # noqa: S608 - fixed SQL
            "follower_count <> actual_follower_count OR following_count <> "
            "actual_following_count ORDER BY user_id LIMIT ?",
            (examples,),
        ).fetchall()
        if repair and drifted_count:
            for statement in schema.REBUILD_FOLLOW_COUNTS_SQL:
                session.execute(statement)
        session.commit()
    finally:
        session.close()
    return {
        "users_checked": int(checked),
        "users_drifted": int(drifted_count),
        "follower_drift": int(follower_drift),
        "following_drift": int(following_drift),
        "examples": [
            {
                "user_id": r[0],
                "follower_count": r[1],
                "actual_follower_count": r[2],
                "following_count": r[3],
                "actual_following_count": r[4],
            }
            for r in drifted
        ],
        "repaired": bool(repair and drifted_count),
    }


def mutual_follows(settings: Settings, user_id: int) -> list[int]:
    """The users ``user_id`` follows and is followed by (both follows active), ascending."""
    from sqlalchemy import text

    engine = engine_for(settings.live_store_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    f"SELECT friend_id FROM {schema.MUTUAL_FOLLOWS_VIEW} WHERE user_id = :user_id "
                    "ORDER BY friend_id"
                ),
                {"user_id": user_id},
            ).fetchall()
    finally:
        engine.dispose()
    return [row[0] for row in rows]


def follow_counts(settings: Settings, user_id: int) -> dict[str, int]:
    """``{"follower_count", "following_count"}`` of one user as maintained (0 if no row)."""
    from sqlalchemy import select

    engine = engine_for(settings.live_store_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                select(
                    schema.user_follow_counts.c.follower_count,
                    schema.user_follow_counts.c.following_count,
                ).where(schema.user_follow_counts.c.user_id == user_id)
            ).first()
    finally:
        engine.dispose()
    return {"follower_count": row[0] if row else 0, "following_count": row[1] if row else 0}
