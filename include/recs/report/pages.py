"""HTML pages of the operator's view (Jinja2 templates beside this file, autoescaped).

``versions_page`` (the "Who to follow" page in Airflow's navigation) and ``run_page`` (the
view on one run of the nightly DAG). Each chart is a Vega-Lite spec (``recs.report.charts``)
inlined as JSON and drawn by ``static/report.js`` with the vega, vega-lite and vega-embed
builds served from ``static/vendor/`` (no CDN). ``root`` is the relative path from the page
to the app's root (``""`` or ``"../../"``), so every link works under any mount point;
``ui`` the relative path to Airflow's UI root, for links that leave the plugin
(``target="_top"``: the page is shown inside Airflow's iframe).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

TEMPLATES_DIR = Path(__file__).with_name("templates")
STATIC_DIR = Path(__file__).with_name("static")


@cache
def _environment():
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(num=_number, pct=_percent, secs=_seconds, spec=_spec)
    return environment


def versions_page(
    versions: dict[str, Any], runs: list[dict[str, Any]], *, dag_id: str, root: str, ui: str
) -> str:
    """The navigation page: versions (chart, table with roles and rollback commands), the last
    changes of ``CURRENT`` and the newest runs, each linking to its report."""
    from recs.report import charts

    return _render(
        "versions.html",
        versions=versions,
        runs=runs,
        dag_id=dag_id,
        root=root,
        ui=ui,
        versions_spec=charts.versions_chart(versions["versions"]),
    )


def run_page(
    report: dict[str, Any],
    versions: dict[str, Any],
    *,
    dag_id: str,
    airflow_run_id: str | None,
    root: str,
    ui: str,
) -> str:
    """The run view: every section of ``recs.report.content.run_report`` with its chart."""
    from recs.report import charts

    specs = {
        "stages": charts.stage_chart(report["stages"]),
        "skew": charts.skew_chart(report["shards"], report["skew"]),
        "hubs": charts.hub_chart(report["shards"]),
        "gate": charts.gate_chart(report["gate"]),
        "volume": charts.volume_chart(report["volume"]),
    }
    return _render(
        "run.html",
        report=report,
        versions=versions,
        specs=specs,
        dag_id=dag_id,
        airflow_run_id=airflow_run_id,
        root=root,
        ui=ui,
    )


def message_page(title: str, message: str, *, root: str) -> str:
    """A page that only says something (a run with no files yet, another DAG's run)."""
    return _render("message.html", title=title, message=message, root=root)


def _render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(**context)


def _number(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _percent(value: Any, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _seconds(value: Any) -> str:
    return "–" if value is None else f"{value:,.1f} s"


def _spec(value: Any) -> str:
    """A spec as JSON safe inside ``<script type="application/json">`` (no ``</``)."""
    import markupsafe

    return markupsafe.Markup(json.dumps(value, separators=(",", ":")).replace("</", "<\\/"))
