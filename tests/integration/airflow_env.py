"""The environment the integration tests run Airflow and ``recs`` commands in: a throwaway
``RECS_HOME`` and ``AIRFLOW_HOME`` under ``home``, this repository's DAGs, plugins and dbt
profile, and this interpreter's ``bin`` first on ``PATH`` (as ``make demo`` exports them)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def airflow_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECS_", "AIRFLOW"))}
    env.update(
        RECS_HOME=str(home / "data"),
        AIRFLOW_HOME=str(home / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        DBT_PROFILES_DIR=str(REPO / "dbt_project"),
        PATH=f"{BIN}:{os.environ.get('PATH', '')}",
    )
    return env
