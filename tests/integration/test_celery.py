"""The nightly DAG on a real CeleryExecutor with two workers, against ``airflow dags test``.

1. **Reference**: a synthetic graph (``recs generate-graph --users 3000 --seed 7``, relative to
   2026-11-01) in its own home, and ``airflow dags test recs_who_to_follow_nightly 2026-11-01``
   with ``RECS_SHARD_COUNT=4`` (one process, SQLite metadata DB, as ``make demo``). It freezes
   the date's snapshot from the live store and retains it under ``snapshots/2026-11-01/``.
2. **Celery**: a second home holding only a copy of that retained snapshot (no live store, so
   both runs read the same bytes), and ``celery_stack.CeleryStack``: a throwaway Redis, a
   PostgreSQL metadata DB (the session's ``recs.testing.pgserver``), ``airflow db migrate``,
   the API server, scheduler, DAG processor and two Celery workers (``recs-worker-a``,
   ``recs-worker-b``, one task at a time each). The DAG is unpaused and triggered for
   2026-11-01 with the reference's run id: the run id is part of every published row
   (``run_id``), and ``airflow dags test`` names its run after the wall clock, so the reference
   runs first and the Celery run takes its name. The test waits for the run to end, reads the
   task instances from the metadata DB, and stops every process.

Checked: every task succeeded; the four ``traverse_shard`` instances ran on both workers (the
host each task instance records) and nothing ran anywhere else; each published shard file and
export has the same sha256 as the reference's, and the bytes on disk match the manifests; no
process of the stack outlived it. About 5 minutes here (README, "Running it in Airflow").
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid

import pytest
from airflow_env import BIN, airflow_env
from celery_stack import DAG_ID, DUCKDB_POOL, CeleryStack, redis_server_binary, run

from recs.nightly.runs import run_id_from_airflow
from tests.needs import need

DATE = "2026-11-01"
SHARDS = 4
# Two gate tasks and two graph-capping tasks of two shards (partitions) each, so those tasks
# are mapped over groups here too.
RUN_ENV = {
    "RECS_SHARD_COUNT": str(SHARDS),
    "RECS_GATE_SHARDS_PER_TASK": "2",
    "RECS_GRAPH_PARTITIONS_PER_TASK": "2",
}
WORKERS = ("recs-worker-a", "recs-worker-b")
RUN_TIMEOUT = 1200.0  # seconds; the run itself takes about 2 minutes here

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def redis_server() -> str:
    """Debian's redis-server (``make redis-server``); missing: skip, or fail under ``make test``
    (``RECS_REQUIRE_REDIS=1``). Asked first, before the reference run spends minutes."""
    return need(
        redis_server_binary(),
        "no redis-server: `make test` installs Debian's; or set RECS_REDIS_SERVER",
        "RECS_REQUIRE_REDIS",
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``airflow dags test`` of 2026-11-01 on the synthetic graph, in its own home."""
    home = tmp_path_factory.mktemp("dags-test")
    env = {**airflow_env(home), **RUN_ENV}
    run([str(BIN / "recs"), "generate-graph", "--users", "3000", "--seed", "7", "--replace"], env)
    run([str(BIN / "airflow"), "db", "migrate"], env)
    run([str(BIN / "airflow"), "pools", "set", DUCKDB_POOL, "1", "one DuckDB writer"], env)
    run([str(BIN / "airflow"), "dags", "test", DAG_ID, DATE], env, timeout=1800)
    listed = run([str(BIN / "airflow"), "dags", "list-runs", DAG_ID, "-o", "json"], env)
    # stdout may begin with warnings (graphviz missing); the JSON document is the last line
    (dag_run,) = json.loads(listed.stdout.strip().splitlines()[-1])
    assert dag_run["state"] == "success", dag_run
    # Airflow's run id, and the one recs names the run's folders and version after
    return {
        "data": home / "data",
        "airflow_run_id": dag_run["run_id"],
        "run_id": run_id_from_airflow(dag_run["run_id"]),
    }


@pytest.fixture(scope="module")
def celery_run(redis_server, reference, tmp_path_factory, postgres_server):
    """The same date and run id through the Celery stack, over a copy of the retained snapshot;
    every process stopped before the tests look at the result."""
    home = tmp_path_factory.mktemp("celery")
    data = home / "data"
    shutil.copytree(reference["data"] / "snapshots" / DATE, data / "snapshots" / DATE)
    metadata_url = postgres_server.create_database(f"airflow_celery_{uuid.uuid4().hex[:8]}")
    stack = CeleryStack(home, metadata_url, WORKERS, env=RUN_ENV)
    run_id = reference["airflow_run_id"]
    try:
        stack.start()
        stack.airflow("dags", "unpause", DAG_ID)
        stack.airflow(
            "dags", "trigger", DAG_ID, "--logical-date", f"{DATE}T00:00:00+00:00",
            "--run-id", run_id,
        )  # fmt: skip
        state = stack.wait_for_run(run_id, RUN_TIMEOUT)
        task_instances = stack.task_instances(run_id)
        if state != "success":
            pytest.fail(
                f"the Celery run ended {state}: {task_instances}\n{stack.log_tails()}",
                pytrace=False,
            )
    finally:
        leftovers = stack.stop()
    return {
        "data": data,
        "run_id": run_id_from_airflow(run_id),
        "task_instances": task_instances,
        "leftovers": leftovers,
    }


def test_every_task_of_the_celery_run_succeeded_and_published(celery_run):
    states = {(ti["task_id"], ti["map_index"]): ti["state"] for ti in celery_run["task_instances"]}
    assert set(states.values()) == {"success"}, states
    # eight single tasks, a traverse_shard per shard, a validate_shards per group of
    # RECS_GATE_SHARDS_PER_TASK (2) shards and a cap_graph per group of
    # RECS_GRAPH_PARTITIONS_PER_TASK (2) partitions
    assert len(states) == 8 + SHARDS + SHARDS // 2 + SHARDS // 2
    for grouped in ("validate_shards", "cap_graph"):
        indexes = sorted(index for task_id, index in states if task_id == grouped)
        assert indexes == list(range(SHARDS // 2)), grouped
    published = celery_run["data"] / "published"
    assert (published / "CURRENT").read_text().strip() == celery_run["run_id"]
    # The snapshot came from the copied retained one: the live store was never opened.
    assert not (celery_run["data"] / "live.db").exists()


def test_the_shard_tasks_ran_on_both_workers(celery_run):
    shards = [ti for ti in celery_run["task_instances"] if ti["task_id"] == "traverse_shard"]
    assert sorted(ti["map_index"] for ti in shards) == list(range(SHARDS))
    assert {ti["hostname"] for ti in shards} == set(WORKERS), shards
    elsewhere = [ti for ti in celery_run["task_instances"] if ti["hostname"] not in WORKERS]
    assert elsewhere == []


def _published(data, run_id) -> tuple[dict, dict]:
    """``{path: sha256}`` of a version's shard files and exports, from its manifest, and the
    same computed from the files on disk."""
    version = data / "published" / run_id
    manifest = json.loads((version / "manifest.json").read_text())
    listed = {entry["path"]: entry["sha256"] for entry in manifest["shards"] + manifest["exports"]}
    on_disk = {path: hashlib.sha256((version / path).read_bytes()).hexdigest() for path in listed}
    return listed, on_disk


def test_the_published_bytes_equal_the_dags_test_run(reference, celery_run):
    celery_listed, celery_files = _published(celery_run["data"], celery_run["run_id"])
    reference_listed, reference_files = _published(reference["data"], reference["run_id"])
    assert len([path for path in celery_listed if path.startswith("shard_id=")]) == SHARDS
    assert celery_listed == celery_files
    assert reference_listed == reference_files
    assert celery_listed == reference_listed


def test_no_process_of_the_stack_outlived_it(celery_run):
    assert celery_run["leftovers"] == []
