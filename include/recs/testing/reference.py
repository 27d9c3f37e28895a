"""The design document's algorithm, written plainly in pure Python, to cross-check the kernel.

This is our own straightforward rendering of the design's ``bounded_second_degree``,
``prune_candidates``, ``activity_recency_score`` and ``score_candidate``: dict adjacency, a
``Counter`` of mutual counts, set exclusions, sorted() for every cut. It differs from the design
only where the product is deliberately stricter, and in exactly the ways ``recs.traversal``
documents:

- sampling is the deterministic order of ``recs.sampling`` (not ``random.sample``);
- only ``active`` follows are expanded; follows (any status) are excluded as candidates;
- accounts missing from ``users`` are not in the graph; self-follows and duplicates are ignored;
- candidates must be ``is_recommendable`` (active, discoverable) in ``candidate_profiles``;
- ties are broken deterministically: ``(mutual_count desc, candidate_id asc)`` for the
  ``max_candidates_to_score`` cut, ``(score desc, mutual_count desc, candidate_id asc)`` for top-k;
- the ranking is ``recs.traversal.ranking``'s (issue 13): each path weighted by
  ``Settings.ranking`` (the design's blend: 1), a popularity term and the hub damping; the
  capped lists in ``sample`` or ``popularity`` order (``hop1_order`` / ``hop2_order``; recency
  and reciprocity are not restated here).

Two layers: ``recommend_from_follows`` is the design's per-user loop over an adjacency already
in sample order (what ``make bench`` times, per user, as "the design's algorithm in pure
Python"); ``reference_recommendations`` first samples every list with Python-integer keys
(``capped_follows``, independent of the NumPy / Numba code) and is what the tests compare the
kernel with. It is slow (``bench/README.md``) and meant for tests and the benchmark's checks.
Scores agree with the kernel's to ~1e-16, not bit for bit: the kernel's activity term is
evaluated by Polars.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from recs.sampling import capped_follows, sample_key_int
from recs.times import MICROS_PER_DAY, ONE_MICROSECOND, naive_utc


def activity_recency(last_active_at: dt.datetime | None, as_of: dt.datetime, half_life_days):
    """``0.5 ** (days_inactive / half_life_days)``, 0.0 for an unknown ``last_active_at``.

    ``days_inactive = max(0, as_of - last_active_at)`` in days (both naive UTC), computed from
    integer microseconds like the kernel's Polars expression.
    """
    if last_active_at is None:
        return 0.0
    micros = (as_of - last_active_at) // ONE_MICROSECOND
    days_inactive = max(0.0, micros / MICROS_PER_DAY)
    return 0.5 ** (days_inactive / half_life_days)


def score(weight: float, activity: float, settings, followers: int = 0, max_followers: int = 0,
          hub_followers: int = 0) -> float:
    """``mutual_weight * min(weight / mutual_saturation, 1) * damping + activity_weight *
    activity + popularity_weight * followers / max_followers`` (``recs.traversal.ranking``);
    ``weight`` = ``mutual_count`` for the design's blend, ``damping`` = ``(hub_followers /
    followers) ** hub_damping`` for a hub (``followers >= hub_followers > 0``), else 1."""
    mutual = min(weight / settings.mutual_saturation, 1.0)
    damping = getattr(settings, "hub_damping", 0.0)
    if damping > 0.0 and hub_followers > 0 and followers >= hub_followers:
        mutual *= (hub_followers / followers) ** damping
    popularity = followers * (1.0 / max_followers) if max_followers > 0 else 0.0
    return (
        settings.mutual_weight * mutual + settings.activity_weight * activity
        + getattr(settings, "popularity_weight", 0.0) * popularity
    )


def path_weight(ranking: str, follows: int, followers: int) -> float:
    """Weight of a path through an account with ``follows`` and ``followers`` (its degree, at
    least 2): 1 (blend), ``1 / log2 d`` (adamic_adar), ``2 / d`` (resource_allocation)."""
    degree = max(follows + followers, 2)
    if ranking == "blend":
        return 1.0
    if ranking == "adamic_adar":
        return 1.0 / math.log2(degree)
    if ranking == "resource_allocation":
        return 2.0 / degree
    raise ValueError(f"unknown ranking {ranking!r}")


def ordered_follows(follower: int, followees, cap: int, seed: int, order: str,
                    followers_of: Mapping[int, int]) -> list[int]:
    """The first ``cap`` of ``followees`` in ``order``: ``sample`` (``capped_follows``) or
    ``popularity`` (more followers first, then the sample key's high 32 bits, then the id:
    ``recs.traversal.hop_order``)."""
    if order == "sample":
        return capped_follows(follower, followees, cap, seed)
    if order != "popularity":
        raise NotImplementedError(f"the reference restates sample and popularity orders only, "
                                  f"not {order!r}")
    limit = 2**32 - 1
    return sorted(
        set(followees),
        key=lambda f: (limit - min(followers_of.get(f, 0), limit),
                       sample_key_int(follower, f, seed) >> 32, f),
    )[:cap]


def recommend_from_follows(
    user_ids: Iterable[int],
    following: Mapping[int, Sequence[int]],
    exclusions: Mapping[int, Collection[int]],
    activity: Mapping[int, float],
    settings,
    first_hop: Mapping[int, Sequence[int]] | None = None,
    weights: Mapping[int, float] | None = None,
    followers: Mapping[int, int] | None = None,
    max_followers: int = 0,
    hub_followers: int = 0,
) -> list[dict[str, Any]]:
    """The design's per-user loop (``bounded_second_degree``, ``prune_candidates``,
    ``score_candidate``, top-k) over an adjacency that is already in sample order.

    ``following``: account -> its active follows of known accounts, self-follows and duplicates
    removed, in sample order (``recs.sampling``); the design's ``sample_bounded(ids, cap)`` is
    then the prefix ``ids[:cap]`` (``hop1_cap`` for the user, ``hop2_cap`` for each friend).
    ``exclusions``: user -> ids it must not be recommended (its follows of any status, blocks
    either way, mutes, dismissals); the user itself is always excluded. ``activity``: account
    -> its activity term (``activity_recency``) for every recommendable account; an account
    missing from it is not recommendable. Settings used: ``hop1_cap, hop2_cap,
    min_mutual_count, max_candidates_to_score, top_k, followed_by_count`` and the weights.
    ``first_hop``: user -> its first-hop list, when it differs from ``following`` (the product
    expands only follows of active accounts); default ``following``. ``weights``: account ->
    the weight of a path through it (``path_weight``; default 1); ``followers``: account -> its
    followers, ``max_followers`` the most any account has, ``hub_followers`` the smallest hub's
    (``score``; default none).

    Returns rows sorted by ``(user_id, rank)``, each a dict with ``user_id, candidate_id,
    mutual_count, score, rank, followed_by`` (list of first-hop ids in sample order).
    """
    rows: list[dict[str, Any]] = []
    followed_by_count = settings.followed_by_count
    first_hop = following if first_hop is None else first_hop
    followers = followers or {}
    for user in sorted(set(user_ids)):
        mutual_counts: Counter[int] = Counter()
        path_sums: dict[int, float] = defaultdict(float)
        reached_by: dict[int, list[int]] = defaultdict(list)
        for friend in first_hop.get(user, ())[: settings.hop1_cap]:
            row = following.get(friend, ())[: settings.hop2_cap]
            if weights is not None:
                weight = weights.get(friend, 1.0)
                for candidate in row:
                    path_sums[candidate] += weight
            if not followed_by_count:
                mutual_counts.update(row)  # counts only: Counter's C loop
                continue
            for candidate in row:
                mutual_counts[candidate] += 1
                reached = reached_by[candidate]
                if len(reached) < followed_by_count:
                    reached.append(friend)

        excluded = exclusions.get(user, ())
        pruned = {
            candidate: count
            for candidate, count in mutual_counts.items()
            if candidate != user
            and candidate not in excluded
            and candidate in activity
            and count >= settings.min_mutual_count
        }
        strongest = sorted(pruned.items(), key=lambda item: (-item[1], item[0]))
        strongest = strongest[: settings.max_candidates_to_score]

        scored = [
            (score(path_sums[candidate] if weights is not None else count, activity[candidate],
                   settings, followers.get(candidate, 0), max_followers, hub_followers),
             count, candidate)
            for candidate, count in strongest
        ]
        scored.sort(key=lambda item: (-item[0], -item[1], item[2]))
        for rank, (value, count, candidate) in enumerate(scored[: settings.top_k], start=1):
            rows.append({
                "user_id": user,
                "candidate_id": candidate,
                "mutual_count": count,
                "score": value,
                "rank": rank,
                "followed_by": list(reached_by[candidate]),
            })
    return rows


def reference_recommendations(
    user_ids: Iterable[int],
    follow_edges: Iterable[tuple[int, int, str]],
    known_users: Iterable[int],
    exclusions: Mapping[int, Iterable[int]],
    profiles: Mapping[int, tuple[bool, dt.datetime | None]],
    settings,
    as_of: dt.datetime,
    inactive_accounts: Collection[int] = (),
    followers: Mapping[int, int] | None = None,
    hub_followers: int = 0,
) -> list[dict[str, Any]]:
    """Recommendations for ``user_ids`` by the plain algorithm, from raw snapshot rows.

    ``follow_edges``: every snapshot edge as ``(follower_id, followee_id, status)`` (at least
    those of the users and of the accounts they follow); ``known_users``: the ids of
    ``users.parquet``; ``exclusions``: ``user_id -> excluded ids`` (the ``follow_exclusions``
    export); ``profiles``: ``candidate_id -> (is_recommendable, last_active_at)``; ``as_of``:
    naive UTC; ``inactive_accounts``: ids whose status is not ``active`` (never a first hop);
    ``followers``: ``candidate_profiles.in_degree`` by account (its largest is the popularity
    term's scale), ``hub_followers`` the smallest hub's. Samples every list with the
    pure-integer keys (``ordered_follows``), then runs ``recommend_from_follows``. Returns its
    rows.
    """
    known = set(known_users)
    active: dict[int, set[int]] = defaultdict(set)
    any_status: dict[int, set[int]] = defaultdict(set)
    for follower, followee, status in follow_edges:
        any_status[follower].add(followee)
        if status == "active" and followee in known and followee != follower:
            active[follower].add(followee)

    users = sorted(set(user_ids))
    cap = max(settings.hop1_cap, settings.hop2_cap)
    seed = settings.sample_seed
    inactive = set(inactive_accounts)
    following: dict[int, list[int]] = {}
    first_hop: dict[int, list[int]] = {}
    followers = followers or {}
    hop1_order = getattr(settings, "hop1_order", "sample")
    hop2_order = getattr(settings, "hop2_order", "sample")
    for user in users:
        expandable = [f for f in active.get(user, ()) if f not in inactive]
        first_hop[user] = ordered_follows(
            user, expandable, settings.hop1_cap, seed, hop1_order, followers
        )
        for friend in first_hop[user]:
            if friend not in following:
                following[friend] = ordered_follows(
                    friend, active.get(friend, ()), cap, seed, hop2_order, followers
                )
    excluded = {
        user: set(exclusions.get(user, ())) | any_status.get(user, set()) for user in users
    }
    recommendable = {
        candidate: activity_recency(last_active, as_of, settings.half_life_days)
        for candidate, (is_recommendable, last_active) in profiles.items()
        if is_recommendable
    }
    ranking = getattr(settings, "ranking", "blend")
    weights = {
        friend: path_weight(ranking, len(active.get(friend, ())), followers.get(friend, 0))
        for friend in following
    }
    return recommend_from_follows(
        users, following, excluded, recommendable, settings, first_hop=first_hop,
        weights=weights, followers=followers, max_followers=max(followers.values(), default=0),
        hub_followers=hub_followers,
    )


def reference_shard(paths, settings, shard_id: int):
    """``reference_recommendations`` for one shard of a run, as a ``RECOMMENDATION_SCHEMA`` frame.

    Reads the same files as ``recs.traversal.traverse_shard`` (the whole snapshot's follow
    edges, so it is for small graphs only) and returns a Polars frame sorted by user_id, rank.
    """
    import polars as pl

    from recs.contracts import RECOMMENDATION_SCHEMA, SNAPSHOT_SCHEMAS
    from recs.sharding import partition_files

    snapshot = Path(paths.snapshot_dir)
    exports = Path(paths.exports_dir)
    accounts = pl.read_parquet(snapshot / "users.parquet", columns=["user_id", "account_status"])
    known = accounts["user_id"].to_list()
    inactive = accounts.filter(pl.col("account_status") != "active")["user_id"].to_list()
    edge_files = [f for files in partition_files(snapshot / "follow_edges").values() for f in files]
    edge_columns = ["follower_id", "followee_id", "status"]
    edges = pl.concat(
        [pl.read_parquet(f, columns=edge_columns) for f in edge_files]
        or [pl.DataFrame(schema={c: SNAPSHOT_SCHEMAS["follow_edges"][c] for c in edge_columns})]
    )
    eligible_files = partition_files(exports / "eligible_users").get(shard_id, [])
    users = [v for f in eligible_files for v in pl.read_parquet(f)["user_id"].to_list()]
    exclusions: dict[int, set[int]] = defaultdict(set)
    for f in partition_files(exports / "follow_exclusions").get(shard_id, []):
        for owner, excluded in pl.read_parquet(f).select("user_id", "excluded_id").iter_rows():
            exclusions[owner].add(excluded)
    profile_frame = pl.read_parquet(exports / "candidate_profiles.parquet")
    followers = dict(profile_frame.select("candidate_id", "in_degree").iter_rows())
    hubs_path = exports / "hub_accounts.parquet"
    hub_followers = (
        int(pl.read_parquet(hubs_path)["in_degree"].min() or 0) if hubs_path.exists() else 0
    )
    profiles = {
        candidate: (bool(recommendable), last_active)
        for candidate, recommendable, last_active in profile_frame.select(
            "candidate_id", "is_recommendable", "last_active_at"
        ).iter_rows()
    }
    as_of = naive_utc(paths.as_of)
    rows = reference_recommendations(
        users, edges.iter_rows(), known, exclusions, profiles, settings, as_of,
        inactive_accounts=inactive, followers=followers, hub_followers=hub_followers,
    )
    constant = ("generated_at", "run_id")
    computed = {k: v for k, v in RECOMMENDATION_SCHEMA.items() if k not in constant}
    frame = pl.DataFrame(rows, schema=computed).with_columns(
        pl.lit(as_of, dtype=pl.Datetime("us")).alias("generated_at"),
        pl.lit(paths.run_id, dtype=pl.String).alias("run_id"),
    )
    return frame.select(list(RECOMMENDATION_SCHEMA))
