"""``recs run``, ``recs shard run``, ``recs summary``, ``recs runs``: the nightly run from a shell.

Every command wraps the same ``recs.nightly.pipeline`` function an Airflow task calls, with the
same run-scoped paths, so ``recs shard run --snapshot-date D --shard 17`` rewrites exactly the
bytes the DAG's ``traverse_shard`` task wrote for shard 17 of that run.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from recs.cli.app import (
    RUN_ID_HELP,
    JsonOpt,
    RunIdOpt,
    SnapshotDate,
    app,
    current_settings,
    emit,
    err,
    out,
    print_mapping,
    progress,
    shard_app,
)


@app.command("run")
def run(
    snapshot_date: SnapshotDate,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help=f"Default cli__<date>; {RUN_ID_HELP}.")
    ] = None,
    rebuild_snapshot: Annotated[
        bool,
        typer.Option(
            "--rebuild-snapshot",
            help="A past date with no retained snapshot: rebuild it from the live store as of "
            "the date's cut-off (keeps rows created by then; cannot restore what was removed or "
            "changed since).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the whole nightly pipeline in this process (the DAG's functions, without Airflow)."""
    from recs.nightly.pipeline import run_all
    from recs.nightly.runs import check_run_id

    if run_id is not None:
        check_run_id(run_id)  # refused, never rewritten: exit 2 before any stage starts
    settings = current_settings()
    result = run_all(
        settings.home,
        snapshot_date,
        run_id,
        settings,
        progress=progress,
        rebuild_snapshot=rebuild_snapshot,
    )

    def render(doc):
        table = Table(title=f"run {doc['run_id']} ({doc['snapshot_date']})")
        table.add_column("stage")
        table.add_column("seconds", justify="right")
        table.add_column("share", justify="right")
        for name, stage in doc["stages"].items():
            share = stage["seconds"] / doc["seconds"] if doc["seconds"] else 0.0
            table.add_row(name, f"{stage['seconds']:.2f}", f"{share:.0%}")
        table.add_row("total", f"{doc['seconds']:.2f}", "100%")
        out.print(table)

    emit(result, as_json, render)


@shard_app.command("run")
def shard_run(
    snapshot_date: SnapshotDate,
    shard: Annotated[int, typer.Option("--shard", help="Shard id, 0..shard_count-1.")],
    run_id: RunIdOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rerun one shard of an existing run: same inputs, same bytes as the Airflow task."""
    from recs.nightly import pipeline
    from recs.nightly.runs import RunPaths

    paths = RunPaths.find(current_settings().home, snapshot_date, run_id)
    result = pipeline.traverse_shard(paths, shard)
    emit(result, as_json, lambda doc: print_mapping(f"shard {shard:03d} of {paths.run_id}", doc))


@app.command("summary")
def summary(snapshot_date: SnapshotDate, run_id: RunIdOpt = None, as_json: JsonOpt = False) -> None:
    """What one run did: snapshot counts, exports, per-shard users, rows, traversals, seconds."""
    from recs.nightly.reporting import run_summary

    paths_doc = run_summary(current_settings().home, snapshot_date, run_id)
    emit(paths_doc, as_json, _render_summary)


@app.command("runs")
def runs(as_json: JsonOpt = False) -> None:
    """Published versions, their shard counts and rows, and which one is current."""
    from recs.published import list_versions

    settings = current_settings()
    versions = list_versions(settings.published_dir)

    def render(doc):
        if not doc["versions"]:
            err.print(
                f"nothing published under {settings.published_dir.resolve()}: run `make demo` "
                "or `recs run`, or set RECS_HOME to your data directory",
                highlight=False,
            )
            return
        table = Table(title="published versions")
        for column in ("current", "run_id", "snapshot_date", "shards", "users", "rows"):
            table.add_column(column, overflow="fold")
        for version in doc["versions"]:
            table.add_row(
                "*" if version.get("is_current") else "",
                str(version.get("run_id")),
                str(version.get("snapshot_date")),
                str(version.get("shard_count")),
                f"{version.get('users', 0):,}",
                f"{version.get('rows', 0):,}",
            )
        out.print(table)

    emit({"versions": versions}, as_json, render)


def _render_summary(doc: dict) -> None:
    print_mapping(f"run {doc['run_id']} ({doc['snapshot_date']})", doc["totals"])
    table = Table(title="shards")
    for column in ("shard", "users_in", "with_recs", "rows", "traversals", "seconds"):
        table.add_column(column, justify="right")
    for shard in doc["shards"]:
        table.add_row(
            f"{shard['shard_id']:03d}",
            f"{shard.get('users_in', 0):,}",
            f"{shard.get('users_with_recommendations', 0):,}",
            f"{shard.get('rows', 0):,}",
            f"{shard.get('traversals', 0):,}",
            f"{shard.get('seconds', 0):.2f}",
        )
    out.print(table)
