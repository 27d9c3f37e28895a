"""The ingestion DAG: imports cleanly, parses without heavy libraries, has the designed shape;
and (slow) one real `airflow dags test` run ingests a dropped file and archives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS_DIR = REPO / "dags"
BIN = Path(sys.executable).parent

DAG_ID = "recs_ingest_events"
HEAVY = (
    "polars",
    "duckdb",
    "dbt",
    "great_expectations",
    "pandas",
    "pyarrow",
    "numba",
    "numpy",
    "recs.ingest",
)


@pytest.fixture(scope="module")
def dag(dagbag):
    return dagbag.dags[DAG_ID]


def test_dag_imports_without_errors_and_file_name_is_the_dag_id(dagbag):
    assert dagbag.import_errors == {}
    assert DAG_ID in dagbag.dags
    assert (DAGS_DIR / f"{DAG_ID}.py").exists()


def test_parsing_the_dag_file_loads_no_heavy_library(modules_loaded_by_parsing):
    """Import the DAG file in a fresh interpreter and list what ended up in sys.modules
    (not even recs.ingest: the sensor imports it when it runs)."""
    assert modules_loaded_by_parsing(DAG_ID, HEAVY) == []


def test_polls_every_five_minutes_one_run_at_a_time(dag):
    from airflow.sdk import CronTriggerTimetable

    assert dag.catchup is False
    assert dag.max_active_runs == 1
    assert isinstance(dag.timetable, CronTriggerTimetable)
    assert dag.timetable.expression == "*/5 * * * *"


def test_task_graph_is_sensor_then_ingest(dag):
    upstream = {task.task_id: sorted(task.upstream_task_ids) for task in dag.tasks}
    assert upstream == {
        "wait_for_event_files": [],
        "ingest_event_files": ["wait_for_event_files"],
    }


def test_sensor_waits_without_a_slot_and_gives_up_before_the_next_run(dag):
    sensor = dag.get_task("wait_for_event_files")
    assert sensor.mode == "reschedule"
    assert sensor.soft_fail is True  # no files for a whole interval: skipped, not failed
    assert sensor.timeout < 5 * 60
    assert sensor.poke_interval <= 60


def test_ingest_retries_and_updates_the_live_store_asset(dag):
    ingest = dag.get_task("ingest_event_files")
    assert ingest.retries >= 1  # safe: re-applied events are duplicates
    assert [asset.uri for asset in ingest.outlets] == ["recs://follow-graph/live-store"]


@pytest.mark.slow
def test_a_dropped_file_is_ingested_and_archived_by_a_real_dag_run(tmp_path):
    """`airflow dags test` with one event file in the landing folder: the sensor finds it at
    once, the ingest task applies 3 events (2 users, 1 follow) and moves the file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECS_", "AIRFLOW"))}
    env.update(
        RECS_HOME=str(tmp_path / "data"),
        AIRFLOW_HOME=str(tmp_path / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS_DIR),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        PATH=f"{BIN}:{os.environ.get('PATH', '')}",
    )
    landing = tmp_path / "data" / "landing"
    landing.mkdir(parents=True)
    events = [
        {
            "event_id": "u1",
            "event_type": "user_upsert",
            "event_time": "2026-10-01T00:00:00Z",
            "actor_id": 1,
        },
        {
            "event_id": "u2",
            "event_type": "user_upsert",
            "event_time": "2026-10-01T00:00:00Z",
            "actor_id": 2,
        },
        {
            "event_id": "f",
            "event_type": "follow",
            "event_time": "2026-10-01T00:01:00Z",
            "actor_id": 1,
            "target_id": 2,
        },
    ]
    (landing / "0001.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    for command in (["airflow", "db", "migrate"], ["airflow", "dags", "test", DAG_ID]):
        done = subprocess.run(
            [str(BIN / command[0]), *command[1:]],
            env=env,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (landing / "0001.jsonl").exists()
    assert (landing / "ingested" / "0001.jsonl").exists()
    from recs.config import Settings
    from recs.ingest.reconcile import follow_counts, mutual_follows

    settings = Settings(home=tmp_path / "data")
    assert mutual_follows(settings, 1) == []
    assert follow_counts(settings, 2) == {"follower_count": 1, "following_count": 0}
