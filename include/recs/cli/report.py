"""The operator's view from a shell: ``recs report`` (one run's report) and ``recs dbt-docs``.

``recs report`` prints what the Airflow plugin's run view shows (``recs.report.content``):
stages, per-shard status and cost with the skew flag, the gate, hub traffic, dbt's results.
``recs dbt-docs`` generates dbt's docs for a built run (``<run_dir>/dbt/docs/``, with the run's
own ``--vars``) and, with ``--serve``, serves them (``dbt docs serve`` on that folder); without
``--snapshot-date`` it takes the newest run, which is what ``make dbt-docs`` does.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import Annotated

import typer

from recs.assets import NIGHTLY_DAG_ID, REPORT_URL_PREFIX
from recs.cli.app import (
    JsonOpt,
    NewestDateOpt,
    RunIdOpt,
    app,
    chosen_run,
    emit,
    err,
    print_mapping,
)
from recs.errors import RecsError


@app.command("report")
def report(
    snapshot_date: NewestDateOpt = None, run_id: RunIdOpt = None, as_json: JsonOpt = False
) -> None:
    """One run's report: stages, shards (status, cost, skew), the gate, hub traffic, dbt."""
    from recs.report.content import run_report

    paths = chosen_run(snapshot_date, run_id)
    document = run_report(paths)

    def render(doc: dict) -> None:
        gate, skew, run = doc["gate"], doc["skew"], doc["run"]
        statuses = [f"{s['shard_id']:03d} {s['status']}" for s in doc["shards"]]
        stopped = [s["stage"] for s in doc["stages"] if s["state"] == "failed"]
        print_mapping(
            f"run {paths.run_id} ({paths.snapshot_date})",
            {
                **(
                    {"failed stages": ", ".join(stopped) + " (`recs summary` or Airflow: why)"}
                    if stopped
                    else {}
                ),
                "published": "yes, CURRENT" if run["is_current"] else (
                    "yes" if run["published"] else _removed_text(run["removed_since"])
                ),
                "stage seconds": _stage_seconds(doc, paths.run_id),
                "gate": f"{gate['outcome']}: {gate['passed']} of {gate['evaluated']} passed"
                + (" (stale: shards were computed since; `recs validate` judges them)"
                   if gate["stale"] else ""),  # fmt: skip
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


def _removed_text(at: str | None) -> str:
    """"no", or for a version removed since it was published (``removed_since``), the
    summary's words (``reporting.removed_words``)."""
    from recs.nightly.reporting import removed_words

    return removed_words(at) if at else "no"


def _stage_seconds(doc: dict, run_id: str) -> str:
    """Each stage's seconds the report found; for a run without `recs run`'s record, also where
    the others are: Airflow's task records, in the plugin's run view (this command does not
    read Airflow's metadata DB), unless its id is the CLI's own (`cli__<date>`), which Airflow
    never gives. A newcomer read only build_models and traverse_shard after `make demo` and
    took the rest for missing."""
    from recs.nightly.runs import CLI_RUN_ID_PREFIX

    known = ", ".join(
        f"{s['stage']} {s['seconds']:.1f}" for s in doc["stages"] if s["seconds"] is not None
    )
    if doc["files"].get("stage_times") is None and all(
        s["source"] == "files" for s in doc["stages"]
    ):
        where = "recs run records the others in stage_times.json, which this run lacks"
        if not run_id.startswith(CLI_RUN_ID_PREFIX):  # `recs run`'s own id: not Airflow's
            # a run id of its own may be either's (`recs run --run-id`): a newcomer followed
            # the link of a recs run's to a view that had no such run
            where = (
                "if Airflow ran it, its task records hold every stage's: the run view "
                f"{REPORT_URL_PREFIX}/runs/{NIGHTLY_DAG_ID}/{run_id} in Airflow's UI; if recs "
                "run did, it records them in stage_times.json, which this run lacks"
            )
        return f"{known} (from the run's files; {where})" if known else where
    return known or "none recorded"


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
    snapshot_date: NewestDateOpt = None,
    run_id: RunIdOpt = None,
    serve: Annotated[bool, typer.Option("--serve", help="Serve them (dbt docs serve).")] = False,
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, help="Port for --serve.")
    ] = 8081,
    as_json: JsonOpt = False,
) -> None:
    """Generate dbt's docs (lineage from the snapshot sources to the exposures) for a built
    run, into <run_dir>/dbt/docs/; --serve then serves them on --port."""
    from recs.nightly import pipeline

    paths = chosen_run(snapshot_date, run_id)
    if serve:  # before generating (~10 s): a port in use was found only after
        _refuse_port_in_use(port)
    err.print(f"generating dbt docs for run {paths.run_id} ({paths.snapshot_date}) ...")
    result = pipeline.dbt_docs(paths)
    emit(result, as_json, lambda doc: print_mapping(f"dbt docs of {paths.run_id}", doc))
    if serve:
        from dbt.cli.main import dbtRunner

        from recs.nightly.models import DOCS_TARGET, dbt_args
        from recs.nightly.pipeline import run_settings

        err.print(f"serving them on http://localhost:{port}/ (Ctrl-C stops)")
        args = dbt_args("docs serve", paths, run_settings(paths), target=DOCS_TARGET)
        # dbt logs any exception that ends it with its traceback, Ctrl-C and SIGTERM too, and
        # returns it: silenced, then raised as ours (a port in use exited 0 after a traceback);
        # its banner goes to stderr, so --json leaves one document on stdout
        with contextlib.redirect_stdout(sys.stderr):
            outcome = dbtRunner().invoke(
                [*args, "--port", str(port), "--no-browser", "--log-level", "none"]
            )
        _raise_serve_error(outcome.exception, port)


def _refuse_port_in_use(port: int) -> None:
    """``_raise_serve_error``'s line if ``port`` cannot be bound now where ``dbt docs serve``
    binds it (``DBT_HOST``, default 127.0.0.1; without ``SO_REUSEADDR``, as it does)."""
    host = os.environ.get("DBT_HOST") or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # socketserver.TCPServer's
        try:
            probe.bind((host, port))
        except OSError as error:
            _raise_serve_error(error, port)


def _raise_serve_error(error: BaseException | None, port: int) -> None:
    """Re-raise what ended ``dbt docs serve``: an interrupt as it came (``recs: aborted`` or
    ``terminated``); a socket error as one line naming the port (``RecsError``, exit 2);
    anything else as ``RecsError`` too. Nothing when it ended without one."""
    if error is None:
        return
    if isinstance(error, KeyboardInterrupt):
        raise error
    if isinstance(error, OSError):
        raise RecsError(
            f"cannot serve the docs on port {port}: {error.strerror or error} (choose another "
            "with --port)"
        ) from None
    raise RecsError(f"dbt docs serve failed: {' '.join(str(error).split())}") from None
