"""The nightly run over a PostgreSQL live store publishes the same table as over SQLite.

One synthetic event stream (``recs.demo.event_stream``: 400 users, ~7 k events of every type,
out-of-order delivery, duplicates and a few broken lines) is ingested into a SQLite store and
into a database on a real PostgreSQL server; then the whole nightly pipeline (``run_all``:
snapshot, dbt, CSR graph, traversal, GX gate, publish) runs over each with the same snapshot
date and run id. Ingestion must report the same counts, the snapshots must hold the same bytes
(every Parquet file; only the manifest names a different store) and the published
recommendations must be equal row for row.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from recs.config import Settings
from recs.demo.event_stream import synthetic_events, write_events
from recs.ingest.reconcile import reconcile_counts
from recs.ingest.run import ingest_paths
from recs.nightly import pipeline

pytestmark = pytest.mark.slow

DATE = "2026-11-01"
RUN_ID = "parity"


def files_under(folder: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_postgres_and_sqlite_stores_publish_the_same_recommendations(
    postgres_url, tmp_path, monkeypatch
):
    monkeypatch.setenv("DBT_PROFILES_DIR", str(Path(__file__).resolve().parents[2] / "dbt_project"))
    events = tmp_path / "events.jsonl"
    write_events(
        events,
        synthetic_events(400, 11, avg_out_degree=15, duplicate_share=0.01, malformed_share=0.002),
    )
    stores = {
        "sqlite": None,
        "postgresql": postgres_url,
    }
    results = {}
    for backend, url in stores.items():
        settings = Settings(home=tmp_path / backend, store_url=url, shard_count=4)
        counts = ingest_paths([events], settings)
        assert counts["balanced"] and counts["quarantined"] > 0 and counts["duplicates"] > 0
        assert reconcile_counts(settings)["users_drifted"] == 0
        run = pipeline.run_all(settings.home, DATE, RUN_ID, settings)
        run_dir = settings.home / "runs" / DATE / RUN_ID
        published = pl.read_parquet(
            settings.home / "published" / RUN_ID / "shard_id=*" / "recommendations.parquet",
            hive_partitioning=False,
        ).sort("user_id", "rank")
        results[backend] = {
            "counts": {
                k: v for k, v in counts.items() if k not in ("seconds", "events_per_second")
            },
            "snapshot": files_under(run_dir / "snapshot"),
            "published": published,
            "stages": run["stages"]["publish_run"]["result"],
        }
    sqlite, postgres = results["sqlite"], results["postgresql"]
    assert sqlite["counts"] | {"store": None} == postgres["counts"] | {"store": None}
    snapshot_files = set(sqlite["snapshot"])
    assert snapshot_files == set(postgres["snapshot"])
    differing = {
        name for name in snapshot_files if sqlite["snapshot"][name] != postgres["snapshot"][name]
    }
    assert differing == {"manifest.json"}  # the manifest names the store and its settings
    assert sqlite["published"].height > 1000
    assert sqlite["published"].equals(postgres["published"])
    assert sqlite["stages"]["rows"] == postgres["stages"]["rows"]
