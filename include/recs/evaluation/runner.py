"""One evaluation end to end: split, the product on the training part, baselines, metrics.

``evaluate(edges, settings, options)``:

1. splits the edges (``split``; temporal when every edge has a time, unless told otherwise);
2. loads the training follows into a throwaway live store (``recs.store.bulk.write_store``, in
   a throwaway ``RECS_HOME``): every account ``active``, discoverable, public, no blocks, mutes,
   dismissals, pending requests or interest tags, so nothing generated distorts the result.
   Activity: ``uniform`` (every account last active an hour before the cut-off, created 400
   days before it) or, for edges with times, ``edges``: each account created at its first
   training follow (made or received) and last active at its last one, the run dated at the
   cut and the eligibility window widened to the training span, so every account is eligible
   and the activity term sees real recency;
3. per ranking variant (``variants``): ``recs.nightly.pipeline.run_all`` with the variant's
   settings (one run id per variant, the date's snapshot retained and reused), then each test
   user's list through the read path (``recs.serving.read_path.who_to_follow`` at a fixed
   clock, the run's cut-off: batch list, read-time filters, cold start, top-up);
4. the classic baselines over the same training graph (``baselines``);
5. per-user metrics (``metrics``), catalogue coverage, hub share, cold-start users apart, the
   traversals per user of each run, and paired bootstrap intervals of each method's recall
   against the best baseline's and against the design's.

Returns a JSON-able result (``report`` renders it); raises ``EvaluationError`` /
``DatasetError`` for what a user can get wrong.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from recs.errors import EvaluationError
from recs.evaluation.baselines import BASELINES, adjacency, baseline_lists
from recs.evaluation.edges import EdgeList
from recs.evaluation.metrics import (
    catalogue_coverage,
    hub_share,
    paired_difference,
    per_user_metrics,
    summary,
)
from recs.evaluation.split import Split, random_split, temporal_split
from recs.evaluation.variants import DEFAULT_VARIANTS, VARIANTS, variant_overrides

log = logging.getLogger("recs.evaluation")
Progress = Callable[[str], None]

UNIFORM_SNAPSHOT_DATE = dt.date(2026, 11, 1)
"""The run date of an evaluation without times (``recs.demo.generated.REFERENCE_DATE``)."""


@dataclass(frozen=True)
class EvaluationOptions:
    """What to evaluate and how; defaults from ``Settings.eval_*`` (``from_settings``).

    A random split is repeated with the next seeds until the test users pooled over the repeats
    number ``min_test_users`` (at most ``max_repeats``): one 10 % holdout of a few hundred users
    moves recall by about 0.01 from seed to seed, more than the differences measured.
    ``split``/``activity``: ``auto`` picks ``temporal``/``edges`` when every edge has a time,
    else ``random``/``uniform``. ``workdir``: where the throwaway homes go (default a new
    temporary folder, removed afterwards unless ``keep``)."""

    k: int = 20
    share: float = 0.1
    min_follows: int = 10
    seed: int = 13
    temporal_quantile: float = 0.8
    split: str = "auto"
    activity: str = "auto"
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    baselines: tuple[str, ...] = BASELINES
    resamples: int = 2000
    min_test_users: int = 3000
    max_repeats: int = 10
    workdir: Path | None = None
    keep: bool = False

    @classmethod
    def from_settings(cls, settings, **overrides) -> EvaluationOptions:
        values = {
            "k": settings.top_k, "share": settings.eval_holdout_share,
            "min_follows": settings.eval_min_follows, "seed": settings.eval_seed,
            "temporal_quantile": settings.eval_temporal_quantile,
            "resamples": settings.eval_bootstrap_resamples,
            "min_test_users": settings.eval_min_test_users,
            "max_repeats": settings.eval_max_repeats,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def check(self) -> None:
        """Refuse options no evaluation can run with, before any work (a newcomer's ``--activity
        bogus`` was refused after the split and five baselines, a ``--min-follows -5`` ran as
        0, ``--variants ''`` ran all 18). Raises ``EvaluationError``."""
        if self.split not in ("auto", "random", "temporal"):
            raise EvaluationError(f"unknown split {self.split!r}: auto, random or temporal")
        if self.activity not in ("auto", "uniform", "edges"):
            raise EvaluationError(f"unknown activity {self.activity!r}: auto, uniform or edges")
        if self.min_follows < 2:  # one follow hidden of one: the user has nothing to go on
            raise EvaluationError(f"min follows must be at least 2, not {self.min_follows}")
        for kind, names in (("variant", self.variants), ("baseline", self.baselines)):
            if not names:
                raise EvaluationError(f"no {kind} named: leave the option out for all of them")
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:
            raise EvaluationError(
                f"unknown baseline {unknown[0]!r}: one of {', '.join(BASELINES)}"
            )
        for name in self.variants:
            variant_overrides(name)


@dataclass
class MethodResult:
    """One method's lists and per-user metrics (``per_user``: ``metrics.per_user_metrics``
    plus ``source``), and its JSON-able ``summary``."""

    name: str
    kind: str
    description: str
    lists: pl.DataFrame
    per_user: pl.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)


def make_split(edges: EdgeList, options: EvaluationOptions) -> Split:
    """The split ``options`` ask for (module docstring, step 1)."""
    kind = options.split
    if kind == "auto":
        kind = "temporal" if edges.has_times else "random"
    if kind == "temporal":
        return temporal_split(edges, quantile=options.temporal_quantile)
    if kind == "random":
        return random_split(edges, share=options.share, min_follows=options.min_follows,
                            seed=options.seed)
    raise EvaluationError(f"unknown split {kind!r}: auto, random or temporal")


# --- the training store ------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingStore:
    """Where the product reads the training graph: its home, run date and read clock."""

    home: Path
    snapshot_date: dt.date
    now: dt.datetime  # naive UTC: the run's cut-off, the read path's clock
    eligibility_window_days: int
    activity: str


def _timestamps(values: np.ndarray) -> pl.Series:
    return pl.Series(values.astype(np.int64)).cast(pl.Datetime("us"))


def load_training_store(split: Split, settings, activity: str, home: Path) -> TrainingStore:
    """Write the training follows and their accounts into a new live store under ``home``
    (module docstring, step 2). ``settings``: gives nothing but the bulk loader's defaults."""
    from recs.store.bulk import TableRows, write_store

    micros = 1_000_000
    user_ids = split.user_ids
    train = split.train
    if activity == "edges":
        if train["followed_at"].null_count():
            raise EvaluationError("activity from edges needs a time on every edge")
        stamps = pl.concat([
            train.select(pl.col("follower_id").alias("user_id"), "followed_at"),
            train.select(pl.col("followee_id").alias("user_id"), "followed_at"),
        ]).group_by("user_id").agg(
            pl.col("followed_at").min().alias("first"), pl.col("followed_at").max().alias("last")
        )
        frame = pl.DataFrame({"user_id": user_ids}).join(stamps, on="user_id", how="left")
        cut_s = float(train["followed_at"].max())
        first = frame["first"].fill_null(cut_s).to_numpy()
        last = frame["last"].fill_null(cut_s).to_numpy()
        snapshot_date = dt.datetime.fromtimestamp(cut_s, dt.UTC).date()
        now = dt.datetime.combine(snapshot_date + dt.timedelta(days=1), dt.time())
        created_us = (first * micros).astype(np.int64)
        active_us = (last * micros).astype(np.int64)
        edge_us = (train["followed_at"].to_numpy() * micros).astype(np.int64)
        span_days = (now - dt.datetime(1970, 1, 1)).total_seconds() / 86_400 - last.min() / 86_400
        window = int(math.ceil(span_days)) + 1
    elif activity == "uniform":
        snapshot_date = UNIFORM_SNAPSHOT_DATE
        now = dt.datetime.combine(snapshot_date + dt.timedelta(days=1), dt.time())
        now_us = int((now - dt.datetime(1970, 1, 1)).total_seconds()) * micros
        created_us = np.full(len(user_ids), now_us - 400 * 86_400 * micros)
        active_us = np.full(len(user_ids), now_us - 3600 * micros)
        edge_us = np.full(train.height, now_us - 30 * 86_400 * micros)
        window = settings.eligibility_window_days
    else:
        raise EvaluationError(f"unknown activity {activity!r}: auto, uniform or edges")
    users = pl.DataFrame({
        "user_id": user_ids, "created_at": _timestamps(created_us),
        "last_active_at": _timestamps(active_us),
        "account_status": "active", "is_discoverable": True, "is_private": False,
    })
    follows = pl.DataFrame({
        "follower_id": train["follower_id"], "followee_id": train["followee_id"],
        "created_at": _timestamps(edge_us), "status": "active",
    })
    home.mkdir(parents=True, exist_ok=True)
    write_store(
        f"sqlite:///{(home / 'live.db').resolve()}",
        [TableRows("users", [users], users.height),
         TableRows("follow_edges", [follows], follows.height)],
        replace=True,
    )
    return TrainingStore(home, snapshot_date, now, window, activity)


def variant_settings(base, store: TrainingStore, overrides: dict[str, Any]):
    """The settings of one variant's run: ``base`` (the caller's, so ``RECS_*`` tunables hold)
    with the throwaway home and store, every account eligible, the gate's volume change checks
    off (each variant replaces another variant's version of the same graph, not last night's:
    ``min_mutual_count`` 2 against 1 changes the rows far beyond ``gate_max_drop``), and the
    variant's overrides."""
    from recs.config import Settings

    values = base.model_dump()
    values.update({
        "home": store.home, "store_url": None, "snapshot_store_url": None,
        "eligibility_window_days": max(base.eligibility_window_days,
                                       store.eligibility_window_days),
        "api_cold_start_pool": base.api_cold_start_pool,
        "gate_max_drop": 1.0, "gate_max_growth": 1_000_000.0,
    })
    values.update(overrides)
    return Settings(**values)


# --- the product's lists ------------------------------------------------------------------------


def served_lists(settings, run_id: str, test_users: np.ndarray, k: int, now: dt.datetime):
    """Every test user's list through the read path: ``user_id, candidate_id, rank, source``
    (``batch`` or ``cold_start``) and ``filled`` (a cold-start item topping a batch list up)."""
    from recs.serving.live_store import LiveStore
    from recs.serving.read_path import who_to_follow
    from recs.serving.versions import PublishedVersion

    version = PublishedVersion.load(
        settings.published_dir, run_id, eager=True, cold_start_pool=settings.api_cold_start_pool
    )
    store = LiveStore(settings.live_store_url, timeout_ms=0, pool_size=1)
    users, candidates, ranks, sources, filled = [], [], [], [], []
    try:
        for user_id in test_users.tolist():
            document = who_to_follow(
                user_id, k, version=version, store=store, settings=settings, now=now
            )
            for item in document["items"]:
                users.append(user_id)
                candidates.append(item["candidate_id"])
                ranks.append(item["rank"])
                sources.append(document["source"])
                filled.append(document["source"] == "batch" and item["score"] is None)
    finally:
        store.close()
    return pl.DataFrame(
        {"user_id": users, "candidate_id": candidates, "rank": ranks, "source": sources,
         "filled": filled},
        schema={"user_id": pl.Int64, "candidate_id": pl.Int64, "rank": pl.Int32,
                "source": pl.String, "filled": pl.Boolean},
    )


def run_traversals(home: Path, snapshot_date: dt.date, run_id: str) -> dict[str, Any]:
    """Traversals, eligible users and rows of a run, from its shard manifests."""
    from recs.files import read_json
    from recs.nightly.runs import RunPaths

    paths = RunPaths.create(home, snapshot_date, run_id)
    totals = {"traversals": 0, "users_in": 0, "rows": 0}
    for manifest_path in sorted(paths.shards_dir.glob("shard_id=*/manifest.json")):
        manifest = read_json(manifest_path)
        for key in totals:
            totals[key] += int(manifest.get(key, 0))
    totals["traversals_per_user"] = (
        totals["traversals"] / totals["users_in"] if totals["users_in"] else 0.0
    )
    hubs_path = paths.exports_dir / "hub_accounts.parquet"
    totals["hub_ids"] = (
        pl.read_parquet(hubs_path)["user_id"].to_numpy() if hubs_path.exists()
        else np.zeros(0, np.int64)
    )
    return totals


def _by_source(per_user: pl.DataFrame) -> dict[str, dict[str, float]]:
    return {
        source: summary(per_user.filter(pl.col("source") == source))
        for source in ("batch", "cold_start")
    }


def repeats_for(split: Split, options: EvaluationOptions) -> int:
    """How many random splits (seeds ``seed``, ``seed + 1``, ...) pool at least
    ``min_test_users`` test users, at most ``max_repeats``; 1 for a temporal split."""
    if split.kind != "random":
        return 1
    users = max(1, len(split.test_users))
    return max(1, min(options.max_repeats, math.ceil(options.min_test_users / users)))


def _product_run(name, settings, split, store, options, run_all) -> MethodResult:
    t0 = time.perf_counter()
    run_settings = variant_settings(settings, store, variant_overrides(name))
    run_all(store.home, store.snapshot_date, run_id=name, settings=run_settings)
    served = served_lists(run_settings, name, split.test_users, options.k, store.now)
    counts = run_traversals(store.home, store.snapshot_date, name)
    hub_ids = counts.pop("hub_ids")
    per_user = per_user_metrics(served, split.test, options.k).join(
        served.group_by("user_id").agg(pl.col("source").first(), pl.col("filled").any()),
        on="user_id", how="left",
    ).with_columns(pl.col("source").fill_null("none"), pl.col("filled").fill_null(False))
    return MethodResult(name, "product", VARIANTS[name][0], served, per_user, {
        **counts, "seconds": round(time.perf_counter() - t0, 2),
        "catalogue_coverage": catalogue_coverage(served, len(split.user_ids)),
        "hub_share": hub_share(served, hub_ids), "hub_ids": hub_ids,
    })


def _pooled(parts: list[MethodResult]) -> MethodResult:
    """One method's results over the repeats: per-user rows stacked (a ``repeat`` column),
    counts summed, coverage and hub share averaged over the repeats."""
    first = parts[0]
    per_user = pl.concat([
        part.per_user.with_columns(repeat=pl.lit(r, dtype=pl.Int32))
        for r, part in enumerate(parts)
    ], how="diagonal_relaxed")
    lists = pl.concat([part.lists.with_columns(repeat=pl.lit(r, dtype=pl.Int32))
                       for r, part in enumerate(parts)], how="diagonal_relaxed")
    pooled = {"repeats": len(parts)}
    for key in ("traversals", "users_in", "rows", "seconds"):
        if key in first.summary:
            pooled[key] = sum(part.summary[key] for part in parts)
    if "users_in" in pooled:
        pooled["traversals_per_user"] = (
            pooled["traversals"] / pooled["users_in"] if pooled["users_in"] else 0.0
        )
    for key in ("catalogue_coverage", "hub_share"):
        pooled[key] = float(np.mean([part.summary[key] for part in parts]))
    if first.kind == "product":
        pooled["by_source"] = _by_source(per_user)
        pooled["filled_users"] = int(per_user["filled"].sum())
    pooled.update(summary(per_user))
    return MethodResult(first.name, first.kind, first.description, lists, per_user, pooled)


def evaluate(
    edges: EdgeList, settings, options: EvaluationOptions, progress: Progress | None = None
) -> dict[str, Any]:
    """Run one evaluation (module docstring); returns its result document."""
    from recs.nightly.pipeline import run_all

    say = progress or (lambda message: log.info("%s", message))
    options.check()
    started = time.perf_counter()
    activity = options.activity
    if activity == "auto":
        activity = "edges" if edges.has_times else "uniform"
    splits = [make_split(edges, options)]
    repeats = repeats_for(splits[0], options)
    for r in range(1, repeats):
        splits.append(make_split(edges, replace(options, seed=options.seed + r)))
    workdir = Path(options.workdir) if options.workdir else Path(
        tempfile.mkdtemp(prefix="recs-evaluate-")
    )
    parts: dict[str, list[MethodResult]] = {}
    try:
        for r, split in enumerate(splits):
            say(f"{edges.name}: {split.kind} split {r + 1}/{repeats}, "
                f"{len(split.test_users):,} test users, {split.test.height:,} hidden follows, "
                f"{split.train.height:,} training follows")
            matrix = adjacency(split.train, split.user_ids)
            for name in options.baselines:
                t0 = time.perf_counter()
                lists = baseline_lists(
                    name, split.train, split.user_ids, split.test_users, options.k, matrix
                )
                per_user = per_user_metrics(lists, split.test, options.k).with_columns(
                    source=pl.lit("baseline")
                )
                parts.setdefault(name, []).append(MethodResult(
                    name, "baseline", name.replace("_", " "), lists, per_user,
                    {"seconds": round(time.perf_counter() - t0, 2),
                     "catalogue_coverage": catalogue_coverage(lists, len(split.user_ids))},
                ))
                say(f"baseline {name}: recall@{options.k} {per_user['recall'].mean():.4f}")
            store = load_training_store(split, settings, activity, workdir / f"{edges.name}-{r}")
            hub_ids = np.zeros(0, np.int64)
            for name in options.variants:
                result = _product_run(name, settings, split, store, options, run_all)
                hub_ids = result.summary.pop("hub_ids")
                parts.setdefault(name, []).append(result)
                say(f"variant {name}: recall@{options.k} {result.per_user['recall'].mean():.4f}"
                    f", {result.summary['traversals_per_user']:,.0f} traversals/user "
                    f"({result.summary['seconds']:.0f} s)")
            for name in options.baselines:
                parts[name][-1].summary["hub_share"] = hub_share(parts[name][-1].lists, hub_ids)
            if not options.keep:
                shutil.rmtree(store.home, ignore_errors=True)
    finally:
        if not options.keep and not options.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    methods = [_pooled(results) for results in parts.values()]
    meta = dict(splits[0].meta)
    meta.update({
        "repeats": repeats, "seeds": [options.seed + r for r in range(repeats)]
        if splits[0].kind == "random" else [],
        "pooled_test_users": sum(len(split.test_users) for split in splits),
    })
    return _document(edges, meta, options, activity, methods, started)


def _document(edges, meta, options, activity, methods, started) -> dict[str, Any]:
    baselines = [m for m in methods if m.kind == "baseline"]
    best = max(baselines, key=lambda m: m.summary["recall"]) if baselines else None
    design = next((m for m in methods if m.name == "design"), None)
    comparisons = []
    for method in methods:
        for against in (best, design):
            if against is None or against is method or (
                method.kind == "baseline" and against is best
            ):
                continue
            for metric in ("recall", "ndcg"):
                difference = paired_difference(
                    method.per_user[metric].to_numpy(), against.per_user[metric].to_numpy(),
                    resamples=options.resamples, seed=options.seed,
                )
                comparisons.append({"method": method.name, "against": against.name,
                                    "metric": metric, **difference})
    return {
        "dataset": edges.name,
        "edges": {"self_loops_dropped": edges.self_loops_dropped,
                  "duplicates_dropped": edges.duplicates_dropped, "has_times": edges.has_times},
        "split": meta,
        "k": options.k,
        "activity": activity,
        "best_baseline": best.name if best else None,
        "methods": [
            {"name": m.name, "kind": m.kind, "description": m.description,
             "settings": variant_overrides(m.name) if m.kind == "product" else {},
             **m.summary}
            for m in methods
        ],
        "comparisons": comparisons,
        "seconds": round(time.perf_counter() - started, 1),
    }
