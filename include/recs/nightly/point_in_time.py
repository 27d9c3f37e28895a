"""What a snapshot holds as of its run's cut-off, and when one may be made at all.

The cut-off is ``RunPaths.as_of``, the end of the run's data interval ``[date, cut-off)``: a row
created at or after it is left out (``CUT_OFF_COLUMNS``), and so is a row naming an account
created after it (``ACCOUNT_COLUMNS``); ``last_active_at`` is clamped to it. A snapshot is made
only once the cut-off has passed (``refuse_cut_off_ahead``: the one place a nightly run reads the
clock) and while the store still shows the date (``retained.refuse_stale``). Applied by
``retained.freeze`` as it reads the live store; tests: ``tests/unit/nightly/test_point_in_time.py``.
"""

from __future__ import annotations

import datetime as dt

import polars as pl

from recs.errors import CutOffAheadError
from recs.nightly.runs import RunPaths

CUT_OFF_COLUMNS = {
    "users": "created_at",
    "follow_edges": "created_at",
    "blocks": "created_at",
    "mutes": "created_at",
    "dismissed_candidates": "dismissed_at",
}
"""The time a row came into being, per table: rows at or after the cut-off are left out (the
data interval ``[date, cut-off)`` is half-open). Interests carry no time and are kept."""
ACCOUNT_COLUMNS = {
    "follow_edges": ("follower_id", "followee_id"),
    "blocks": ("blocker_id", "blocked_id"),
    "mutes": ("muter_id", "muted_id"),
    "dismissed_candidates": ("user_id", "candidate_id"),
    "user_interests": ("user_id",),
}
"""The account ids each table names (a row naming an account created after the cut-off goes)."""


def refuse_cut_off_ahead(paths: RunPaths, now: dt.datetime) -> None:
    """Raise ``CutOffAheadError`` when ``paths``' cut-off is later than ``now`` (naive UTC, the
    wall clock): the day is not over, and what is frozen now would be retained as the whole day
    and reused by its own run. The one place a nightly run reads the clock: it decides whether
    a snapshot may be made, never what goes into it."""
    cut_off = paths.as_of.replace(tzinfo=None)
    if cut_off <= now:
        return
    day = paths.snapshot_date
    latest = (now - dt.timedelta(days=1)).date().isoformat()
    raise CutOffAheadError(
        f"the day {day.isoformat()} is not over: its cut-off {cut_off.isoformat()}Z is still "
        f"ahead (now {now.isoformat(timespec='seconds')}Z), and a snapshot frozen now would be "
        f"kept as the whole day's. Run {latest} or an earlier day (an Airflow run without a "
        "logical date takes the latest complete day), or wait for the cut-off",
        seconds_ahead=(cut_off - now).total_seconds(),
    )


def newest(users: pl.DataFrame) -> dt.datetime | None:
    """The latest account creation or activity in the store (naive UTC), None if empty."""
    latest = users.select(pl.max_horizontal(pl.col("created_at").max(),
                                            pl.col("last_active_at").max())).item()  # fmt: skip
    return latest


def users_as_of(
    users: pl.DataFrame, cut_off: dt.datetime
) -> tuple[pl.DataFrame, pl.Series, dict[str, int]]:
    """The accounts that existed by the cut-off, ``last_active_at`` clamped to it; the ids of
    the later ones (rows naming them are dropped too); rows left out per table so far."""
    later = pl.col("created_at") >= cut_off
    dropped = users.filter(later).get_column("user_id")
    kept = users.filter(later.not_() | pl.col("created_at").is_null()).with_columns(
        pl.when(pl.col("last_active_at") > cut_off)
        .then(pl.lit(cut_off, dtype=pl.Datetime("us")))
        .otherwise(pl.col("last_active_at"))
        .alias("last_active_at")
    )
    return kept, dropped, {"users": dropped.len()}


def as_of(
    frame: pl.DataFrame,
    name: str,
    cut_off: dt.datetime,
    dropped: pl.Series,
    excluded: dict[str, int],
) -> pl.DataFrame:
    """``frame``'s rows that existed by the cut-off (``CUT_OFF_COLUMNS``) and name no account
    created after it; counts what it leaves out in ``excluded[name]``."""
    keep = pl.lit(True)
    column = CUT_OFF_COLUMNS.get(name)
    if column is not None:  # the data interval is half-open: the cut-off itself is the next day
        keep = keep & (pl.col(column) < cut_off).fill_null(True)
    if dropped.len():
        for account in ACCOUNT_COLUMNS.get(name, ()):
            keep = keep & pl.col(account).is_in(dropped.implode()).not_()
    excluded.setdefault(name, 0)
    if frame.select(keep.fill_null(False).all()).item():  # NULL: the filter drops the row
        return frame  # a nightly read keeps every row: no copy of them
    kept = frame.filter(keep)
    excluded[name] = excluded.get(name, 0) + frame.height - kept.height
    return kept


def is_eligible(cut_off: dt.datetime, window_days: int) -> pl.Expr:
    """The users dbt's ``eligible_users`` selects, as a Polars filter: active, and active since
    ``cut_off - window_days`` (``cut_off`` naive or aware UTC). The shard plan is sized by it and
    the gate compares with it."""
    since = cut_off.replace(tzinfo=None) - dt.timedelta(days=window_days)
    return (pl.col("account_status") == "active") & (pl.col("last_active_at") >= since)
