"""The operator's view from a shell: ``recs report`` (one run's report) and ``recs dbt-docs``.

``recs report`` prints what the Airflow plugin's run view shows (``recs.report.content``):
stages, per-shard status and cost with the skew flag, the gate, hub traffic, dbt's results.
``recs dbt-docs`` generates dbt's docs for a built run (``<run_dir>/dbt/docs/``, with the run's
own ``--vars``) and, with ``--serve``, serves them (``dbt docs serve`` on that folder); without
``--snapshot-date`` it takes the newest run, which is what ``make dbt-docs`` does.
"""

from __future__ import annotations

from typing import Annotated

import typer

from recs.cli.app import JsonOpt, RunIdOpt, app, current_settings, emit, err, print_mapping
from recs.errors import RunNotFoundError


def _run_paths(snapshot_date: str | None, run_id: str | None):
    """The run a report or dbt-docs command is about: the given one; without a date, the run of
    that id with the latest date, or without an id either, the newest run that froze a snapshot
    (``list_runs``' order: the latest date, then the most recently changed)."""
    from recs.nightly.runs import RunPaths, check_run_id
    from recs.report.content import list_runs

    settings = current_settings()
    home = settings.home
    if snapshot_date is None and run_id is not None:
        check_run_id(run_id)  # a glob of safe characters only
        dates = sorted(p.parent.name for p in (home / "runs").glob(f"????-??-??/{run_id}"))
        if not dates and (settings.published_dir / run_id / "manifest.json").is_file():
            raise RunNotFoundError(
                f"no run {run_id} under {home}/runs: its folder is gone (`recs gc` removes "
                f"runs older than RECS_RUN_RETENTION_DAYS), its published version is not: "
                f"`recs runs show {run_id}` shows that"
            )
        if not dates:
            raise RunNotFoundError(
                f"no run {run_id} under {home}/runs (`recs runs` lists the published ones)"
            )
        snapshot_date = dates[-1]
    elif snapshot_date is None:  # the newest that froze its snapshot (a refused run may not)
        newest = [r for r in list_runs(home, limit=50) if _frozen(home, r)]
        if not newest:
            raise RunNotFoundError(
                f"no run under {home}/runs: run `make demo` or `recs run --snapshot-date D` first"
            )
        snapshot_date, run_id = newest[0]["snapshot_date"], newest[0]["run_id"]
    return RunPaths.find(home, snapshot_date, run_id)


def _frozen(home, run: dict) -> bool:
    """Whether a ``list_runs`` entry froze its snapshot (False for a folder not named as a run)."""
    from recs.errors import RecsError
    from recs.nightly.runs import RunPaths

    try:
        paths = RunPaths.create(home, run["snapshot_date"], run["run_id"])
        return paths.snapshot_manifest.is_file()
    except RecsError:
        return False


DateOpt = Annotated[
    str | None,
    typer.Option("--snapshot-date", help="The run's snapshot date, YYYY-MM-DD (default: newest)."),
]


@app.command("report")
def report(
    snapshot_date: DateOpt = None, run_id: RunIdOpt = None, as_json: JsonOpt = False
) -> None:
    """One run's report: stages, shards (status, cost, skew), the gate, hub traffic, dbt."""
    from recs.report.content import run_report

    paths = _run_paths(snapshot_date, run_id)
    document = run_report(paths)

    def render(doc: dict) -> None:
        gate, skew, run = doc["gate"], doc["skew"], doc["run"]
        statuses = [f"{s['shard_id']:03d} {s['status']}" for s in doc["shards"]]
        print_mapping(
            f"run {paths.run_id} ({paths.snapshot_date})",
            {
                "published": "yes, CURRENT" if run["is_current"] else (
                    "yes" if run["published"] else "no"
                ),
                "stage seconds": ", ".join(
                    f"{s['stage']} {s['seconds']:.1f}" for s in doc["stages"]
                    if s["seconds"] is not None
                ) or "none recorded",
                "gate": f"{gate['outcome']}: {gate['passed']} of {gate['evaluated']} passed",
                "checks not passed": ", ".join(_not_passed(gate)) or (
                    "none" if gate["evaluated"] else "none run"
                ),
                "compared with": gate["compared_with"] or (
                    "nothing (skipped)" if gate["outcome"] != "not validated" else "not validated"
                ),
                "shards": ", ".join(statuses) or "none planned",
                "skew (traversals over 2x median)": (
                    ", ".join(f"{i:03d}" for i in skew["flagged"]) or "none"
                ),
                "hub share of traversals": "none recorded"
                if doc["hubs"]["share"] is None
                else f"{doc['hubs']['share']:.1%}",
                "dbt problems": ", ".join(p["unique_id"] for p in doc["dbt"]["problems"]) or "none",
                "Data Docs": doc["files"]["data_docs"] or "not built",
                "dbt docs": doc["files"]["dbt_docs"] or "not generated (recs dbt-docs)",
            },
        )

    emit(document, as_json, render)


def _not_passed(gate: dict) -> list[str]:
    """The gate's failed or errored checks by name (each once, in suite order), with
    ``(errored)`` after those that could not be evaluated."""
    names: dict[str, str] = {}
    for checkpoint in gate["checkpoints"]:
        for item in checkpoint["expectations"]:
            if item["status"] != "passed":
                errored = " (errored)" if item["status"] == "errored" else ""
                names.setdefault(str(item["name"]), f"{item['name']}{errored}")
    return list(names.values())


@app.command("dbt-docs")
def dbt_docs(
    snapshot_date: DateOpt = None,
    run_id: RunIdOpt = None,
    serve: Annotated[bool, typer.Option("--serve", help="Serve them (dbt docs serve).")] = False,
    port: Annotated[int, typer.Option("--port", help="Port for --serve.")] = 8081,
    as_json: JsonOpt = False,
) -> None:
    """Generate dbt's docs (lineage from the snapshot sources to the exposures) for a built
    run, into <run_dir>/dbt/docs/; --serve then serves them on --port."""
    from recs.nightly import pipeline

    paths = _run_paths(snapshot_date, run_id)
    err.print(f"generating dbt docs for run {paths.run_id} ({paths.snapshot_date}) ...")
    result = pipeline.dbt_docs(paths)
    emit(result, as_json, lambda doc: print_mapping(f"dbt docs of {paths.run_id}", doc))
    if serve:
        from dbt.cli.main import dbtRunner

        from recs.nightly.models import DOCS_TARGET, dbt_args
        from recs.nightly.pipeline import run_settings

        err.print(f"serving them on http://localhost:{port}/ (Ctrl-C stops)")
        args = dbt_args("docs serve", paths, run_settings(paths), target=DOCS_TARGET)
        dbtRunner().invoke([*args, "--port", str(port), "--no-browser"])
