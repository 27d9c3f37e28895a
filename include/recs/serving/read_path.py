"""The online read path as plain functions: batch list → read-time filters → cold start.

``who_to_follow`` answers one request. The API (``serving.api``) and ``recs recommend`` both
call it, so there is one read path. It reads only the published version the server serves
(``versions``) and the live store (``live_store``), never a run's working files.

Flow for user ``u`` (design document, "Online Serving Layer and Cold-Start Handler"):

1. **Account** (live store): unknown → ``UnknownUserError`` (404); not ``active`` → the same.
   Cold start if the account is younger than ``cold_start_account_age_hours`` (24 h, from the
   *wall clock*: this is the online path; ``now`` is injected for tests) or follows fewer than
   ``cold_start_min_following`` (5) accounts (counted with a ``LIMIT``).
2. **Batch list**: the user's rows of the published version, best first.
3. **Read-time filters** (``filters``): dismissed, blocked, muted (fail closed), followed,
   requested, suspended, deactivated, hidden or gone since the snapshot (fail open); every drop
   is counted by reason. The "followed by" ids keep only accounts the user still follows;
   ``mutual_count`` stays the batch's and ``others = mutual_count - len(published ids)``.
4. **Cold start** (``cold_start``) when step 1 says so, or no version is served, or the user
   has no batch row, or every batch row was dropped.
5. **Fill** (``fill_short_lists``, issue 13): a batch list left shorter than ``limit`` is
   topped up with cold-start items (never one already listed; the same read-time filters), so
   every eligible user gets a full list; ``source`` stays ``batch``, the added items have
   ``score`` None and ``mutual_count`` 0 like any cold-start item.

Items are renumbered ``rank = 1..n`` after filtering (the served position).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from recs.config import Settings
from recs.errors import DismissalNotFoundError, InvalidRequestError, UnknownUserError, quoted
from recs.serving.cold_start import cold_start_items
from recs.serving.filters import LiveCheck
from recs.serving.live_store import LiveStore
from recs.serving.metrics import COLD_START, DROPPED, FILLED, FOLLOWED_BY_DROPPED
from recs.serving.versions import BatchRow, PublishedVersion
from recs.times import utc_iso, wall_clock

Clock = Callable[[], dt.datetime]
"""A function returning now as naive UTC (``wall_clock`` in production, a fixed one in tests)."""

__all__ = ["Clock", "parse_limit", "record_dismissal", "remove_dismissal", "wall_clock",
           "who_to_follow"]  # fmt: skip


def parse_limit(text: str | int | None, settings: Settings) -> int:
    """``?limit=`` as an int in ``1 .. api_max_limit`` (default ``api_default_limit`` when
    None: not given). Text is canonical decimal, as ids are (``auth.parse_id``): ``""``,
    `` 5`` (``?limit=+5`` decodes to it), ``05`` and ``5.0`` are refused, not read as 5 or the
    default (a newcomer found ids strict and the limit beside them lenient). Raises
    ``InvalidRequestError``."""
    if text is None:
        return min(settings.api_default_limit, settings.api_max_limit)
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif text.isascii() and text.isdigit() and not text.startswith("0") and len(text) <= 9:
        value = int(text)
    else:
        value = -1
    if not 1 <= value <= settings.api_max_limit:
        raise InvalidRequestError(
            f"invalid limit {quoted(text)}: expected an integer between 1 and "
            f"{settings.api_max_limit}"
        )
    return value


def who_to_follow(
    user_id: int,
    limit: int,
    *,
    version: PublishedVersion | None,
    store: LiveStore,
    settings: Settings,
    now: dt.datetime,
) -> dict[str, Any]:
    """One user's who-to-follow list (module docstring: the flow and every rule).

    ``version`` is the published version to read (None: nothing loaded, cold start only);
    ``now`` is naive UTC (the wall clock in production). Returns::

        {"user_id": int, "source": "batch" | "cold_start", "run_id": str | None,
         "generated_at": "YYYY-MM-DDTHH:MM:SSZ" | None,
         "cold_start_reason": None (batch) | "new_account" | "thin_graph" | "no_version"
                              | "no_batch_row" | "all_dropped",
         "items": [{"candidate_id": int, "rank": int (1..n), "score": float | None,
                    "mutual_count": int,
                    "followed_by": {"ids": [int, ...] (<= 3), "others": int}}, ...]}

    with at most ``limit`` items. Raises ``UnknownUserError`` (not in the live store, or not an
    active account) and ``StoreUnavailableError`` (the live store failed a fail-closed check).
    """
    account = store.account(user_id, settings.cold_start_min_following)
    if account is None:
        raise UnknownUserError(f"unknown user {user_id}: not in the live store")
    if account.account_status != "active":
        raise UnknownUserError(
            f"user {user_id} is {account.account_status}: only active accounts get recommendations"
        )
    age = now - account.created_at
    if age < dt.timedelta(hours=settings.cold_start_account_age_hours):
        reason = "new_account"
    elif account.following < settings.cold_start_min_following:
        reason = "thin_graph"
    elif version is None:
        reason = "no_version"
    else:
        rows, generated_at = version.batch_rows(user_id)
        if not rows:
            reason = "no_batch_row"
        else:
            check = LiveCheck(user_id, store)
            items = _validated_batch(rows, limit, check)
            if items:
                if settings.fill_short_lists and len(items) < limit:
                    filled = cold_start_items(
                        user_id, limit - len(items), version, store,
                        skip={item["candidate_id"] for item in items},
                        first_rank=len(items) + 1, check=check,
                    )
                    FILLED.inc(len(filled))
                    items.extend(filled)
                return _document(user_id, "batch", version.run_id, generated_at, items, None)
            reason = "all_dropped"
    COLD_START.labels(reason).inc()
    items = cold_start_items(user_id, limit, version, store)
    return _document(
        user_id,
        "cold_start",
        version.run_id if version else None,
        version.generated_at if version else None,
        items,
        reason,
    )


def _document(user_id, source, run_id, generated_at, items, reason) -> dict[str, Any]:
    return {
        "user_id": user_id,
        "source": source,
        "run_id": run_id,
        "generated_at": utc_iso(generated_at) if generated_at else None,
        "cold_start_reason": reason,  # why not the batch list (the metric's reason label)
        "items": items,
    }


def _validated_batch(rows: list[BatchRow], limit: int, check: LiveCheck) -> list[dict[str, Any]]:
    candidates = [row.candidate_id for row in rows]
    mutuals = sorted({m for row in rows for m in row.followed_by})
    dropped, follows = check.drops(candidates, mutuals)
    items: list[dict[str, Any]] = []
    for row in rows:
        reason = dropped.get(row.candidate_id)
        if reason is not None:
            DROPPED.labels("batch", reason).inc()
            continue
        if len(items) >= limit:
            continue
        followed_by = list(row.followed_by)
        if follows is not None:
            followed_by = [m for m in row.followed_by if follows.get(m) == "active"]
            if len(followed_by) < len(row.followed_by):
                FOLLOWED_BY_DROPPED.labels("not_followed").inc(
                    len(row.followed_by) - len(followed_by)
                )
        items.append(
            {
                "candidate_id": row.candidate_id,
                "rank": len(items) + 1,
                "score": row.score,
                "mutual_count": row.mutual_count,
                "followed_by": {
                    "ids": followed_by,
                    "others": max(row.mutual_count - len(row.followed_by), 0),
                },
            }
        )
    return items


def record_dismissal(
    store: LiveStore, user_id: int, candidate_id: int, now: dt.datetime
) -> dict[str, Any]:
    """Record that ``user_id`` dismissed ``candidate_id`` at ``now`` (naive UTC), committed
    before returning: from then on the candidate is dropped on every read path (the read-time
    check) and by every later batch (the snapshot's exclusions). It is a dismiss event at
    ``now`` for ingestion's last-writer-wins (``LiveStore.add_dismissal``): an ingested
    undismiss older than it is superseded.

    Returns ``{"user_id", "candidate_id", "dismissed_at" (ISO, Z), "created"}``; ``created``
    False if it was already dismissed. Raises ``InvalidRequestError`` for dismissing oneself,
    ``UnknownUserError`` for an unknown user or candidate, ``StoreUnavailableError``.
    """
    if user_id == candidate_id:
        raise InvalidRequestError(f"user {user_id} cannot dismiss itself")
    created, dismissed_at = store.add_dismissal(user_id, candidate_id, now)
    return {
        "user_id": user_id,
        "candidate_id": candidate_id,
        "dismissed_at": utc_iso(dismissed_at),
        "created": created,
    }


def remove_dismissal(
    store: LiveStore, user_id: int, candidate_id: int, now: dt.datetime | None = None
) -> None:
    """Undo a dismissal at ``now`` (naive UTC; default the wall clock): an undismiss event
    for ingestion's last-writer-wins (``LiveStore.remove_dismissal``). Raises
    ``DismissalNotFoundError`` if there was none (the undismissal is still recorded),
    ``StoreUnavailableError`` if the store failed."""
    if not store.remove_dismissal(user_id, candidate_id, now):
        raise DismissalNotFoundError(f"user {user_id} has not dismissed {candidate_id}")
