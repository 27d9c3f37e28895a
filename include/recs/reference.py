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
  ``max_candidates_to_score`` cut, ``(score desc, mutual_count desc, candidate_id asc)`` for top-k.

It is slow (pure Python, every sample key computed with Python integers: about 11 s for 300
users of a 6 M-edge graph at caps 200 x 50, mostly building the adjacency) and meant for tests
and the benchmark's spot checks. Scores agree with the kernel's to ~1e-16, not bit for bit:
the kernel's activity term is evaluated by Polars.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from recs.sampling import capped_follows

_ONE_MICROSECOND = dt.timedelta(microseconds=1)


def activity_recency(last_active_at: dt.datetime | None, as_of: dt.datetime, half_life_days):
    """``0.5 ** (days_inactive / half_life_days)``, 0.0 for an unknown ``last_active_at``.

    ``days_inactive = max(0, as_of - last_active_at)`` in days (both naive UTC), computed from
    integer microseconds like the kernel's Polars expression.
    """
    if last_active_at is None:
        return 0.0
    micros = (as_of - last_active_at) // _ONE_MICROSECOND
    days_inactive = max(0.0, micros / 86_400_000_000)
    return 0.5 ** (days_inactive / half_life_days)


def score(mutual_count: int, activity: float, settings) -> float:
    """The design's blend: ``mutual_weight * min(mutual_count / mutual_saturation, 1)
    + activity_weight * activity``."""
    mutual = min(mutual_count / settings.mutual_saturation, 1.0)
    return settings.mutual_weight * mutual + settings.activity_weight * activity


def reference_recommendations(
    user_ids: Iterable[int],
    follow_edges: Iterable[tuple[int, int, str]],
    known_users: Iterable[int],
    exclusions: Mapping[int, Iterable[int]],
    profiles: Mapping[int, tuple[bool, dt.datetime | None]],
    settings,
    as_of: dt.datetime,
) -> list[dict[str, Any]]:
    """Recommendations for ``user_ids`` by the plain algorithm.

    ``follow_edges``: every snapshot edge as ``(follower_id, followee_id, status)``;
    ``known_users``: the ids of ``users.parquet``; ``exclusions``: ``user_id -> excluded ids``
    (the ``follow_exclusions`` export); ``profiles``: ``candidate_id -> (is_recommendable,
    last_active_at)``; ``as_of``: naive UTC. Settings used: ``hop1_cap, hop2_cap, sample_seed,
    min_mutual_count, max_candidates_to_score, top_k, followed_by_count`` and the weights.

    Returns rows sorted by ``(user_id, rank)``, each a dict with ``user_id, candidate_id,
    mutual_count, score, rank, followed_by`` (list of first-hop ids in sample order).
    """
    known = set(known_users)
    active: dict[int, set[int]] = defaultdict(set)
    any_status: dict[int, set[int]] = defaultdict(set)
    for follower, followee, status in follow_edges:
        any_status[follower].add(followee)
        if status == "active" and followee in known and followee != follower:
            active[follower].add(followee)

    seed = settings.sample_seed
    second_hop_cache: dict[int, list[int]] = {}

    def second_hop(friend: int) -> list[int]:
        if friend not in second_hop_cache:
            second_hop_cache[friend] = capped_follows(
                friend, active.get(friend, ()), settings.hop2_cap, seed
            )
        return second_hop_cache[friend]

    rows: list[dict[str, Any]] = []
    for user in sorted(set(user_ids)):
        first_hop = capped_follows(user, active.get(user, ()), settings.hop1_cap, seed)
        mutual_counts: Counter[int] = Counter()
        reached_by: dict[int, list[int]] = defaultdict(list)
        for friend in first_hop:
            for candidate in second_hop(friend):
                mutual_counts[candidate] += 1
                if len(reached_by[candidate]) < settings.followed_by_count:
                    reached_by[candidate].append(friend)

        excluded = {user} | set(exclusions.get(user, ())) | any_status.get(user, set())
        pruned = {
            candidate: count
            for candidate, count in mutual_counts.items()
            if candidate not in excluded
            and profiles.get(candidate, (False, None))[0]
            and count >= settings.min_mutual_count
        }
        strongest = sorted(pruned.items(), key=lambda item: (-item[1], item[0]))
        strongest = strongest[: settings.max_candidates_to_score]

        scored = []
        for candidate, count in strongest:
            activity = activity_recency(profiles[candidate][1], as_of, settings.half_life_days)
            scored.append((score(count, activity, settings), count, candidate))
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


def reference_shard(paths, settings, shard_id: int):
    """``reference_recommendations`` for one shard of a run, as a ``RECOMMENDATION_SCHEMA`` frame.

    Reads the same files as ``recs.traversal.traverse_shard`` (the whole snapshot's follow
    edges, so it is for small graphs only) and returns a Polars frame sorted by user_id, rank.
    """
    import polars as pl

    from recs.contracts import RECOMMENDATION_SCHEMA, SNAPSHOT_SCHEMAS
    from recs.graph import partition_files

    snapshot = Path(paths.snapshot_dir)
    exports = Path(paths.exports_dir)
    known = pl.read_parquet(snapshot / "users.parquet", columns=["user_id"])["user_id"].to_list()
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
    profiles = {
        candidate: (bool(recommendable), last_active)
        for candidate, recommendable, last_active in profile_frame.select(
            "candidate_id", "is_recommendable", "last_active_at"
        ).iter_rows()
    }
    as_of = paths.as_of.astimezone(dt.UTC).replace(tzinfo=None)
    rows = reference_recommendations(
        users, edges.iter_rows(), known, exclusions, profiles, settings, as_of
    )
    constant = ("generated_at", "run_id")
    computed = {k: v for k, v in RECOMMENDATION_SCHEMA.items() if k not in constant}
    frame = pl.DataFrame(rows, schema=computed).with_columns(
        pl.lit(as_of, dtype=pl.Datetime("us")).alias("generated_at"),
        pl.lit(paths.run_id, dtype=pl.String).alias("run_id"),
    )
    return frame.select(list(RECOMMENDATION_SCHEMA))
