"""Names of the data assets the DAGs read and produce (light: standard library only).

The lineage Airflow's asset graph shows: ``recs_ingest_events`` updates the live store
(outlet) → ``freeze_snapshot`` reads it (inlet) and produces the snapshot → ``publish_run``
publishes what was computed from it (inlet) as the published table. The nightly DAG keeps its
cron schedule: the ingest DAG updates the store every few minutes, and a run per update is not
the design. Downstream DAGs can be scheduled on the published table
(``schedule=[Asset(PUBLISHED_ASSET_URI)]``). The URIs name the logical dataset, not one run's
folder: the run-scoped path and counts of each update travel in the asset event's extra.
"""

from __future__ import annotations

LIVE_STORE_ASSET_NAME = "recs_live_graph_store"
LIVE_STORE_ASSET_URI = "recs://follow-graph/live-store"

SNAPSHOT_ASSET_NAME = "recs_follow_graph_snapshot"
SNAPSHOT_ASSET_URI = "recs://follow-graph/snapshot"

PUBLISHED_ASSET_NAME = "recs_who_to_follow_published"
PUBLISHED_ASSET_URI = "recs://who-to-follow/published"

NIGHTLY_DAG_ID = "recs_who_to_follow_nightly"
"""The nightly DAG's id (its file ``dags/recs_who_to_follow_nightly.py``), for the UI plugin."""

REPORT_URL_PREFIX = "/recs"
"""Where the UI plugin (``plugins/recs_operator_view.py``) mounts the operator's view in
Airflow's API server; a run's report is at ``{REPORT_URL_PREFIX}/runs/<dag_id>/<run_id>``
(``run_id`` Airflow's, or the run folder's name)."""

DUCKDB_WRITER_POOL = "recs_duckdb_writer"
"""Airflow pool of one slot: every task that opens a DuckDB file read-write runs alone."""
