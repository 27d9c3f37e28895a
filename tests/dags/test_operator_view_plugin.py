"""The plugin file is as thin as a DAG file: importing it (what the scheduler, DAG processor
and workers do) loads no heavy library, no FastAPI route and not Airflow's security module;
it declares the nav and dag_run views and the /recs app."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "recs_operator_view.py"
HEAVY = ("polars", "duckdb", "dbt", "great_expectations", "pandas", "pyarrow", "numpy", "altair",
         "airflow.api_fastapi.core_api.security", "recs.report", "recs.report.web")  # fmt: skip


def test_importing_the_plugin_loads_nothing_heavy():
    code = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('p', {str(PLUGIN)!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        "plugin = module.RecsOperatorViewPlugin\n"
        "print(json.dumps({'loaded': sorted(m for m in %r if m in sys.modules),\n"
        "  'views': plugin.external_views,\n"
        "  'apps': [a['url_prefix'] for a in plugin.fastapi_apps]}))\n"
        % (HEAVY,)
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, env={**os.environ})  # fmt: skip
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["loaded"] == []
    assert found["apps"] == ["/recs"]
    views = {view["destination"]: view for view in found["views"]}
    assert views["nav"]["href"] == "recs/" and views["nav"]["url_route"] == "who-to-follow"
    assert views["dag_run"]["href"] == "recs/runs/{DAG_ID}/{RUN_ID}"
    assert all(not view["href"].startswith("/") for view in found["views"])
