"""recs.times: naive UTC datetimes, epoch microseconds and ISO text, converted one way only."""

from __future__ import annotations

import datetime as dt

from recs.times import (
    MAX_EPOCH_US,
    MIN_EPOCH_US,
    epoch_micros,
    from_epoch_micros,
    naive_utc,
    utc_iso,
    wall_clock,
)


def test_naive_and_aware_times_name_the_same_instant():
    """10:30+02:00 is 08:30 UTC; a naive time is taken as UTC."""
    aware = dt.datetime(2026, 11, 1, 10, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    naive = dt.datetime(2026, 11, 1, 8, 30)
    assert naive_utc(aware) == naive
    assert naive_utc(naive) is naive
    assert epoch_micros(aware) == epoch_micros(naive) == 1_793_521_800_000_000
    assert from_epoch_micros(1_793_521_800_000_001) == naive + dt.timedelta(microseconds=1)
    assert utc_iso(aware) == utc_iso(naive) == "2026-11-01T08:30:00Z"


def test_times_past_the_datetime_range_in_utc_do_not_overflow():
    """0001-01-01T00:00+05:00 is five hours before datetime.min in UTC: a number below the
    range, not an OverflowError."""
    early = dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    assert epoch_micros(early) == MIN_EPOCH_US - 5 * 3600 * 1_000_000
    assert epoch_micros(dt.datetime.max) == MAX_EPOCH_US
    assert from_epoch_micros(MIN_EPOCH_US) == dt.datetime.min


def test_the_wall_clock_is_naive_utc():
    before = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    now = wall_clock()
    assert now.tzinfo is None
    assert dt.timedelta(0) <= now - before < dt.timedelta(seconds=5)
