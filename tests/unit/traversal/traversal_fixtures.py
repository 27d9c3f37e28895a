"""Builds tiny runs on disk (snapshot + dbt exports) for the graph and traversal tests.

Every traversal test runs a fixture written by ``write_run`` through ``build_graph`` and
``traverse_shard`` (``run``); the expected rows are derived by hand in each test's docstring.
Sample orders that matter are pinned in test_sampling / asserted with ``capped_follows`` (seed
20240601): user 1's follows 10, 11, 12 come in the order 10, 12, 11.

The files follow ``recs.contracts`` exactly and the layout of ``recs.runs``: follow edges under
``snapshot/follow_edges/shard_id=NNN/part-0.parquet`` (zero-padded, by shard of follower_id),
exports under ``exports/<name>/shard_id=N/data_0.parquet`` (not padded, as DuckDB writes them;
a shard without eligible users gets no folder at all). The exports are derived the way the dbt
models define them, so each test only lists users, edges and the extra exclusion rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

import polars as pl

from recs.config import Settings
from recs.contracts import EXPORT_SCHEMAS, SNAPSHOT_SCHEMAS, conform
from recs.files import write_json
from recs.nightly import in_degrees
from recs.nightly.runs import RunPaths
from recs.sharding import shard_of
from recs.traversal import traverse_shard
from recs.traversal.graph import build_graph

SEED = 20_240_601
DAY = dt.timedelta(days=1)
SNAPSHOT_DATE = dt.date(2026, 11, 1)
AS_OF = dt.datetime(2026, 11, 2)  # midnight UTC after the snapshot date (RunPaths.as_of)
CREATED = dt.datetime(2025, 1, 1)


@dataclass
class User:
    user_id: int
    last_active_at: dt.datetime | None = AS_OF
    account_status: str = "active"
    is_discoverable: bool = True
    eligible: bool = True


@dataclass
class Fixture:
    """A tiny graph: users, follow edges and extra exclusion rows (blocked, muted, ...)."""

    users: list[User]
    edges: list[tuple[int, int, str]]  # (follower_id, followee_id, status)
    exclusions: list[tuple[int, int, str]] = field(default_factory=list)  # (user, excluded, reason)
    missing_profiles: set[int] = field(default_factory=set)  # users without a profile row
    hubs: list[int] = field(default_factory=list)  # rows of exports/hub_accounts.parquet


#: The design document's ranking (issue 13 keeps it as a named variant): each mutual path counts
#: 1, min_mutual_count 2, rows in sample order, the 0.7 / 0.3 blend without a popularity term.
#: The hand-derived tests of the flow pin it; test_ranking derives the shipped default's scores.
DESIGN_RANKING = {
    "ranking": "blend", "min_mutual_count": 2, "hop1_order": "sample", "hop2_order": "sample",
    "mutual_weight": 0.7, "activity_weight": 0.3, "popularity_weight": 0.0, "hub_damping": 0.0,
}


def settings_for(tmp_path, *, shipped: bool = False, **overrides) -> Settings:
    """Settings of a test run: the design's ranking (``DESIGN_RANKING``), or with ``shipped``
    the shipped defaults; ``overrides`` on top."""
    values = {"home": tmp_path / "home", "shard_count": 1}
    if not shipped:
        values.update(DESIGN_RANKING)
    values.update(overrides)
    return Settings(**values)


def users_with(ids: Iterable[int], **attributes) -> list[User]:
    return [User(user_id=i, **attributes) for i in ids]


def recount_in_degrees(paths: RunPaths) -> None:
    """Count the snapshot's in-degrees from its follow edges, as the freeze does (build_graph
    checks them against the edges): after writing the edges or changing them."""
    in_degrees.from_follow_edges(paths.snapshot_dir).write_parquet(
        paths.snapshot_dir / in_degrees.FILE
    )


def write_run(fixture: Fixture, settings: Settings, run_id: str = "test_run") -> RunPaths:
    """Write the snapshot and exports of ``fixture`` under ``settings.home``; return the paths."""
    paths = RunPaths.create(settings.home, SNAPSHOT_DATE, run_id)
    shards = settings.shard_count
    users = pl.DataFrame(
        {
            "user_id": [u.user_id for u in fixture.users],
            "created_at": [CREATED] * len(fixture.users),
            "last_active_at": [u.last_active_at for u in fixture.users],
            "account_status": [u.account_status for u in fixture.users],
            "is_discoverable": [u.is_discoverable for u in fixture.users],
            "is_private": [False] * len(fixture.users),
        },
        schema=SNAPSHOT_SCHEMAS["users"],
    )
    paths.snapshot_dir.mkdir(parents=True, exist_ok=True)
    users.write_parquet(paths.snapshot_dir / "users.parquet")

    edges = pl.DataFrame(
        {
            "follower_id": [e[0] for e in fixture.edges],
            "followee_id": [e[1] for e in fixture.edges],
            "created_at": [CREATED] * len(fixture.edges),
            "status": [e[2] for e in fixture.edges],
        },
        schema=SNAPSHOT_SCHEMAS["follow_edges"],
    )
    edge_shards = [shard_of(f, shards) for f in edges["follower_id"].to_list()]
    edges = edges.with_columns(pl.Series("shard", edge_shards, dtype=pl.Int64))
    for shard in range(shards):
        part = paths.snapshot_dir / "follow_edges" / f"shard_id={shard:03d}"
        part.mkdir(parents=True, exist_ok=True)
        edges.filter(pl.col("shard") == shard).drop("shard").write_parquet(part / "part-0.parquet")
    recount_in_degrees(paths)
    write_json(
        paths.snapshot_manifest,
        {"settings": settings.model_dump(mode="json"), "snapshot_date": str(SNAPSHOT_DATE)},
    )

    exports = paths.exports_dir
    exports.mkdir(parents=True, exist_ok=True)
    eligible = [u.user_id for u in fixture.users if u.eligible]
    _write_by_shard(
        pl.DataFrame({"user_id": eligible}, schema=EXPORT_SCHEMAS["eligible_users"]),
        exports / "eligible_users",
        shards,
    )
    follow_rows = [(f, t, "following" if s == "active" else "pending") for f, t, s in fixture.edges]
    exclusion_rows = follow_rows + list(fixture.exclusions)
    exclusions = pl.DataFrame(
        {
            "user_id": [r[0] for r in exclusion_rows],
            "excluded_id": [r[1] for r in exclusion_rows],
            "reason": [r[2] for r in exclusion_rows],
        },
        schema=EXPORT_SCHEMAS["follow_exclusions"],
    ).filter(pl.col("user_id").is_in(eligible))
    _write_by_shard(exclusions, exports / "follow_exclusions", shards)

    in_degree = (
        edges.filter(pl.col("status") == "active")
        .group_by("followee_id")
        .agg(pl.len().cast(pl.Int64).alias("in_degree"))
    )
    profiles = (
        users.filter(~pl.col("user_id").is_in(sorted(fixture.missing_profiles)))
        .rename({"user_id": "candidate_id"})
        .join(in_degree, left_on="candidate_id", right_on="followee_id", how="left")
        .with_columns(
            pl.col("in_degree").fill_null(0),
            ((pl.col("account_status") == "active") & pl.col("is_discoverable")).alias(
                "is_recommendable"
            ),
        )
    )
    conform(profiles, EXPORT_SCHEMAS["candidate_profiles"]).sort("candidate_id").write_parquet(
        exports / "candidate_profiles.parquet"
    )
    pl.DataFrame(
        {"user_id": fixture.hubs, "in_degree": [0] * len(fixture.hubs)},
        schema=EXPORT_SCHEMAS["hub_accounts"],
    ).write_parquet(exports / "hub_accounts.parquet")
    return paths


def _write_by_shard(frame: pl.DataFrame, root, shards: int) -> None:
    """Hive layout ``root/shard_id=N/data_0.parquet``; shards without rows get no folder."""
    key = frame.columns[0]
    with_shard = frame.with_columns(
        pl.Series("shard", [shard_of(v, shards) for v in frame[key].to_list()], dtype=pl.Int64)
    )
    for shard in sorted(set(with_shard["shard"].to_list())):
        part = root / f"shard_id={shard}"
        part.mkdir(parents=True, exist_ok=True)
        with_shard.filter(pl.col("shard") == shard).drop("shard").write_parquet(
            part / "data_0.parquet"
        )


def run(fixture: Fixture, settings, shard_id: int = 0):
    """Write ``fixture``, build its graph, traverse one shard: ``(paths, manifest, frame)``."""
    paths = write_run(fixture, settings)
    build_graph(paths, settings)
    manifest = traverse_shard(paths, settings, shard_id)
    return paths, manifest, pl.read_parquet(paths.shard_output(shard_id))


def rows(frame: pl.DataFrame) -> list[tuple]:
    """(user, candidate, mutual_count, score rounded to 1e-12, rank, followed_by) per row."""
    return [
        (
            r["user_id"],
            r["candidate_id"],
            r["mutual_count"],
            round(r["score"], 12),
            r["rank"],
            r["followed_by"],
        )
        for r in frame.iter_rows(named=True)
    ]


def only_user_1(ids, **attributes) -> list[User]:
    """User 1 is the only eligible user; everyone else exists but is not refreshed tonight."""
    return [User(1)] + [User(i, eligible=False, **attributes) for i in ids]


def exclusion_graph() -> Fixture:
    """User 1 follows 10, 11, 12 (active) and 13 (pending); every pre-rank filter applies to
    some account two hops away (test_predicates derives the counts)."""
    follows = {
        10: [20, 21, 23, 13, 1, 11, 24, 27, 29, 31],
        11: [20, 21, 24, 25, 13, 1, 28, 29, 30],
        12: [20, 22, 25, 26, 11, 27, 28, 30, 31],
        13: [22, 23, 26],
    }
    edges = [(1, 10, "active"), (1, 11, "active"), (1, 12, "active"), (1, 13, "pending")]
    edges += [(f, t, "active") for f, targets in follows.items() for t in targets]
    users = only_user_1([10, 11, 12, 13, 20, 22, 23, 26, 27, 28, 29, 30, 31])
    users += [
        User(21, last_active_at=AS_OF - 14 * DAY, eligible=False),
        User(24, account_status="suspended", eligible=False),
        User(25, is_discoverable=False, eligible=False),
    ]
    exclusions = [(1, 27, "blocked"), (1, 28, "blocked_by"), (1, 29, "muted"), (1, 30, "dismissed")]
    return Fixture(users=users, edges=edges, exclusions=exclusions, missing_profiles={31})
