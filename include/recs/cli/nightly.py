"""The nightly run from a shell: ``recs run``, ``shard run``, ``validate``, ``publish``,
``summary``, ``runs`` (and ``runs show``), ``rollback`` and ``gc``.

Every command wraps the same ``recs.nightly`` function an Airflow task calls, with the same
run-scoped paths, so ``recs shard run --snapshot-date D --shard 17`` rewrites exactly the
bytes the DAG's ``traverse_shard`` task wrote for shard 17 of that run, and ``recs validate``
/ ``recs publish`` are the DAG's ``validate_run`` / ``publish_run`` (after a fix, e.g. a shard
rerun). The gate's outcomes exit with their own codes (``recs.errors``).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from recs.cli.app import (
    RUN_ID_HELP,
    JsonOpt,
    NewestDateOpt,
    RunIdOpt,
    SnapshotDate,
    app,
    chosen_run,
    current_settings,
    emit,
    err,
    note_other_runs,
    out,
    print_mapping,
    print_whole,
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
            help="Make the date's snapshot again from the live store as of its cut-off, "
            "replacing any retained one. For a past date with no retained snapshot, a damaged "
            "one no run store holds, or a store whose lost rows were restored. Keeps the rows "
            "created by the cut-off; cannot restore what was removed or changed since.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the whole nightly pipeline in this process (the DAG's functions, without Airflow)."""
    from recs.nightly.pipeline import run_all
    from recs.nightly.runs import check_run_id
    from recs.nightly.switch import interrupted_switch

    if run_id is not None:
        check_run_id(run_id)  # refused, never rewritten: exit 2 before any stage starts
    settings = current_settings()
    with interrupted_switch(settings.published_dir):
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
        rebuilt = _rebuilt_note(doc["stages"]["freeze_snapshot"]["result"])
        if rebuilt:
            out.print(rebuilt, highlight=False, soft_wrap=True)
        out.print(_run_outcome(doc), highlight=False, soft_wrap=True)

    emit(result, as_json, render)
    _report_carry_over(result["stages"]["publish_run"]["result"])


def _compared_with(compared: str | None, run_id: str, nothing: str = "nothing (skipped)") -> str:
    """The version a gate compared with, for people (``nothing`` when it compared with none): a
    rerun of a published run id compared with its own earlier publication (a newcomer read the
    run compared with itself)."""
    if not compared:
        return nothing
    if compared == run_id:
        return f"{compared} (its own earlier publication, which this one replaced)"
    return compared


def _rebuilt_note(frozen: dict) -> str | None:
    """For a run that rebuilt its snapshot (``--rebuild-snapshot``), one line saying so and what
    the cut-off left out (from the snapshot manifest); a newcomer's rebuild said nothing."""
    if frozen.get("source") != "rebuilt":
        return None
    from recs.files import read_json

    left_out = read_json(Path(frozen["manifest"])).get("excluded_after_cut_off") or {}
    rows = ", ".join(f"{table} {count:,}" for table, count in left_out.items() if count)
    return (
        "the snapshot was rebuilt from the live store as of its cut-off, replacing the date's "
        f"retained one; left out as created after it: {rows or 'nothing'}"
    )


def _run_outcome(doc: dict) -> str:
    """How a finished ``recs run`` ended, in one line: what was published, what ``CURRENT``
    names now and what the gate compared with (``run_all``'s publish and gate results)."""
    published = doc["stages"]["publish_run"]["result"]
    gate = doc["stages"]["validate_run"]["result"]
    skipped = [item.get("reason") for item in gate.get("skipped") or [] if item.get("reason")]
    nothing = f"nothing ({skipped[0] if skipped else 'skipped'})"
    compared = _compared_with(gate.get("compared_with"), doc["run_id"], nothing)
    figures = f"{published['users']:,} users with lists, {published['rows']:,} rows"
    if published["current"]:
        where = f"CURRENT now names it (was {published['previous'] or 'none'})"
    else:
        # the publish's warning above gave the way to serve it: said once (from a newcomer)
        where = f"CURRENT stays on {published['previous']}, a later snapshot"
    return f"published {doc['run_id']}: {figures}; {where}; the gate compared with {compared}"


def _report_carry_over(published: dict) -> None:
    for item in published.get("carried_over", []):
        err.print(
            f"shard {item['shard_id']:03d} failed: its users keep the lists computed in "
            f"{item['carried_from']} (carried over)",
            highlight=False,
        )


@shard_app.command("run")
def shard_run(
    snapshot_date: SnapshotDate,
    shard: Annotated[int, typer.Option("--shard", help="Shard id, 0..shard_count-1.")],
    run_id: RunIdOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rerun one shard of an existing run: same inputs, same bytes as the Airflow task."""
    from recs.nightly import pipeline
    from recs.nightly.artifacts import find_run

    paths = find_run(current_settings().home, snapshot_date, run_id)
    note_other_runs(paths, run_id)
    _warn_frozen(paths)
    result = pipeline.traverse_shard(paths, shard)
    emit(result, as_json, lambda doc: print_mapping(f"shard {shard:03d} of {paths.run_id}", doc))


@app.command("summary")
def summary(
    snapshot_date: NewestDateOpt = None, run_id: RunIdOpt = None, as_json: JsonOpt = False
) -> None:
    """What one run did: snapshot counts, shards computed, eligible users, users with lists,
    rows, traversals and seconds (per shard too), the gate's outcome, whether it is served,
    and whether another process is working on it now."""
    from recs.nightly.reporting import run_summary

    paths = chosen_run(snapshot_date, run_id)
    paths_doc = run_summary(paths.home, paths.snapshot_date, paths.run_id)
    emit(paths_doc, as_json, _render_summary)


@app.command("validate")
def validate(
    snapshot_date: SnapshotDate, run_id: RunIdOpt = None, as_json: JsonOpt = False
) -> None:
    """Run the gate on an existing run (the DAG's validate_run): exit 3 if the data failed, 4 if
    the gate itself errored, 5 if there was nothing to validate."""
    from recs.nightly import pipeline
    from recs.nightly.artifacts import find_run

    paths = find_run(current_settings().home, snapshot_date, run_id)
    note_other_runs(paths, run_id)
    _warn_frozen(paths)
    result = pipeline.validate_run(paths)
    _warn_not_computed(result["failed_shards"], "a publish carries them over from CURRENT")
    shown = {k: v for k, v in result.items() if k not in ("skipped",)}
    shown["skipped"] = ", ".join(item["name"] for item in result["skipped"]) or "none"
    emit(result, as_json, lambda doc: print_mapping(f"gate of {paths.run_id}: passed", shown))


@app.command("publish")
def publish(snapshot_date: SnapshotDate, run_id: RunIdOpt = None, as_json: JsonOpt = False) -> None:
    """Publish a validated run (the DAG's publish_run): failed shards are carried over from
    the version CURRENT names."""
    from recs.nightly import pipeline
    from recs.nightly.artifacts import find_run
    from recs.nightly.switch import interrupted_switch

    settings = current_settings()
    paths = find_run(settings.home, snapshot_date, run_id)
    note_other_runs(paths, run_id)
    _warn_frozen(paths)
    with interrupted_switch(settings.published_dir):
        result = pipeline.publish_run(paths)
    _warn_not_computed(
        [entry["shard_id"] for entry in result["carried_over"]], "carried over from CURRENT"
    )
    shown = {key: value for key, value in result.items() if key not in ("previous", "replaced")}
    shown["carried_over"] = _carried_text(result["carried_over"])
    shown["CURRENT before"] = result["previous"] or "none"
    shown["this version"] = _PUBLISHED_AS[result["replaced"]]
    emit(result, as_json, lambda doc: print_mapping(f"published {paths.run_id}", shown))


def _warn_frozen(paths) -> None:
    """One stderr line naming the ``RECS_*`` settings this environment sets that the run does
    not take (``pipeline.settings_not_taken``): a run computes and is gated with the settings
    frozen at its snapshot."""
    from recs.nightly.pipeline import settings_not_taken

    ignored = settings_not_taken(paths, current_settings())
    if ignored:
        named = ", ".join(
            f"RECS_{name.upper()}={given} (the run's: {taken})"
            for name, (given, taken) in ignored.items()
        )
        err.print(
            f"recs: warning: not taken by run {paths.run_id}, which keeps the settings frozen at "
            f"its snapshot: {named}; a new run takes them",
            highlight=False,
            soft_wrap=True,
        )


def _warn_not_computed(shard_ids: list[int], fate: str) -> None:
    """One stderr line when shards have no output (failed, or never run: a ``recs run``
    stopped by Ctrl-C), with the way to compute them (a newcomer validated and published such
    a run, and half its users got the day before's lists without a word)."""
    if shard_ids:
        named = ", ".join(f"{shard_id:03d}" for shard_id in shard_ids)
        err.print(
            f"recs: warning: shards {named} have no output of this run (failed, or never run): "
            f"{fate}; `recs shard run --shard N` computes one first",
            highlight=False,
            soft_wrap=True,
        )


_PUBLISHED_AS = {
    "new": "new",
    "unchanged": "published again, the same files",
    # the manifest holds the verdict: a gate run again changes it, shard bytes the same or not
    # (a newcomer read "files replaced" after a byte-identical shard rerun)
    "replaced": "published again, replacing the version (its manifest or files differ: a new "
    "verdict, a shard rerun)",
}
"""The human words of ``publish_run``'s ``replaced`` (``--json`` keeps the key's value)."""


@app.command("rollback")
def rollback(
    to: Annotated[
        str | None,
        typer.Option(
            "--to", help="Version to serve (default: the one CURRENT replaced when published)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Point CURRENT back at an earlier complete, validated version, atomically."""
    from recs.nightly.publish import rollback as _rollback
    from recs.nightly.switch import interrupted_switch

    settings = current_settings()
    with interrupted_switch(settings.published_dir):
        result = _rollback(settings, to)

    def render(doc):
        if doc["changed"]:
            was = doc["previous"] or "none"  # (a CURRENT that named no version, mended)
            out.print(f"CURRENT: {doc['run_id']} (was {was})", highlight=False)
        else:
            out.print(f"CURRENT already names {doc['run_id']}", highlight=False)

    emit(result, as_json, render)


@app.command("gc")
def gc(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")
    ] = False,
    today: Annotated[
        str | None,
        typer.Option(
            "--today",
            help="Count ages from this date, YYYY-MM-DD (default: today UTC); a later one only "
            "with --dry-run.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove old runs, snapshots and published versions by the retention settings
    (RECS_RUN_RETENTION_DAYS, RECS_SNAPSHOT_RETENTION_DAYS, RECS_PUBLISHED_RETENTION_VERSIONS);
    never CURRENT or its predecessor."""
    from recs.errors import InvalidDateError
    from recs.nightly.retention import collect_garbage
    from recs.nightly.runs import parse_snapshot_date

    day = parse_snapshot_date(today, "--today date") if today is not None else None
    now = dt.datetime.now(dt.UTC).date()
    if day is not None and day > now and not dry_run:
        # a mistyped year would count every folder old: runs and snapshots gone before their time
        raise InvalidDateError(
            f"invalid --today date {today!r}: later than today ({now.isoformat()} UTC), so "
            "folders would be removed before their retention; give today or an earlier date, "
            "or add --dry-run to see what a later day would remove"
        )
    settings = current_settings()
    longest = max(settings.run_retention_days, settings.snapshot_retention_days)
    try:
        if day is not None:  # counted back by the retentions: 0001-01-05 has no 14 days before
            day - dt.timedelta(days=longest)
    except OverflowError:
        raise InvalidDateError(
            f"invalid --today date {today!r}: too early to count the retention days back from"
        ) from None
    result = collect_garbage(settings, day, dry_run=dry_run)

    def render(doc):
        verb = "would remove" if doc["dry_run"] else "removed"
        lines = [
            f"{verb} {kind}/{name}" for kind, names in doc["removed"].items() for name in names
        ]
        for line in lines:
            out.print(line, highlight=False)
        kept = ", ".join(f"{k} {v}" for k, v in doc["kept"].items() if v) or _nothing_kept(
            settings
        )
        err.print(
            f"{verb} {len(lines)} folder(s), ages counted from {doc['today']}; kept {kept}",
            highlight=False,
        )

    emit(result, as_json, render)
    if result.get("run_store_error"):  # the local retention is done; the store's is not
        from recs.errors import RunStoreError

        raise RunStoreError(result["run_store_error"])


def _nothing_kept(settings) -> str:
    """What ``recs gc`` kept when no version is published here: a home without ``published/``
    is a mistyped RECS_HOME (surely so when the home itself is missing), or a worker of a run
    store (a newcomer's worker was asked whether its RECS_HOME was right), whose versions the
    publishing machine's gc prunes."""
    where = settings.published_dir.resolve()
    if settings.published_dir.is_dir():
        return "nothing published"
    if settings.run_store_url and settings.home.is_dir():
        return (
            f"nothing published on this machine (no {where}): the versions are pruned by "
            "`recs gc` where published/ is"
        )
    return f"nothing published: no {where} (is RECS_HOME right?)"


runs_app = typer.Typer(
    help="Published versions, their shards (computed or carried over) and which is current.",
    invoke_without_command=True,
)
app.add_typer(runs_app, name="runs")


@runs_app.callback()
def runs(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Published versions, their shard counts, rows, carried-over shards, which one is current."""
    if ctx.invoked_subcommand is not None:
        # `recs runs --json show ID` as `recs runs show --json ID` (a newcomer's --json went
        # unheeded there)
        ctx.ensure_object(dict)["json"] = as_json
        return
    from recs.published import list_versions

    settings = current_settings()
    versions = list_versions(settings.published_dir)
    problem = _current_problem(settings.published_dir, versions)
    if problem:
        err.print(f"recs: warning: {problem}", highlight=False, soft_wrap=True)

    def render(doc):
        if not doc["versions"]:
            err.print(
                f"nothing published under {settings.published_dir.resolve()}: run `make demo` "
                "or `recs run`, or set RECS_HOME to your data directory",
                highlight=False,
            )
            return
        table = Table(title="published versions")
        for column in (
            "current",
            "run_id",
            "snapshot_date",
            "shards",
            "users",
            "rows",
            "carried over (from)",
        ):
            # one line each but the carried-over list, which wraps at its spaces
            table.add_column(column, no_wrap=column != "carried over (from)")
        for version in doc["versions"]:
            table.add_row(
                "*" if version.get("is_current") else "",
                str(version.get("run_id")),
                str(version.get("snapshot_date")),
                str(version.get("shard_count")),
                f"{version.get('users', 0):,}",
                f"{version.get('rows', 0):,}",
                _carried_text(version.get("carried_over", [])),
            )
        print_whole(table)

    emit({"versions": versions, "current_problem": problem}, as_json, render)


def _current_text(is_current: bool, current: str | None, problem: str | None) -> str:
    """``runs show``'s "current" line: yes, or what ``CURRENT`` names instead."""
    if is_current:
        return "yes"
    if problem:
        return "no (CURRENT unusable: see the warning above)"
    return f"no (CURRENT: {current})" if current else "no (nothing is current)"


def _current_problem(published_dir, versions: list[dict]) -> str | None:
    """What is wrong with ``CURRENT``: it names no version (damaged from outside:
    ``published.current_version``'s error), one that is not published, or one whose files are
    not all there (``published.check_version``); None when it is sound or absent (nothing
    published)."""
    from recs.errors import CorruptFileError, RunNotFoundError
    from recs.published import CURRENT_FILE, check_version, current_version

    try:
        name = current_version(published_dir)
    except CorruptFileError as damaged:
        return str(damaged)
    if name is None:
        return None
    if any(v["run_id"] == name for v in versions):
        try:
            check_version(published_dir, name)  # every file there, of the manifest's size
        except RunNotFoundError as incomplete:
            return f"CURRENT names {name}, which is damaged: {incomplete}"
        return None
    return (
        f"{published_dir / CURRENT_FILE} names {name!r}, which is not a complete published "
        "version: point it at one with `recs rollback --to RUN_ID`"
    )


@runs_app.command("show")
def runs_show(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="A published version's run id.", metavar="RUN_ID")],
    as_json: JsonOpt = False,
) -> None:
    """One published version: its validation and, per shard, computed or carried over (from
    which run), users and rows."""
    as_json = as_json or bool((ctx.obj or {}).get("json"))
    from recs.nightly import history
    from recs.nightly.runs import check_run_id
    from recs.published import check_version, current_version, list_versions

    published_dir = current_settings().published_dir
    manifest = check_version(published_dir, check_run_id(run_id))
    current = current_version(published_dir, strict=False)
    problem = _current_problem(published_dir, list_versions(published_dir))
    if problem:
        err.print(f"recs: warning: {problem}", highlight=False, soft_wrap=True)
    document = {
        **manifest,
        "is_current": run_id == current,
        "predecessor": history.predecessor(published_dir, run_id),
    }

    def render(doc):
        validation = doc.get("validation", {})
        print_mapping(
            f"version {run_id}",
            {
                "current": _current_text(doc["is_current"], current, problem),
                "snapshot date": doc.get("snapshot_date"),
                "users": doc.get("users", 0),
                "rows": doc.get("rows", 0),
                "validation": "passed" if validation.get("success") else "not passed",
                "compared with": _compared_with(validation.get("compared_with"), run_id),
                "rollback target": doc["predecessor"] or "none",
            },
        )
        table = Table(title="shards")
        for column in ("shard", "status", "computed in", "users", "rows"):
            justify = "right" if column in ("users", "rows") else "left"
            table.add_column(column, justify=justify, no_wrap=True)
        for shard in doc["shards"]:
            status = shard.get("status", "computed")
            origin = shard.get("carried_from") if status == "carried_over" else run_id
            table.add_row(
                f"{shard['shard_id']:03d}",
                status.replace("_", " "),
                origin if isinstance(origin, str) else ", ".join(origin),
                f"{shard.get('users', 0):,}",
                f"{shard.get('rows', 0):,}",
            )
        print_whole(table)

    emit(document, as_json, render)


def _carried_text(carried: list[dict]) -> str:
    """``001 (night_1), 007 (night_1)``; ``-`` when every shard was computed."""
    parts = []
    for item in carried:
        origin = item.get("carried_from")
        origin = ", ".join(origin) if isinstance(origin, list) else origin
        parts.append(f"{item['shard_id']:03d} ({origin})")
    return ", ".join(parts) or "-"


def _render_summary(doc: dict) -> None:
    from recs.nightly.reporting import total_lines

    print_mapping(f"run {doc['run_id']} ({doc['snapshot_date']})", total_lines(doc))
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
