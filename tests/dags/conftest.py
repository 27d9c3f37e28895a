"""Airflow reads its configuration at import time: point it at a throwaway home first."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAGS_DIR = REPO / "dags"

_home = Path(tempfile.mkdtemp(prefix="recs-airflow-test-"))
os.environ.setdefault("AIRFLOW_HOME", str(_home))
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS_DIR)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
