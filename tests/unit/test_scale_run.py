"""bench/scale_run.py keeps to its own ``--home``: the caller's store settings are not passed on.

``generate-graph --replace`` drops and reloads the live store its environment names, so a
``RECS_STORE_URL`` left in the caller's shell once replaced another store with the benchmark's
graph (a review's finding: a 5,000-user store held 1,000 users afterwards).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
_spec = importlib.util.spec_from_file_location("scale_run", BENCH / "scale_run.py")
scale_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale_run)


def test_the_store_settings_are_not_inherited(tmp_path):
    """Each store setting is left out, in any case (the settings read the environment without
    regard to case); every other variable is kept, and the home and shard count are its own."""
    environ = {
        "RECS_STORE_URL": "sqlite:////elsewhere/live.db",
        "recs_snapshot_store_url": "sqlite:////elsewhere/standby.db",
        "RECS_RUN_STORE_URL": "s3://bucket/runs",
        "RECS_RUN_STORE_OPTIONS": "{}",
        "RECS_RUN_CACHE_DIR": "/elsewhere/cache",
        "RECS_HOME": "/elsewhere",
        "RECS_HOP2_CAP": "40",
        "PATH": "/usr/bin",
    }
    env, dropped = scale_run.own_environment(environ, tmp_path, 3)
    assert dropped == [
        "RECS_RUN_CACHE_DIR", "RECS_RUN_STORE_OPTIONS", "RECS_RUN_STORE_URL", "RECS_STORE_URL",
        "recs_snapshot_store_url",
    ]  # fmt: skip
    assert env == {
        "RECS_HOME": str(tmp_path),
        "RECS_SHARD_COUNT": "3",
        "RECS_HOP2_CAP": "40",
        "PATH": "/usr/bin",
    }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_store_named_by_the_callers_environment_is_left_alone(tmp_path):
    """A whole tiny benchmark (1,000 users, 2 shards) run with ``RECS_STORE_URL`` naming
    another store: that store's bytes are unchanged, and the benchmark's graph is in its own
    home's ``live.db``. (Seen failing without ``own_environment``: the other store was
    replaced.)"""
    victim_home = tmp_path / "victim"
    env = {**os.environ, "RECS_HOME": str(victim_home)}
    for name in scale_run.NOT_INHERITED:
        env.pop(name, None)
    subprocess.run(
        [sys.executable, "-m", "recs.cli", "generate-graph", "--users", "300", "--seed", "3"],
        env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    victim = victim_home / "live.db"
    before = _sha256(victim)
    home = tmp_path / "bench"
    done = subprocess.run(
        [sys.executable, str(BENCH / "scale_run.py"), "--users", "1000", "--shards", "2",
         "--home", str(home)],
        env={**env, "RECS_STORE_URL": f"sqlite:///{victim}"},
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    # exit 1: a graph this small misses the 50 M-edge and hub checks, by design of the checks
    assert done.returncode == 1, done.stderr[-2000:]
    assert _sha256(victim) == before
    assert f"ignoring RECS_STORE_URL: the benchmark uses only its own store under {home}" in (
        done.stderr
    )
    generated = json.loads((home / "generate-graph.json").read_text())
    assert generated["users"] == 1000
    assert (home / "live.db").is_file()
