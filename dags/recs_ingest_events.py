"""Ingest upstream relationship events: new files in the landing folder -> the live store.

Every five minutes a sensor looks for event files (JSON Lines or Parquet) in
``<RECS_HOME>/landing/``; as soon as there are some, one task applies them to the live graph
store (``recs.ingest.run.ingest_landing``: idempotent by ``event_id``, last writer wins per
relationship, bad lines quarantined) and moves them to ``landing/ingested/``. The same call is
``recs ingest --landing`` on the command line. Producers must write a file under a hidden name
(``.name``) or another suffix and rename it when complete, so a half-written file is never read.

A declaration only: each task body is one call into ``recs``; top-level imports are
``airflow.sdk``, ``pendulum``, the standard library and ``recs.assets``. The sensor runs in
``reschedule`` mode (no worker slot held while it waits) and gives up quietly (skipped, not
failed) before the next run starts; ``max_active_runs=1`` keeps one ingester at a time.
Retrying the ingest task is safe: events already applied count as duplicates. The live store is
an asset: each ingest records its counts in the asset event, and the nightly DAG's
``freeze_snapshot`` reads it (its inlet).
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import Asset, CronTriggerTimetable, PokeReturnValue, dag, get_current_context, task

from recs.assets import LIVE_STORE_ASSET_NAME, LIVE_STORE_ASSET_URI

LIVE_STORE = Asset(name=LIVE_STORE_ASSET_NAME, uri=LIVE_STORE_ASSET_URI)

POLL_MINUTES = 5


@dag(
    dag_id="recs_ingest_events",
    schedule=CronTriggerTimetable(f"*/{POLL_MINUTES} * * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"owner": "recs"},
    tags=["recs", "ingestion"],
    doc_md=__doc__,
)
def recs_ingest_events():
    @task.sensor(
        poke_interval=30,
        timeout=(POLL_MINUTES - 1) * 60,
        mode="reschedule",
        soft_fail=True,
    )
    def wait_for_event_files() -> PokeReturnValue:
        """Done as soon as the landing folder holds event files; their paths go to XCom."""
        from recs.config import get_settings
        from recs.ingest.run import pending_files

        files = [str(path) for path in pending_files(get_settings())]
        return PokeReturnValue(is_done=bool(files), xcom_value=files)

    @task(outlets=[LIVE_STORE], retries=2, retry_delay=dt.timedelta(minutes=1))
    def ingest_event_files(files: list[str]) -> dict:
        """Apply the files to the live store and archive them; returns the run's counts."""
        from recs.config import get_settings
        from recs.ingest.run import ingest_landing

        result = ingest_landing(get_settings(), files)
        counts = {
            key: result[key]
            for key in ("read", "applied", "duplicates", "superseded", "quarantined", "balanced")
        }
        get_current_context()["outlet_events"][LIVE_STORE].extra = {
            **counts,
            "files": len(result["files"]),
        }
        return counts

    ingest_event_files(wait_for_event_files())


recs_ingest_events()
