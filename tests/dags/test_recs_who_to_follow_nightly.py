"""DAG integrity: imports cleanly, parses without heavy libraries, and has the designed shape."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS_DIR = REPO / "dags"

DAG_ID = "recs_who_to_follow_nightly"
HEAVY = ("polars", "duckdb", "dbt", "great_expectations", "pandas", "pyarrow", "numba", "numpy")


@pytest.fixture(scope="module")
def dag(dagbag):
    return dagbag.dags[DAG_ID]


def test_every_dag_file_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert DAG_ID in dagbag.dags


def test_dag_file_name_equals_dag_id():
    assert (DAGS_DIR / f"{DAG_ID}.py").exists()


def test_parsing_the_dag_file_loads_no_heavy_library(modules_loaded_by_parsing):
    """Import the DAG file in a fresh interpreter and list what ended up in sys.modules."""
    loaded = modules_loaded_by_parsing(DAG_ID, HEAVY)
    assert loaded == [], f"DAG parse imported heavy modules: {loaded}"


def test_schedule_and_run_policy(dag):
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    # Daily at 01:00 UTC over the previous day's data interval (logical date = interval start =
    # the snapshot date), not a trigger timetable whose logical date is the run time.
    from airflow.sdk import CronDataIntervalTimetable

    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert dag.timetable.expression == "0 1 * * *"
    assert str(dag.timetable.timezone) in ("UTC", "Timezone('UTC')")


def test_task_graph_is_the_designed_flow(dag):
    upstream = {task.task_id: sorted(task.upstream_task_ids) for task in dag.tasks}
    assert upstream == {
        "freeze_snapshot": [],
        "build_models": ["freeze_snapshot"],
        "build_graph": ["build_models"],
        "plan_shards": ["build_graph"],
        "traverse_shard": ["build_graph", "plan_shards"],
        "validate_run": ["build_graph", "traverse_shard"],
        "publish_run": ["validate_run"],
    }


def test_retries_on_data_tasks_none_on_the_gate(dag):
    tasks = {task.task_id: task for task in dag.tasks}
    for task_id in (
        "freeze_snapshot",
        "build_models",
        "build_graph",
        "traverse_shard",
        "publish_run",
    ):
        assert tasks[task_id].retries >= 1, task_id
    assert tasks["validate_run"].retries == 0
    assert str(tasks["publish_run"].trigger_rule) in ("all_success", "TriggerRule.ALL_SUCCESS")


def test_shard_task_is_mapped_with_a_readable_index(dag):
    task = dag.get_task("traverse_shard")
    assert task.map_index_template is not None
    rendered = task.map_index_template.replace("{{ '%03d' % task.op_kwargs['shard_id'] }}", "007")
    assert rendered == "shard-007"


def test_duckdb_writer_runs_alone(dag):
    from recs.assets import DUCKDB_WRITER_POOL

    assert dag.get_task("build_models").pool == DUCKDB_WRITER_POOL
    assert dag.get_task("traverse_shard").pool != DUCKDB_WRITER_POOL


def test_snapshot_and_published_table_are_assets(dag):
    from recs.assets import PUBLISHED_ASSET_URI, SNAPSHOT_ASSET_URI

    outlets = {
        task.task_id: [getattr(asset, "uri", None) for asset in task.outlets] for task in dag.tasks
    }
    assert outlets["freeze_snapshot"] == [SNAPSHOT_ASSET_URI]
    assert outlets["publish_run"] == [PUBLISHED_ASSET_URI]
