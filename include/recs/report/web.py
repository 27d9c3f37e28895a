"""The operator's view as a FastAPI app: pages, their JSON, the run's files, the chart libraries.

``create_app`` is mounted by the Airflow plugin (``plugins/recs_operator_view.py``) under
``/recs`` in Airflow's API server; nothing here imports Airflow. The caller passes in:

- ``authorize_run``: a FastAPI dependency that refuses the request unless its user may read
  runs of the DAG named by the route's ``dag_id`` path parameter (Airflow's
  ``requires_access_dag("GET", DagAccessEntity.RUN)``), and ``authorize_nightly``: the same for
  the nightly DAG, guarding the routes that name no DAG. Every route depends on one of them.
- ``airflow_run``: ``(dag_id, run_id) -> {"run_id", "logical_date", "state",
  "task_instances": [...]} | None``, what Airflow knows of a DAG run (``run_id`` may be the
  folder name ``recs.nightly.runs.run_id_from_airflow`` made of it).

Routes (relative to the mount point): ``/`` versions and runs; ``/runs/{dag_id}/{run_id}``
the run view; ``.../data-docs/{path}`` the run's GX Data Docs; ``.../dbt-docs`` its dbt docs;
``.../files/{name}`` its gate and dbt JSON; ``/api/versions`` and ``/api/runs/{dag_id}/{run_id}``
the same data as JSON; ``/static/{path}`` the stylesheet, script and vendored vega builds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from recs.assets import NIGHTLY_DAG_ID
from recs.errors import InvalidRunIdError, RunNotFoundError
from recs.report import content, pages
from recs.report.versions import versions_report

RUN_FILES = {
    "results.json": Path("validation") / "results.json",
    "summary.json": Path("validation") / "summary.json",
    "run_results.json": content.DBT_RESULTS,
}
AirflowRun = Callable[[str, str], dict[str, Any] | None]


def create_app(
    *,
    authorize_run: Callable[..., Any],
    authorize_nightly: Callable[..., Any],
    home: Callable[[], Path] | None = None,
    airflow_run: AirflowRun | None = None,
    nightly_dag_id: str = NIGHTLY_DAG_ID,
) -> FastAPI:
    """The app (module docstring). ``home`` returns ``RECS_HOME`` (default: the settings'
    ``home``, read per request, so the API server's environment decides)."""

    def recs_home() -> Path:
        if home is not None:
            return Path(home())
        from recs.config import get_settings

        return Path(get_settings().home)

    app = FastAPI(title="recs: the operator's view", docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip
    run_guard = [Depends(authorize_run)]
    nightly_guard = [Depends(authorize_nightly)]

    def located(dag_id: str, run_id: str) -> tuple[Any, dict[str, Any] | None]:
        """The run's paths and Airflow's record of it; 404 for another DAG or no folder."""
        if dag_id != nightly_dag_id:
            raise HTTPException(404, f"{dag_id} is not the nightly DAG ({nightly_dag_id})")
        facts = airflow_run(dag_id, run_id) if airflow_run is not None else None
        logical = (facts or {}).get("logical_date")
        try:
            paths = content.find_run(recs_home(), run_id, logical[:10] if logical else None)
        except (RunNotFoundError, InvalidRunIdError) as error:
            raise HTTPException(404, str(error)) from None
        return paths, facts

    @app.get("/", response_class=HTMLResponse, dependencies=nightly_guard)
    def versions_view() -> HTMLResponse:
        home_dir = recs_home()
        html = pages.versions_page(
            versions_report(home_dir / "published"),
            content.list_runs(home_dir),
            dag_id=nightly_dag_id,
            root="",
            ui="../",
        )
        return HTMLResponse(html)

    @app.get("/api/versions", dependencies=nightly_guard)
    def versions_json() -> JSONResponse:
        home_dir = recs_home()
        return JSONResponse(
            {**versions_report(home_dir / "published"), "runs": content.list_runs(home_dir)}
        )

    @app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=run_guard)
    def run_view(dag_id: str, run_id: str) -> HTMLResponse:
        root = "../../"
        if dag_id != nightly_dag_id:
            message = (f"This view reports on runs of {nightly_dag_id}; {dag_id} runs have no "
                       "run report.")  # fmt: skip
            return HTMLResponse(pages.message_page("No run report", message, root=root))
        try:
            paths, facts = located(dag_id, run_id)
        except HTTPException as error:
            message = (f"{error.detail}. A run that has not frozen its snapshot yet has no "
                       "files to report on.")  # fmt: skip
            return HTMLResponse(pages.message_page("No run report yet", message, root=root), 404)
        report = content.run_report(paths, (facts or {}).get("task_instances"))
        html = pages.run_page(
            report,
            versions_report(paths.home / "published"),
            dag_id=dag_id,
            airflow_run_id=(facts or {}).get("run_id"),
            root=root,
            ui="../../../",
        )
        return HTMLResponse(html)

    @app.get("/api/runs/{dag_id}/{run_id}", dependencies=run_guard)
    def run_json(dag_id: str, run_id: str) -> JSONResponse:
        paths, facts = located(dag_id, run_id)
        report = content.run_report(paths, (facts or {}).get("task_instances"))
        return JSONResponse({**report, "airflow_run_id": (facts or {}).get("run_id")})

    @app.get("/runs/{dag_id}/{run_id}/data-docs/{path:path}", dependencies=run_guard)
    def data_docs(dag_id: str, run_id: str, path: str) -> FileResponse:
        paths, _ = located(dag_id, run_id)
        return _file_under(paths.validation_dir / "data_docs", path or "index.html")

    @app.get("/runs/{dag_id}/{run_id}/dbt-docs", dependencies=run_guard)
    def dbt_docs(dag_id: str, run_id: str) -> FileResponse:
        paths, _ = located(dag_id, run_id)
        return _file_under(paths.run_dir, str(content.DBT_DOCS))

    @app.get("/runs/{dag_id}/{run_id}/files/{name}", dependencies=run_guard)
    def run_file(dag_id: str, run_id: str, name: str) -> FileResponse:
        if name not in RUN_FILES:
            raise HTTPException(404, f"no file {name!r} (one of {', '.join(RUN_FILES)})")
        paths, _ = located(dag_id, run_id)
        return _file_under(paths.run_dir, str(RUN_FILES[name]))

    @app.get("/static/{path:path}", dependencies=nightly_guard)
    def static(path: str) -> FileResponse:
        return _file_under(pages.STATIC_DIR, path)

    return app


def _file_under(folder: Path, relative: str) -> FileResponse:
    """``folder / relative`` if it is a file inside ``folder`` (no ``..`` or link escapes)."""
    root = Path(folder).resolve()
    target = (root / relative).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        raise HTTPException(404, f"not found: {relative}")
    return FileResponse(target)
