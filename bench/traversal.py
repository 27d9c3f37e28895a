"""``make bench``: the traversal three ways on one graph, checked equal, then timed per core.

On a synthetic power-law graph that it generates and runs through the real pipeline stages
(``recs.synthetic.generate_graph``, ``freeze_snapshot``, ``build_models``, ``build_graph``; kept
under ``--home`` and reused by later runs with the same size and seed), it compares:

1. **reference** — the design document's algorithm (bounded BFS, prune, score, top-k) as a
   straightforward pure-Python loop (``recs.reference.recommend_from_follows``) over an
   adjacency already in sample order, on a uniform sample of one shard's users; scaled per user
   (its traversals / its CPU seconds).
2. **DuckDB** — the same traversal as one SQL query per shard (first hop, the capped second hop,
   group by (user, candidate), exclusions, ``max_candidates_to_score`` cut, score, top-k, the
   "followed by" ids), every cap a ``row_number()``. Its per-run preparation (tables, sample
   keys computed in SQL, the ``hop2_cap`` cut of every follow list) is timed apart, like our
   ``build_graph``.
3. **ours** — ``recs.traversal.traverse_shard`` end to end (read the shard's Parquet inputs and
   the memory-mapped graph, traverse, prune, score, top-k, write Parquet + manifest), every
   shard in its own fresh process, as the Airflow task runs it.

Before timing anything it checks that the three produce the same rows (candidates, mutual
counts and ranks exactly; ``followed_by`` exactly; scores to 1e-9) for a sample of one shard's
users, half of them with *uncapped* neighbourhoods (every expanded list complete, so the result
does not depend on sampling) and half capped (where the three implementations of the
deterministic sample must agree). The reference side of the check samples with pure Python
integers (``recs.reference.reference_recommendations``) and DuckDB computes the SplitMix64 keys
in SQL, so the check is independent of our NumPy / Numba code. If anything differs it prints
the first difference and exits 2 without reporting any rate.

Per core, honestly: every thread pool is pinned to one thread (``POLARS_MAX_THREADS``,
``NUMBA_NUM_THREADS``, BLAS / OpenMP variables, DuckDB ``SET threads = 1``) and every rate is
traversals per CPU-second of the process (user + system time of all its threads: the shared
2-core machine's other load does not count against us). Wall-clock seconds are printed next
to them.

Prints traversals per second per core for each, the ratios ours / reference and ours / DuckDB,
our shard task's peak RSS, bytes per traversal, the capacity model for the design's night
(220 M users x 200 x 50 in 4 hours, against its 1,000 cores), and ends with one line::

    traversals_per_core_s=... ratio_vs_reference=... ratio_vs_duckdb=... shard_peak_rss_mb=...

Usage: ``python bench/traversal.py [--users 200000] [--shards 4] [--home DIR] ...``
(``--help``); ``make bench`` runs it with the defaults (about 3 minutes on first use, most of
it generating and loading the graph; about a minute when the graph is reused). On the 1 M-user
run of ``make bench-scale``: ``--home /tmp/recs-scale --existing scale`` (about 3 minutes).
"""

from __future__ import annotations

import os

# Pin every thread pool to one thread before numpy / polars / numba are imported.
for _variable in (
    "POLARS_MAX_THREADS", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS", "RAYON_NUM_THREADS",
):
    os.environ[_variable] = "1"

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

SNAPSHOT_DATE = "2026-11-01"  # the reference date of generated fields (recs.datasets)
RUN_ID = "bench"
#: The design document's night: users refreshed, caps, window, and its own per-core estimate.
DESIGN_USERS = 220_000_000
DESIGN_TRAVERSALS_PER_USER = 200 * 50
DESIGN_WINDOW_SECONDS = 4 * 3600
DESIGN_RATE_PER_CORE = 150_000
DESIGN_CORES = 1_000
#: ARCHITECTURE §3: the capped second-hop lists of 500 M accounts, about 22 B int32 entries.
DESIGN_NODES = 500_000_000
DESIGN_CAPPED_ENTRIES = 22_000_000_000
#: Shards of the design's night in the capacity model: Airflow's default max_map_length.
NIGHT_SHARDS = 1024
SCORE_TOLERANCE = 1e-9
MB = 1024 * 1024


# --- the graph and the run -------------------------------------------------------------------


def settings_for(home: Path, shards: int):
    from recs.config import Settings

    return Settings(home=home, shard_count=shards)


def prepare_run(args) -> tuple[Any, dict[str, Any]]:
    """Generate the graph and run the stages up to ``build_graph`` (or reuse a previous run).

    Returns ``(paths, info)``; ``info`` holds the generation summary and stage timings.
    """
    from recs.demo.synthetic import generate_graph
    from recs.errors import RecsError
    from recs.nightly import pipeline
    from recs.nightly.runs import RunPaths
    from recs.traversal.graph import load_graph

    home = Path(args.home)
    marker = home / "bench-graph.json"
    wanted = {
        "users": args.users, "avg_out_degree": args.avg_out_degree, "seed": args.seed,
        "shards": args.shards,
    }
    paths = RunPaths.create(home, SNAPSHOT_DATE, RUN_ID)
    if marker.exists() and not args.fresh:
        info = json.loads(marker.read_text())
        if info.get("wanted") == wanted and paths.snapshot_manifest.exists():
            say(f"reusing the graph and run under {home} (--fresh to rebuild)")
            try:
                load_graph(paths.graph_dir)
            except RecsError:  # built by an older version: rebuild this stage only
                pipeline.build_graph(paths)
            return paths, info
    home.mkdir(parents=True, exist_ok=True)
    settings = settings_for(home, args.shards)
    timings: dict[str, float] = {}
    say(f"generating {args.users:,} users x {args.avg_out_degree} follows (seed {args.seed}) "
        f"into {settings.live_store_url} ...")
    started = time.perf_counter()
    generated = generate_graph(
        args.users, args.seed, settings, avg_out_degree=args.avg_out_degree, replace=True
    )
    timings["generate_graph"] = time.perf_counter() - started
    for name, stage, stage_args in (
        ("freeze_snapshot", pipeline.freeze_snapshot, (paths, settings)),
        ("build_models", pipeline.build_models, (paths,)),
        ("build_graph", pipeline.build_graph, (paths,)),
    ):
        say(f"{name} ...")
        started = time.perf_counter()
        stage(*stage_args)
        timings[name] = time.perf_counter() - started
    info = {"wanted": wanted, "generated": generated, "timings": timings}
    marker.write_text(json.dumps(info, indent=2, default=str))
    return paths, info


# --- inputs shared by the checks --------------------------------------------------------------


def active_edges(paths, followers):
    """The snapshot's distinct active follows of ``followers`` to known accounts, no
    self-follows (exactly the edges every implementation may expand), as a lazy frame."""
    import polars as pl

    users = pl.scan_parquet(paths.snapshot_dir / "users.parquet").select("user_id")
    return (
        pl.scan_parquet(paths.snapshot_dir / "follow_edges" / "*" / "*.parquet")
        .filter(pl.col("follower_id").is_in([int(f) for f in followers]))
        .filter((pl.col("status") == "active") & (pl.col("follower_id") != pl.col("followee_id")))
        .select("follower_id", "followee_id")
        .join(users, left_on="followee_id", right_on="user_id", how="semi")
        .join(users, left_on="follower_id", right_on="user_id", how="semi")
        .unique()
    )


def shard_users(paths, shard_id: int):
    import numpy as np

    from recs.traversal.inputs import eligible_user_ids

    settings = run_settings(paths)
    return np.asarray(eligible_user_ids(paths, shard_id, settings.shard_count))


def run_settings(paths):
    from recs.nightly.pipeline import run_settings as frozen

    return frozen(paths)


def neighbourhoods(paths, users) -> Any:
    """Per user: ``follows`` (active, known), ``widest_friend`` (the most follows among them)
    and ``uncapped`` (follows <= hop1_cap and widest_friend <= hop2_cap: every list the
    traversal expands is complete, so no cap, and no sample, changes the result)."""
    import polars as pl

    settings = run_settings(paths)
    wanted = pl.LazyFrame({"follower_id": users})
    friends = active_edges(paths, users).collect()
    degree = (
        active_edges(paths, friends["followee_id"].unique())
        .group_by("follower_id")
        .agg(pl.len().alias("degree"))
    )
    widest = (
        friends.lazy()
        .join(degree, left_on="followee_id", right_on="follower_id", how="left")
        .group_by("follower_id")
        .agg(pl.len().alias("follows"), pl.col("degree").fill_null(0).max().alias("widest_friend"))
    )
    return (
        wanted.join(widest, on="follower_id", how="left")
        .with_columns(pl.col("follows").fill_null(0), pl.col("widest_friend").fill_null(0))
        .with_columns(
            uncapped=(pl.col("follows") <= settings.hop1_cap)
            & (pl.col("widest_friend") <= settings.hop2_cap)
        )
        .rename({"follower_id": "user_id"})
        .collect()
    )


def check_sample(paths, shard_id: int, size: int, seed: int):
    """Half uncapped users (those with at least two follows), half capped, of one shard."""
    import numpy as np
    import polars as pl

    users = shard_users(paths, shard_id)
    hoods = neighbourhoods(paths, users)
    rng = np.random.default_rng(seed)
    uncapped = hoods.filter(pl.col("uncapped") & (pl.col("follows") >= 2))["user_id"].to_numpy()
    capped = hoods.filter(~pl.col("uncapped"))["user_id"].to_numpy()
    take_uncapped = min(len(uncapped), size // 2)
    take_capped = min(len(capped), size - take_uncapped)
    chosen = np.concatenate([
        rng.choice(uncapped, take_uncapped, replace=False),
        rng.choice(capped, take_capped, replace=False),
    ])
    return np.sort(chosen), take_uncapped, take_capped


# --- 1. the reference ------------------------------------------------------------------------


def reference_check_rows(paths, users) -> Any:
    """``recs.reference.reference_recommendations`` (pure-integer sampling) for ``users``."""
    import polars as pl

    from recs.testing.reference import reference_recommendations

    settings = run_settings(paths)
    wanted = [int(u) for u in users]
    edges_path = paths.snapshot_dir / "follow_edges" / "*" / "*.parquet"
    all_edges = pl.scan_parquet(edges_path).select("follower_id", "followee_id", "status")
    own = all_edges.filter(pl.col("follower_id").is_in(wanted)).collect()
    friends = own["followee_id"].unique().to_list()
    needed = pl.concat([
        own, all_edges.filter(pl.col("follower_id").is_in(friends)).collect()
    ]).unique(maintain_order=True)
    known = pl.read_parquet(
        paths.snapshot_dir / "users.parquet", columns=["user_id", "account_status"]
    )
    inactive = known.filter(pl.col("account_status") != "active")["user_id"].to_list()
    exclusions: dict[int, set[int]] = {}
    for owner, excluded in (
        pl.scan_parquet(paths.exports_dir / "follow_exclusions" / "*" / "*.parquet")
        .filter(pl.col("user_id").is_in(wanted))
        .select("user_id", "excluded_id")
        .collect()
        .iter_rows()
    ):
        exclusions.setdefault(owner, set()).add(excluded)
    profiles_frame = pl.read_parquet(
        paths.exports_dir / "candidate_profiles.parquet",
        columns=["candidate_id", "is_recommendable", "last_active_at", "in_degree"],
    )
    profiles = {
        candidate: (bool(recommendable), last_active)
        for candidate, recommendable, last_active, _ in profiles_frame.iter_rows()
    }
    followers = dict(profiles_frame.select("candidate_id", "in_degree").iter_rows())
    hubs_path = paths.exports_dir / "hub_accounts.parquet"
    hub_followers = int(pl.read_parquet(hubs_path)["in_degree"].min() or 0) if (
        hubs_path.exists()
    ) else 0
    as_of = paths.as_of.astimezone(dt.UTC).replace(tzinfo=None)
    rows = reference_recommendations(
        wanted, needed.iter_rows(), known["user_id"].to_list(), exclusions, profiles, settings,
        as_of, inactive_accounts=inactive, followers=followers, hub_followers=hub_followers,
    )
    return rows_frame(rows)


def rows_frame(rows):
    import polars as pl

    schema = {
        "user_id": pl.Int64, "candidate_id": pl.Int64, "mutual_count": pl.Int32,
        "score": pl.Float64, "rank": pl.Int32, "followed_by": pl.List(pl.Int64),
    }
    return pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)


@dataclass
class Timing:
    name: str
    traversals: int
    cpu_seconds: float
    wall_seconds: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.traversals / self.cpu_seconds if self.cpu_seconds else 0.0


def time_reference(paths, users) -> list[Timing]:
    """Time ``recommend_from_follows`` for ``users`` (CPU seconds of this process), with its
    inputs built beforehand (untimed): the sample-ordered follow lists of the users and their
    follows (``recs.sampling.sample_order``, NumPy), exclusions and the activity term. Twice:
    with the "followed by" ids (our output, checked equal) and without them (the design's
    loop only counts); the ratios use the faster of the two."""
    import numpy as np
    import polars as pl

    from recs.sampling import rank_within_groups, sample_order
    from recs.testing.reference import recommend_from_follows
    from recs.traversal.graph import load_graph

    settings = run_settings(paths)
    wanted = [int(u) for u in users]
    cap = max(settings.hop1_cap, settings.hop2_cap)

    def follow_lists(accounts) -> dict[int, list[int]]:
        frame = active_edges(paths, accounts).collect()
        followers = frame["follower_id"].to_numpy()
        followees = frame["followee_id"].to_numpy()
        order = sample_order(followers, followees, settings.sample_seed)
        followers, followees = followers[order], followees[order]
        keep = rank_within_groups(followers) < cap
        followers, followees = followers[keep], followees[keep]
        cuts = np.flatnonzero(np.r_[True, followers[1:] != followers[:-1]])
        lists = np.split(followees, cuts[1:]) if len(followers) else []
        return {int(followers[c]): lst.tolist() for c, lst in zip(cuts, lists, strict=True)}

    following = follow_lists(wanted)
    friends = {f for u in wanted for f in following.get(u, [])[: settings.hop1_cap]}
    following.update(follow_lists(friends - set(following)))
    exclusions: dict[int, set[int]] = {u: set() for u in wanted}
    any_status = (
        pl.scan_parquet(paths.snapshot_dir / "follow_edges" / "*" / "*.parquet")
        .filter(pl.col("follower_id").is_in(wanted))
        .select(pl.col("follower_id").alias("user_id"), pl.col("followee_id").alias("excluded_id"))
    )
    exported = (
        pl.scan_parquet(paths.exports_dir / "follow_exclusions" / "*" / "*.parquet")
        .filter(pl.col("user_id").is_in(wanted))
        .select("user_id", "excluded_id")
    )
    for owner, excluded in pl.concat([any_status, exported]).collect().iter_rows():
        exclusions[owner].add(excluded)
    graph = load_graph(paths.graph_dir)
    recommendable = ~np.isnan(np.asarray(graph.activity))
    activity = dict(zip(
        np.asarray(graph.user_ids)[recommendable].tolist(),
        np.asarray(graph.activity)[recommendable].tolist(),
        strict=True,
    ))
    traversals = sum(
        min(len(following.get(friend, ())), settings.hop2_cap)
        for user in wanted
        for friend in following.get(user, [])[: settings.hop1_cap]
    )
    timings = []
    for name, variant in (
        ("reference (pure Python)", settings),
        ("reference, no followed_by", settings.model_copy(update={"followed_by_count": 0})),
    ):
        cpu, wall = time.process_time(), time.perf_counter()
        rows = recommend_from_follows(wanted, following, exclusions, activity, variant)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        timings.append(Timing(
            name, traversals, cpu, wall,
            f"{len(wanted):,} users of one shard, {len(rows):,} rows; scaled per user"
            if variant is settings else "the design's loop, counts only (Counter.update)",
        ))
    return timings


# --- 2. DuckDB --------------------------------------------------------------------------------


def duckdb_connection(paths, memory_limit: str):
    """An in-memory DuckDB (one thread) with the run's inputs as tables; returns
    ``(connection, prep_cpu_seconds, prep_wall_seconds)``.

    Tables: ``active_edges`` (distinct active follows between known accounts, no self-follows,
    with ``shard_id`` of the follower and the SplitMix64 ``sample_key`` computed in SQL),
    ``capped`` (each account's first ``hop2_cap`` of them by ``row_number()`` over
    ``(sample_key, followee_id)``: DuckDB's ``build_graph``), ``exclusions`` (the export plus
    the snapshot's own follows of any status), ``candidates`` (recommendable accounts and their
    activity term), ``eligible`` (users by shard).
    """
    import duckdb

    from recs.sampling import GOLDEN_GAMMA, MIX_MULTIPLIER_1, MIX_MULTIPLIER_2, seed_mixer

    settings = run_settings(paths)
    snapshot, exports = paths.snapshot_dir, paths.exports_dir
    as_of = paths.as_of.replace(tzinfo=None).isoformat(sep=" ")
    mask = (1 << 64) - 1
    hubs = exports / "hub_accounts.parquet"
    hub_sql = (f"(select coalesce(min(in_degree), 0) from read_parquet('{hubs}'))"
               if hubs.exists() else "0")

    def weight_sql(degree: str) -> str:  # recs.traversal.ranking.path_weights
        return {
            "blend": "1.0",
            "adamic_adar": f"1.0 / log2(greatest({degree}, 2))",
            "resource_allocation": f"2.0 / greatest({degree}, 2)",
        }[settings.ranking]

    def mix64(column: str, prefix: str) -> str:
        # SplitMix64's output function in 128-bit arithmetic cut to 64 bits (DuckDB's UBIGINT
        # arithmetic raises on overflow instead of wrapping).
        return (
            f"m64_add({column}, {GOLDEN_GAMMA}) as {prefix}1, "
            f"m64_mul(xor({prefix}1, {prefix}1 >> 30), {MIX_MULTIPLIER_1}) as {prefix}2, "
            f"m64_mul(xor({prefix}2, {prefix}2 >> 27), {MIX_MULTIPLIER_2}) as {prefix}3, "
            f"xor({prefix}3, {prefix}3 >> 31) as {prefix}4"
        )

    connection = duckdb.connect()
    connection.execute("set threads = 1")
    connection.execute(f"set memory_limit = '{memory_limit}'")
    connection.execute(f"set temp_directory = '{Path(paths.home) / 'duckdb-spill'}'")
    connection.execute("set preserve_insertion_order = false")
    connection.execute(
        f"create macro m64_mul(a, b) as ((a::uhugeint * b::uhugeint) & {mask}::uhugeint)::ubigint"
    )
    connection.execute(
        f"create macro m64_add(a, b) as ((a::uhugeint + b::uhugeint) & {mask}::uhugeint)::ubigint"
    )
    cpu, wall = time.process_time(), time.perf_counter()
    connection.execute(f"""
        create table users as
        select user_id, account_status from read_parquet('{snapshot}/users.parquet');

        create table edges as
        select follower_id, followee_id, status, shard_id::integer as shard_id
        from read_parquet('{snapshot}/follow_edges/*/*.parquet', hive_partitioning = true);

        create table active_edges as
        with pairs as (
            select distinct follower_id, followee_id, shard_id
            from edges
            where status = 'active'
                and follower_id <> followee_id
                and followee_id in (select user_id from users)
                and follower_id in (select user_id from users)
        ),
        keyed as (
            select
                follower_id, followee_id, shard_id,
                m64_add(follower_id::ubigint, {int(seed_mixer(settings.sample_seed))}) as a0,
                {mix64('a0', 'a')},
                xor(a4, followee_id::ubigint) as b0,
                {mix64('b0', 'b')}
            from pairs
        )
        select follower_id, followee_id, shard_id, b4 as sample_key from keyed;

        create table followers as
        select candidate_id as account_id, coalesce(in_degree, 0) as in_degree
        from read_parquet('{exports}/candidate_profiles.parquet');

        create table path_weights as
        select
            active_edges.follower_id as account_id,
            {weight_sql('count(*) + coalesce(any_value(followers.in_degree), 0)')} as weight
        from active_edges
        left join followers on followers.account_id = active_edges.follower_id
        group by active_edges.follower_id;

        create table capped as
        select active_edges.follower_id, active_edges.followee_id
        from active_edges
        left join followers on followers.account_id = active_edges.followee_id
        qualify row_number() over (
            partition by active_edges.follower_id order by {order_sql(settings.hop2_order)}
        ) <= {settings.hop2_cap};

        create table exclusions as
        select user_id, excluded_id, shard_id::integer as shard_id
        from read_parquet('{exports}/follow_exclusions/*/*.parquet', hive_partitioning = true)
        union
        select follower_id, followee_id, shard_id from edges;

        create table candidates as
        select
            candidate_id,
            coalesce(pow(0.5, greatest(0.0, (epoch_us(timestamp '{as_of}')
                - epoch_us(last_active_at)) / 86400000000.0) / {settings.half_life_days}), 0.0)
                as activity,
            coalesce(in_degree, 0) as in_degree
        from read_parquet('{exports}/candidate_profiles.parquet')
        where is_recommendable;

        create table scale as
        select
            (select max(in_degree) from followers) as max_in_degree,
            {hub_sql} as hub_in_degree;

        create table eligible as
        select user_id, shard_id::integer as shard_id
        from read_parquet('{exports}/eligible_users/*/*.parquet', hive_partitioning = true);

        drop table edges;
    """)
    return connection, time.process_time() - cpu, time.perf_counter() - wall


def order_sql(order: str) -> str:
    """The ``row_number()`` order of a capped list (``recs.traversal.hop_order``; needs the
    followee's ``followers.in_degree`` joined): sample, or popularity first."""
    if order == "sample":
        return "sample_key, followee_id"
    if order == "popularity":
        return ("coalesce(followers.in_degree, 0) desc, sample_key >> 32, "
                "active_edges.followee_id")
    raise SystemExit(f"the DuckDB side restates sample and popularity orders only, not {order}")


def duckdb_query(settings, only_users: bool) -> str:
    """The shard's traversal as one query (parameters ``$shard`` and, if ``only_users``,
    ``$users``): first hop (follows of active accounts) capped by ``row_number()``, joined to the
    capped second hop, grouped
    by (user, candidate), pruned, cut to ``max_candidates_to_score`` and ``top_k`` by
    ``row_number()``; the "followed by" ids are looked up for the kept rows only (computing
    them for every pair with an ordered ``list()`` tripled the query's time)."""
    user_filter = "and follower_id in (select unnest($users))" if only_users else ""
    return f"""
        with
        hop1 as materialized (
            select
                active_edges.follower_id as user_id,
                active_edges.followee_id as friend_id,
                row_number() over (
                    partition by active_edges.follower_id
                    order by {order_sql(settings.hop1_order)}
                ) as friend_rank
            from active_edges
            left join followers on followers.account_id = active_edges.followee_id
            where shard_id = $shard
                and active_edges.follower_id in (
                    select user_id from eligible where shard_id = $shard
                )
                and active_edges.followee_id in (
                    select user_id from users where account_status = 'active'
                )
                {user_filter}
            qualify friend_rank <= {settings.hop1_cap}
        ),
        counted as (
            select hop1.user_id, capped.followee_id as candidate_id,
                count(*)::integer as mutual_count,
                sum(path_weights.weight order by hop1.friend_rank) as path_sum
            from hop1
            inner join capped on capped.follower_id = hop1.friend_id
            inner join path_weights on path_weights.account_id = hop1.friend_id
            group by hop1.user_id, capped.followee_id
            having count(*) >= {settings.min_mutual_count}
        ),
        pruned as (
            select counted.*, candidates.activity, candidates.in_degree
            from counted
            inner join candidates on candidates.candidate_id = counted.candidate_id
            where counted.candidate_id <> counted.user_id
                and not exists (
                    select 1 from exclusions
                    where exclusions.shard_id = $shard
                        and exclusions.user_id = counted.user_id
                        and exclusions.excluded_id = counted.candidate_id
                )
            qualify row_number() over (
                partition by counted.user_id
                order by counted.mutual_count desc, counted.candidate_id
            ) <= {settings.max_candidates_to_score}
        ),
        ranked as (
            select
                user_id, candidate_id, mutual_count,
                {settings.mutual_weight} * least(path_sum / {settings.mutual_saturation}, 1.0)
                    * (case when {settings.hub_damping} > 0 and scale.hub_in_degree > 0
                        and in_degree >= scale.hub_in_degree
                        then pow(scale.hub_in_degree / in_degree, {settings.hub_damping})
                        else 1.0 end)
                    + {settings.activity_weight} * activity
                    + {settings.popularity_weight} * (in_degree * (1.0 / scale.max_in_degree))
                    as score,
                (row_number() over (
                    partition by user_id order by score desc, mutual_count desc, candidate_id
                ))::integer as rank
            from pruned
            cross join scale
            qualify rank <= {settings.top_k}
        ),
        explained as (
            select ranked.user_id, ranked.candidate_id,
                min_by(hop1.friend_id, hop1.friend_rank, {settings.followed_by_count})
                    as followed_by
            from ranked
            inner join hop1 on hop1.user_id = ranked.user_id
            inner join capped on capped.follower_id = hop1.friend_id
                and capped.followee_id = ranked.candidate_id
            group by all
        )
        select ranked.user_id, ranked.candidate_id, ranked.mutual_count, ranked.score,
            ranked.rank, explained.followed_by
        from ranked
        inner join explained using (user_id, candidate_id)
        order by ranked.user_id, ranked.rank
    """


def duckdb_rows(connection, settings, shard_id: int, users=None):
    import polars as pl

    params: dict[str, Any] = {"shard": shard_id}
    if users is not None:
        params["users"] = [int(u) for u in users]
    table = connection.sql(duckdb_query(settings, users is not None), params=params)
    frame = pl.from_arrow(table.to_arrow_table())
    return frame.with_columns(pl.col("followed_by").cast(pl.List(pl.Int64)))


# --- 3. ours ----------------------------------------------------------------------------------


def run_shard_child(home: str, run_id: str, shard_id: int, repeat: int) -> None:
    """Child mode: run traverse_shard ``repeat`` times in this fresh process; print JSON."""
    started = time.perf_counter()
    from recs.nightly.runs import RunPaths
    from recs.traversal import traverse_shard
    from recs.traversal.output import memory_mb

    imported = time.perf_counter() - started
    paths = RunPaths.create(home, SNAPSHOT_DATE, run_id)
    settings = run_settings(paths)
    runs = []
    process = None
    for attempt in range(repeat):
        runs.append(traverse_shard(paths, settings, shard_id))
        if attempt == 0:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            process = {
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
                "peak_rss_mb": memory_mb()["peak_rss_mb"],
            }
    print(json.dumps({"imports_seconds": imported, "process": process, "runs": runs}))


def baseline_child() -> None:
    """Child mode: the same imports and one compiled call, no shard: the fixed RSS."""
    import numpy as np

    from recs.traversal.ids import DenseIndex
    from recs.traversal.output import memory_mb

    DenseIndex(np.arange(10, dtype=np.int64) * 10**12)(np.arange(3))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"cpu_seconds": usage.ru_utime + usage.ru_stime, **memory_mb()}))


def child(*arguments: str) -> dict[str, Any]:
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, __file__, *arguments], capture_output=True, text=True, check=False
    )
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr)
        raise SystemExit(f"child {arguments} failed with exit code {completed.returncode}")
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = time.perf_counter() - started
    return result


# --- the check -------------------------------------------------------------------------------


def compare(name: str, expected, got) -> list[str]:
    """Differences between two row frames (exact on ids, counts, ranks, followed_by)."""
    import polars as pl

    keys = ["user_id", "rank"]
    exact = ["candidate_id", "mutual_count", "followed_by"]
    expected, got = expected.sort(keys), got.sort(keys)
    problems = []
    if expected.height != got.height:
        problems.append(f"{name}: {got.height} rows, expected {expected.height}")
    joined = expected.join(got, on=keys, how="full", suffix="_got", coalesce=True)
    for column in exact:
        bad = joined.filter(pl.col(column).ne_missing(pl.col(f"{column}_got")))
        if bad.height:
            first = bad.row(0, named=True)
            problems.append(
                f"{name}: {bad.height} rows differ in {column}, first user {first['user_id']} "
                f"rank {first['rank']}: expected {first[column]}, got {first[column + '_got']}"
            )
    score_gap = joined.select((pl.col("score") - pl.col("score_got")).abs().max()).item()
    if score_gap is not None and score_gap > SCORE_TOLERANCE:
        problems.append(f"{name}: scores differ by up to {score_gap:.3g}")
    return problems


# --- report ----------------------------------------------------------------------------------


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def graph_bytes(paths) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(Path(paths.graph_dir).iterdir())}


def capacity_model(rate: float, graph_info: dict[str, Any], shard: dict[str, Any]) -> list[str]:
    """Cores and memory for the design's night from the measured per-core rate."""
    traversals = DESIGN_USERS * DESIGN_TRAVERSALS_PER_USER
    core_seconds = traversals / rate
    cores = core_seconds / DESIGN_WINDOW_SECONDS
    design_cores = traversals / DESIGN_RATE_PER_CORE / DESIGN_WINDOW_SECONDS
    mean_per_user = graph_info["traversals"] / max(graph_info["eligible_users"], 1)
    realistic_cores = cores * mean_per_user / DESIGN_TRAVERSALS_PER_USER
    # shared, memory-mapped once per machine: capped rows (int32) + per-node arrays
    per_node = graph_info["per_node_bytes"]
    shared = DESIGN_CAPPED_ENTRIES * 4 + DESIGN_NODES * per_node
    # private per task process: the runtime, plus the measured private memory per eligible
    # user of a shard times the users of one shard of the night, split into Airflow's default
    # max_map_length (1,024) mapped tasks
    tasks = max(1, int(-(-cores // 1)))
    private_per_user = shard["private_bytes"] / max(shard["users"], 1)
    users_per_task_shard = DESIGN_USERS / NIGHT_SHARDS
    private = shard["baseline_bytes"] + private_per_user * users_per_task_shard
    return [
        f"  night: {DESIGN_USERS / 1e6:.0f} M users x {DESIGN_TRAVERSALS_PER_USER:,} traversals "
        f"(200 x 50, every list full) = {traversals:.2e} traversals in "
        f"{DESIGN_WINDOW_SECONDS / 3600:.0f} h",
        f"  design: {DESIGN_RATE_PER_CORE:,}/s/core -> {design_cores:,.0f} cores "
        f"(the design document says ~{DESIGN_CORES:,})",
        f"  measured: {rate / 1e6:.1f} M/s/core -> {core_seconds / 3600:,.0f} core-hours "
        f"-> {cores:.1f} cores ({DESIGN_CORES / cores:,.0f}x fewer than the design)",
        f"  with this graph's mean of {mean_per_user:,.0f} traversals per eligible user "
        f"instead of the full {DESIGN_TRAVERSALS_PER_USER:,}: {realistic_cores:.1f} cores",
        f"  memory, shared per machine (memory-mapped, page cache): "
        f"{DESIGN_CAPPED_ENTRIES / 1e9:.0f} B capped entries x 4 B + "
        f"{DESIGN_NODES / 1e6:.0f} M accounts x {per_node:.0f} B "
        f"(indptr, ids, activity, id map) = {shared / 1e9:.0f} GB",
        f"  memory, private per task: {shard['baseline_bytes'] / MB:.0f} MB runtime + "
        f"{private_per_user / 1024:.1f} KB per shard user x {users_per_task_shard / 1e6:.1f} M "
        f"users (a {NIGHT_SHARDS:,}-shard night) = {private / 2**30:.1f} GB",
        f"  -> {tasks} cores on one machine with {(shared + tasks * private) / 1e9:,.0f} GB "
        f"of RAM (the graph once + {tasks} running tasks)",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=200_000, help="graph size (default 200k)")
    parser.add_argument("--avg-out-degree", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--shards", type=int, default=4,
                        help="shard_count of the run (default 4: ~50 k users per shard)")
    parser.add_argument("--home", default=None,
                        help="RECS_HOME of the bench (default /tmp/recs-bench/<size>)")
    parser.add_argument("--fresh", action="store_true", help="regenerate the graph and run")
    parser.add_argument("--existing", metavar="RUN_ID", default=None,
                        help="use this existing run under --home (e.g. make bench-scale's: "
                             "--home /tmp/recs-scale --existing scale) instead of generating")
    parser.add_argument("--check-users", type=int, default=200)
    parser.add_argument("--reference-users", type=int, default=1000)
    parser.add_argument("--duckdb-shards", type=int, default=1,
                        help="shards timed with DuckDB (default 1; each takes ~10-20 s)")
    parser.add_argument("--duckdb-memory", default="6GB")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--run-shard", nargs=4, metavar=("HOME", "RUN_ID", "SHARD", "REPEAT"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_shard:
        home, run_id, shard, repeat = args.run_shard
        run_shard_child(home, run_id, int(shard), int(repeat))
        return 0
    if args.baseline:
        baseline_child()
        return 0
    if args.home is None:
        size = f"{args.users}u-{args.avg_out_degree}d-s{args.seed}-{args.shards}sh"
        args.home = f"/tmp/recs-bench/{size}"

    import numpy as np

    load_before = os.getloadavg()
    if args.existing:
        from recs.nightly.runs import RunPaths

        paths, info = RunPaths.create(args.home, SNAPSHOT_DATE, args.existing), {}
        summary = Path(args.home) / "generate-graph.json"  # written by bench/scale_run.py
        if summary.exists():
            info["generated"] = json.loads(summary.read_text())
    else:
        paths, info = prepare_run(args)
    settings = run_settings(paths)
    from recs.traversal.graph import load_graph

    graph = load_graph(paths.graph_dir)
    check_shard = 0

    # --- check first ---------------------------------------------------------------------
    say(f"check: ours, the reference and DuckDB on {args.check_users} users of shard "
        f"{check_shard} ...")
    sample, n_uncapped, n_capped = check_sample(paths, check_shard, args.check_users, args.seed)
    ours_check = child("--run-shard", str(paths.home), paths.run_id, str(check_shard), "1")
    import polars as pl

    ours_rows = (
        pl.read_parquet(paths.shard_output(check_shard))
        .filter(pl.col("user_id").is_in(sample.tolist()))
        .select("user_id", "candidate_id", "mutual_count", "score", "rank", "followed_by")
    )
    reference_rows = reference_check_rows(paths, sample)
    say("DuckDB: loading the run's tables (sample keys in SQL, hop2 cap by row_number) ...")
    connection, prep_cpu, prep_wall = duckdb_connection(paths, args.duckdb_memory)
    duck_rows = duckdb_rows(connection, settings, check_shard, sample)
    problems = compare("reference vs ours", reference_rows, ours_rows)
    problems += compare("reference vs DuckDB", reference_rows, duck_rows)
    print(f"check: {len(sample)} users of shard {check_shard} ({n_uncapped} with uncapped "
          f"neighbourhoods, {n_capped} capped), {reference_rows.height:,} rows "
          f"({reference_rows['user_id'].n_unique()} users with recommendations)")
    if problems or reference_rows.height == 0:
        for problem in problems or ["no rows to compare"]:
            print(f"  MISMATCH {problem}")
        print("refusing to report: the three implementations disagree")
        return 2
    print("  identical: candidates, mutual counts, ranks and followed_by; scores within "
          f"{SCORE_TOLERANCE:g} (reference vs ours, reference vs DuckDB)")

    # --- timings -------------------------------------------------------------------------
    rng = np.random.default_rng(args.seed + 1)
    users0 = shard_users(paths, check_shard)
    count = min(args.reference_users, len(users0))
    timing_users = np.sort(rng.choice(users0, count, replace=False))
    say(f"timing the reference on {len(timing_users)} users ...")
    references = time_reference(paths, timing_users)
    reference = max(references, key=lambda t: t.rate)

    say("timing our shard task, each shard in a fresh process (then once more, warm) ...")
    baseline = child("--baseline")
    ours_runs = []
    for shard_id in range(settings.shard_count):
        result = child("--run-shard", str(paths.home), paths.run_id, str(shard_id), "2")
        ours_runs.append(result)
        fresh, warm = result["runs"]
        say(f"  shard {shard_id:03d}: {fresh['traversals']:,} traversals, task "
            f"{fresh['cpu_seconds']:.2f} s CPU fresh / {warm['cpu_seconds']:.2f} s warm, "
            f"process {result['process']['cpu_seconds']:.2f} s, "
            f"peak RSS {result['process']['peak_rss_mb']:.0f} MB")
    traversals = sum(r["runs"][0]["traversals"] for r in ours_runs)
    fresh_task = Timing(
        "ours: shard task, fresh process", traversals,
        sum(r["runs"][0]["cpu_seconds"] for r in ours_runs),
        sum(r["runs"][0]["seconds"] for r in ours_runs),
        "traverse_shard: read Parquet + mmap graph, traverse, prune, score, top-k, write",
    )
    warm_task = Timing(
        "ours: shard task, warm", traversals,
        sum(r["runs"][1]["cpu_seconds"] for r in ours_runs),
        sum(r["runs"][1]["seconds"] for r in ours_runs),
        "the same task run again in the same process (no start-up)",
    )
    whole_process = Timing(
        "ours: whole process", traversals,
        sum(r["process"]["cpu_seconds"] for r in ours_runs),
        sum(r["wall_seconds"] - r["runs"][1]["seconds"] for r in ours_runs),
        "+ interpreter start and imports (numpy, polars, numba, pydantic)",
    )

    say(f"timing DuckDB on {args.duckdb_shards} shard(s) ...")
    duck_traversals = duck_cpu = duck_wall = 0.0
    duck_rows_total = 0
    for shard_id in range(min(args.duckdb_shards, settings.shard_count)):
        cpu, wall = time.process_time(), time.perf_counter()
        frame = duckdb_rows(connection, settings, shard_id)
        duck_cpu += time.process_time() - cpu
        duck_wall += time.perf_counter() - wall
        duck_rows_total += frame.height
        expected_rows = ours_runs[shard_id]["runs"][0]["rows"]
        if frame.height != expected_rows:
            print(f"MISMATCH DuckDB shard {shard_id}: {frame.height} rows, ours {expected_rows}")
            print("refusing to report: the three implementations disagree")
            return 2
        duck_traversals += ours_runs[shard_id]["runs"][0]["traversals"]
    duck = Timing(
        "DuckDB SQL, one query per shard", int(duck_traversals), duck_cpu, duck_wall,
        f"{args.duckdb_shards} shard(s), {duck_rows_total:,} rows (same count as ours); "
        f"per-run prep {prep_cpu:.1f} s CPU untimed",
    )
    connection.close()
    load_after = os.getloadavg()

    # --- report --------------------------------------------------------------------------
    meta = graph.meta
    eligible = sum(r["runs"][0]["users_in"] for r in ours_runs)
    sizes = graph_bytes(paths)
    per_node = (sum(sizes.values()) - sizes["indices.npy"] - sizes["meta.json"]) / meta["n_nodes"]
    peak = max(r["process"]["peak_rss_mb"] for r in ours_runs)
    biggest = max(ours_runs, key=lambda r: r["process"]["peak_rss_mb"])
    big_fresh = biggest["runs"][0]
    file_mb = big_fresh.get("rss_file_mb", 0.0)
    private_mb = biggest["process"]["peak_rss_mb"] - file_mb
    generated = info.get("generated", {})
    print()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after "
          "(shared; rates use CPU seconds)")
    print(f"graph: {meta['n_nodes']:,} users, {meta['edges_read']:,} follow edges, max in-degree "
          f"{generated.get('max_in_degree', 0):,}, capped CSR {meta['n_edges']:,} entries "
          f"({sum(sizes.values()) / MB:.0f} MB mapped); {settings.shard_count} shards, "
          f"{eligible:,} eligible users, {traversals:,} traversals "
          f"({traversals / max(eligible, 1):,.0f} per user)")
    print("threads pinned to 1 (POLARS_MAX_THREADS, NUMBA_NUM_THREADS, BLAS, DuckDB threads=1); "
          "rate = traversals / CPU-second of the process")
    print()
    timings = [*references, duck, fresh_task, warm_task, whole_process]
    width = max(len(t.name) for t in timings)
    print(f"{'':{width}}  {'traversals':>13}  {'CPU s':>7}  {'wall s':>7}  {'per core /s':>12}")
    for t in timings:
        print(f"{t.name:{width}}  {t.traversals:>13,}  {t.cpu_seconds:>7.2f}  "
              f"{t.wall_seconds:>7.2f}  {t.rate / 1e6:>10.2f} M   {t.note}")
    ratio_reference = fresh_task.rate / reference.rate
    ratio_duckdb = fresh_task.rate / duck.rate
    print()
    print(f"ours / reference: {ratio_reference:.1f}x (vs the faster reference row)   "
          f"ours / DuckDB: {ratio_duckdb:.1f}x   "
          f"(warm: {warm_task.rate / reference.rate:.1f}x, {warm_task.rate / duck.rate:.1f}x; "
          f"whole process: {whole_process.rate / reference.rate:.1f}x, "
          f"{whole_process.rate / duck.rate:.1f}x)")
    print(f"our shard task: peak RSS {peak:.0f} MB (largest shard: {big_fresh['users_in']:,} "
          f"users, {big_fresh['rows']:,} rows); of it {file_mb:.0f} MB file-backed (the shared "
          f"graph mapping and libraries) and {private_mb:.0f} MB private; an idle process with "
          f"the same imports peaks at {baseline['peak_rss_mb']:.0f} MB")
    shard_traversals = big_fresh["traversals"]
    print(f"bytes per traversal: {biggest['process']['peak_rss_mb'] * MB / shard_traversals:.1f} "
          f"(peak RSS), {max(private_mb - baseline['peak_rss_mb'], 0) * MB / shard_traversals:.1f}"
          f" (private, over the idle baseline); read from the graph: 4 per traversal")
    print()
    print("capacity model (from the fresh-process shard task rate):")
    shard_model = {
        "private_bytes": max(private_mb - baseline["peak_rss_mb"], 0) * MB,
        "users": big_fresh["users_in"],
        "baseline_bytes": baseline["peak_rss_mb"] * MB,
    }
    graph_info = {"traversals": traversals, "eligible_users": eligible, "per_node_bytes": per_node}
    for line in capacity_model(fresh_task.rate, graph_info, shard_model):
        print(line)
    results = {
        "traversals_per_core_s": round(fresh_task.rate),
        "ratio_vs_reference": round(ratio_reference, 2),
        "ratio_vs_duckdb": round(ratio_duckdb, 2),
        "shard_peak_rss_mb": round(peak, 1),
    }
    if args.json:
        Path(args.json).write_text(json.dumps({
            **results,
            "timings": {t.name: t.__dict__ | {"rate": t.rate} for t in timings},
            "shards": ours_runs, "baseline": baseline, "graph": meta, "check": {
                "users": len(sample), "uncapped": n_uncapped, "capped": n_capped,
                "rows": reference_rows.height,
            },
            "ours_check_run": ours_check,
        }, indent=2, default=str))
    print()
    print(" ".join(f"{k}={v}" for k, v in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
