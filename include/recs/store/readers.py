"""Consistent reads of the whole live store: every table in **one read transaction**.

``open_reader(url)`` yields a ``LiveStoreReader``; its reads all see the store at one instant
while writers keep committing, and none of them waits for a writer or makes one wait (with
several connections on SQLite, writers wait for the milliseconds they take to open: below):

- SQLite (WAL mode): the ADBC SQLite driver, ``BEGIN`` then the ``SELECT``s on a
  ``query_only`` connection; a WAL reader sees the database as of its first read
  (sqlite.org/wal.html §2.2). Text timestamps are parsed by Arrow's ISO-8601 cast.
- PostgreSQL: the ADBC PostgreSQL driver in one ``REPEATABLE READ, READ ONLY`` transaction;
  the driver fetches each ``SELECT`` as ``COPY (...) TO STDOUT (FORMAT binary)`` into Arrow.
- Any other SQLAlchemy URL: ``polars.read_database`` on one SQLAlchemy transaction.

**Several connections, one snapshot** (``open_reader(url, connections=n)``): ``iter_ranges``
splits one table by ranges of an integer key, each read by its own connection on a thread of the
caller's, so a large table is read on ``n`` cores. All of them see the one instant:

- SQLite: a further connection takes the write lock (``BEGIN IMMEDIATE``) while the readers
  open their transactions and make their first read, then lets it go: no commit can fall between
  them. A writer that begins then waits that long (~4 ms; its busy timeout covers it); one
  whose deferred transaction has already read and then writes fails at once with "database is
  locked" (SQLite does not retry that upgrade; this project's writers all ``BEGIN
  IMMEDIATE``). If the lock is not free within the busy timeout (a bulk load holds it), the
  reader has waited that long and reads with one connection.
- PostgreSQL: the first transaction exports its snapshot (``pg_export_snapshot()``) and the
  others adopt it (``SET TRANSACTION SNAPSHOT``), as ``pg_dump --jobs`` does; also on a hot
  standby (PostgreSQL >= 10). The URL must reach one server (not a pool of replicas). A failed
  export means a new transaction on one connection; a connection that cannot open or join the
  snapshot (a connection limit) means fewer. A hash-partitioned table is read partition by
  partition, dealt out to the connections (a key range would scan every partition).

Frames have the columns and dtypes of ``recs.contracts.SNAPSHOT_SCHEMAS``. The nightly
snapshot (``recs.nightly.snapshot``) is the reader. Why ADBC, and why this process must not
hold the same SQLite file open through ``sqlite3`` meanwhile: ``recs/store/README.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any, Protocol, Self

import polars as pl
import pyarrow as pa

from recs.contracts import SNAPSHOT_SCHEMAS, arrow_schema
from recs.errors import LiveStoreError
from recs.store import schema
from recs.store.connections import (
    apply_sqlite_pragmas,
    display_url,
    engine_for,
    is_postgres,
    libpq_url,
    one_line,
    sqlite_file,
)
from recs.store.read_ahead import ReadAhead
from recs.store.sqlite_arrow import conform

log = logging.getLogger("recs.store.readers")

READ_BATCH_ROWS = 1 << 17
"""Rows per Arrow batch of the ADBC SQLite reader (its default, 1024, costs ~10 % in calls)."""


READ_CHUNK_ROWS = 1 << 20
"""Rows per frame that ``iter_table`` yields: follow edges are partitioned chunk by chunk."""

PREFETCH_ROWS = 2 * READ_CHUNK_ROWS
"""Rows the driver may read ahead of the frame being converted (``ReadAhead``): two chunks.
SQLite's batches are ``READ_BATCH_ROWS`` rows (16 batches ahead); PostgreSQL's driver cuts
its batches by size (16 MiB, its default hint), so it is held to 2 of them."""


class LiveStoreReader(Protocol):
    """One open, consistent read of the live store (one transaction for every table)."""

    backend: str

    def iter_table(self, name: str) -> Iterator[pl.DataFrame]:
        """Every row of store table ``name`` in frames of about ``READ_CHUNK_ROWS`` rows, with
        the columns/dtypes of SNAPSHOT_SCHEMAS; at least one (possibly empty) frame. Consume
        it fully before the next read."""
        ...

    def read_table(self, name: str) -> pl.DataFrame:
        """Every row of store table ``name`` as one frame (``iter_table`` concatenated)."""
        ...

    def iter_ranges(self, name: str, column: str) -> list[Iterator[pl.DataFrame]]:
        """Every row of store table ``name`` as ``iter_table`` frames, split into at most one
        part per open connection: ranges of the integer ``column`` (ascending, disjoint, equal
        spans of its values, so dense ids balance them; the first also yields the rows whose
        ``column`` is NULL), or on PostgreSQL the table's partitions dealt out in turn (a range
        cannot prune hash partitions). One part with a single connection, an empty table or a
        key that is not an integer. Each iterator uses its own connection: consume each on one
        thread, all of them fully, before any other read."""
        ...


@contextmanager
def open_reader(url: str, connections: int = 1) -> Iterator[LiveStoreReader]:
    """A ``LiveStoreReader`` whose reads all see one snapshot; the transaction ends on exit.

    ``connections`` (>= 1): how many connections ``iter_ranges`` may read with (module
    docstring; fewer if the store cannot pin one snapshot across them, logged; the SQLAlchemy
    fallback always uses one). Raises ``LiveStoreError`` if a SQLite store file does not
    exist or lacks a table, or PostgreSQL cannot be reached.
    """
    path = sqlite_file(url)
    if path is not None:
        reader: Any = _AdbcSqliteReader(path, connections)
    elif is_postgres(url):
        reader = _AdbcPostgresReader(url, connections)
    else:
        reader = _SqlAlchemyReader(url)
    with reader:
        yield reader


def _missing_tables_message(where: str, missing: list[str]) -> str:
    return (
        f"the live store {where} has no table {', '.join(missing)}: load data first "
        "(`recs load-dataset slashdot` or `recs generate-graph`)"
    )


class _Reader:
    """What every ``LiveStoreReader`` shares: opening, the table check, ``read_table``, exit."""

    def __enter__(self) -> Self:
        """Open the connection and its read transaction; ``LiveStoreError`` (closed) if the
        store lacks a snapshot table."""
        try:
            present = self._begin()
        except BaseException:
            self._close()
            raise
        self._require_tables(present, self._where())
        return self

    def _begin(self) -> set[str]:  # pragma: no cover - abstract
        """Connect, begin the read transaction; return the names of the store's tables."""
        raise NotImplementedError

    def _where(self) -> str:  # pragma: no cover - abstract
        """The store as messages name it (password masked)."""
        raise NotImplementedError

    def _require_tables(self, present: set[str], where: str) -> None:
        """Close and raise ``LiveStoreError`` unless every snapshot table is ``present``."""
        missing = [name for name in SNAPSHOT_SCHEMAS if name not in present]
        if missing:
            self._close()
            raise LiveStoreError(_missing_tables_message(where, missing))

    def read_table(self, name: str) -> pl.DataFrame:
        return _concat(self.iter_table(name))

    def iter_table(self, name: str) -> Iterator[pl.DataFrame]:  # pragma: no cover - abstract
        raise NotImplementedError

    def iter_ranges(self, name: str, column: str) -> list[Iterator[pl.DataFrame]]:
        return [self.iter_table(name)]

    def __exit__(self, *exc_info: object) -> None:
        self._close()

    def _close(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class _AdbcReader(_Reader):
    """An ADBC connection and cursor holding one read transaction; rolled back on close."""

    _connection: Any = None
    _cursor: Any = None
    _read_ahead: ReadAhead | None = None
    _prefetch_batches = PREFETCH_ROWS // READ_BATCH_ROWS
    _siblings: list[_AdbcReader]
    """Further connections in this reader's snapshot, for ``iter_ranges``."""

    def _rows(self, sql: str) -> list[tuple[Any, ...]]:
        """Every row of ``sql``'s result (a small one: bounds, names, settings)."""
        cursor = self._idle()
        cursor.execute(sql)
        return [tuple(row) for row in cursor.fetchall()]

    def _select(self, name: str, where: str = "") -> Iterator[pl.DataFrame]:  # pragma: no cover
        """``iter_table`` of the rows of ``name`` matching the SQL condition ``where``."""
        raise NotImplementedError

    def _open_siblings(self, count: int, make: Callable[[], _AdbcReader]) -> None:
        """Open up to ``count`` further readers in this one's snapshot (``make()`` one, then
        its ``_begin_one``); at the first that cannot open (a connection limit, a snapshot its
        server does not know), it is closed and the read goes on with those open (logged)."""
        for _ in range(count):
            sibling = make()
            try:
                sibling._begin_one()
            except Exception as error:  # noqa: BLE001 - fewer connections still read consistently
                sibling._close()
                log.warning("the snapshot reads with %d connection(s): another could not join "
                            "its snapshot (%s)", 1 + len(self._siblings),
                            one_line(error, getattr(self, "url", None)))  # fmt: skip
                return
            self._siblings.append(sibling)

    def _begin_one(self) -> set[str]:  # pragma: no cover - abstract
        """Connect and begin one read transaction; return the names of the store's tables."""
        raise NotImplementedError

    def iter_table(self, name: str) -> Iterator[pl.DataFrame]:
        return self._select(name)

    def iter_ranges(self, name: str, column: str) -> list[Iterator[pl.DataFrame]]:
        readers = [self, *self._siblings]
        if len(readers) == 1:
            return [self.iter_table(name)]
        # one aggregate per query: SQLite reads a min() or a max() alone from the key's index,
        # both in one query by scanning the table (5 s at 50 M edges)
        [(low, high)] = self._rows(
            f"SELECT (SELECT min({column}) FROM {name}), (SELECT max({column}) FROM {name})"  # noqa: S608
        )
        if not (isinstance(low, int) and isinstance(high, int)):
            return [self.iter_table(name)]  # empty, or not integers: the contract check says so
        count = min(len(readers), high - low + 1)
        if count < 2:
            return [self.iter_table(name)]
        # equal spans of the key: the ids of a store are dense (generated or imported ones)
        bounds = [low + (high - low + 1) * i // count for i in range(1, count)]
        conditions = [f"{column} < {bounds[0]}"]
        conditions += [
            f"{column} >= {a} AND {column} < {b}" for a, b in zip(bounds, bounds[1:], strict=False)
        ]
        conditions.append(f"{column} >= {bounds[-1]}")
        ranges = [
            reader._select(name, f"WHERE {where}")
            for reader, where in zip(readers, conditions, strict=False)  # count <= readers
        ]
        # a NULL key is in no range: read after the first one, on its connection (it is refused
        # by the caller, never dropped unseen)
        ranges[0] = chain(ranges[0], self._select(name, f"WHERE {column} IS NULL"))
        log.info("read %s in %d ranges of %s: %s", name, count, column, bounds)
        return ranges

    def _idle(self) -> Any:
        """The cursor, once no read-ahead thread uses the connection any more: an abandoned
        stream's thread is stopped first (a driver is not safe to call from two threads: a
        ``ROLLBACK`` beside a fetching thread crashed the process)."""
        if self._read_ahead is not None:
            self._read_ahead.close()
            self._read_ahead = None
        return self._cursor

    def _close(self) -> None:
        for sibling in getattr(self, "_siblings", ()):
            sibling._close()
        self._siblings = []
        self._idle()
        try:
            if self._cursor is not None:
                self._cursor.execute("ROLLBACK")  # a read transaction: nothing to commit
        except Exception:  # noqa: BLE001 - no transaction open, or the connection is gone
            pass
        finally:
            if self._cursor is not None:
                self._cursor.close()
            if self._connection is not None:
                self._connection.close()
            self._cursor = self._connection = None

    def _frames(
        self, name: str, convert: Callable[[list[pa.RecordBatch]], pl.DataFrame]
    ) -> Iterator[pl.DataFrame]:
        """The record batches of the query just executed, ``convert``ed in groups of about
        ``READ_CHUNK_ROWS`` rows; at least one (possibly empty) frame."""
        rows = 0
        pending: list[pa.RecordBatch] = []
        pending_rows = 0
        batches = ReadAhead(self._idle().fetch_record_batch(), self._prefetch_batches)
        self._read_ahead = batches
        try:
            for batch in batches:
                pending.append(batch)
                pending_rows += batch.num_rows
                if pending_rows >= READ_CHUNK_ROWS:
                    rows += pending_rows
                    log.info("read %s: %d rows", name, rows)
                    yield convert(pending)
                    pending, pending_rows = [], 0
        finally:
            batches.close()
        if pending or not rows:
            rows += pending_rows
            log.info("read %s: %d rows", name, rows)
            yield convert(pending)


class _AdbcSqliteReader(_AdbcReader):
    """SQLite via ADBC: ``BEGIN`` + ``SELECT``s on a ``query_only`` connection (WAL reader)."""

    backend = "sqlite"

    def __init__(self, path: str, connections: int = 1) -> None:
        self.path = path
        self.connections = connections
        self._siblings = []

    def _where(self) -> str:
        return self.path

    def _begin(self) -> set[str]:
        if not Path(self.path).is_file():
            raise LiveStoreError(
                f"no live store at {self.path}: load data first "
                "(`recs load-dataset slashdot` or `recs generate-graph`)"
            )
        if self.connections == 1:
            return self._begin_one()
        paused = time.perf_counter()
        writers = self._pause_writers()
        try:
            present = self._begin_one()
            if writers is not None:
                self._open_siblings(self.connections - 1, lambda: _AdbcSqliteReader(self.path))
        finally:
            if writers is not None:
                connection, cursor = writers
                try:
                    cursor.execute("ROLLBACK")
                finally:
                    cursor.close()
                    connection.close()
                waited = 1000 * (time.perf_counter() - paused)
                log.info("writers to %s paused %.1f ms while %d connections opened one snapshot",
                         self.path, waited, self.connections)  # fmt: skip
        return present

    def _pause_writers(self) -> tuple[Any, Any] | None:
        """A connection and its cursor holding the write lock (``BEGIN IMMEDIATE``, within
        the busy timeout), so no commit falls between the readers' first reads; None (logged)
        if the lock is not free."""
        import adbc_driver_sqlite.dbapi as adbc

        connection = adbc.connect(self.path, autocommit=True)
        cursor = connection.cursor()
        try:
            apply_sqlite_pragmas(cursor, "snapshot")
            cursor.execute("BEGIN IMMEDIATE")
        except Exception as error:  # noqa: BLE001 - one connection still reads consistently
            log.warning("the snapshot reads %s with one connection: the write lock was not free "
                        "(%s)", self.path, one_line(error))  # fmt: skip
            cursor.close()
            connection.close()
            return None
        return connection, cursor

    def _begin_one(self) -> set[str]:
        import adbc_driver_sqlite.dbapi as adbc

        self._connection = adbc.connect(self.path, autocommit=True)
        cursor = self._cursor = self._connection.cursor()
        apply_sqlite_pragmas(cursor, "snapshot")
        [(mode,)] = self._rows("PRAGMA journal_mode")
        if str(mode).lower() != "wal":
            raise LiveStoreError(
                f"the live store {self.path} is in {mode} journal mode, not WAL: a snapshot "
                "would block writers (open it once through recs.store.connections.engine_for)"
            )
        cursor.execute("PRAGMA query_only=ON")
        cursor.execute("BEGIN")
        # The first read fixes the WAL snapshot that every later SELECT sees.
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {row[0] for row in cursor.fetchall()}

    def _select(self, name: str, where: str = "") -> Iterator[pl.DataFrame]:
        contract = SNAPSHOT_SCHEMAS[name]
        nullable = {
            column.name for column in schema.metadata.tables[name].columns if column.nullable
        }
        # The driver infers each column's type from its first batch; a batch of only NULLs
        # would be typed int64 and the next text batch would fail, so NULLs are read as ''.
        columns = ", ".join(
            f"coalesce({column}, '') AS {column}" if column in nullable else column
            for column in contract
        )
        cursor = self._idle()
        cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(READ_BATCH_ROWS)})
        cursor.execute(f"SELECT {columns} FROM {name} {where}")  # noqa: S608 - fixed names
        yield from self._frames(
            name,
            lambda batches: conform(
                pa.Table.from_batches(batches) if batches else None, contract, nullable
            ),
        )


class _AdbcPostgresReader(_AdbcReader):
    """PostgreSQL via ADBC: one ``REPEATABLE READ, READ ONLY`` transaction, each table read by
    the driver as ``COPY (SELECT ...) TO STDOUT (FORMAT binary)`` straight into Arrow batches.

    A repeatable-read transaction reads one MVCC snapshot for all its statements and takes only
    ``ACCESS SHARE`` locks, which conflict with no writer (only with DDL such as ``DROP`` or
    ``TRUNCATE``): follows keep committing while the snapshot reads. The snapshot holds back
    ``VACUUM``'s horizon for as long as it runs (a few seconds per million edges).
    """

    backend = "postgresql"
    _prefetch_batches = 2  # the driver's batches are 16 MiB (PREFETCH_ROWS)

    def __init__(self, url: str, connections: int = 1, snapshot: str | None = None) -> None:
        self.url = url
        self.connections = connections
        self._snapshot = snapshot  # a sibling adopts the first connection's exported snapshot
        self._siblings = []

    def _where(self) -> str:
        return display_url(self.url)

    def _begin(self) -> set[str]:
        present = self._begin_one()
        if self.connections > 1:
            try:
                [(snapshot,)] = self._rows("SELECT pg_export_snapshot()")
            except Exception as error:  # noqa: BLE001 - one connection still reads consistently
                log.warning("the snapshot reads with one connection: %s",
                            one_line(error, self.url))  # fmt: skip
                # the failed export aborted the transaction: nothing was read yet, so a new one
                self._close()
                return self._begin_one()
            self._open_siblings(
                self.connections - 1, lambda: _AdbcPostgresReader(self.url, snapshot=snapshot)
            )
        return present

    def iter_ranges(self, name: str, column: str) -> list[Iterator[pl.DataFrame]]:
        readers = [self, *self._siblings]
        partitions = [] if len(readers) == 1 else [
            row[0] for row in self._rows(
                "SELECT child.relname FROM pg_inherits JOIN pg_class child ON child.oid = "
                "inhrelid JOIN pg_class parent ON parent.oid = inhparent WHERE parent.relname = "
                f"'{name}' AND parent.relnamespace = current_schema()::regnamespace "
                "ORDER BY child.relname"
            )
        ]  # fmt: skip
        if len(partitions) < 2:
            return super().iter_ranges(name, column)
        dealt = [partitions[i :: len(readers)] for i in range(min(len(readers), len(partitions)))]
        log.info("read %s in %d parts of its %d partitions", name, len(dealt), len(partitions))
        return [
            reader._partitions(name, tables)
            for reader, tables in zip(readers, dealt, strict=False)  # len(dealt) <= readers
        ]

    def _partitions(self, name: str, tables: list[str]) -> Iterator[pl.DataFrame]:
        """The rows of partitions ``tables`` of ``name``, one after another on this reader's
        connection."""
        for table in tables:
            yield from self._select(name, table=table)

    def _begin_one(self) -> set[str]:
        import adbc_driver_postgresql.dbapi as adbc

        try:
            self._connection = adbc.connect(libpq_url(self.url), autocommit=True)
        except Exception as error:  # noqa: BLE001 - one readable line for any connect failure
            message = one_line(error, self.url)
            raise LiveStoreError(
                f"cannot connect to the live store {display_url(self.url)}: {message}"
            ) from None
        cursor = self._cursor = self._connection.cursor()
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        if self._snapshot is not None:  # before any query of the transaction
            cursor.execute(f"SET TRANSACTION SNAPSHOT '{self._snapshot}'")
        # The first statement fixes the snapshot every later COPY reads.
        cursor.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema()"
        )
        return {row[0] for row in cursor.fetchall()}

    def _select(
        self, name: str, where: str = "", table: str | None = None
    ) -> Iterator[pl.DataFrame]:
        """``table``: read that partition of ``name`` instead of the whole table."""
        contract = SNAPSHOT_SCHEMAS[name]
        target = arrow_schema(contract)
        source = table or name
        self._idle().execute(f"SELECT {', '.join(contract)} FROM {source} {where}")  # noqa: S608

        def frame(batches: list[pa.RecordBatch]) -> pl.DataFrame:
            # The driver types bigint/timestamp/varchar/boolean as the contract's Arrow types;
            # the cast drops its per-field metadata and fails loudly on any drift.
            table = pa.Table.from_batches(batches).cast(target) if batches else target.empty_table()
            result = pl.from_arrow(table)
            assert isinstance(result, pl.DataFrame)
            return result

        yield from self._frames(name, frame)


class _SqlAlchemyReader(_Reader):
    """Any SQLAlchemy URL: one transaction (PostgreSQL: REPEATABLE READ, READ ONLY)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: Any = None
        self._connection: Any = None
        self.backend = "unknown"

    def _where(self) -> str:
        return display_url(self.url)

    def _begin(self) -> set[str]:
        from sqlalchemy import inspect

        self._engine = engine_for(self.url)
        self.backend = self._engine.dialect.name
        connection = self._engine.connect()
        if self.backend == "postgresql":
            connection = connection.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
        self._connection = connection
        connection.begin()
        if self.backend == "sqlite":  # pysqlite only BEGINs before DML: do it explicitly
            connection.exec_driver_sql("BEGIN")
        return set(inspect(connection).get_table_names())

    def iter_table(self, name: str) -> Iterator[pl.DataFrame]:
        from sqlalchemy import select

        table = schema.metadata.tables[name]
        contract = SNAPSHOT_SCHEMAS[name]
        query = select(*(table.c[column] for column in contract))
        frames = pl.read_database(
            query,
            connection=self._connection,
            iter_batches=True,
            batch_size=READ_CHUNK_ROWS,
            schema_overrides=contract,
        )
        rows = 0
        for frame in frames:
            rows += frame.height
            log.info("read %s: %d rows", name, rows)
            yield frame.select(pl.col(column).cast(dtype) for column, dtype in contract.items())
        if not rows:
            yield pl.DataFrame(schema=contract)

    def _close(self) -> None:
        try:
            if self._connection is not None:
                self._connection.rollback()
                self._connection.close()
        finally:
            if self._engine is not None:
                self._engine.dispose()
            self._connection = self._engine = None


def _concat(frames: Iterator[pl.DataFrame]) -> pl.DataFrame:
    parts = list(frames)
    return pl.concat(parts, rechunk=False) if len(parts) > 1 else parts[0]
