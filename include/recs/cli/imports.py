"""``recs import edges|users|blocks|mutes|dismissals|interests``: bring your own graph.

One sub-command per table of the live store (``recs.imports.tables.IMPORT_TABLES``), each with
the options every import shares and one ``--<column>-col`` option per store column, built from
the table's spec so the help, the options and the docs cannot disagree. Every sub-command calls
``recs.imports.run.import_table``.
"""

from __future__ import annotations

import datetime as dt
import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from recs.cli.app import app, current_settings, emit, err, print_mapping, progress
from recs.imports.tables import DEFAULT_TIME, IMPORT_TABLES, REJECT_REASONS, ImportTable


def _wrapped(text: str, width: int = 78) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


IMPORT_HELP = f"""Load your own graph into the live store: CSV/TSV (optionally gzipped) or
Parquet files, or a SQL query on another database.

One sub-command per table (users, edges, blocks, mutes, dismissals, interests); each names
the source column of every store column with a --<column>-col option (default: the column of
that name; in a headerless file the ids are columns 1, 2). Nothing is generated unless asked
(edges --generate-missing).

\b
Accounts the rows name but the store lacks are created: status active,
discoverable, not private; created_at the earliest time of the rows naming
them (else --default-time, {DEFAULT_TIME:%Y-%m-%dT%H:%M:%SZ}); last_active_at the latest
time of the rows they made (as follower, blocker, muter, dismissing user),
NULL if none or without a time column.

\b
Rejected rows go to a rejects CSV with their line numbers, counted by reason:
{_wrapped(", ".join(REJECT_REASONS))}.

The whole import is one store transaction: a failed or killed import leaves the store as it
was (run it again). Into an empty table (or with --replace, which empties that table first)
rows go straight in and indexes are rebuilt after; into a table with rows they are merged,
and rows already there are rejected (users: --update-existing updates them)."""

import_app = typer.Typer(help=IMPORT_HELP, no_args_is_help=True, rich_markup_mode=None)
app.add_typer(import_app, name="import")


def _option(*names: str, help: str, **kwargs) -> Any:
    return typer.Option(*names, help=help, **kwargs)


_COMMON: list[tuple[str, Any, Any]] = [
    (
        "path",
        Annotated[
            str | None,
            typer.Argument(help="CSV/TSV (.gz) or Parquet file.", metavar="[PATH]"),
        ],
        None,
    ),
    (
        "from_sql",
        Annotated[
            str | None,
            _option(
                "--from-sql",
                help="Read from this database "
                "URL (postgresql://..., sqlite:///...) instead of a file; needs --query.",
            ),
        ],
        None,
    ),
    (
        "query",
        Annotated[
            str | None,
            _option("--query", help="The SQL query whose rows to import (with --from-sql)."),
        ],
        None,
    ),
    (
        "file_format",
        Annotated[
            str,
            _option(
                "--format",
                help="auto (by the name: .parquet/.pq, else delimited text), csv, tsv or parquet.",
            ),
        ],
        "auto",
    ),
    (
        "separator",
        Annotated[
            str | None,
            _option(
                "--separator",
                help="Field separator: one character or tab, comma, semicolon, pipe, space "
                "(default: from the first data line).",
            ),
        ],
        None,
    ),
    (
        "header",
        Annotated[
            bool | None,
            _option(
                "--header/--no-header",
                help="The first data "
                "line is a header (default: unless all its fields are numbers).",
            ),
        ],
        None,
    ),
    (
        "comment",
        Annotated[
            str,
            _option(
                "--comment",
                help="Lines starting with this are "
                "skipped (still counted in line numbers); '' for none.",
            ),
        ],
        "#",
    ),
    (
        "time_format",
        Annotated[
            str,
            _option(
                "--time-format",
                help="iso (ISO-8601, no zone = "
                "UTC), epoch-s, epoch-ms, epoch-us or a strftime pattern.",
            ),
        ],
        "iso",
    ),
    (
        "default_time",
        Annotated[
            str | None,
            _option(
                "--default-time",
                help="Time of rows without a time column, ISO-8601 (default 2000-01-01T00:00:00Z).",
            ),
        ],
        None,
    ),
    (
        "replace",
        Annotated[
            bool,
            _option(
                "--replace",
                help="Empty this table (and what derives from it) first, in the same transaction.",
            ),
        ],
        False,
    ),
    (
        "rejects",
        Annotated[
            Path | None,
            _option(
                "--rejects",
                help="Where to write rejected rows "
                "(default RECS_HOME/imports/<command>-<time>.rejects.csv).",
            ),
        ],
        None,
    ),
    ("as_json", Annotated[bool, _option("--json", help="Print one JSON object on stdout.")], False),
]

_EXTRA: dict[str, list[tuple[str, Any, Any]]] = {
    "edges": [
        (
            "generate_missing",
            Annotated[
                bool,
                _option(
                    "--generate-missing",
                    help="Generate what the input lacks as recs load-dataset does (user fields, "
                    "follow times, and pending requests, blocks, mutes, dismissals, interests "
                    "where the store has none); listed in "
                    "the output.",
                ),
            ],
            False,
        ),
        (
            "seed",
            Annotated[
                int | None,
                _option(
                    "--seed", min=0, help="Seed of --generate-missing (default load-dataset's)."
                ),
            ],
            None,
        ),
    ],
    "users": [
        (
            "update_existing",
            Annotated[
                bool,
                _option(
                    "--update-existing",
                    help="Update accounts the store already holds (e.g. created with defaults "
                    "by an edges import) instead of rejecting them: the columns the file maps; "
                    "the others keep their stored values.",
                ),
            ],
            False,
        ),
    ],
}


def _column_parameter(spec: ImportTable, column) -> tuple[str, Any, Any]:
    name = column.option.removeprefix("--").replace("-", "_")
    where = f"default: the column named {column.name}"
    if column.required:
        position = [c.name for c in spec.columns].index(column.name) + 1
        where += f", headerless: column {position}"
    return (
        name,
        Annotated[
            str | None,
            _option(column.option, help=f"Source column of {column.name} ({where}). {column.help}"),
        ],
        None,
    )


def _register(spec: ImportTable) -> None:
    parameters = [
        *_COMMON,
        *(_column_parameter(spec, column) for column in spec.columns),
        *_EXTRA.get(spec.command, []),
    ]
    option_of = {
        column.name: column.option.removeprefix("--").replace("-", "_") for column in spec.columns
    }

    def command(**values: Any) -> None:
        _import(spec, {name: values.get(option) for name, option in option_of.items()}, values)

    command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
            for name, annotation, default in parameters
        ]
    )
    command.__annotations__ = {name: annotation for name, annotation, _ in parameters}
    command.__doc__ = f"{spec.grain} Into {spec.table}."
    import_app.command(spec.command)(command)


def _snapshots_after(
    settings, summary: dict[str, Any], *, replace: bool
) -> tuple[list[str], list[str]]:
    """(discarded, kept) retained snapshot dates after an import. ``--replace`` removed rows a
    retained snapshot still holds, so every snapshot is discarded
    (``recs.nightly.retained.discard_all``); an import that added rows keeps them (a retained
    snapshot is the store as it was at its cut-off) and names their dates, so a rerun can
    rebuild them with ``--rebuild-snapshot``."""
    from recs.nightly.retained import discard_all, retained_dates

    if replace:
        return discard_all(settings.home), []
    if not summary["loaded"] and not summary.get("updated"):
        return [], []
    return [], retained_dates(settings.home)


def _import(spec: ImportTable, columns: dict[str, str | None], values: dict[str, Any]) -> None:
    from recs.imports.run import ImportOptions, import_table, parse_options
    from recs.imports.sources import open_source, parse_separator

    settings = current_settings()
    source = open_source(
        values["path"],
        from_sql=values["from_sql"],
        query=values["query"],
        file_format=values["file_format"],
        separator=parse_separator(values["separator"]),
        header=values["header"],
        comment=values["comment"] or None,
        batch_rows=settings.import_batch_rows,
    )
    options = ImportOptions(
        replace=values["replace"],
        update_existing=values.get("update_existing", False),
        generate_missing=values.get("generate_missing", False),
        seed=values.get("seed"),
        rejects=values["rejects"],
        parse=parse_options(
            settings,
            time_format=values["time_format"],
            default_time=_default_time(values["default_time"]),
        ),
    )
    summary = import_table(spec.command, source, columns, settings, options, progress=progress)
    summary["discarded_snapshots"], summary["snapshots_without_this_import"] = _snapshots_after(
        settings, summary, replace=options.replace
    )

    def render(doc: dict[str, Any]) -> None:
        if doc["ignored_columns"]:
            err.print(
                f"warning: columns not imported (no --<column>-col names them): "
                f"{', '.join(doc['ignored_columns'])}",
                highlight=False,
            )
        if doc["generated"]:
            err.print(
                f"generated (not in the input, seed {doc['seed']}): {', '.join(doc['generated'])}",
                highlight=False,
            )
        if doc["rejected"]:
            reasons = ", ".join(f"{k} {v:,}" for k, v in doc["rejected_by_reason"].items())
            err.print(
                f"rejected by reason: {reasons} (rows in {doc['rejects_file']})", highlight=False
            )
        if doc["hint"]:
            err.print(f"hint: {doc['hint']}", highlight=False)
        shown = {
            key: value
            for key, value in doc.items()
            if key not in ("rejected_by_reason", "timings", "generated", "atomicity",
                           "ignored_columns", "hint")
            and value is not None
        }
        shown["store"] = f"{doc['store']['backend']} {doc['store']['url']}"
        if doc["snapshots_without_this_import"]:
            err.print(
                "retained snapshots do not hold this import: "
                f"{', '.join(doc['snapshots_without_this_import'])} (rerun those dates with "
                "--rebuild-snapshot to include it)",
                highlight=False,
            )
        print_mapping(f"imported {spec.command} into {spec.table}", shown)
        err.print(f"written in {doc['atomicity']}", highlight=False)

    emit(summary, values["as_json"], render)


def _default_time(text: str | None) -> dt.datetime | None:
    from recs.errors import ImportInputError
    from recs.times import naive_utc

    if text is None:
        return None
    try:
        return naive_utc(dt.datetime.fromisoformat(text.replace("Z", "+00:00")))
    except ValueError:
        raise ImportInputError(f"--default-time must be an ISO-8601 time, not {text!r}") from None


for _spec in IMPORT_TABLES.values():
    _register(_spec)
