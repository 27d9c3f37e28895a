"""``recs ingest`` and ``recs reconcile``: events into the live store, and its counts checked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from recs.cli.app import (
    JsonOpt,
    app,
    current_settings,
    emit,
    err,
    out,
    print_mapping,
    print_whole,
    progress,
)
from recs.errors import RecsError


@app.command("ingest")
def ingest(
    paths: Annotated[
        list[str] | None,
        typer.Argument(help="Event files (.jsonl, .ndjson, .json, .gz, .parquet) or folders."),
    ] = None,
    landing: Annotated[
        bool,
        typer.Option(
            "--landing",
            help="Ingest the landing folder's new files and move them to landing/ingested/ "
            "(what the recs_ingest_events DAG runs).",
        ),
    ] = False,
    batch_events: Annotated[
        int | None, typer.Option("--batch-events", min=1, help="Events per transaction.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Apply follow/unfollow/block/... events to the live store: idempotent by event_id,
    last writer wins per relationship, bad lines quarantined (read = applied + duplicates +
    superseded + quarantined)."""
    from recs.ingest.batch import BATCH_EVENTS
    from recs.ingest.run import ingest_landing, ingest_paths
    from recs.store.connections import sqlite_file

    settings = current_settings()
    if landing == bool(paths):
        raise RecsError("give event files or folders to ingest, or --landing (not both)")
    batch_events = batch_events or BATCH_EVENTS
    new_file = sqlite_file(settings.live_store_url)
    if new_file is not None and Path(new_file).exists():
        new_file = None
    if landing:
        result = ingest_landing(settings, batch_events=batch_events, progress=progress)
    else:
        result = ingest_paths(
            paths or [], settings, batch_events=batch_events, progress=progress
        )

    def render(doc):
        table = Table(title=f"ingested into {doc['store']} in {doc['seconds']:.1f} s")
        for column in ("file", "read", "applied", "duplicates", "superseded", "quarantined"):
            table.add_column(
                column, justify="left" if column == "file" else "right", no_wrap=column == "file"
            )
        for entry in [*doc["files"], {"path": "total", **doc}]:
            table.add_row(
                str(entry["path"]),
                *(
                    f"{entry[key]:,}"
                    for key in ("read", "applied", "duplicates", "superseded", "quarantined")
                ),
            )
        print_whole(table)  # a path whole, also when the output is not a terminal
        if doc["quarantine_reasons"]:
            reasons = ", ".join(f"{k} {v:,}" for k, v in doc["quarantine_reasons"].items())
            err.print(f"quarantined by reason: {reasons} (table quarantined_events)")

    emit(result, as_json, render)
    if new_file is not None:  # e.g. recs run outside the repository: RECS_HOME is relative
        err.print(
            f"note: there was no live store at {Path(new_file).resolve()}: a new one was "
            "created (set RECS_HOME or RECS_STORE_URL to use an existing store)",
            highlight=False,
        )


@app.command("reconcile")
def reconcile(
    repair: Annotated[
        bool, typer.Option("--repair", help="Replace drifted counts with the recomputed ones.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Recompute follower/following counts from the active follows and report drift against
    the maintained counts; exits 1 if drift remains (none, or repaired: 0)."""
    from recs.errors import CountsDriftError
    from recs.ingest.reconcile import reconcile_counts

    report = reconcile_counts(current_settings(), repair=repair)

    def render(doc):
        print_mapping("follow counts", {k: v for k, v in doc.items() if k != "examples"})
        if doc["examples"]:
            table = Table(title="drifted users (first few)")
            for column in doc["examples"][0]:
                table.add_column(column, justify="right")
            for example in doc["examples"]:
                table.add_row(*(f"{value:,}" for value in example.values()))
            out.print(table)

    emit(report, as_json, render)
    if report["users_drifted"] and not report["repaired"]:
        raise CountsDriftError(
            f"follow counts drifted for {report['users_drifted']:,} users: "
            "`recs reconcile --repair` recomputes them from the edges"
        )
