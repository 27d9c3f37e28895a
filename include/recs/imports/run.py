"""One ``recs import``: read and check the whole input, then write it in one store transaction.

``import_table(command, source, columns, settings, options)``:

1. **read**: every batch of the source is validated (``recs.imports.validation``) and staged
   (``recs.imports.staging``), rejects included; the live store is not touched yet. If the
   first batch has rows and every one of them is refused for one reason (a wrong
   ``--time-format``, a header read as data), the import stops there with ``ImportInputError``.
2. **write** (``recs.imports.writers``): in one transaction, ``--replace`` empties the table,
   the distinct rows go in (fresh or merged), follow counts follow, accounts the rows name but
   the store lacks are created (``CREATED_USER_DEFAULTS``), and with ``--generate-missing``
   the fields the input lacks are generated as ``recs load-dataset`` does
   (``recs.imports.generation``). Commit.
3. **report**: the rejects file (CSV, by line number) and a summary where ``rows_read =
   loaded + updated + rejected``.

A failure or a kill before the commit leaves the store as it was; the import is then simply
run again (it never leaves part of a file behind, so nothing needs resuming).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from recs.config import Settings
from recs.errors import ImportInputError
from recs.imports.batches import Source, SourceBatch
from recs.imports.sources import DelimitedFile
from recs.imports.staging import Staging, staging_folder
from recs.imports.tables import DEFAULT_TIME, IMPORT_TABLES, REJECT_REASONS, ImportTable
from recs.imports.typed_sources import ParquetSource
from recs.imports.validation import ParseOptions, column_mapping, row_text, validate
from recs.imports.writers import StoreWriter, created_users_frame, open_writer
from recs.store.bulk import prefetched
from recs.store.connections import one_line
from recs.times import wall_clock

log = logging.getLogger("recs.imports.run")

Progress = Callable[[str], None]

ATOMICITY = (
    "one transaction: a failed or interrupted import leaves the store as it was; run it again"
)
"""What the summary says about an interrupted import (``atomicity``)."""

_REFUSED_COLUMN_REASONS = (
    "non_integer_id",
    "bad_timestamp",
    "unknown_status",
    "bad_boolean",
    "malformed_line",
    "active_before_created",
)


@dataclass(frozen=True)
class ImportOptions:
    """How to import: ``replace`` the table's rows, ``update_existing`` users the store holds
    (users only), ``generate_missing`` fields as ``recs load-dataset`` does (edges only, from
    ``seed``), where to write ``rejects`` (default ``RECS_HOME/imports/<command>-<UTC
    time>.rejects.csv``) and how to ``parse`` values."""

    replace: bool = False
    update_existing: bool = False
    generate_missing: bool = False
    seed: int | None = None
    rejects: Path | None = None
    parse: ParseOptions = field(default_factory=ParseOptions)


def parse_options(
    settings: Settings, *, time_format: str = "iso", default_time: dt.datetime | None = None
) -> ParseOptions:
    """``ParseOptions`` with the latest accepted time ``RECS_INGEST_MAX_FUTURE_SECONDS`` after
    this machine's clock (as ``recs ingest`` bounds event times)."""
    latest = wall_clock() + dt.timedelta(seconds=settings.ingest_max_future_seconds)
    return ParseOptions(
        time_format=time_format, default_time=default_time or DEFAULT_TIME, latest_time=latest
    )


def import_table(
    command: str,
    source: Source,
    columns: dict[str, str | None],
    settings: Settings,
    options: ImportOptions | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Import ``source`` into the table of ``recs import <command>`` (module docstring).

    ``columns``: store column -> source column (the ``--<column>-col`` options; None or absent:
    by name, or by position in a headerless file). Returns a JSON-able summary: ``command,
    table, source, store`` (backend, URL), ``mode`` (fresh or merge), ``rows_read, loaded,
    updated, rejected, rejected_by_reason, users_created, follow_counts, generated,
    rejects_file, hint`` (what to do about rejects an option would have loaded, or None),
    ``balanced, atomicity, seconds, rows_per_second, timings``, and
    ``ignored_columns``: the source's columns no store column is mapped to (a ``status`` column
    is not ``account_status``: say ``--status-col status``).

    Raises ``ImportInputError`` (bad input or options, nothing written) and ``LiveStoreError``
    (the store cannot be opened or written; nothing written).
    """
    options = options or ImportOptions()
    spec = IMPORT_TABLES[command]
    check_rejects_path(options.rejects)
    if options.update_existing and spec.table != "users":
        raise ImportInputError("--update-existing applies to recs import users only")
    if options.generate_missing and spec.table != "follow_edges":
        raise ImportInputError("--generate-missing applies to recs import edges only")
    mapping = column_mapping(spec, source, columns)
    if isinstance(source, ParquetSource):
        source.wanted = sorted({name for name in mapping.values() if name is not None})
    if isinstance(source, DelimitedFile):
        source.integer_columns = {mapping[name] for name in spec.id_columns}
    started = time.perf_counter()
    timings: dict[str, float] = {}
    with (
        staging_folder(settings.home / "tmp") as folder,
        Staging(spec, folder, memory_mb=settings.import_memory_mb) as staging,
    ):
        rows_read = _read(source, spec, mapping, options.parse, staging, progress)
        timings["read"] = time.perf_counter() - started
        with open_writer(settings.live_store_url) as writer:
            written = _write(writer, spec, mapping, staging, options, progress)
            by_reason = staging.rejected_by_reason()
            rejected = sum(by_reason.values())
            rejects_file = None
            if rejected:  # before the commit: rejects that cannot be kept import nothing
                rejects_file = options.rejects or _default_rejects_path(settings, command)
                _write_rejects(staging, rejects_file)
            t0 = time.perf_counter()
            writer.commit()
            timings["commit"] = time.perf_counter() - t0
        timings["write"] = time.perf_counter() - started - timings["read"]
    seconds = time.perf_counter() - started
    summary = {
        "command": command,
        "table": spec.table,
        "source": source.name,
        "store": {"backend": writer.backend, "url": writer.where},
        "rows_read": rows_read,
        "ignored_columns": [c for c in source.columns if c not in set(mapping.values())],
        **written,
        "rejected": rejected,
        "rejected_by_reason": {r: by_reason[r] for r in REJECT_REASONS if r in by_reason},
        "rejects_file": str(rejects_file) if rejects_file else None,
        "hint": _hint(spec, by_reason, options, source.name),
        "balanced": rows_read == written["loaded"] + written["updated"] + rejected,
        "atomicity": ATOMICITY,
        "seconds": round(seconds, 3),
        "rows_per_second": round(rows_read / seconds) if seconds > 0 else None,
        "timings": {name: round(value, 3) for name, value in timings.items()},
    }
    log.info("imported %s: %s", command, summary)
    return summary


def _hint(
    spec: ImportTable, by_reason: dict[str, int], options: ImportOptions, source_name: str
) -> str | None:
    """What to do about rejects that an option would have loaded, or None: users the store
    already holds (an import of edges creates the accounts it names, with default columns)
    are updated only with ``--update-existing``."""
    existing = by_reason.get("already_in_store", 0)
    if spec.table != "users" or not existing or options.update_existing:
        return None
    return (
        f"accounts of {source_name} already in the store: {existing:,}; if an earlier import "
        "created them with default columns (one of edges, say), import this file again with "
        "--update-existing to set their columns from it"
    )


def check_rejects_path(path: Path | None) -> None:
    """``ImportInputError`` before any work if ``--rejects`` names a folder or a file in a
    folder that does not exist (the rejects must be kept, so the import would be refused
    after reading the whole input)."""
    if path is None:
        return
    if Path(path).is_dir():
        raise ImportInputError(f"--rejects {path} is a folder: give the path of a CSV file")
    if not Path(path).parent.is_dir():
        raise ImportInputError(f"--rejects {path}: the folder {Path(path).parent} does not exist")


def _write_rejects(staging: Staging, path: Path) -> None:
    try:
        staging.write_rejects(path)
    except (OSError, duckdb.Error) as error:
        raise ImportInputError(
            f"cannot write the rejects file {path} ({one_line(error, limit=200)}): nothing imported"
        ) from None


def _default_rejects_path(settings: Settings, command: str) -> Path:
    stamp = wall_clock().strftime("%Y%m%dT%H%M%S%fZ")
    return settings.home / "imports" / f"{command}-{stamp}.rejects.csv"


def _read(
    source: Source,
    spec: ImportTable,
    mapping: dict[str, str | None],
    parse: ParseOptions,
    staging: Staging,
    progress: Progress | None,
) -> int:
    """Validate and stage every batch; returns the rows read (accepted + rejected)."""
    rows = 0
    rejected = 0
    first = True
    checked = (
        (validate(batch, spec, mapping, parse), batch) for batch in source.batches()
    )  # parsed and checked in a helper thread while the previous batch is staged
    for (accepted, rejects), batch in prefetched(checked):
        if first and accepted.height + rejects.height:
            _refuse_a_wrong_column(source, batch, spec, mapping, accepted, rejects)
            first = False
        staging.add(accepted, rejects)
        rows += accepted.height + rejects.height
        rejected += rejects.height
        if progress is not None:
            progress(f"read {rows:,} rows of {source.name} ({rejected:,} rejected so far)")
    return rows


def _refuse_a_wrong_column(
    source: Source,
    batch: SourceBatch,
    spec: ImportTable,
    mapping: dict[str, str | None],
    accepted: pl.DataFrame,
    rejects: pl.DataFrame,
) -> None:
    """``ImportInputError`` if no row of the first batch was accepted and most of them were
    refused for one reason that a wrong option explains (the column options, ``--time-format``
    or ``--header`` do not fit the input); a few other bad lines do not hide it."""
    if accepted.height or rejects.height < 1:
        return
    counts = rejects["reason"].value_counts(sort=True)
    reason, count = counts.row(0)
    if reason not in _REFUSED_COLUMN_REASONS or 2 * count <= rejects.height:
        return
    others = ", ".join(f"{r} {n:,}" for r, n in counts.rows()[1:])
    example = rejects.filter(pl.col("reason") == reason).row(0, named=True)
    raise ImportInputError(
        f"nothing imported: all {rejects.height:,} rows of the first batch of {source.name} "
        f"were rejected, {count:,} as {reason}{f' (also {others})' if others else ''}, e.g. "
        f"line {example['line_number']:,}: {example['detail']} "
        f"({_advice(source, batch, spec, mapping, reason, rejects)})"
    )


_WHOLE_DECIMAL = r"^\s*\+?[0-9]+\.0*\s*$"
"""A text id written as a decimal with a zero fraction (``1000.0``: how pandas writes a float
column to CSV)."""


def _advice(
    source: Source,
    batch: SourceBatch,
    spec: ImportTable,
    mapping: dict[str, str | None],
    reason: str,
    rejects: pl.DataFrame,
) -> str:
    """What to check when the first batch was refused, mostly for ``reason``: how to write the
    ids when every ``non_integer_id`` reject is an id written as a whole decimal (naming each
    source column holding such ids), else the options that read the input."""
    if reason == "non_integer_id":
        quoted = rejects.filter(pl.col("reason") == reason)["detail"].str.extract(r" '(.*)' ")
        decimal = [
            name
            for name in (mapping.get(column) for column in spec.id_columns)
            if name is not None
            and batch.frame[name].dtype == pl.String
            and batch.frame[name].str.contains(_WHOLE_DECIMAL).any()
        ]
        if decimal and quoted.str.contains(_WHOLE_DECIMAL).fill_null(False).all():
            columns = ", ".join(f"{name!r}: 'Int64'" for name in decimal)
            if isinstance(source, DelimitedFile):
                return (
                    "the ids are written as decimals, as pandas writes a float column: write "
                    f"them as integers, e.g. df.astype({{{columns}}}) before to_csv, or write "
                    "Parquet, whose float ids are read exactly up to 2**53"
                )
            return (
                f"the ids are text written as decimals: store {', '.join(decimal)} as integers "
                "(cast them in --query for SQL)"
            )
    if reason == "active_before_created":
        return "are --created-at-col and --last-active-at-col the other way round?"
    return "check the --<column>-col options, --time-format and --header/--no-header"


_NAMING_USERS = ("follow_edges", "blocks", "mutes", "dismissed_candidates", "user_interests")
"""Tables whose rows name accounts (``users``): ``import users --replace`` would orphan them."""


def _refuse_orphaning(writer: StoreWriter) -> None:
    """``ImportInputError`` (nothing written) if ``import users --replace`` would drop the
    accounts rows of other tables name: they would point at accounts that no longer exist."""
    named = [table for table in _NAMING_USERS if not writer.is_empty(table)]
    if named:
        raise ImportInputError(
            f"refusing import users --replace: {', '.join(named)} name the accounts it would "
            "drop; import users without --replace (--update-existing updates accounts in "
            "place), or start from an empty store (a RECS_HOME of its own, or make clean)"
        )


def _write(
    writer: StoreWriter,
    spec: ImportTable,
    mapping: dict[str, str | None],
    staging: Staging,
    options: ImportOptions,
    progress: Progress | None,
) -> dict[str, Any]:
    """Everything that happens inside the store's transaction (module docstring, step 2)."""
    if options.replace and spec.table == "users":
        _refuse_orphaning(writer)
    if options.replace:
        writer.clear(spec)
    fresh = writer.is_empty(spec.table)
    creates_users = spec.table != "users"
    users_fresh = creates_users and writer.is_empty("users")
    times_given = bool(spec.time_columns) and mapping.get(spec.time_columns[0]) is not None
    is_edges = spec.table == "follow_edges"
    result: dict[str, Any] = {
        "mode": "fresh" if fresh else "merge",
        "replace": options.replace,
        "loaded": 0,
        "updated": 0,
        "users_created": 0,
        "follow_counts": None,
        "generated": [],
    }
    if options.generate_missing:
        from recs.imports.generation import write_generated

        result.update(
            write_generated(
                writer,
                staging,
                fresh=fresh,
                users_fresh=users_fresh,
                times_given=times_given,
                status_given=mapping.get("status") is not None,
                seed=options.seed,
                default_time=options.parse.default_time,
                progress=progress,
            )
        )
        return result
    frames = staging.distinct_rows(
        users_of=spec.id_columns if creates_users else (),
        counts=is_edges and fresh,
        times_given=times_given,
    )
    reverse = None
    if is_edges and fresh and writer.backend == "postgresql":

        def reverse() -> Iterator[pl.DataFrame]:
            return staging.reverse_rows(["followee_id", "follower_id", "created_at", "status"])

    loaded = writer.load(
        spec,
        frames,
        fresh=fresh,
        update_existing=options.update_existing,
        updated_columns=tuple(name for name, source in mapping.items() if source is not None),
        reverse=reverse,
        progress=progress,
    )
    result["loaded"], result["updated"] = loaded.inserted, loaded.updated
    if loaded.existing is not None and loaded.existing.height:
        staging.add_rejects(_already_in_store(spec, loaded.existing))
    if is_edges and fresh:
        result["follow_counts"] = writer.set_follow_counts(staging.follow_counts(), progress)
    if creates_users:
        default_time = options.parse.default_time
        result["users_created"] = writer.create_users(
            (created_users_frame(part, default_time) for part in staging.user_summary()),
            fresh=users_fresh,
            progress=progress,
        )
    return result


def _already_in_store(spec: ImportTable, existing: pl.DataFrame) -> pl.DataFrame:
    key = spec.key
    details = [
        "the store already holds " + ", ".join(f"{k} {v}" for k, v in zip(key, values, strict=True))
        for values in existing.select(list(key)).iter_rows()
    ]
    return pl.DataFrame(
        {
            "line_number": existing["line_number"],
            "reason": ["already_in_store"] * existing.height,
            "detail": details,
            "line": row_text(existing, spec),
        },
        schema={
            "line_number": pl.Int64,
            "reason": pl.String,
            "detail": pl.String,
            "line": pl.String,
        },
    )
