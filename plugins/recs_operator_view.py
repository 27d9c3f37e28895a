"""Airflow plugin: the operator's view of who-to-follow inside Airflow's UI (Airflow 3.1+).

- A FastAPI app at ``/recs`` in the API server (``recs.report.web.create_app``): the run
  report, the published versions, each run's Great Expectations Data Docs and dbt docs.
- Two external views the UI shows in an iframe: "Who to follow" in the navigation (``nav``:
  versions, rollback target, runs) and "Run report" on every DAG run (``dag_run``; the UI
  replaces ``{DAG_ID}`` and ``{RUN_ID}``; runs of other DAGs get a one-line note).

Thin, like the DAG files: top-level imports are the standard library, Airflow's plugin class
and ``recs.assets``. The app is built on its first request (``_ReportApp``), inside the API
server, so the scheduler, the DAG processor and the workers, which load plugins too, never
import FastAPI routes, Airflow's security module or the report code. Auth is Airflow's own:
every route depends on ``requires_access_dag("GET", DagAccessEntity.RUN)`` (the DAG named in
the path, or the nightly DAG), which reads the UI's ``_token`` cookie or a bearer token and
refuses anonymous requests (401) and users without access (403).
"""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from recs.assets import NIGHTLY_DAG_ID, REPORT_URL_PREFIX

HREF_ROOT = REPORT_URL_PREFIX.lstrip("/")  # the UI resolves external views' hrefs relatively


class _ReportApp:
    """An ASGI app that builds the real one (``build_app``) when the first request arrives."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope, receive, send) -> None:
        if self._app is None:
            self._app = build_app()
        await self._app(scope, receive, send)


def build_app():
    """``recs.report.web.create_app`` with Airflow's auth dependencies and run records."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    from recs.report.web import create_app

    return create_app(
        authorize_run=requires_access_dag("GET", DagAccessEntity.RUN),
        authorize_nightly=requires_access_dag("GET", DagAccessEntity.RUN, NIGHTLY_DAG_ID),
        airflow_run=airflow_run,
    )


def airflow_run(dag_id: str, run_id: str) -> dict[str, Any] | None:
    """What Airflow's metadata DB holds of a DAG run: ``{"run_id", "logical_date", "state",
    "task_instances": [{"task_id", "map_index", "state", "start_date", "end_date",
    "duration", "try_number"}]}``, or None. ``run_id`` is Airflow's, or the folder name the
    run writes under (``recs.nightly.runs.run_id_from_airflow`` of it)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from recs.errors import InvalidRunIdError
    from recs.nightly.runs import run_id_from_airflow

    def folder_name(airflow_run_id: str) -> str | None:
        try:
            return run_id_from_airflow(airflow_run_id)
        except InvalidRunIdError:
            return None

    with create_session() as session:
        dag_run = session.scalar(
            select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)
        )
        if dag_run is None:  # a link from the versions page names the run's folder
            candidates = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)).all()
            dag_run = next(
                (r for r in candidates if folder_name(r.run_id) == run_id),
                None,
            )
        if dag_run is None:
            return None
        instances = session.scalars(
            select(TaskInstance).where(
                TaskInstance.dag_id == dag_id, TaskInstance.run_id == dag_run.run_id
            )
        ).all()
        return {
            "run_id": dag_run.run_id,
            "logical_date": _iso(dag_run.logical_date),
            "state": str(dag_run.state),
            "task_instances": [
                {
                    "task_id": ti.task_id,
                    "map_index": ti.map_index,
                    "state": str(ti.state) if ti.state is not None else None,
                    "start_date": _iso(ti.start_date),
                    "end_date": _iso(ti.end_date),
                    "duration": ti.duration,
                    "try_number": ti.try_number,
                }
                for ti in instances
            ],
        }


def _iso(moment) -> str | None:
    return moment.isoformat() if moment is not None else None


class RecsOperatorViewPlugin(AirflowPlugin):
    """The run report and the published versions in Airflow's UI."""

    name = "recs_operator_view"
    fastapi_apps = [
        {"app": _ReportApp(), "url_prefix": REPORT_URL_PREFIX, "name": "recs: the operator's view"}
    ]
    external_views = [
        {
            "name": "Who to follow",
            "href": f"{HREF_ROOT}/",
            "destination": "nav",
            "url_route": "who-to-follow",
        },
        {
            "name": "Run report",
            "href": f"{HREF_ROOT}/runs/{{DAG_ID}}/{{RUN_ID}}",
            "destination": "dag_run",
            "url_route": "who-to-follow-run",
        },
    ]
