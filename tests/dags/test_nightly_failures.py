"""The nightly DAG under failure: trigger rules, and real DAG runs (``dag.test``, in process).

Structure: ``validate_run`` runs once every shard is done (``all_done``) and never retries;
``publish_run`` keeps ``all_success``. Then, on a synthetic graph (2,000 users, 4 shards) whose
night of 2026-11-01 was published by ``run_all``, two DAG runs in this process, where a
monkeypatch can reach the task code:

- 2026-11-02, shard 1's traversal raises on both of its tries: the other shards succeed,
  ``validate_run`` and ``publish_run`` still run and succeed, and the new version carries
  shard 1 over from night_1;
- 2026-11-03, ``build_graph`` finds stale graph pieces: it fails without retries, the shards
  never run, ``validate_run`` runs (all done)
  and fails at once naming build_graph, ``publish_run`` does not run, CURRENT is unchanged.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DAG_ID = "recs_who_to_follow_nightly"


def test_the_gate_runs_past_failed_shards_and_the_publish_does_not(dagbag):
    dag = dagbag.dags[DAG_ID]
    validate = dag.get_task("validate_run")
    assert str(validate.trigger_rule) in ("all_done", "TriggerRule.ALL_DONE")
    assert validate.retries == 0
    assert str(dag.get_task("publish_run").trigger_rule) in (
        "all_success",
        "TriggerRule.ALL_SUCCESS",
    )
    assert dag.get_task("traverse_shard").retries >= 1
    assert sorted(validate.upstream_task_ids) == ["build_graph", "validate_shards"]
    gate = dag.get_task("validate_shards")  # a group of shards each, after every shard, failed too
    assert str(gate.trigger_rule) in ("all_done", "TriggerRule.ALL_DONE")
    assert sorted(gate.upstream_task_ids) == ["plan_gate", "traverse_shard"]


@pytest.fixture(scope="module")
def night_1(tmp_path_factory):
    """RECS_HOME with a synthetic live store and night_1 (2026-11-01) published; the
    session's Airflow metadata DB migrated."""
    from recs.config import Settings
    from recs.demo.synthetic import generate_graph
    from recs.nightly import pipeline

    migrated = subprocess.run(
        [str(BIN / "airflow"), "db", "migrate"],
        env={**os.environ},
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert migrated.returncode == 0, migrated.stdout[-2000:] + migrated.stderr[-2000:]
    home = tmp_path_factory.mktemp("dag-nights") / "home"
    settings = Settings(home=home, shard_count=4)
    generate_graph(2000, 7, settings, avg_out_degree=15)
    pipeline.run_all(home, "2026-11-01", "night_1", settings)
    return home


@pytest.fixture
def nightly(night_1, monkeypatch):
    """A freshly parsed nightly DAG with the environment of ``night_1``'s home."""
    from airflow.dag_processing.dagbag import DagBag

    from recs.config import get_settings

    monkeypatch.setenv("RECS_HOME", str(night_1))
    monkeypatch.setenv("RECS_SHARD_COUNT", "4")
    get_settings.cache_clear()
    yield DagBag(dag_folder=str(REPO / "dags")).dags[DAG_ID]
    get_settings.cache_clear()


def task_tries(dag_run) -> dict[tuple[str, int], int]:
    from airflow.models import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.run_id == dag_run.run_id).one()
        return {
            (ti.task_id, ti.map_index): ti.try_number
            for ti in run.get_task_instances(session=session)
        }


def task_states(dag_run) -> dict[tuple[str, int], str]:
    from airflow.models import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.run_id == dag_run.run_id).one()
        return {
            (ti.task_id, ti.map_index): str(ti.state)
            for ti in run.get_task_instances(session=session)
        }


@pytest.mark.slow
def test_a_failed_mapped_shard_still_lets_validate_and_publish_run(night_1, nightly, monkeypatch):
    import recs.traversal
    from recs.nightly.runs import run_id_from_airflow
    from recs.published import current_version, version_manifest

    real_traverse = recs.traversal.traverse_shard
    tries: list[int] = []

    def traverse(paths, settings, shard_id, **options):
        tries.append(shard_id)
        if shard_id == 1:
            raise RuntimeError("injected traversal failure")
        return real_traverse(paths, settings, shard_id, **options)

    monkeypatch.setattr(recs.traversal, "traverse_shard", traverse)
    shard_task = nightly.get_task("traverse_shard")
    monkeypatch.setattr(shard_task, "retries", 1)
    monkeypatch.setattr(shard_task, "retry_delay", dt.timedelta(0))

    dag_run = nightly.test(logical_date=dt.datetime(2026, 11, 2, tzinfo=dt.UTC))
    states = task_states(dag_run)
    assert tries.count(1) == 2  # the first try and its one retry
    assert states[("traverse_shard", 1)] == "failed"
    assert {states[("traverse_shard", i)] for i in (0, 2, 3)} == {"success"}
    assert states[("validate_run", -1)] == "success"
    assert states[("publish_run", -1)] == "success"

    run_id = run_id_from_airflow(dag_run.run_id)
    published = night_1 / "published"
    assert current_version(published) == run_id
    manifest = version_manifest(published, run_id)
    assert [(s["status"], s["carried_from"]) for s in manifest["shards"]] == [
        ("computed", None),
        ("carried_over", "night_1"),
        ("computed", None),
        ("computed", None),
    ]
    # The published asset event says what was published, carried shards included.
    extra = published_asset_events(dag_run)[-1]
    assert extra["run_id"] == run_id and extra["current"] is True
    assert (extra["users"], extra["rows"]) == (manifest["users"], manifest["rows"])
    assert extra["carried_over"] == [{"shard_id": 1, "carried_from": "night_1"}]
    assert extra["previous"] == "night_1"


def published_asset_events(dag_run) -> list[dict]:
    """The ``extra`` of the published asset's events this DAG run emitted, oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    from recs.assets import PUBLISHED_ASSET_URI

    with create_session() as session:
        events = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.uri == PUBLISHED_ASSET_URI)
            .filter(AssetEvent.source_run_id == dag_run.run_id)
            .order_by(AssetEvent.id)
            .all()
        )
        return [dict(event.extra or {}) for event in events]


@pytest.mark.slow
def test_a_failed_stage_before_the_shards_fails_the_gate_cleanly(
    night_1, nightly, monkeypatch, capfd
):
    from recs.nightly import pipeline
    from recs.published import current_version

    before = current_version(night_1 / "published")

    from recs.traversal.graph_pieces import StalePieceError

    def broken(paths):
        raise StalePieceError("injected: graph pieces of partitions [2] are missing")

    monkeypatch.setattr(pipeline, "assemble_graph", broken)
    assert nightly.get_task("build_graph").retries >= 1  # not for stale pieces: failed at once
    dag_run = nightly.test(logical_date=dt.datetime(2026, 11, 3, tzinfo=dt.UTC))
    states = task_states(dag_run)
    assert states[("build_graph", -1)] == "failed"
    assert task_tries(dag_run)[("build_graph", -1)] == 1
    assert states[("plan_shards", -1)] == "upstream_failed"
    assert states[("validate_run", -1)] == "failed"
    assert states[("publish_run", -1)] == "upstream_failed"
    assert str(dag_run.state) == "failed"
    captured = capfd.readouterr()
    assert "build_graph is failed" in captured.out + captured.err
    assert current_version(night_1 / "published") == before
