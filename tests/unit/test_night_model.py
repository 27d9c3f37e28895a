"""bench/night_model.py on a measured run made up by hand (each figure worked out below)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "night_model", Path(__file__).resolve().parents[2] / "bench" / "night_model.py"
)
night = importlib.util.module_from_spec(_spec)
sys.modules["night_model"] = night  # dataclasses look their module up
_spec.loader.exec_module(night)

STAGES = [
    {"stage": "generate_graph", "wall_seconds": 99.0, "cpu_seconds": 99.0, "peak_rss_mb": 9.0},
    {"stage": "freeze_snapshot", "wall_seconds": 10.0, "cpu_seconds": 12.0, "peak_rss_mb": 1024},
    {"stage": "build_models", "wall_seconds": 20.0, "cpu_seconds": 30.0, "peak_rss_mb": 2048},
    {"stage": "traverse_shard x 4", "wall_seconds": 8.0, "cpu_seconds": 8.0, "peak_rss_mb": 500},
    {"stage": "validate_run", "wall_seconds": 5.0, "cpu_seconds": 5.0, "peak_rss_mb": 512},
]
# 60 M edges -> x1,000 to 60 B; 5 M accounts -> x100 to 500 M; 1,000 eligible users with 1,000
# traversals and 20 rows each -> 220 M users: 2.2e11 traversals and 4.4e9 rows, x220,000 each.
RUN = {"edges": 60_000_000, "accounts": 5_000_000, "eligible_users": 1000,
       "traversals": 1_000_000, "rows": 20_000}  # fmt: skip


def test_each_stage_scales_by_its_own_quantity():
    costs = {c.stage: c for c in night.night_model(STAGES, shard_peak_mb=500, cores=100, **RUN)}
    assert set(costs) == {"freeze_snapshot", "build_models", "traverse_shard x 4", "validate_run"}
    freeze = costs["freeze_snapshot"]
    assert freeze.unit == "edges" and freeze.night_units / freeze.measured_units == 1000
    assert freeze.wall_hours == pytest.approx(10 * 1000 / 3600)  # 2.78 h in one process
    assert freeze.cpu_hours == pytest.approx(12 * 1000 / 3600)
    assert freeze.peak_gb == pytest.approx(1000.0)  # 1 GB x 1,000
    models = costs["build_models"]  # the dbt build reads the users-sized tables, not the edges
    assert models.unit == "accounts" and models.night_units / models.measured_units == 100
    assert models.wall_hours == pytest.approx(20 * 100 / 3600)  # 0.56 h in one process
    assert models.peak_gb == pytest.approx(200.0)  # 2 GB x 100
    shards = costs["traverse_shard x 4"]
    assert shards.spread and shards.night_units == pytest.approx(2.2e11)
    assert shards.cpu_hours == pytest.approx(8 * 220_000 / 3600)  # 488.9 core-hours
    assert shards.wall_hours == pytest.approx(8 * 220_000 / 3600 / 100)  # over 100 cores
    assert shards.peak_gb == pytest.approx(500 / 1024)  # a shard task does not grow
    validate = costs["validate_run"]
    assert validate.unit == "rows" and validate.wall_hours == pytest.approx(5 * 220_000 / 3600)


def test_the_window_is_missed_when_one_process_stages_take_it():
    costs = night.night_model(STAGES, shard_peak_mb=500, cores=100, **RUN)
    assert night.cores_for_window(costs) is None  # 2.8 + 0.6 + 305.6 h before any shard
    lines = night.render(costs, 100, 24)
    assert "does not fit the window" in lines[-1] and "build_models" not in lines[-1]
    assert "validate_run would need 110,000 GB" in lines[-1]  # 0.5 GB x 220,000


def test_cores_for_the_window_when_it_fits():
    stages = [dict(STAGES[1], wall_seconds=3.6), STAGES[3]]  # freeze: 3.6 s x 1,000 = 1 h
    costs = night.night_model(stages, shard_peak_mb=500, cores=100, **RUN)
    assert night.cores_for_window(costs) == pytest.approx(8 * 220_000 / 3600 / 3)  # 163 cores
    assert night.render(costs, 100, 24)[-1] == "  -> fits the window with 163 cores for the shards"


def test_a_run_without_output_cannot_be_scaled():
    with pytest.raises(ValueError):
        night.night_model(STAGES, shard_peak_mb=1, cores=1, **{**RUN, "rows": 0})


def test_the_mapped_gate_is_spread_and_keeps_one_tasks_memory():
    """validate_shards x 4 (2 CPU s, 300 MB per task) grows with rows (x220,000) like
    validate_run, but is spread over the 100 cores and its peak is one task's."""
    stages = [*STAGES, {"stage": "validate_shards x 4", "wall_seconds": 2.5, "cpu_seconds": 2.0,
                        "peak_rss_mb": 300}]  # fmt: skip
    gate = next(c for c in night.night_model(stages, shard_peak_mb=500, cores=100, **RUN)
                if c.stage == "validate_shards x 4")  # fmt: skip
    assert gate.spread and gate.unit == "rows"
    assert gate.cpu_hours == pytest.approx(2 * 220_000 / 3600)  # 122.2 core-hours
    assert gate.wall_hours == pytest.approx(2 * 220_000 / 3600 / 100)
    assert gate.peak_gb == pytest.approx(300 / 1024)
