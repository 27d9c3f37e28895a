"""docker-compose.yml: every ``RECS_*`` variable it sets is a setting ``recs.config.Settings``
reads (a typo would be silently ignored: ``extra="ignore"``), and the snapshot reads the
standby while everything else uses the primary."""

from __future__ import annotations

from pathlib import Path

import yaml

from recs.config import Settings

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _environments() -> dict[str, dict[str, str]]:
    document = yaml.safe_load(COMPOSE.read_text())
    return {
        name: dict(service.get("environment") or {})
        for name, service in document["services"].items()
    }


def test_every_recs_variable_in_the_compose_file_is_a_setting():
    fields = {f"RECS_{name.upper()}" for name in Settings.model_fields}
    used = {key for env in _environments().values() for key in env if key.startswith("RECS_")}
    assert used, "the compose file sets no RECS_* variable"
    assert sorted(used - fields) == []


def test_the_batch_snapshots_the_standby_and_the_api_uses_the_primary():
    environments = _environments()
    worker, api = environments["airflow-worker"], environments["recs-api"]
    assert "@recs-store/" in worker["RECS_STORE_URL"]
    assert "@recs-store-standby/" in worker["RECS_SNAPSHOT_STORE_URL"]
    assert api["RECS_STORE_URL"] == worker["RECS_STORE_URL"]
    assert "RECS_SNAPSHOT_STORE_URL" not in api
