"""Names of the data assets the nightly DAG produces (light: standard library only).

Airflow shows them as data lineage and can schedule downstream DAGs on them
(``schedule=[Asset(PUBLISHED_ASSET_URI)]``). The URIs name the logical dataset, not one run's
folder: the run-scoped path of each update travels in the asset event's extra.
"""

from __future__ import annotations

SNAPSHOT_ASSET_NAME = "recs_follow_graph_snapshot"
SNAPSHOT_ASSET_URI = "recs://follow-graph/snapshot"

PUBLISHED_ASSET_NAME = "recs_who_to_follow_published"
PUBLISHED_ASSET_URI = "recs://who-to-follow/published"

DUCKDB_WRITER_POOL = "recs_duckdb_writer"
"""Airflow pool of one slot: every task that opens a DuckDB file read-write runs alone."""
