"""Backfills of past dates through Airflow: each date's snapshot holds what existed by its cut-off.

The live store (``tests/history_store.py``) has a history up to 2026-11-06. Two past dates are
run by ``airflow dags test`` (Airflow's own task runner, the whole DAG, a throwaway metadata
DB), each triggered with ``{"rebuild_snapshot": true}``: no snapshot of them is retained. By
hand, with cut-off = the date + 1 day, 00:00 UTC:

- 2026-11-01: users 1 2 3 5 6 7; follows 1->2 2->1 1->3 + the four of 5 6 7; no block.
- 2026-11-03: also 3->1 (11-03 00:00) and the block 2->3 (11-03 00:00); 2->3 was created at
  11-04 00:00, the cut-off itself, which belongs to the next day: left out; user 4 (11-05) too.

Both runs publish; user 1's list is [7] in both (1->5->7, 1->6->7). A third date, 2026-10-25,
triggered without the rebuild flag, fails at its first task with the one-line reason, retries
none, and writes no snapshot.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import polars as pl
import pytest
from airflow_env import BIN, REPO, airflow_env
from history_store import add_mutual_friends, build_store

from recs.config import Settings

DAG_ID = "recs_who_to_follow_nightly"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("backfill")
    settings = Settings(home=home / "data")
    build_store(settings)
    add_mutual_friends(settings)
    env = airflow_env(home)
    _airflow(env, "db", "migrate")
    _airflow(env, "pools", "set", "recs_duckdb_writer", "1", "one DuckDB writer")
    return {"home": home, "data": home / "data", "env": env}


def _airflow(env, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [str(BIN / "airflow"), *args], env=env, capture_output=True, text=True, cwd=REPO,
        timeout=1200,
    )  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(
            f"airflow {' '.join(args)}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done


def _states(env, date: str) -> dict[str, str]:
    done = _airflow(env, "tasks", "states-for-dag-run", DAG_ID, date, "-o", "json")
    return {row["task_id"]: row["state"] for row in json.loads(done.stdout)}


def _snapshot(data: Path, date: str) -> tuple[list[int], list[tuple[int, int]], int, dict]:
    (run_dir,) = (data / "runs" / date).iterdir()
    snapshot = run_dir / "snapshot"
    users = pl.read_parquet(snapshot / "users.parquet")["user_id"].sort().to_list()
    edges = pl.read_parquet(snapshot / "follow_edges" / "**" / "*.parquet")
    pairs = sorted(zip(edges["follower_id"], edges["followee_id"], strict=True))
    blocks = pl.read_parquet(snapshot / "blocks.parquet").height
    return users, pairs, blocks, json.loads((snapshot / "manifest.json").read_text())


def test_two_past_dates_each_hold_only_what_existed_by_their_cut_off(airflow_home):
    env, data = airflow_home["env"], airflow_home["data"]
    for date in ("2026-11-01", "2026-11-03"):
        _airflow(env, "dags", "test", DAG_ID, date, "--conf", '{"rebuild_snapshot": true}')
        assert set(_states(env, date).values()) == {"success"}, _states(env, date)
    friends = [(1, 5), (1, 6), (5, 7), (6, 7)]
    users, pairs, blocks, manifest = _snapshot(data, "2026-11-01")
    assert users == [1, 2, 3, 5, 6, 7]
    assert pairs == sorted([(1, 2), (2, 1), (1, 3), *friends])
    assert blocks == 0
    assert manifest["cut_off"] == "2026-11-02T00:00:00+00:00" and manifest["source"]["rebuilt"]
    users, pairs, blocks, manifest = _snapshot(data, "2026-11-03")
    assert users == [1, 2, 3, 5, 6, 7]
    assert pairs == sorted([(1, 2), (2, 1), (1, 3), (3, 1), *friends])
    assert blocks == 1
    assert manifest["cut_off"] == "2026-11-04T00:00:00+00:00"
    for date in ("2026-11-01", "2026-11-03"):
        (run_dir,) = (data / "runs" / date).iterdir()
        published = data / "published" / run_dir.name / "manifest.json"
        assert json.loads(published.read_text())["snapshot_date"] == date
        lists = pl.read_parquet(data / "published" / run_dir.name / "shard_id=*" / "*.parquet")
        assert lists.filter(pl.col("user_id") == 1)["candidate_id"].to_list() == [7]


def test_a_past_date_without_a_retained_snapshot_fails_at_once(airflow_home):
    env, data = airflow_home["env"], airflow_home["data"]
    done = _airflow(env, "dags", "test", DAG_ID, "2026-10-25", check=False)
    states = _states(env, "2026-10-25")
    assert states["freeze_snapshot"] == "failed"
    assert states["build_models"] in ("upstream_failed", None)
    output = done.stdout + done.stderr
    assert "no snapshot of 2026-10-25 is retained" in output
    assert "--rebuild-snapshot" in output
    assert not (data / "snapshots" / "2026-10-25").exists()
    assert not list((data / "runs" / "2026-10-25").glob("*/snapshot"))
