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
    # Daily over the previous calendar day in UTC (logical date = interval start = the snapshot
    # date), not a trigger timetable whose logical date is the run time.
    from airflow.sdk import CronDataIntervalTimetable

    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert dag.timetable.expression == "0 0 * * *"
    assert str(dag.timetable.timezone) in ("UTC", "Timezone('UTC')")


def test_the_data_interval_ends_at_the_runs_cut_off(dag):
    """The rule written once (RunPaths.as_of): a run that starts after midnight covers the day
    before; its snapshot date is the interval's start date, its cut-off the interval's end."""
    import pendulum
    from airflow.timetables.interval import CronDataIntervalTimetable  # the scheduler's

    from recs.nightly.runs import RunPaths

    timetable = CronDataIntervalTimetable(dag.timetable.expression, dag.timetable.timezone)
    interval = timetable.infer_manual_data_interval(
        run_after=pendulum.datetime(2026, 11, 2, 0, 30, tz="UTC")
    )
    assert interval.start == pendulum.datetime(2026, 11, 1, tz="UTC")
    paths = RunPaths.create("/tmp/unused", interval.start.date(), None)
    assert paths.as_of == interval.end


def test_task_graph_is_the_designed_flow(dag):
    upstream = {task.task_id: sorted(task.upstream_task_ids) for task in dag.tasks}
    assert upstream == {
        "freeze_snapshot": [],
        "build_models": ["freeze_snapshot"],
        "plan_graph": ["build_models"],
        "cap_graph": ["build_models", "plan_graph"],
        "build_graph": ["build_models", "cap_graph"],
        "plan_shards": ["build_graph"],
        "traverse_shard": ["build_graph", "plan_gate", "plan_shards"],
        "plan_gate": ["build_graph", "plan_shards"],
        "validate_shards": ["plan_gate", "traverse_shard"],
        "validate_run": ["build_graph", "validate_shards"],
        "publish_run": ["validate_run"],
    }


def test_retries_on_data_tasks_none_on_the_gate(dag):
    tasks = {task.task_id: task for task in dag.tasks}
    for task_id in (
        "freeze_snapshot",
        "build_models",
        "plan_graph",
        "cap_graph",
        "build_graph",
        "traverse_shard",
        "validate_shards",
        "publish_run",
    ):
        assert tasks[task_id].retries >= 1, task_id
    assert tasks["validate_run"].retries == 0
    for task_id in ("validate_shards", "validate_run"):  # they judge failed shards too
        assert str(tasks[task_id].trigger_rule) in ("all_done", "TriggerRule.ALL_DONE")
    assert str(tasks["publish_run"].trigger_rule) in ("all_success", "TriggerRule.ALL_SUCCESS")


def test_shard_tasks_are_mapped_with_a_readable_index(dag):
    task = dag.get_task("traverse_shard")
    assert task.map_index_template is not None
    rendered = task.map_index_template.replace("{{ '%03d' % task.op_kwargs['shard_id'] }}", "007")
    assert rendered == "shard-007"


@pytest.mark.parametrize(
    ("task_id", "index"),
    [("validate_shards", "shards-008-015"), ("cap_graph", "partitions-008-015")],
)
def test_group_tasks_are_mapped_over_groups_with_a_readable_index(dag, task_id, index):
    import jinja2

    task = dag.get_task(task_id)
    template = jinja2.Template(task.map_index_template)

    class Task:
        op_kwargs = {"shard_ids": [8, 9, 10, 11, 12, 13, 14, 15]}

    assert template.render(task=Task) == index


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


def test_lineage_runs_from_the_ingested_live_store_to_the_published_table(dagbag):
    """The ingest DAG's outlet is freeze_snapshot's inlet, the snapshot publish_run's inlet:
    Airflow's asset graph links ingest → live store → nightly → snapshot → published. The
    nightly DAG keeps its cron schedule (the ingest DAG updates the store every 5 minutes)."""
    from recs.assets import LIVE_STORE_ASSET_URI, NIGHTLY_DAG_ID, SNAPSHOT_ASSET_URI

    nightly, ingest = dagbag.dags[NIGHTLY_DAG_ID], dagbag.dags["recs_ingest_events"]

    def uris(assets) -> list[str]:
        return [getattr(asset, "uri", None) for asset in assets]

    assert uris(ingest.get_task("ingest_event_files").outlets) == [LIVE_STORE_ASSET_URI]
    assert uris(nightly.get_task("freeze_snapshot").inlets) == [LIVE_STORE_ASSET_URI]
    assert uris(nightly.get_task("publish_run").inlets) == [SNAPSHOT_ASSET_URI]
    assert nightly.timetable.expression == "0 0 * * *"


def _dag_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("nightly_dag_file", DAGS_DIR / f"{DAG_ID}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_invalid_run_id_fails_the_first_task_without_retries(monkeypatch, tmp_path):
    """A run triggered as ``../../x`` (or ``..``, or 70 characters): freeze_snapshot's first
    step raises AirflowFailException (no retry can fix a run id) with the CLI's one-line
    message; Airflow's own ids keep their folder names (``:`` and ``+`` → ``_``)."""
    import datetime as dt
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from recs.config import get_settings

    module = _dag_module()
    monkeypatch.setenv("RECS_HOME", str(tmp_path))
    get_settings.cache_clear()
    logical = dt.datetime(2026, 11, 1, 1, tzinfo=dt.UTC)

    def context_for(run_id):
        dag_run = SimpleNamespace(run_id=run_id, run_after=logical)
        return lambda: {"dag_run": dag_run, "logical_date": logical}

    try:
        for bad in ("../../x", "..", "r" * 70):
            monkeypatch.setattr(module, "get_current_context", context_for(bad))
            with pytest.raises(AirflowFailException) as raised:
                module._run_ref()
            assert str(raised.value).startswith(f"invalid run id {bad!r}"), raised.value
            assert "run ids are 1 to 64 characters" in str(raised.value)
        good = "scheduled__2026-11-01T01:00:00+00:00"
        monkeypatch.setattr(module, "get_current_context", context_for(good))
        assert module._run_ref() == {
            "home": str(tmp_path),
            "snapshot_date": "2026-11-01",
            "run_id": "scheduled__2026-11-01T01_00_00_00_00",
        }
    finally:
        get_settings.cache_clear()


def test_each_task_finds_the_run_under_its_own_home(monkeypatch, tmp_path):
    """(From a review.) The run reference in XCom names the home of the task that made it; a
    task on another worker works under its own ``RECS_HOME``, as the README says, relative
    ones included (from its own working directory), never under the other worker's."""
    from recs.config import get_settings

    module = _dag_module()
    run = {"home": "/elsewhere/m1/data", "snapshot_date": "2026-11-01", "run_id": "night_1"}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RECS_HOME", "data")
    get_settings.cache_clear()
    try:
        paths = module._paths(run)
    finally:
        get_settings.cache_clear()
    assert paths.run_dir == tmp_path / "data" / "runs" / "2026-11-01" / "night_1"


def test_a_manual_run_without_a_logical_date_takes_the_latest_complete_day(monkeypatch, tmp_path):
    """Triggered at 2026-11-02 00:30 or 23:59 UTC with no logical date: the run is of 11-01, the
    day the schedule's run after midnight covers (11-02 is not over: its freeze would be
    refused); a logical date, when given, is the snapshot date as it is."""
    import datetime as dt
    from types import SimpleNamespace

    from recs.config import get_settings

    module = _dag_module()
    monkeypatch.setenv("RECS_HOME", str(tmp_path))
    get_settings.cache_clear()
    try:
        for after in (dt.datetime(2026, 11, 2, 0, 30, tzinfo=dt.UTC),
                      dt.datetime(2026, 11, 2, 23, 59, tzinfo=dt.UTC)):  # fmt: skip
            dag_run = SimpleNamespace(run_id="manual__2026-11-02", run_after=after)
            monkeypatch.setattr(
                module, "get_current_context",
                lambda dag_run=dag_run: {"dag_run": dag_run, "logical_date": None},
            )  # fmt: skip
            assert module._run_ref()["snapshot_date"] == "2026-11-01"
        logical = dt.datetime(2026, 11, 2, 0, 30, tzinfo=dt.UTC)
        monkeypatch.setattr(
            module, "get_current_context",
            lambda: {"dag_run": dag_run, "logical_date": logical},
        )  # fmt: skip
        assert module._run_ref()["snapshot_date"] == "2026-11-02"
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize(("ahead", "retried"), [(30.0, True), (3600.0, False)])
def test_a_cut_off_just_ahead_is_retried_and_one_further_ahead_fails_at_once(
    monkeypatch, tmp_path, ahead, retried
):
    """(From a review.) The scheduled run starts at midnight: a worker clock 30 s behind the
    scheduler's sees its cut-off ahead, and the task fails with its retries (the retry is past
    midnight); a day an hour from its end fails at once (AirflowFailException)."""
    import datetime as dt
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from recs.config import get_settings
    from recs.errors import CutOffAheadError
    from recs.nightly import pipeline

    module = _dag_module()
    monkeypatch.setenv("RECS_HOME", str(tmp_path))
    get_settings.cache_clear()
    logical = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    dag_run = SimpleNamespace(run_id="scheduled__2026-11-01T00:00:00+00:00", run_after=logical)
    monkeypatch.setattr(module, "get_current_context", lambda: {
        "dag_run": dag_run, "logical_date": logical, "params": {}, "outlet_events": {},
    })  # fmt: skip

    def ahead_of_the_clock(*args, **kwargs):
        raise CutOffAheadError("the day 2026-11-01 is not over", seconds_ahead=ahead)

    monkeypatch.setattr(pipeline, "freeze_snapshot", ahead_of_the_clock)
    task = module.recs_who_to_follow_nightly().get_task("freeze_snapshot")
    expected = CutOffAheadError if retried else AirflowFailException
    try:
        with pytest.raises(expected, match="the day 2026-11-01 is not over") as raised:
            task.python_callable()
        assert type(raised.value) is expected
    finally:
        get_settings.cache_clear()


@pytest.mark.parametrize("mismatch", [True, False])
def test_in_degrees_that_do_not_match_fail_build_graph_at_once(monkeypatch, tmp_path, mismatch):
    """In-degrees that do not weigh up to the edges (``InDegreeMismatchError``): no retry mends
    them, so build_graph fails at once with the message; a file that cannot be read
    (``CorruptFileError``, which an I/O error of a network volume becomes too) keeps the
    retries (from a review: an NFS hiccup failed the task for good)."""
    from airflow.sdk.exceptions import AirflowFailException

    from recs.config import get_settings
    from recs.errors import CorruptFileError
    from recs.nightly import pipeline
    from recs.traversal.in_degree_check import InDegreeMismatchError

    module = _dag_module()
    monkeypatch.setenv("RECS_HOME", str(tmp_path))
    get_settings.cache_clear()
    problem = "injected: the in-degrees do not match" if mismatch else "injected: EIO"
    error = InDegreeMismatchError(problem) if mismatch else CorruptFileError(problem)

    def raises(paths):
        raise error

    monkeypatch.setattr(pipeline, "assemble_graph", raises)
    task = module.recs_who_to_follow_nightly().get_task("build_graph")
    assert task.retries >= 1
    run = {"home": str(tmp_path), "snapshot_date": "2026-11-01", "run_id": "manual_1"}
    expected = AirflowFailException if mismatch else CorruptFileError
    try:
        with pytest.raises(expected, match=problem) as raised:
            task.python_callable(run)
        assert type(raised.value) is expected
    finally:
        get_settings.cache_clear()
