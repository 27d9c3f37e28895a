"""Bulk loading of the live store: whole tables of rows in one transaction (the demo loaders).

``write_store(url, tables)`` creates the schema if it is missing (a non-empty store is refused
unless ``replace``), then in one transaction empties every table (``replace``), inserts every
``TableRows`` and fills ``user_follow_counts`` from the active edges, so ``recs reconcile``
finds no drift after a load, and a load that fails or is interrupted leaves the store as it
was. (``replace`` used to drop the schema in a transaction of its own first: Ctrl-C during
``load-dataset --replace`` left an empty store, 5 of 5 times for a newcomer.)

- SQLite: the ADBC SQLite driver binds Arrow batches in C (``adbc_ingest``, no Python row
  objects), with the secondary indexes dropped during the load and rebuilt at the end.
- PostgreSQL: the ADBC PostgreSQL driver, binary ``COPY ... FROM STDIN``; the edge triggers
  fill ``follow_edges_reverse`` once per batch.
- Any other SQLAlchemy URL: Core ``executemany`` in batches of ``SQLALCHEMY_BATCH_ROWS``.

The ADBC driver links its own copy of SQLite, and two copies in one process must not hold the
same file open at once (``recs/store/README.md``): the SQLAlchemy engine that creates the
schema is disposed of before the ADBC connection opens. Measured speeds: ``bench/README.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from recs.errors import DatasetError
from recs.store import schema
from recs.store.connections import (
    SQLITE_TIMESTAMP_FORMAT_POLARS,
    apply_sqlite_pragmas,
    display_url,
    engine_for,
    libpq_url,
    normalize_url,
    sqlite_file,
)

log = logging.getLogger("recs.store.bulk")

ProgressCallback = Callable[[str], None]
"""``progress(message)``: one line such as ``"follow_edges: 2,097,152/5,000,000 rows"`` (the
convention of ``pipeline.run_all`` and the CLI)."""


SQLALCHEMY_BATCH_ROWS = 10_000


class TableRows(NamedTuple):
    """Rows for one store table: frames in the table's column names and contract dtypes."""

    table: str
    frames: Iterable[pl.DataFrame]
    total: int
    label: str | None = None  # shown in progress, e.g. "follow_edges (pending)"


def _use_sqlite_bulk_path(url: str) -> bool:
    """Whether ``url`` is a SQLite file the ADBC bulk path can write."""
    return sqlite_file(url) is not None


def refuse_non_empty_store(url: str) -> None:
    """Raise ``DatasetError`` if the live store at ``url`` already holds rows (the message
    lists them and points to ``--replace``), or cannot be read. Only reads: a missing SQLite
    file or missing tables count as empty, and nothing is created, so the CLI calls it before
    minutes of loading or generating, and ``_prepare_store`` again before writing."""
    from sqlalchemy import func, inspect, select

    path = sqlite_file(url)
    if path is not None and not Path(path).exists():
        return
    engine = engine_for(url)
    try:
        with engine.connect() as connection:
            present = set(inspect(connection).get_table_names())
            counts = {
                table.name: connection.execute(select(func.count()).select_from(table)).scalar_one()
                for table in schema.tables_for(engine.dialect.name)
                if table.name in present
            }
    except Exception as error:  # noqa: BLE001 - unreachable store: one line, not a traceback
        raise DatasetError(f"cannot read the live store: {error}".splitlines()[0]) from None
    finally:
        engine.dispose()
    if any(counts.values()):
        held = ", ".join(f"{count:,} {name}" for name, count in counts.items() if count)
        raise DatasetError(
            f"the live store {display_url(url)} is not empty ({held}): pass --replace "
            "to drop and reload it"
        )


def _prepare_store(url: str, *, replace: bool) -> None:
    """Create the schema where it is missing (``schema.create_schema``: idempotent, brings an
    older store's up to date); refuse a non-empty store unless ``replace``. Nothing is dropped
    here: ``replace`` empties the tables in the load's own transaction (``_emptied``)."""
    path = sqlite_file(url)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = engine_for(url)
    try:
        schema.create_schema(engine)
    finally:
        engine.dispose()
    if not replace:
        refuse_non_empty_store(url)


def _emptied(dialect_name: str) -> list[str]:
    """The statements that empty every table of the store (``schema.tables_for``), run first
    in the load's transaction by ``replace``: one ``TRUNCATE`` on PostgreSQL (without
    ``follow_edges_reverse``: ``follow_edges``' truncate trigger empties it, and may not while
    the same statement names it), else a ``DELETE`` a table (dependants first)."""
    tables = [table.name for table in reversed(schema.tables_for(dialect_name))]
    if dialect_name == "postgresql":
        return [f"TRUNCATE {', '.join(t for t in tables if t != 'follow_edges_reverse')}"]
    return [f"DELETE FROM {name}" for name in tables]


def write_store(
    url: str,
    tables: Iterable[TableRows],
    *,
    replace: bool = False,
    progress: ProgressCallback | None = None,
) -> dict[str, str]:
    """Insert frames into the live store at ``url`` in one transaction.

    ``tables``: ``TableRows(table, frames, total, label)``; each frame has the table's column
    names with contract dtypes (Int64, ``Datetime("us")`` naive UTC, String, Boolean). Creates
    the schema if missing; in one transaction, ``replace`` empties every table first and the
    rows' ``user_follow_counts`` are filled from the active edges
    (``schema.REBUILD_FOLLOW_COUNTS_SQL``), so ``recs reconcile`` finds no drift after a load
    and a failed or interrupted load changes nothing. Returns ``{"backend", "url"}``. Raises
    ``DatasetError`` if the store is not empty and ``replace`` is false.

    PostgreSQL is bulk-loaded through the ADBC PostgreSQL driver (``COPY ... FROM STDIN`` in
    binary, one transaction); its triggers fill ``follow_edges_reverse`` once per batch.
    """
    _prepare_store(url, replace=replace)
    if _use_sqlite_bulk_path(url):
        _write_sqlite_adbc(sqlite_file(url), tables, progress, replace)
        backend = "sqlite"
    elif normalize_url(url).startswith("postgresql"):
        _write_postgres_adbc(url, tables, progress, replace)
        backend = "postgresql"
    else:
        backend = _write_sqlalchemy(url, tables, progress, replace)
    return {"backend": backend, "url": display_url(url)}


def _report(progress: ProgressCallback | None, rows: TableRows, done: int) -> None:
    message = f"{rows.label or rows.table}: {done:,}/{rows.total:,} rows"
    log.info("wrote %s", message)
    if progress is not None:
        progress(message)


def secondary_index_ddl(
    dialect_name: str = "sqlite", tables: Iterable[str] | None = None
) -> tuple[list[str], list[str]]:
    """``(drop, create)`` statements of the non-primary-key indexes of ``tables`` (default:
    every table) on a backend (``sqlite`` or ``postgresql``), from ``schema.metadata``. On
    PostgreSQL ``follow_edges`` has none: its reverse direction is a table."""
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.schema import CreateIndex, DropIndex

    dialect = postgresql.dialect() if dialect_name == "postgresql" else sqlite.dialect()
    wanted = set(tables) if tables is not None else None
    indexes = [
        index
        for table in schema.tables_for(dialect_name)
        if wanted is None or table.name in wanted
        for index in table.indexes
        if not (dialect_name == "postgresql" and table.name == "follow_edges")
    ]
    drop = [str(DropIndex(index).compile(dialect=dialect)) for index in indexes]
    create = [str(CreateIndex(index).compile(dialect=dialect)) for index in indexes]
    return drop, create


def _write_sqlite_adbc(
    path: str,
    tables: Iterable[TableRows],
    progress: ProgressCallback | None,
    replace: bool,
) -> None:
    import adbc_driver_sqlite.dbapi as adbc

    drop_indexes, create_indexes = secondary_index_ddl()
    connection = adbc.connect(path, autocommit=True)
    cursor = connection.cursor()
    try:
        apply_sqlite_pragmas(cursor, "bulk_load")  # 1 GiB cache, 4 index-sorter threads
        cursor.execute("BEGIN IMMEDIATE")
        try:
            for statement in drop_indexes + (_emptied("sqlite") if replace else []):
                cursor.execute(statement)
            for rows in tables:
                done = 0
                # The next batch is built (generated, timestamps formatted) in a helper thread
                # while SQLite ingests this one: ADBC releases the GIL during the insert.
                batches = (_sqlite_text_timestamps(f).to_arrow() for f in rows.frames)
                for batch in prefetched(batches):
                    if batch.num_rows:
                        cursor.adbc_ingest(rows.table, batch, mode="append")
                    done += batch.num_rows
                    _report(progress, rows, done)
            t0 = time.perf_counter()
            for statement in create_indexes:
                cursor.execute(statement)
            log.info("built %d indexes in %.1f s", len(create_indexes), time.perf_counter() - t0)
            if progress is not None:
                progress(f"built {len(create_indexes)} indexes")
            _rebuild_counts(cursor, progress)
            t0 = time.perf_counter()
            cursor.execute("COMMIT")
            log.info("committed in %.1f s", time.perf_counter() - t0)
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
    finally:
        cursor.close()
        connection.close()


_EXHAUSTED = object()


def prefetched(items: Iterable[Any]) -> Iterator[Any]:
    """Iterate ``items`` while a helper thread already produces the next one."""
    from concurrent.futures import ThreadPoolExecutor

    iterator = iter(items)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="recs-load") as pool:
        upcoming = pool.submit(next, iterator, _EXHAUSTED)
        while (item := upcoming.result()) is not _EXHAUSTED:
            upcoming = pool.submit(next, iterator, _EXHAUSTED)
            yield item


def _sqlite_text_timestamps(frame: pl.DataFrame) -> pl.DataFrame:
    """Timestamps as the text SQLAlchemy's SQLite ``DateTime`` stores and parses back."""
    return frame.with_columns(
        pl.col(name).dt.strftime(SQLITE_TIMESTAMP_FORMAT_POLARS)
        for name, dtype in frame.schema.items()
        if dtype == pl.Datetime("us")
    )


def _write_sqlalchemy(
    url: str,
    tables: Iterable[TableRows],
    progress: ProgressCallback | None,
    replace: bool,
) -> str:
    engine = engine_for(url)
    try:
        with engine.begin() as conn:
            for statement in _emptied(engine.dialect.name) if replace else []:
                conn.exec_driver_sql(statement)
            for rows in tables:
                table = schema.metadata.tables[rows.table]
                done = 0
                for frame in rows.frames:
                    for offset in range(0, frame.height, SQLALCHEMY_BATCH_ROWS):
                        batch = frame.slice(offset, SQLALCHEMY_BATCH_ROWS).to_dicts()
                        conn.execute(table.insert(), batch)
                    done += frame.height
                    _report(progress, rows, done)
            for statement in schema.REBUILD_FOLLOW_COUNTS_SQL:
                conn.exec_driver_sql(statement)
        return engine.dialect.name
    finally:
        engine.dispose()


def _rebuild_counts(cursor: Any, progress: ProgressCallback | None) -> None:
    """Fill ``user_follow_counts`` from the edges just loaded (same transaction)."""
    t0 = time.perf_counter()
    for statement in schema.REBUILD_FOLLOW_COUNTS_SQL:
        cursor.execute(statement)
    log.info("counted follows per user in %.1f s", time.perf_counter() - t0)
    if progress is not None:
        progress("counted follows per user")


def _write_postgres_adbc(
    url: str,
    tables: Iterable[TableRows],
    progress: ProgressCallback | None,
    replace: bool,
) -> None:
    """Bulk-load PostgreSQL through ADBC (binary ``COPY``) in one transaction.

    Timestamps stay Arrow ``timestamp[us]`` (PostgreSQL ``timestamp without time zone``).
    """
    import adbc_driver_postgresql.dbapi as adbc

    connection = adbc.connect(libpq_url(url))  # autocommit off: one transaction
    cursor = connection.cursor()
    try:
        for statement in _emptied("postgresql") if replace else []:
            cursor.execute(statement)
        for rows in tables:
            done = 0
            for batch in prefetched(frame.to_arrow() for frame in rows.frames):
                if batch.num_rows:
                    cursor.adbc_ingest(rows.table, batch, mode="append")
                done += batch.num_rows
                _report(progress, rows, done)
        _rebuild_counts(cursor, progress)
        cursor.execute("ANALYZE")
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    finally:
        cursor.close()
        connection.close()
