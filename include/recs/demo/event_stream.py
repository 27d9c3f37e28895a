"""A deterministic synthetic upstream event stream (JSON Lines) for tests, benchmarks and demos.

``synthetic_events(n_users, seed)`` yields what the follow service would emit for a small
social network over ``SPAN_DAYS`` days, as ``recs ingest`` reads it: one ``user_upsert`` per
user (account age, activity, privacy, status, interest tags), one follow per edge of
``recs.demo.synthetic``'s power-law graph (a ``follow_request`` or ``follow`` to a private account
stays pending until a later ``follow_accept``, or a ``follow_reject``), some later unfollows,
blocks (a few lifted again), mutes and dismissals. Times are in event order except for
``shuffle_window`` (out-of-order delivery); ``duplicate_share`` of the lines are sent twice and
``malformed_share`` replaced by broken lines (for benchmarks of the quarantine path).

Shares are round, plausible numbers chosen to exercise every event type, not measurements.
Deterministic for ``seed``: the same arguments always give the same lines.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from recs.demo.generated import INTEREST_TAGS, rng_for
from recs.files import atomic_write
from recs.times import MICROS_PER_DAY, utc_iso

STREAM_START = dt.datetime(2026, 10, 1)
SPAN_DAYS = 30
PRIVATE_SHARE = 0.05
SUSPENDED_SHARE = 0.02
UNFOLLOW_SHARE = 0.08
ACCEPT_SHARE = 0.7  # of pending requests; REJECT_SHARE more are rejected, the rest stay pending
REJECT_SHARE = 0.1
BLOCK_RATE = 0.01  # blocks per user
UNBLOCK_SHARE = 0.2
MUTE_RATE = 0.02
DISMISS_RATE = 0.05
STREAM_SEED_OFFSET = 4_242  # keeps the stream's random numbers apart from the graph's


def _iso(moment_us: int) -> str:
    return utc_iso(STREAM_START + dt.timedelta(microseconds=int(moment_us)))


def synthetic_events(
    n_users: int,
    seed: int,
    *,
    avg_out_degree: float = 20,
    shuffle_window: int = 50,
    duplicate_share: float = 0.0,
    malformed_share: float = 0.0,
) -> Iterator[str]:
    """JSON lines of a synthetic stream for users ``0 .. n_users-1`` (see the module doc).

    The follows are the edges of ``recs.demo.synthetic.synthetic_follow_graph(n_users, seed,
    avg_out_degree=...)``. Raises ``DatasetError`` for ``n_users < 1``.
    """
    from recs.demo.synthetic import synthetic_follow_graph

    rng = rng_for(seed + STREAM_SEED_OFFSET, 1)
    span_us = SPAN_DAYS * MICROS_PER_DAY
    events: list[tuple[int, str, dict]] = []  # (time_us, kind, fields)

    private = rng.random(n_users) < PRIVATE_SHARE
    suspended = rng.random(n_users) < SUSPENDED_SHARE
    age_days = rng.integers(2, 900, n_users)
    active_us = span_us - rng.integers(0, 10 * MICROS_PER_DAY, n_users)
    tag_count = rng.integers(1, 3, n_users)
    for user in range(n_users):
        tags = rng.choice(len(INTEREST_TAGS), int(tag_count[user]), replace=False)
        fields = {
            "created_at": _iso(-int(age_days[user]) * MICROS_PER_DAY),
            "last_active_at": _iso(int(active_us[user])),
            "is_private": bool(private[user]),
            "interests": sorted(INTEREST_TAGS[t] for t in tags),
        }
        if suspended[user]:
            fields["status"] = "suspended"
        events.append((user, "user_upsert", {"actor_id": user, **fields}))

    graph = synthetic_follow_graph(n_users, seed, avg_out_degree=avg_out_degree)
    follows = [(src, dst) for src, dst in graph.edge_chunks()]
    src = np.concatenate([graph.user_ids[s] for s, _ in follows]) if follows else np.zeros(0)
    dst = np.concatenate([graph.user_ids[d] for _, d in follows]) if follows else np.zeros(0)
    n_edges = len(src)
    start = 1_000_000 + rng.integers(0, span_us // 2, n_edges)
    later = start + rng.integers(1_000_000, span_us // 2, n_edges)
    request = rng.random(n_edges) < 0.5
    outcome = rng.random(n_edges)
    unfollow = rng.random(n_edges) < UNFOLLOW_SHARE
    for i in range(n_edges):
        a, b = int(src[i]), int(dst[i])
        kind = "follow_request" if private[b] and request[i] else "follow"
        events.append((int(start[i]), kind, {"actor_id": a, "target_id": b}))
        if private[b]:
            if outcome[i] < ACCEPT_SHARE:
                events.append((int(later[i]), "follow_accept", {"actor_id": b, "target_id": a}))
            elif outcome[i] < ACCEPT_SHARE + REJECT_SHARE:
                events.append((int(later[i]), "follow_reject", {"actor_id": b, "target_id": a}))
        elif unfollow[i]:
            events.append((int(later[i]), "unfollow", {"actor_id": a, "target_id": b}))

    def pairs(rate: float) -> Iterator[tuple[int, int, int]]:
        count = int(rate * n_users)
        left = rng.integers(0, n_users, count)
        right = rng.integers(0, n_users, count)
        moment = 1_000_000 + rng.integers(0, span_us, count)
        for a, b, t in zip(left.tolist(), right.tolist(), moment.tolist(), strict=True):
            if a != b:
                yield a, b, t

    for a, b, t in pairs(BLOCK_RATE):
        events.append((t, "block", {"actor_id": a, "target_id": b}))
        if rng.random() < UNBLOCK_SHARE:
            events.append((t + span_us // 10, "unblock", {"actor_id": a, "target_id": b}))
    for a, b, t in pairs(MUTE_RATE):
        events.append((t, "mute", {"actor_id": a, "target_id": b}))
    for a, b, t in pairs(DISMISS_RATE):
        events.append((t, "dismiss", {"actor_id": a, "target_id": b}))

    events.sort(key=lambda e: e[0])
    order = np.argsort(np.arange(len(events)) + rng.integers(0, shuffle_window + 1, len(events)))
    duplicate = rng.random(len(events)) < duplicate_share
    malformed = rng.random(len(events)) < malformed_share
    for position, index in enumerate(order.tolist()):
        moment, kind, fields = events[index]
        line = json.dumps(
            {"event_id": f"e{index}", "event_type": kind, "event_time": _iso(moment), **fields},
            separators=(",", ":"),
        )
        if malformed[position]:
            line = line[: len(line) // 2]
        yield line
        if duplicate[position]:
            yield line


def write_events(path: Path, lines: Iterator[str]) -> int:
    """Write lines as a JSON Lines file, atomically (``recs.files.atomic_write``: a landing
    folder never shows a half-written file); returns the number of lines."""
    count = 0
    with atomic_write(path) as handle:
        for line in lines:
            handle.write(line)
            handle.write("\n")
            count += 1
    return count
