"""Airflow reads its configuration at import time: point it at a throwaway home first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS_DIR = REPO / "dags"

_home = Path(tempfile.mkdtemp(prefix="recs-airflow-test-"))
os.environ.setdefault("AIRFLOW_HOME", str(_home))
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(DAGS_DIR)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"


@pytest.fixture(scope="session")
def dagbag():
    """Every DAG file of dags/, parsed once for the whole test session."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_DIR))


@pytest.fixture(scope="session")
def modules_loaded_by_parsing():
    """A function: import ``dags/<dag_id>.py`` in a fresh interpreter, return which of
    ``modules`` it loaded."""
    return _modules_loaded_by_parsing


def _modules_loaded_by_parsing(dag_id: str, modules: tuple[str, ...]) -> list[str]:
    dag_file = str(DAGS_DIR / f"{dag_id}.py")
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('d', {dag_file!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        f"print(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ},
        cwd=REPO,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])
