"""The fields a bare follow graph lacks, generated deterministically, and the graph's load.

The real files hold only ``follower followee`` pairs. Everything else the pipeline needs
(account age, activity recency, status, discoverability, privacy, blocks, mutes, dismissals,
pending requests, interest tags) is **generated** from a seed (``DATASET_SEED`` for the real
datasets) relative to ``REFERENCE_DATE``; ``GENERATED_FIELDS`` lists them for the CLI and the
README. Each field has its own random stream (``RandomStream``), so changing one never shifts
another. ``load_graph`` writes a ``FollowGraph`` (every edge an ``active`` follow) plus its
generated fields into the live store (``recs.store.bulk.write_store``); the real datasets
(``recs.demo.datasets``) and the synthetic graphs (``recs.demo.synthetic``) both load through it,
so a synthetic store looks like a loaded one. Pending requests are *extra* rows with
``status = 'pending'`` on pairs that are not edges of the graph.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np
import polars as pl

from recs.config import Settings
from recs.demo.follow_graph import EDGE_CHUNK_ROWS, FollowGraph
from recs.store.bulk import ProgressCallback, TableRows, write_store
from recs.store.relationships import PAIR_TABLES
from recs.store.schema import ACCOUNT_STATUSES
from recs.times import MICROS_PER_SECOND, epoch_micros

log = logging.getLogger("recs.demo.generated")


# --- reference instant and seed ----------------------------------------------------------------

REFERENCE_DATE = dt.date(2026, 11, 1)
"""The snapshot date the demo DAG runs for; generated timestamps are relative to its end."""
REFERENCE_END = dt.datetime(2026, 11, 2)
"""End of ``REFERENCE_DATE`` (naive UTC), i.e. the demo run's ``as_of``. Every generated
timestamp is at most one second before it."""
DATASET_SEED = 20_261_101
"""Fixed seed of every generated field of the real datasets."""

_END_S = epoch_micros(REFERENCE_END) // MICROS_PER_SECOND
_DAY_S = 86_400

# --- the generated fields and their distributions ----------------------------------------------
# Shares and medians are plausible round numbers for a large consumer social network, chosen so
# that every branch of the product is exercised (cold start, dormant users, suspended candidates,
# both block directions, pending requests), not measurements of one.

NEW_ACCOUNT_SHARE = 0.005  # created within the 24 h before REFERENCE_END: cold start
ACCOUNT_AGE_MEDIAN_DAYS = 700.0  # lognormal account age of the others ...
ACCOUNT_AGE_SIGMA = 0.9
ACCOUNT_AGE_MIN_DAYS = 2.0  # ... clipped to 2 days .. 15 years
ACCOUNT_AGE_MAX_DAYS = 5_475.0
RECENCY_MEDIAN_DAYS = 2.0  # lognormal time since last activity: half active within 2 days,
DORMANT_AFTER_DAYS = 30.0  # ... and DORMANT_SHARE idle for more than 30 days (not eligible)
DORMANT_SHARE = 0.20
SUSPENDED_SHARE = 0.02
DEACTIVATED_SHARE = 0.01
DISCOVERABLE_SHARE = 0.97
PRIVATE_SHARE = 0.05

INTEREST_TAGS = (
    "technology",
    "science",
    "politics",
    "sports",
    "music",
    "movies",
    "gaming",
    "books",
    "business",
    "health",
    "travel",
    "food",
)
INTEREST_COUNT_PROBABILITIES = (0.5, 0.3, 0.2)  # 1, 2 or 3 tags per user
INTEREST_TAG_EXPONENT = 0.6  # tag i is picked with weight (i + 1) ** -0.6: a mild Zipf skew

# Relationship rows: count = clip(round(rate * users), 1, cap): hundreds, never millions.
# fof_share of them land on friends-of-friends (likely candidates), so they change results.
RELATIONSHIPS = {
    #                      rate    cap    fof_share
    "pending_follows": (0.005, 2_000, 0.5),
    "blocks": (0.004, 2_000, 0.5),
    "mutes": (0.003, 2_000, 0.3),
    "dismissed_candidates": (0.008, 4_000, 0.7),
}

GENERATED_FIELDS: dict[str, str] = {
    "users.created_at": (
        f"account age: {NEW_ACCOUNT_SHARE:.1%} within the last 24 h (cold start), the rest "
        f"lognormal, median {ACCOUNT_AGE_MEDIAN_DAYS:.0f} days"
    ),
    "users.last_active_at": (
        f"lognormal recency, median {RECENCY_MEDIAN_DAYS:g} days, ~{DORMANT_SHARE:.0%} idle "
        f"> {DORMANT_AFTER_DAYS:.0f} days; never before created_at"
    ),
    "users.account_status": (
        f"{SUSPENDED_SHARE:.0%} suspended, {DEACTIVATED_SHARE:.0%} deactivated, rest active"
    ),
    "users.is_discoverable": f"{DISCOVERABLE_SHARE:.0%} true",
    "users.is_private": f"{PRIVATE_SHARE:.0%} true",
    "follow_edges.created_at": "uniform between the later account creation and the reference end",
    "follow_edges (status='pending')": (
        "extra pending follow requests on pairs that are not edges of the dataset, half to "
        "friends-of-friends, half to private accounts"
    ),
    "blocks": "a few hundred, half on friends-of-friends (both directions)",
    "mutes": "a few hundred, some on friends-of-friends",
    "dismissed_candidates": "a few hundred, most on friends-of-friends",
    "user_interests": f"1-3 tags per user from {len(INTEREST_TAGS)} topics",
}
"""The fields the real files lack, generated from ``DATASET_SEED`` (name -> how)."""

ACCOUNT_STATUS_CODES = ACCOUNT_STATUSES  # code 0 active, 1 suspended, 2 deactivated


class RandomStream(IntEnum):
    """Independent random streams, so changing one generated field never shifts another."""

    USERS = 1
    INTERESTS = 2
    EDGE_TIMES = 3
    PENDING = 4
    BLOCKS = 5
    MUTES = 6
    DISMISSALS = 7
    GRAPH = 8  # recs.demo.synthetic


def rng_for(seed: int, stream: int, *extra: int) -> np.random.Generator:
    """A NumPy ``default_rng`` for one named stream of a seed (``SeedSequence([seed, ...])``)."""
    return np.random.default_rng([seed, int(stream), *extra])


# --- the dataset registry ----------------------------------------------------------------------


# --- the graph in CSR form ---------------------------------------------------------------------


# --- generated user attributes -----------------------------------------------------------------


@dataclass(frozen=True)
class UserAttributes:
    """Generated attributes by user position. Timestamps are int64 epoch **seconds** (UTC)."""

    created_s: np.ndarray
    last_active_s: np.ndarray
    status_code: np.ndarray  # int8 index into ACCOUNT_STATUS_CODES
    is_discoverable: np.ndarray
    is_private: np.ndarray


def _lognormal_sigma_for_tail(median: float, threshold: float, tail_share: float) -> float:
    """Sigma of a lognormal with this median and ``P(X > threshold) = tail_share``."""
    from statistics import NormalDist

    return float(np.log(threshold / median) / NormalDist().inv_cdf(1.0 - tail_share))


RECENCY_SIGMA = _lognormal_sigma_for_tail(RECENCY_MEDIAN_DAYS, DORMANT_AFTER_DAYS, DORMANT_SHARE)


def generate_user_attributes(n_users: int, seed: int) -> UserAttributes:
    """Account age, last activity, status, discoverability and privacy for ``n_users`` users.

    Distributions: see the module constants (``NEW_ACCOUNT_SHARE``, ``ACCOUNT_AGE_*``,
    ``RECENCY_*``, ``*_SHARE``). Guarantees ``created_s <= last_active_s < REFERENCE_END``.
    Vectorised; deterministic for ``seed``.
    """
    rng = rng_for(seed, RandomStream.USERS)
    is_new = rng.random(n_users) < NEW_ACCOUNT_SHARE
    new_age_s = rng.integers(1, _DAY_S, n_users)
    age_days = np.clip(
        rng.lognormal(np.log(ACCOUNT_AGE_MEDIAN_DAYS), ACCOUNT_AGE_SIGMA, n_users),
        ACCOUNT_AGE_MIN_DAYS,
        ACCOUNT_AGE_MAX_DAYS,
    )
    age_s = np.where(is_new, new_age_s, (age_days * _DAY_S).astype(np.int64))
    recency_s = (
        rng.lognormal(np.log(RECENCY_MEDIAN_DAYS * _DAY_S), RECENCY_SIGMA, n_users)
    ).astype(np.int64)
    recency_s = np.clip(recency_s, 1, age_s)
    status_draw = rng.random(n_users)
    status = np.zeros(n_users, dtype=np.int8)
    status[status_draw < SUSPENDED_SHARE + DEACTIVATED_SHARE] = 2
    status[status_draw < SUSPENDED_SHARE] = 1
    discoverable = rng.random(n_users) < DISCOVERABLE_SHARE
    private = rng.random(n_users) < PRIVATE_SHARE
    return UserAttributes(
        created_s=_END_S - age_s,
        last_active_s=_END_S - recency_s,
        status_code=status,
        is_discoverable=discoverable,
        is_private=private,
    )


def generate_interests(n_users: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """1-3 distinct interest tags per user: ``(user_positions, tag_indices)``, both int64.

    Tags are drawn without replacement with weight ``(i + 1) ** -INTEREST_TAG_EXPONENT``
    (Gumbel top-k: the k largest of ``log w + Gumbel noise`` are a weighted sample without
    replacement; Kool, van Hoof, Welling, "Stochastic Beams and Where to Find Them", ICML 2019).
    """
    rng = rng_for(seed, RandomStream.INTERESTS)
    counts = rng.choice(len(INTEREST_COUNT_PROBABILITIES), n_users, p=INTEREST_COUNT_PROBABILITIES)
    counts = counts + 1
    log_weights = -INTEREST_TAG_EXPONENT * np.log(np.arange(1, len(INTEREST_TAGS) + 1))
    users_out, tags_out = [], []
    for start in range(0, n_users, 200_000):
        stop = min(start + 200_000, n_users)
        keys = log_weights + rng.gumbel(size=(stop - start, len(INTEREST_TAGS)))
        order = np.argsort(-keys, axis=1, kind="stable")
        take = np.arange(len(INTEREST_TAGS)) < counts[start:stop, None]
        rows, cols = np.nonzero(take)
        users_out.append(rows + start)
        tags_out.append(order[rows, cols])
    users = np.concatenate(users_out) if users_out else np.zeros(0, np.int64)
    tags = np.concatenate(tags_out) if tags_out else np.zeros(0, np.int64)
    order = np.lexsort((tags, users))
    return users[order].astype(np.int64), tags[order].astype(np.int64)


def edge_created_s(
    src: np.ndarray, dst: np.ndarray, users: UserAttributes, rng: np.random.Generator
) -> np.ndarray:
    """Follow timestamps (epoch s): uniform between the later account creation and the end."""
    start = np.maximum(users.created_s[src], users.created_s[dst])
    span = (_END_S - 1) - start
    return start + (rng.random(len(src)) * (span + 1)).astype(np.int64)


# --- generated relationship rows ---------------------------------------------------------------


@dataclass(frozen=True)
class PairRows:
    """Generated (left, right) position pairs with epoch-second timestamps."""

    left: np.ndarray
    right: np.ndarray
    at_s: np.ndarray

    def __len__(self) -> int:
        return len(self.left)


def _relationship_count(n_users: int, rate: float, cap: int) -> int:
    if n_users < 2:
        return 0
    return int(min(max(round(rate * n_users), 1), cap))


def friend_of_friend_pairs(
    graph: FollowGraph, rng: np.random.Generator, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``count`` distinct (user, candidate) positions two hops apart, not yet followed.

    Sampling: a user with follows uniformly, one of its follows uniformly, one of that one's
    follows uniformly; pairs that are self or already followed are rejected. Result order is
    draw order (deterministic for ``rng``).
    """
    out_degree = graph.out_degree()
    with_follows = np.flatnonzero(out_degree > 0)
    if count <= 0 or len(with_follows) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    draws = 8 * count + 32
    user = with_follows[rng.integers(0, len(with_follows), draws)]
    friend = graph.indices[
        graph.indptr[user] + (rng.random(draws) * out_degree[user]).astype(np.int64)
    ].astype(np.int64)
    candidate_draw = rng.random(draws)
    has_follows = out_degree[friend] > 0
    user, friend, candidate_draw = (
        user[has_follows],
        friend[has_follows],
        candidate_draw[has_follows],
    )
    candidate = graph.indices[
        graph.indptr[friend] + (candidate_draw * out_degree[friend]).astype(np.int64)
    ].astype(np.int64)
    keep = [
        u != c and not graph.has_edge(u, c)
        for u, c in zip(user.tolist(), candidate.tolist(), strict=True)
    ]
    user, candidate = user[np.array(keep, bool)], candidate[np.array(keep, bool)]
    return _first_distinct(user, candidate, graph.n_users, count)


def _first_distinct(
    left: np.ndarray, right: np.ndarray, n_users: int, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` distinct pairs, in input order."""
    _, first = np.unique(left * n_users + right, return_index=True)
    first = np.sort(first)[:count]
    return left[first], right[first]


def _random_pairs(
    graph: FollowGraph,
    rng: np.random.Generator,
    count: int,
    *,
    targets: np.ndarray | None = None,
    non_edges: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Up to ``count`` distinct random (left, right) position pairs, left != right."""
    n = graph.n_users
    if count <= 0 or n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pool = targets if targets is not None and len(targets) else np.arange(n)
    draws = 4 * count + 16
    left = rng.integers(0, n, draws)
    right = pool[rng.integers(0, len(pool), draws)].astype(np.int64)
    keep = left != right
    if non_edges:
        keep &= np.array(
            [not graph.has_edge(u, v) for u, v in zip(left.tolist(), right.tolist(), strict=True)],
            bool,
        )
    return _first_distinct(left[keep], right[keep], n, count)


def generate_relationships(
    graph: FollowGraph, users: UserAttributes, seed: int
) -> dict[str, PairRows]:
    """Pending follow requests, blocks, mutes and dismissals (positions), per ``RELATIONSHIPS``.

    - ``pending_follows`` (follower, followee): never an existing edge; ``fof_share`` to
      friends-of-friends, the rest to private accounts.
    - ``blocks`` (blocker, blocked): the friend-of-friend share alternates direction, so both
      "user blocked candidate" and "candidate blocked user" occur.
    - ``mutes`` (muter, muted), ``dismissed_candidates`` (user, candidate).
    Timestamps are uniform between the later account creation and the reference end.
    """
    n = graph.n_users
    streams = {
        "pending_follows": RandomStream.PENDING,
        "blocks": RandomStream.BLOCKS,
        "mutes": RandomStream.MUTES,
        "dismissed_candidates": RandomStream.DISMISSALS,
    }
    result: dict[str, PairRows] = {}
    private = np.flatnonzero(users.is_private)
    for name, (rate, cap, fof_share) in RELATIONSHIPS.items():
        rng = rng_for(seed, streams[name])
        total = _relationship_count(n, rate, cap)
        fof_left, fof_right = friend_of_friend_pairs(graph, rng, round(total * fof_share))
        if name == "blocks":  # every other one: the candidate blocks the user
            flip = np.arange(len(fof_left)) % 2 == 1
            fof_left, fof_right = (
                np.where(flip, fof_right, fof_left),
                np.where(flip, fof_left, fof_right),
            )
        is_pending = name == "pending_follows"
        rnd_left, rnd_right = _random_pairs(
            graph,
            rng,
            total,
            targets=private if is_pending else None,
            non_edges=is_pending,
        )
        left, right = _first_distinct(
            np.concatenate([fof_left, rnd_left]), np.concatenate([fof_right, rnd_right]), n, total
        )
        order = np.lexsort((right, left))
        left, right = left[order], right[order]
        result[name] = PairRows(left, right, edge_created_s(left, right, users, rng))
    return result


# --- frames in the store's shape ---------------------------------------------------------------


def _timestamps(seconds: np.ndarray) -> pl.Series:
    return pl.Series(seconds.astype(np.int64) * MICROS_PER_SECOND).cast(pl.Datetime("us"))


_RELATION_OF = {
    "pending_follows": "follow",
    "blocks": "block",
    "mutes": "mute",
    "dismissed_candidates": "dismiss",
}
"""The store relation each generated kind of rows belongs to (``PAIR_TABLES``)."""


@dataclass(frozen=True)
class GeneratedFields:
    """Everything generated for one graph and seed, as frames in the store's shape.

    ``users_frame()`` (one row per graph user), ``follow_frames()`` (the graph's edges as
    active follows with generated ``created_at``, in ``EDGE_CHUNK_ROWS`` chunks), and
    ``relationship_frame(name)`` for ``RELATIONSHIPS`` (``pending_follows`` are extra
    ``follow_edges`` rows with ``status = 'pending'``) and ``interests_frame()``. Used by
    ``load_graph`` and by ``recs import edges --generate-missing`` (``recs.imports``).
    """

    graph: FollowGraph
    users: UserAttributes
    relationships: dict[str, PairRows]
    interest_users: np.ndarray
    interest_tags: np.ndarray
    seed: int

    @classmethod
    def for_graph(cls, graph: FollowGraph, seed: int) -> GeneratedFields:
        """Generate every field of ``GENERATED_FIELDS`` for ``graph`` from ``seed``."""
        users = generate_user_attributes(graph.n_users, seed)
        interest_users, interest_tags = generate_interests(graph.n_users, seed)
        return cls(
            graph,
            users,
            generate_relationships(graph, users, seed),
            interest_users,
            interest_tags,
            seed,
        )

    def users_frame(self) -> pl.DataFrame:
        users = self.users
        return pl.DataFrame(
            {
                "user_id": self.graph.user_ids,
                "created_at": _timestamps(users.created_s),
                "last_active_at": _timestamps(users.last_active_s),
                "account_status": pl.Series(ACCOUNT_STATUS_CODES).gather(users.status_code),
                "is_discoverable": users.is_discoverable,
                "is_private": users.is_private,
            }
        )

    def follow_frames(self) -> Iterator[pl.DataFrame]:
        graph = self.graph
        for index, (src, dst) in enumerate(graph.edge_chunks(EDGE_CHUNK_ROWS)):
            rng = rng_for(self.seed, RandomStream.EDGE_TIMES, index)
            at = edge_created_s(src, dst, self.users, rng)
            yield pl.DataFrame(
                {
                    "follower_id": graph.user_ids[src],
                    "followee_id": graph.user_ids[dst],
                    "created_at": _timestamps(at),
                }
            ).with_columns(status=pl.lit("active"))

    def relationship_frame(self, name: str) -> pl.DataFrame:
        rows = self.relationships[name]
        _, left, right, at = PAIR_TABLES[_RELATION_OF[name]]
        frame = pl.DataFrame(
            {
                left: self.graph.user_ids[rows.left],
                right: self.graph.user_ids[rows.right],
                at: _timestamps(rows.at_s),
            }
        )
        return frame.with_columns(status=pl.lit("pending")) if name == "pending_follows" else frame

    def interests_frame(self) -> pl.DataFrame:
        return pl.DataFrame(
            {
                "user_id": self.graph.user_ids[self.interest_users],
                "tag": pl.Series(INTEREST_TAGS).gather(self.interest_tags),
            }
        )


def load_graph(
    graph: FollowGraph,
    settings: Settings,
    *,
    seed: int,
    replace: bool = False,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Write ``graph`` (as active follows) plus generated fields for ``seed`` into the live store.

    Shared by ``recs.demo.datasets.load_dataset`` and ``recs.demo.synthetic.generate_graph``.
    Returns counts (``users, follow_edges, pending_follows, blocks, mutes, dismissals,
    interests``), the
    status mix, ``generated_fields``, ``reference_date``, ``seed``, ``store`` (backend and
    file) and ``timings`` (seconds for ``generate`` and ``write``). Raises ``DatasetError`` if
    the store is not empty and ``replace`` is false.
    """
    t0 = time.perf_counter()
    n = graph.n_users
    generated = GeneratedFields.for_graph(graph, seed)
    users, relationships = generated.users, generated.relationships
    generate_seconds = time.perf_counter() - t0

    pending = relationships["pending_follows"]
    tables = [
        TableRows("users", [generated.users_frame()], n),
        TableRows("follow_edges", generated.follow_frames(), graph.n_edges),
        TableRows(
            "follow_edges",
            [generated.relationship_frame("pending_follows")],
            len(pending),
            label="follow_edges (pending)",
        ),
    ]
    for name in ("blocks", "mutes", "dismissed_candidates"):
        frame = generated.relationship_frame(name)
        tables.append(TableRows(name, [frame], frame.height))
    interests = generated.interests_frame()
    tables.append(TableRows("user_interests", [interests], interests.height))

    t1 = time.perf_counter()
    backend = write_store(settings.live_store_url, tables, replace=replace, progress=progress)
    write_seconds = time.perf_counter() - t1
    statuses = np.bincount(users.status_code, minlength=len(ACCOUNT_STATUS_CODES))
    summary = {
        "users": n,
        "follow_edges": graph.n_edges,
        "pending_follows": len(pending),
        "blocks": len(relationships["blocks"]),
        "mutes": len(relationships["mutes"]),
        "dismissals": len(relationships["dismissed_candidates"]),
        "interests": interests.height,
        "users_by_status": dict(zip(ACCOUNT_STATUS_CODES, statuses.tolist(), strict=True)),
        "new_accounts_24h": int((users.created_s > _END_S - _DAY_S).sum()),
        "dormant_30d": int((users.last_active_s < _END_S - 30 * _DAY_S).sum()),
        "generated_fields": list(GENERATED_FIELDS),
        "reference_date": REFERENCE_DATE.isoformat(),
        "seed": seed,
        "store": backend,
        "timings": {"generate": round(generate_seconds, 3), "write": round(write_seconds, 3)},
    }
    log.info(
        "loaded %d users, %d follows (+%d pending) into %s in %.1f s",
        n,
        graph.n_edges,
        len(pending),
        backend,
        write_seconds,
    )
    return summary
