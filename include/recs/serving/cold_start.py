"""The cold-start list: for new or thin-graph users, or when no batch row can be served.

Order (design document, "Online Serving Layer and Cold-Start Handler"): the popularity index of
the user's interest tags (live ``user_interests``; merged by in-degree), then the ``_global``
list, then the version's ``api_cold_start_pool`` most-followed recommendable accounts, then --
only if all of those are exhausted -- a scan of the live store's eligible accounts by id. Each
chunk of candidates goes through the read-time filters (``filters.LiveCheck``; self is dropped
too), so the list is never the user, anyone it follows or requested, blocked either way, muted,
dismissed, suspended, deactivated or non-discoverable, and never empty while an eligible
account exists. It needs no batch row for the user, nor any published version at all.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from recs.errors import StoreUnavailableError
from recs.serving.filters import LiveCheck
from recs.serving.live_store import LiveStore
from recs.serving.metrics import DROPPED, FAIL_OPEN
from recs.serving.versions import PublishedVersion


def cold_start_candidates(version: PublishedVersion | None, tags: list[str]) -> Iterator[int]:
    """The version's cold-start order for ``tags`` (``PublishedVersion.popular_for``, then its
    pool), duplicates dropped; nothing without a version."""
    if version is None:
        return
    seen: set[int] = set()
    for source in (version.popular_for(tags), version.pool):
        for candidate in source:
            if candidate not in seen:
                seen.add(candidate)
                yield candidate


def cold_start_items(
    user_id: int, limit: int, version: PublishedVersion | None, store: LiveStore,
    *, skip: set[int] | frozenset[int] = frozenset(), first_rank: int = 1,
    check: LiveCheck | None = None,
) -> list[dict[str, Any]]:
    """Up to ``limit`` cold-start items (module docstring), ranks ``first_rank..``, ``score``
    None, ``mutual_count`` 0, no "followed by"; never one of ``skip`` (the batch items a short
    list is topped up after). ``check``: the request's ``LiveCheck`` if it has one already (a
    short batch list being filled), so the user's exclusions and follows are fetched once per
    request. Raises ``StoreUnavailableError`` if a fail-closed check fails."""
    if check is None:
        check = LiveCheck(user_id, store)
    try:
        tags = store.interests(user_id)
    except StoreUnavailableError:
        FAIL_OPEN.labels("interests").inc()
        tags = []
    accepted: list[int] = []
    considered: set[int] = set(skip)
    candidates = (c for c in cold_start_candidates(version, tags) if c not in skip)
    while len(accepted) < limit:
        want = max(limit - len(accepted) + 8, 16)  # a few spare for the ones dropped
        chunk = list(itertools.islice(candidates, want))
        if not chunk:
            break
        considered.update(chunk)
        dropped, _ = check.drops(chunk)
        for candidate in chunk:
            reason = dropped.get(candidate)
            if reason is not None:
                DROPPED.labels("cold_start", reason).inc()
            elif len(accepted) < limit:
                accepted.append(candidate)
    after = -1
    while len(accepted) < limit:  # last resort: the live store itself (fail closed)
        page = store.eligible_accounts(user_id, after, max(4 * limit, 64))
        if not page:
            break
        accepted.extend(c for c in page if c not in considered)
        after = page[-1]
        del accepted[limit:]
    return [
        {
            "candidate_id": candidate,
            "rank": position,
            "score": None,
            "mutual_count": 0,
            "followed_by": {"ids": [], "others": 0},
        }
        for position, candidate in enumerate(accepted, start=first_rank)
    ]
