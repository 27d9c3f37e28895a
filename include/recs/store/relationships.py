"""Relationships of the live store and their versions: last writer wins by ``(time, event id)``.

A relationship is a directed pair of one kind (``RELATIONS``): follow (follower -> followee),
block (blocker -> blocked), mute (muter -> muted), dismiss (user -> dismissed candidate). Its
**version** is the ``(event_time_us, event_id)`` of the last write applied to it, kept on its row
and, once the row is deleted, in ``relationship_tombstones`` (``recs.store.schema``). Every
writer, ingestion (``recs.ingest``) and the read API's dismissals alike, orders writes the same
way: by event time in epoch microseconds, then by event id (text), and a write changes a
relationship only if it is newer than its version (``supersedes``). Writers serialise on the
same lock (``ADVISORY_LOCK_KEY`` on PostgreSQL, ``BEGIN IMMEDIATE`` on SQLite).

Pure functions, standard library only.
"""

from __future__ import annotations

Version = tuple[int, str]
"""``(event_time_us, event_id)`` of the last write applied to a relationship."""

RELATIONS = ("follow", "block", "mute", "dismiss")

PAIR_TABLES: dict[str, tuple[str, str, str, str]] = {
    "follow": ("follow_edges", "follower_id", "followee_id", "created_at"),
    "block": ("blocks", "blocker_id", "blocked_id", "created_at"),
    "mute": ("mutes", "muter_id", "muted_id", "created_at"),
    "dismiss": ("dismissed_candidates", "user_id", "candidate_id", "dismissed_at"),
}
"""Store table, source column, target column and timestamp column of each relation."""

ADVISORY_LOCK_KEY = 0x7265_6373_696E
"""PostgreSQL transaction-scoped advisory lock ('recsin') every relationship writer takes:
one writer at a time, so a read-modify-write of a version never interleaves with another."""


def supersedes(stamp: Version, version: Version | None) -> bool:
    """Whether a write at ``stamp`` changes a relationship whose version is ``version``
    (None: no write recorded yet, e.g. a row loaded in bulk): it must be strictly newer in
    ``(event_time_us, event_id)`` order. A write that does not supersede is ignored."""
    return version is None or stamp > version


def write_time_after(time_us: int, event_id: str, version: Version | None) -> int:
    """The event time for a write made now (``time_us``, with ``event_id``) that must take
    effect whatever came before: ``time_us`` itself if it supersedes ``version``, else 1 µs
    after the version's time (a producer's clock ahead of ours), so it supersedes it."""
    if supersedes((time_us, event_id), version):
        return time_us
    return version[0] + 1
