"""Nightly who-to-follow: snapshot → dbt → CSR graph (mapped by partition) → mapped shard
traversal and GX → publish.

A declaration only: every task body is one call into ``recs.nightly.pipeline`` (the functions
the ``recs`` CLI calls, so ``recs shard run`` reproduces a task's output byte for byte). Top-level
imports are ``airflow.sdk``, ``pendulum``, the standard library and light ``recs`` modules; the
heavy libraries (polars, duckdb, dbt, great_expectations) load inside the task processes.

Time (the rule, once; ``recs.nightly.runs.RunPaths.as_of``): one run per day over the calendar
day before it in UTC, the data interval ``[D 00:00, D+1 00:00)``; the run's ``snapshot_date`` is
``D`` (its logical date, in its run id ``scheduled__D...``) and its **cut-off** is the interval's
end, ``D+1 00:00 UTC``: its snapshot holds only what existed by then. A backfill or rerun of ``D``
reuses ``D``'s retained snapshot; when none is retained it fails at once, unless triggered with
``{"rebuild_snapshot": true}`` (param below), which rebuilds it from the live store as of the
cut-off (the README says what that cannot reproduce). A manual run without a logical date takes
the latest complete day, the one before the day it runs after; a run of a day not over yet fails
at once (``CutOffAheadError``): what it froze would be kept as the whole day.

The graph is built by partition: ``plan_graph`` writes the plan (``recs.traversal.graph_pieces``)
and cuts the snapshot's partitions into groups of ``graph_partitions_per_task``, one mapped
``cap_graph`` task each caps its partitions' follows into pieces, and ``build_graph`` assembles
them into the CSR every shard task maps, so each task's memory is its partitions' follows plus
the id map.

The gate is mapped too: ``plan_gate`` makes the groups before the traversal starts, and each
``validate_shards`` task checks a group of shards
(``gate_shards_per_task``, one Great Expectations import for the group) one after another once
every shard is done (``all_done``; a failed shard is recorded as such), so its memory is a
shard's. A shard that still fails after its retries does not stop the night: ``validate_run``
runs once every shard's gate is done (``all_done``), merges their results (validating itself any
shard whose result is missing or stale), adds the run-wide checks over the shards that were
computed, and ``publish_run`` (``all_success``) carries the failed ones over from the version
being replaced. If a stage
before the traversal failed, ``validate_run`` fails at once, saying which.
"""

from __future__ import annotations

import datetime as dt

import pendulum
from airflow.sdk import (
    Asset,
    CronDataIntervalTimetable,
    Param,
    TriggerRule,
    dag,
    get_current_context,
    task,
)

from recs.assets import (
    DUCKDB_WRITER_POOL,
    LIVE_STORE_ASSET_NAME,
    LIVE_STORE_ASSET_URI,
    PUBLISHED_ASSET_NAME,
    PUBLISHED_ASSET_URI,
    SNAPSHOT_ASSET_NAME,
    SNAPSHOT_ASSET_URI,
)

# Lineage (recs.assets): ingest → live store → freeze_snapshot → snapshot → publish_run →
# published. Inlets only: the cron schedule stays (a run per ingest batch is not the design).
LIVE_STORE = Asset(name=LIVE_STORE_ASSET_NAME, uri=LIVE_STORE_ASSET_URI)
SNAPSHOT = Asset(name=SNAPSHOT_ASSET_NAME, uri=SNAPSHOT_ASSET_URI)
PUBLISHED = Asset(name=PUBLISHED_ASSET_NAME, uri=PUBLISHED_ASSET_URI)

DATA_TASK_RETRIES = {"retries": 2, "retry_delay": dt.timedelta(minutes=2)}
CUT_OFF_SKEW_SECONDS = 60
"""A cut-off at most this far ahead of a worker's clock fails freeze_snapshot with its retries
(a clock a little behind the scheduler's at midnight: the retry, 2 minutes later, is past it);
further ahead, at once."""
# A gate task's map index reads "shards-008-015": the first and last shard of its group.
GATE_GROUP_INDEX = (
    "shards-{{ '%03d' % task.op_kwargs['shard_ids'][0] }}-"
    "{{ '%03d' % task.op_kwargs['shard_ids'][-1] }}"
)

# A cap_graph task's map index reads "partitions-000-015".
GRAPH_GROUP_INDEX = GATE_GROUP_INDEX.replace("shards-", "partitions-", 1)

# The stages the gate needs to have succeeded; the shards may have failed (carried over).
BEFORE_TRAVERSAL = ("freeze_snapshot", "build_models", "build_graph", "plan_shards")


def _run_ref() -> dict[str, str]:
    """The run reference every task receives: home, snapshot date and run id (small, XCom-able).

    The run id is Airflow's with ``:``/``+``/``~`` made ``_``
    (``recs.nightly.runs.run_id_from_airflow``); one outside ``RUN_ID_PATTERN`` there fails the
    task at once, without retries."""
    from airflow.sdk.exceptions import AirflowFailException

    from recs.config import get_settings
    from recs.errors import InvalidRunIdError
    from recs.nightly.runs import RunPaths, run_id_from_airflow

    context = get_current_context()
    dag_run = context["dag_run"]
    # no logical date (a manual run): the latest complete day, as the schedule's run would
    logical = context.get("logical_date") or dag_run.run_after - dt.timedelta(days=1)
    try:
        run_id = run_id_from_airflow(dag_run.run_id)
    except InvalidRunIdError as error:
        raise AirflowFailException(str(error)) from None  # no retry can fix a run id
    paths = RunPaths.create(get_settings().home, logical.date(), run_id)
    return {
        "home": str(paths.home),
        "snapshot_date": paths.snapshot_date.isoformat(),
        "run_id": paths.run_id,
    }


def _stages_not_succeeded(task_ids: tuple[str, ...]) -> dict[str, str]:
    """``{task_id: state}`` of the tasks of this DAG run among ``task_ids`` that did not
    succeed (asked of Airflow, not inferred from files a previous attempt may have left)."""
    context = get_current_context()
    ti, dag_run = context["ti"], context["dag_run"]
    states = ti.get_task_states(
        dag_id=dag_run.dag_id, task_ids=list(task_ids), run_ids=[dag_run.run_id]
    ).get(dag_run.run_id, {})
    found = {task_id: str(states.get(task_id)) for task_id in task_ids}
    return {task_id: state for task_id, state in found.items() if state != "success"}


def _paths(run: dict[str, str]):
    """The run's paths under this task's own ``RECS_HOME``: ``run["home"]`` is the home of the
    task that made the reference (shown in XCom), which another worker may not have; a relative
    home is taken from each worker's own working directory too."""
    from recs.config import get_settings
    from recs.nightly.runs import RunPaths

    return RunPaths.create(get_settings().home, run["snapshot_date"], run["run_id"])


@dag(
    dag_id="recs_who_to_follow_nightly",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"owner": "recs"},
    tags=["recs", "who-to-follow"],
    doc_md=__doc__,
    params={
        "rebuild_snapshot": Param(
            False,
            type="boolean",
            description="Past date with no retained snapshot: rebuild it from the live store "
            "as of the cut-off (keeps only rows created by then; cannot restore what was "
            "removed or changed since).",
        )
    },
)
def recs_who_to_follow_nightly():
    @task(inlets=[LIVE_STORE], outlets=[SNAPSHOT], **DATA_TASK_RETRIES)
    def freeze_snapshot() -> dict[str, str]:
        """Consistent, non-blocking read of the live store into the run's snapshot Parquet."""
        from airflow.sdk.configuration import conf
        from airflow.sdk.exceptions import AirflowFailException

        from recs.errors import (
            CutOffAheadError,
            RunIdTakenError,
            ShardPlanError,
            SnapshotNotRetainedError,
        )
        from recs.nightly import pipeline

        run = _run_ref()
        context = get_current_context()
        try:
            result = pipeline.freeze_snapshot(
                _paths(run),
                rebuild=bool(context["params"].get("rebuild_snapshot", False)),
                max_map_length=conf.getint("core", "max_map_length"),
            )
        except CutOffAheadError as error:
            if error.seconds_ahead <= CUT_OFF_SKEW_SECONDS:
                raise  # a worker's clock a little behind the scheduler's: a retry is past it
            raise AirflowFailException(str(error)) from None
        except (SnapshotNotRetainedError, ShardPlanError, RunIdTakenError) as error:
            raise AirflowFailException(str(error)) from None  # no retry can fix them
        context["outlet_events"][SNAPSHOT].extra = {
            "snapshot_dir": str(result.get("snapshot_dir", "")),
            "source": result.get("source"),
            "shard_count": result.get("shard_count"),
            **run,
        }
        return run

    @task(pool=DUCKDB_WRITER_POOL, **DATA_TASK_RETRIES)
    def build_models(run: dict[str, str]) -> dict[str, str]:
        """dbt build on the run's own DuckDB file (the pool keeps it to one writer)."""
        from recs.nightly import pipeline

        pipeline.build_models(_paths(run))
        return run

    @task(**DATA_TASK_RETRIES)
    def plan_graph(run: dict[str, str]) -> list[list[int]]:
        """The graph plan and the groups of snapshot partitions one ``cap_graph`` task caps."""
        from recs.nightly import pipeline

        return pipeline.plan_graph(_paths(run))

    @task(map_index_template=GRAPH_GROUP_INDEX, **DATA_TASK_RETRIES)
    def cap_graph(run: dict[str, str], shard_ids: list[int]) -> dict[str, int]:
        """Each account's first hop2_cap follows, for a group of partitions: their pieces."""
        from recs.nightly import pipeline

        pieces = pipeline.cap_graph(_paths(run), shard_ids)
        return {"partitions": len(pieces), "capped_edges": sum(p["capped_edges"] for p in pieces)}

    @task(**DATA_TASK_RETRIES)
    def build_graph(run: dict[str, str]) -> dict[str, str]:
        """Capped CSR adjacency for the run, assembled from the pieces, memory-mapped read-only
        by every shard task. Run again once it has removed the pieces, it keeps the graph it
        assembled; pieces missing or stale otherwise fail it without retries: only capping them
        again mends that (clear it with its upstream ``cap_graph`` tasks). So do in-degrees that
        do not match the edges (only a new run with ``rebuild_snapshot`` mends that); a file
        that cannot be read keeps the retries (an I/O error of a network volume may pass)."""
        from airflow.sdk.exceptions import AirflowFailException

        from recs.nightly import pipeline
        from recs.traversal.graph_pieces import StalePieceError
        from recs.traversal.in_degree_check import InDegreeMismatchError

        try:
            pipeline.assemble_graph(_paths(run))
        except (StalePieceError, InDegreeMismatchError) as error:
            raise AirflowFailException(str(error)) from None
        return run

    @task
    def plan_shards(run: dict[str, str]) -> list[int]:
        """The shard ids of this run, computed at run time from its frozen settings."""
        from recs.nightly import pipeline

        return pipeline.plan_shards(_paths(run))

    @task
    def plan_gate(run: dict[str, str], shard_ids: list[int]) -> list[list[int]]:
        """The groups of the shards one ``validate_shards`` task each checks."""
        from recs.nightly import pipeline

        return pipeline.gate_groups(_paths(run), shard_ids)

    @task(map_index_template="shard-{{ '%03d' % task.op_kwargs['shard_id'] }}", **DATA_TASK_RETRIES)
    def traverse_shard(run: dict[str, str], shard_id: int) -> dict:
        """Capped two-hop traversal, pruning, scoring and top-k for one shard."""
        from recs.nightly import pipeline

        return pipeline.traverse_shard(_paths(run), shard_id)

    @task(
        map_index_template=GATE_GROUP_INDEX,
        trigger_rule=TriggerRule.ALL_DONE,
        **DATA_TASK_RETRIES,
    )
    def validate_shards(shard_ids: list[int]) -> list[dict]:
        """Great Expectations checks of a group of shards' outputs, each saved for
        ``validate_run``; never fails for what it finds (the verdict is the run's), and records
        a failed shard."""
        from recs.nightly import pipeline

        return pipeline.validate_shards(_paths(_run_ref()), shard_ids)

    @task(retries=0, trigger_rule=TriggerRule.ALL_DONE)
    def validate_run() -> dict[str, str]:
        """Great Expectations gate over the computed shards, run even when shards failed; a
        failure (data, the gate itself, nothing to validate) fails the task, nothing publishes."""
        from airflow.sdk.exceptions import AirflowFailException

        from recs.nightly import pipeline

        run = _run_ref()  # from the context, not XCom: an upstream failure leaves none
        failed = _stages_not_succeeded(BEFORE_TRAVERSAL)
        if failed:
            states = ", ".join(f"{task_id} is {state}" for task_id, state in failed.items())
            raise AirflowFailException(
                f"nothing to validate for run {run['run_id']}: {states}; only failed shards "
                "are carried over, an earlier stage must succeed"
            )
        pipeline.validate_run(_paths(run))
        return run

    @task(inlets=[SNAPSHOT], outlets=[PUBLISHED], **DATA_TASK_RETRIES)
    def publish_run(run: dict[str, str]) -> dict:
        """Write published/<run_id>/ and atomically swap CURRENT to it; the asset event says
        what was published (users, rows, the shards carried over and from which run)."""
        from recs.nightly import pipeline

        result = pipeline.publish_run(_paths(run))
        get_current_context()["outlet_events"][PUBLISHED].extra = {
            **run,
            "version_dir": result["version_dir"],
            "current": result["current"],
            "users": result["users"],
            "rows": result["rows"],
            "shard_count": result["shard_count"],
            "carried_over": result["carried_over"],
            "previous": result["previous"],
        }
        return result

    run = freeze_snapshot()
    modelled = build_models(run)
    graph_groups = plan_graph(modelled)
    capped = cap_graph.partial(run=modelled).expand(shard_ids=graph_groups)
    graph = build_graph(modelled)
    capped >> graph
    shard_ids = plan_shards(graph)
    groups = plan_gate(graph, shard_ids)
    shards = traverse_shard.partial(run=graph).expand(shard_id=shard_ids)
    # the gate's plan first: it fails before the traversal's hours if it must, and the shard
    # tasks are queued when no worker is busy with it (each worker then takes shards)
    groups >> shards
    gated = validate_shards.expand(shard_ids=groups)
    shards >> gated
    validated = validate_run()
    [graph, gated] >> validated
    publish_run(validated)


recs_who_to_follow_nightly()
