"""Time conversions, defined once (light: standard library only).

The project's convention (``recs.contracts``): timestamps are **naive UTC** ``datetime``s with
microsecond precision; a relationship's version and an event's time are **epoch microseconds**
(``int``); text for people and JSON is ISO-8601 with a ``Z``. How SQLite stores a timestamp is
the store's business (``recs.store.connections``).
"""

from __future__ import annotations

import datetime as dt

EPOCH = dt.datetime(1970, 1, 1)
"""The Unix epoch as naive UTC."""
_EPOCH_UTC = EPOCH.replace(tzinfo=dt.UTC)
ONE_MICROSECOND = dt.timedelta(microseconds=1)
MICROS_PER_SECOND = 1_000_000
MICROS_PER_DAY = 86_400 * MICROS_PER_SECOND
MIN_EPOCH_US = (dt.datetime.min - EPOCH) // ONE_MICROSECOND
"""Epoch microseconds of ``datetime.min`` (0001-01-01): the earliest instant a naive
``datetime``, and so the store, can hold."""
MAX_EPOCH_US = (dt.datetime.max - EPOCH) // ONE_MICROSECOND
"""Epoch microseconds of ``datetime.max`` (9999-12-31T23:59:59.999999)."""


def naive_utc(moment: dt.datetime) -> dt.datetime:
    """``moment`` as naive UTC: an aware one converted to UTC, a naive one taken as UTC."""
    if moment.tzinfo is None:
        return moment
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def epoch_micros(moment: dt.datetime) -> int:
    """``moment`` (naive UTC, or aware) as integer microseconds since the epoch.

    Computed by subtraction, not by converting to UTC first, so an aware time just outside
    years 1-9999 in UTC (``0001-01-01T00:00:00+05:00``) gives its out-of-range number instead
    of an ``OverflowError``; compare with ``MIN_EPOCH_US`` / ``MAX_EPOCH_US``.
    """
    if moment.tzinfo is None:
        return (moment - EPOCH) // ONE_MICROSECOND
    return (moment - _EPOCH_UTC) // ONE_MICROSECOND


def from_epoch_micros(time_us: int) -> dt.datetime:
    """Epoch microseconds as a naive UTC ``datetime`` (``OverflowError`` outside years 1-9999)."""
    return EPOCH + dt.timedelta(microseconds=time_us)


def utc_iso(moment: dt.datetime) -> str:
    """``moment`` as ISO-8601 UTC text with a ``Z``: ``2026-11-01T08:30:00Z``."""
    return naive_utc(moment).isoformat() + "Z"


def wall_clock() -> dt.datetime:
    """Now as naive UTC. Online paths read it (ingestion's time window, the read API); a
    nightly run only to refuse a cut-off still ahead (``point_in_time.refuse_cut_off_ahead``),
    never to compute (ARCHITECTURE §5, "Time")."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)
