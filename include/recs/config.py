"""Settings: every tunable of the design in one frozen object, read from ``RECS_*`` once.

Light module: imports only pydantic-settings, the standard library and ``recs.times``, so DAG
files may import it at parse time.

Defaults and their source:

- ``hop1_cap`` 200, ``hop2_cap`` 50: the design document's bounded two-hop BFS
  (``bounded_second_degree(hop1_cap=200, hop2_cap_per_node=50)``).
- ``max_candidates_to_score`` 500: its ``MAX_CANDIDATES_TO_SCORE``; ``mutual_saturation`` 25,
  ``half_life_days`` 14: its ``score_candidate`` / ``activity_recency_score``.
- The ranking (issue 13, measured by ``recs evaluate``: ``bench/evaluation/``): ``ranking``
  ``adamic_adar``, ``min_mutual_count`` 1 (the design: ``blend``, 2), ``hop2_order``
  ``popularity``, ``popularity_weight`` 0.02 beside ``mutual_weight`` 0.68 and
  ``activity_weight`` 0.3 (the design: 0.7, 0.3, none), ``fill_short_lists`` on.
- ``top_k`` 20: "the top twenty candidates per user are written".
- ``eligibility_window_days`` 30: "users who were active in the last 30 days".
- ``cold_start_account_age_hours`` 24, ``cold_start_min_following`` 5: its cold-start rule.
- ``run_store_*``, ``run_cache_dir``: where run artifacts live for workers on several machines
  (``recs.nightly.artifacts``); unset, everything stays under ``home``.
- ``api_*``: the online read path (``recs serve``); ``api_jwt_secret`` has no default.
- ``ingest_*``: event ingestion (``recs ingest``): the event_time window an event must fall in
  (``ingest_max_future_seconds`` 3600 ahead of the ingesting machine's clock, not before
  ``ingest_min_event_time`` 2000-01-01; the reasons are on the fields).
- ``gate_*``: the gate's table-level bounds (``recs.nightly.validation``); ``*_retention_*``:
  what ``recs gc`` keeps (``recs.nightly.retention``).
- ``hub_in_degree_threshold``: the design uses 1,000,000 for 500 M users; ``None`` (default)
  scales it to the graph: the in-degree at the ``hub_quantile`` (99.9th percentile), at least
  ``hub_min_in_degree`` (100), so a 80 k-user graph still has a handful of hubs.
"""

from __future__ import annotations

import datetime as dt
import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from recs.times import naive_utc

HopOrder = Literal["sample", "recency", "reciprocity", "popularity"]
"""How the capped first and second hops are chosen (``Settings.hop1_order`` / ``hop2_order``)."""
Ranking = Literal["blend", "adamic_adar", "resource_allocation"]
"""The path weight of the mutual term (``Settings.ranking``)."""


class Settings(BaseSettings):
    """The validated, immutable configuration of one process.

    Read from environment variables prefixed ``RECS_`` (``RECS_HOME``, ``RECS_SHARD_COUNT``,
    ``RECS_HOP1_CAP``, ...). Raises ``pydantic.ValidationError`` on a bad value (a negative
    cap, weights outside 0..1, ...), which the CLI turns into one readable line.
    """

    model_config = SettingsConfigDict(env_prefix="RECS_", frozen=True, extra="ignore")

    home: Path = Field(Path("data"), description="Root of all state: live store, runs, published.")
    store_url: str | None = Field(
        None,
        exclude=True,  # a connection, not part of a run's definition: may hold a password
        description="SQLAlchemy URL of the live graph store; default sqlite:///<home>/live.db.",
    )
    snapshot_store_url: str | None = Field(
        None,
        exclude=True,
        description=(
            "Where freeze_snapshot reads the live store: in production a PostgreSQL hot standby"
            " of store_url, so the batch's read load never reaches the primary the write path"
            " uses (the design's 'never blocked, throttled, or slowed'); default store_url."
        ),
    )
    snapshot_read_connections: int = Field(
        2,
        exclude=True,  # how a store is read, not what the run computes
        ge=1,
        le=16,
        description="Connections freeze_snapshot reads follow_edges with, on threads of their "
        "own, all in one snapshot of the store (recs.store.readers): about the cores the freeze "
        "may use. Each reads an equal span of follower_id values (so dense ids balance them; "
        "one far outlier id leaves one connection most of the rows), or on PostgreSQL its "
        "share of the table's partitions. 1: one connection.",
    )
    snapshot_standby_wait_seconds: float = Field(
        300.0,
        exclude=True,
        ge=0,
        description="How long freeze_snapshot waits for the standby to replay up to the primary.",
    )
    run_store_url: str | None = Field(
        None,
        exclude=True,  # where a run's files live, not what it computes (and may name a bucket)
        description="Where run artifacts live so every worker reaches them "
        "(recs.nightly.artifacts): a shared-volume path or an fsspec URL (s3://bucket/prefix, "
        "file:///..., memory://...). Each task pulls the artifacts it reads into its local "
        "<home>/runs/... before it runs and pushes what it wrote after it succeeds. Unset or "
        "empty: everything stays local under home (no copies).",
    )
    run_store_options: Annotated[dict[str, Any], NoDecode] = Field(
        default_factory=dict,
        exclude=True,  # may hold credentials
        description="fsspec storage options of the run store, as JSON "
        '(RECS_RUN_STORE_OPTIONS=\'{"endpoint_url": "http://127.0.0.1:9000"}\'); S3 '
        "credentials and endpoint also come from the usual AWS_* variables.",
    )
    run_cache_dir: Path | None = Field(
        None,
        exclude=True,
        description="This machine's cache of run graphs copied from the run store (one copy "
        "per run and checksum, shared by its shard tasks); default <home>/cache/graphs.",
    )
    datasets_dir: Path = Field(
        Path(__file__).resolve().parents[2] / "datasets",
        description="Folder searched first for the real graph datasets (RECS_DATASETS_DIR; "
        "default the repository's datasets/); then datasets/, then ../shared/datasets "
        "(recs.demo.datasets.dataset_folders).",
    )

    shard_count: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Mapped traversal tasks per run, fixed; unset: planned from the number of "
        "eligible users (recs.nightly.shard_plan). A run's manifest holds the number it used.",
    )
    shard_users_target: int = Field(
        200_000, ge=1, description="Eligible users per shard the plan aims for."
    )
    shard_count_min: int = Field(4, ge=1, le=4096, description="Fewest shards a plan makes.")
    shard_count_max: int = Field(
        1024, ge=1, le=4096, description="Most shards a plan makes (at most Airflow's "
        "max_map_length, checked at run time)."
    )
    graph_partitions_per_task: int = Field(
        16, ge=1, le=4096, description="Snapshot partitions one cap_graph task caps into "
        "pieces of the graph (recs.traversal.graph_pieces), two files at a time: each task "
        "reads the id map and in-degrees once (n_nodes), so fewer, larger groups cost less; "
        "more spread over workers."
    )
    gate_shards_per_task: int = Field(
        16, ge=1, le=4096, description="Shards one validate_shards task checks, one after "
        "another (recs.nightly.shard_plan.task_groups): each task imports Great Expectations "
        "once, 3-6 s of CPU, and holds one shard at a time plus the next one read ahead, so "
        "fewer, larger groups cost less; more spread over workers."
    )
    snapshot_max_lag_hours: float = Field(
        36.0,
        ge=0.0,
        description="A date's snapshot may be read from the live store only while the store "
        "has nothing newer than the date's cut-off plus this (its newest account creation or "
        "activity); older dates need a retained snapshot, or --rebuild-snapshot.",
    )
    hop1_cap: int = Field(200, ge=1, le=100_000, description="First-hop follows expanded per user.")
    hop2_cap: int = Field(50, ge=1, le=100_000, description="Follows expanded per first-hop node.")
    sample_seed: int = Field(
        20_240_601, ge=0, lt=2**63, description="Seed of the deterministic capped sampling."
    )
    min_mutual_count: int = Field(
        1, ge=1, description="Candidates reached through fewer expanded follows are pruned "
        "(the design: 2, which cost 0.002-0.006 recall@20 on each graph of bench/evaluation/; "
        "1 makes the kernel about 3x slower: bench/README.md, 'Issue 13')."
    )
    max_candidates_to_score: int = Field(500, ge=1, description="Kept by mutual count, pre-score.")
    top_k: int = Field(20, ge=1, le=1000, description="Rows kept per user after ranking.")
    followed_by_count: int = Field(3, ge=0, le=16, description="Mutual ids kept per row.")
    hop1_order: HopOrder = Field(
        "sample", description="Which hop1_cap follows of a user are expanded: 'sample' (uniform, "
        "recs.sampling), 'recency' (newest follows first), 'reciprocity' (follows that follow "
        "back first) or 'popularity' (most-followed first); ties in sample order."
    )
    hop2_order: HopOrder = Field(
        "popularity", description="Which hop2_cap follows of each first-hop account are "
        "expanded (graph/indices.npy): the same choices as hop1_order."
    )

    ranking: Ranking = Field(
        "adamic_adar", description="The mutual term's path weight: 'blend' (the design: each "
        "expanded follow reaching a candidate counts 1, the score is its blend), 'adamic_adar' "
        "(1 / log2 of that account's follows + followers) or 'resource_allocation' (2 / them)."
    )
    mutual_weight: float = Field(0.68, ge=0.0, le=1.0, description="Weight of the mutual term.")
    mutual_saturation: float = Field(
        25.0, gt=0.0, description="Weighted mutual count at which the mutual term saturates."
    )
    activity_weight: float = Field(0.3, ge=0.0, le=1.0, description="Weight of the activity term.")
    half_life_days: float = Field(14.0, gt=0.0, description="Activity decay half-life, days.")
    popularity_weight: float = Field(
        0.02, ge=0.0, le=1.0, description="Weight of the popularity term: the candidate's "
        "followers / the most-followed account's (0: the design's score)."
    )
    hub_damping: float = Field(
        0.0, ge=0.0, le=4.0, description="Audience-relative damping of hub candidates: a hub's "
        "mutual term is multiplied by (hub threshold / its followers) ** hub_damping (0: none)."
    )
    fill_short_lists: bool = Field(
        True, description="The read path tops a batch list shorter than the request up from "
        "the cold-start list (the user's interests, then global), after the read-time filters."
    )

    eligibility_window_days: int = Field(30, ge=1, description="Active within N days to refresh.")
    hub_in_degree_threshold: int | None = Field(
        None, ge=1, description="Fixed hub threshold; None scales it to the graph."
    )
    hub_quantile: float = Field(0.999, gt=0.0, lt=1.0)
    hub_min_in_degree: int = Field(100, ge=1)
    popularity_per_tag: int = Field(100, ge=1, description="Accounts kept per interest tag.")
    duckdb_memory_limit: str = Field(
        "1GB", pattern=r"^\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)$",
        description="DuckDB's memory_limit for the dbt build (build_models): beyond it, joins, "
        "aggregates and sorts spill to <run>/warehouse.duckdb.tmp/, so the task's memory is "
        "bounded by this setting, not by the graph.",
    )

    cold_start_account_age_hours: float = Field(24.0, ge=0.0)
    cold_start_min_following: int = Field(5, ge=0)

    # --- the gate (recs.nightly.validation) ---------------------------------------------------
    # Frozen into the run with the caps and weights: a rerun of the gate judges by the same bounds.
    gate_min_list_share: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="Least share of tonight's eligible users (rows of exports/eligible_users, in "
        "the computed shards) that must get a list; below it the gate fails.",
    )
    gate_max_drop: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="Largest fall of users with lists, and of rows, against the version the run "
        "would replace, as a relative change (0.25: at most 25% fewer).",
    )
    gate_max_growth: float = Field(
        3.0,
        ge=0.0,
        le=1_000_000.0,
        allow_inf_nan=False,
        description="Largest rise of users with lists, and of rows, against the version the run "
        "would replace, as a relative change (3.0: up to +300%, i.e. four times as many).",
    )

    # --- retention (recs gc) -------------------------------------------------------------------
    # Excluded from model_dump() like the api_* fields: they configure `recs gc`, not a run.
    run_retention_days: int = Field(
        14,
        exclude=True,
        ge=1,
        description="`recs gc` removes runs/<date>/<run_id>/ once its date, and the last change "
        "in it, are more than this many days old (never the runs of CURRENT and its "
        "predecessor).",
    )
    snapshot_retention_days: int = Field(
        30,
        exclude=True,
        ge=1,
        description="`recs gc` removes snapshots/<date>/ once its date, and the last change "
        "in it, are more than this many days old.",
    )
    published_retention_versions: int = Field(
        7,
        exclude=True,
        ge=2,
        description="`recs gc` keeps this many most recently published versions under "
        "published/ (always CURRENT and its predecessor, the rollback target).",
    )

    # --- the online read path (recs.serving, recs.api, recs.auth) ---------------------------
    # All excluded from model_dump(): they configure the API process, not a run, so they are
    # not frozen into a run's snapshot manifest (and the secret is never written anywhere).
    api_jwt_secret: SecretStr | None = Field(
        None,
        exclude=True,
        description="HMAC secret signing API tokens (RECS_API_JWT_SECRET); no default is "
        "shipped, `recs serve` and `recs token` refuse to run without one. At least 32 bytes "
        "(RFC 7518 §3.2: an HS256 key at least as long as the hash).",
    )
    api_host: str = Field("127.0.0.1", exclude=True, description="Address `recs serve` binds.")
    api_port: int = Field(8000, exclude=True, ge=1, le=65535, description="Port it binds.")
    api_workers: int = Field(1, exclude=True, ge=1, le=64, description="uvicorn processes.")
    api_default_limit: int = Field(20, exclude=True, ge=1, description="Items without ?limit.")
    api_max_limit: int = Field(100, exclude=True, ge=1, le=10_000, description="Largest ?limit.")
    api_reload_interval_seconds: float = Field(
        0.5, exclude=True, gt=0.0, description="How often the API checks CURRENT for a version."
    )
    api_store_timeout_ms: int = Field(
        2000,
        exclude=True,
        ge=0,
        description="Longest wait on the live store, ms: for a pooled connection, a SQLite "
        "lock (busy_timeout), a PostgreSQL statement (statement_timeout) or lock "
        "(lock_timeout); a request gets 503 after twice this if the store does not answer at "
        "all. 0: no bound.",
    )
    api_store_connections: int = Field(
        8,
        exclude=True,
        ge=1,
        le=256,
        description="Live-store connections per API worker process, and the number of its "
        "requests that use the store at once (the rest wait, within the store timeout). With "
        "SQLite one more serves the reads run on the event loop.",
    )
    api_max_connections: int = Field(
        1000,
        exclude=True,
        ge=1,
        description="Open connections (or requests in progress) per worker process before new "
        "requests are answered 503 at once (uvicorn's limit_concurrency).",
    )
    api_keepalive_timeout_seconds: int = Field(
        5, exclude=True, ge=1, description="An idle keep-alive connection is closed after this. "
        "Clients and proxies that reuse connections must give them up sooner (an idle timeout "
        "below this): one reused as the server closes it gets no answer."
    )
    api_max_header_bytes: int = Field(
        16_384,
        exclude=True,
        ge=1024,
        le=1024 * 1024,
        description="Largest request line plus headers, bytes; a larger request is answered 431 "
        "and its connection closed before the rest is read.",
    )
    api_header_timeout_seconds: float = Field(
        10.0,
        exclude=True,
        gt=0.0,
        description="From a connection's opening, or a request's first byte, to the end of its "
        "headers, s; a slower client gets 408 and its connection is closed.",
    )
    api_body_timeout_seconds: float = Field(
        10.0,
        exclude=True,
        gt=0.0,
        description="Longest wait for each chunk of a request body, s; then 408.",
    )
    api_state_dir: Path | None = Field(
        None,
        exclude=True,
        description="Folder the worker processes of one `recs serve` share to agree on the "
        "served version (recs.serving.coordination); `recs serve --workers N>1` makes a fresh "
        "one. Unset: each process on its own.",
    )
    api_version_switch_timeout_seconds: float = Field(
        120.0,
        exclude=True,
        gt=0.0,
        description="How long the workers wait for one that has not loaded a new version "
        "before serving it anyway (that worker then loads it on its next request).",
    )
    api_token_ttl_seconds: int = Field(
        3600,
        exclude=True,
        ge=1,
        le=2_592_000,
        description="Default lifetime of `recs token`s, s; at most 30 days "
        "(recs.auth.MAX_TTL_SECONDS: an HS256 token cannot be revoked but by a new secret).",
    )
    api_max_body_bytes: int = Field(
        16_384,
        exclude=True,
        ge=1,
        le=64 * 1024 * 1024,
        description="Largest request body the API reads, bytes (a dismissal is ~20): a larger "
        "Content-Length, or a chunked body growing past it, is refused with 413 before it is "
        "held in memory.",
    )
    api_metrics_public: bool = Field(
        False,
        exclude=True,
        description="Serve /metrics without a token. Default: it needs a service-role bearer "
        "token (Prometheus `authorization: {credentials_file: ...}`); /healthz and /readyz "
        "are always open.",
    )
    api_cold_start_pool: int = Field(
        10_000,
        exclude=True,
        ge=0,
        description="Most-followed recommendable accounts a version keeps in memory as the "
        "cold-start fallback after the tag and global lists (then the live store is scanned).",
    )

    # --- event ingestion (recs.ingest) -------------------------------------------------------
    # Excluded from model_dump() like the api_* fields: they configure `recs ingest`, not a run.
    ingest_max_future_seconds: float = Field(
        3600.0,
        exclude=True,
        ge=0.0,
        le=315_360_000.0,  # 10 years of 365 days: a finite window (inf cannot be an int of µs)
        allow_inf_nan=False,
        description="An event whose event_time is more than this many seconds after the "
        "ingesting machine's clock is quarantined (RECS_INGEST_MAX_FUTURE_SECONDS; 0 to "
        "315,360,000, i.e. 10 years). Why: last writer wins by event_time per relationship, so "
        "one event from the future (a producer whose clock says 9999) would win over every "
        "later event of its relationship forever. An hour absorbs ordinary clock skew between "
        "producers and this machine.",
    )
    ingest_min_event_time: dt.datetime = Field(
        dt.datetime(2000, 1, 1),
        exclude=True,
        description="Events dated before this (naive UTC; RECS_INGEST_MIN_EVENT_TIME) are "
        "quarantined: the follow service produced none that old, so such a time is an unset "
        "or zeroed clock (1970-01-01, 0001-01-01), not an event to order others by.",
    )

    # --- bulk import (recs.imports) ----------------------------------------------------------
    # Excluded from model_dump() like the ingest_* fields: they configure `recs import`.
    import_batch_rows: int = Field(
        1 << 20,
        exclude=True,
        ge=1024,
        le=1 << 24,
        description="Rows read at a time from a Parquet file or a --from-sql query "
        "(RECS_IMPORT_BATCH_ROWS); CSV/TSV is read 16 MiB of text at a time.",
    )
    import_memory_mb: int = Field(
        1024,
        exclude=True,
        ge=64,
        description="Memory of an import's staging area (DuckDB, RECS_IMPORT_MEMORY_MB), MiB: it "
        "sorts and de-duplicates the rows within this and spills to RECS_HOME/tmp beyond it, "
        "so an import's memory does not grow with its input.",
    )

    # --- quality evaluation (recs.evaluation, `recs evaluate`) --------------------------------
    # Excluded from model_dump() like the api_* fields: they configure an evaluation, not a run.
    eval_holdout_share: float = Field(
        0.1, exclude=True, gt=0.0, lt=1.0,
        description="Share of each test user's follows hidden by the random split.",
    )
    eval_min_follows: int = Field(
        10, exclude=True, ge=2, description="Follows a user needs to be a random split's test user."
    )
    eval_seed: int = Field(
        13, exclude=True, ge=0, lt=2**63, description="Seed of the random split and bootstrap."
    )
    eval_temporal_quantile: float = Field(
        0.8, exclude=True, gt=0.0, lt=1.0,
        description="A temporal split hides the follows made after this quantile of the times.",
    )
    eval_min_test_users: int = Field(
        3000, exclude=True, ge=1, description="A random split is repeated (next seeds) until "
        "the repeats pool this many test users (recs.evaluation.runner.repeats_for).",
    )
    eval_max_repeats: int = Field(
        10, exclude=True, ge=1, le=100, description="Most repeats of a random split.",
    )
    eval_bootstrap_resamples: int = Field(
        2000, exclude=True, ge=100, le=100_000,
        description="Resamples of the paired bootstrap confidence intervals.",
    )

    @field_validator("store_url", "snapshot_store_url")
    @classmethod
    def _a_database_url(cls, value: str | None) -> str | None:
        """A URL SQLAlchemy can open with an installed driver, checked when the settings are
        read (a command's one line, not a driver's traceback at its first query). The URL is
        never echoed: it may hold a password."""
        if value is None or not value.strip():
            return value
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        try:
            url = make_url(normalize_url(value))
        except ArgumentError:
            raise ValueError(
                "not a database URL (e.g. sqlite:////abs/path/live.db or "
                "postgresql://user@host/db)"
            ) from None
        try:
            url.get_dialect().import_dbapi()
        except NoSuchModuleError:
            raise ValueError(f"no SQLAlchemy dialect {url.drivername!r}") from None
        except ImportError as error:
            missing = f"no module {error.name!r}" if error.name else " ".join(str(error).split())
            raise ValueError(
                f"the driver of {url.drivername!r} is not installed ({missing[:200]})"
            ) from None
        return value

    @field_validator("home", "run_cache_dir", "datasets_dir", "api_state_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        """A relative folder (``RECS_HOME`` defaults to ``data``) is taken from the working
        directory once, here: what a command prints or records names it in full. Symbolic
        links are kept (``absolute``, not ``resolve``)."""
        if value is None:
            return None
        try:
            return value.expanduser().absolute()
        except RuntimeError as error:  # "~nosuchuser/x": a ValidationError, one line
            raise ValueError(f"cannot expand {str(value)!r}: {error}") from None

    @field_validator("run_store_url")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        return value.strip() or None if isinstance(value, str) else value

    @field_validator("run_store_options", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):  # the environment's JSON: a bad one is a ValidationError
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError as error:
                raise ValueError(f"not JSON ({error})") from None
        return value

    @field_validator("ingest_min_event_time")
    @classmethod
    def _naive_utc(cls, value: dt.datetime) -> dt.datetime:
        return naive_utc(value)

    @field_validator("api_jwt_secret")
    @classmethod
    def _secret_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().encode()) < 32:
            raise ValueError("must be at least 32 bytes (HS256 key length, RFC 7518 §3.2)")
        return value

    @model_validator(mode="after")
    def _weights_bound_the_score(self) -> Settings:
        if self.mutual_weight + self.activity_weight + self.popularity_weight > 1.0 + 1e-9:
            raise ValueError(
                "mutual_weight + activity_weight + popularity_weight must not exceed 1.0"
            )
        return self

    @property
    def live_store_url(self) -> str:
        """SQLAlchemy URL of the live store (SQLite in WAL mode under ``home`` by default)."""
        return self.store_url or f"sqlite:///{(self.home / 'live.db').resolve()}"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def published_dir(self) -> Path:
        return self.home / "published"

    @property
    def score_max(self) -> float:
        """Upper bound of ``score``: each term is in 0..1 (the mutual term saturates, the hub
        damping is at most 1), so the sum of the weights bounds it."""
        return self.mutual_weight + self.activity_weight + self.popularity_weight


HOW_NOT_WHAT = frozenset({
    "home", "datasets_dir", "duckdb_memory_limit", "graph_partitions_per_task",
    "gate_shards_per_task", "shard_users_target", "shard_count_min", "shard_count_max",
    "snapshot_max_lag_hours",
})  # fmt: skip
"""Frozen settings that say where a run lives, how its tasks are cut or what the freeze may
read, not what the stages after it compute or gate: never named by
``pipeline.settings_not_taken``, left out of a published version's manifest."""

READ_PATH_ONLY = frozenset({
    "fill_short_lists", "cold_start_account_age_hours", "cold_start_min_following",
})  # fmt: skip
"""Frozen settings only the read API uses, with its own process's values (``recs serve``):
no nightly stage takes them, so neither does ``settings_not_taken`` name them, nor does a
published manifest record them as what its lists were computed with (a review)."""

NOT_COMPUTED = HOW_NOT_WHAT | READ_PATH_ONLY
"""The frozen settings no stage after the freeze computes or gates with: one set for
``what_a_run_computes`` and ``pipeline.settings_not_taken``."""


def what_a_run_computes(settings: Settings) -> dict[str, Any]:
    """The settings a run's stages after the freeze compute and gate with, as JSON values
    (``{"ranking": "adamic_adar", "top_k": 20, ...}``): every field a snapshot manifest freezes
    (the ``exclude=True`` ones, connections, the API's, ingestion's, are not) but
    ``HOW_NOT_WHAT`` and ``READ_PATH_ONLY``. A published version's manifest holds them, so a
    reader can tell how its lists were ranked; a hand-kept list of them had left out the
    ranking and its weights."""
    return settings.model_dump(mode="json", exclude=set(NOT_COMPUTED))


def normalize_url(url: str) -> str:
    """PostgreSQL URLs use the psycopg (3) driver, the one in requirements.txt whose pipeline
    mode ``recs.ingest`` relies on: ``postgresql://``, ``postgres://`` and
    ``postgresql+psycopg2://`` become ``postgresql+psycopg://``; other URLs are unchanged."""
    for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment on first call."""
    return Settings()
