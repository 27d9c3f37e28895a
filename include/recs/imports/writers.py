"""The live-store side of an import: **one transaction** per import, through each backend's bulk
path, committed only after every row is in (``open_writer``).

- **SQLite**: the ADBC SQLite driver binds Arrow batches in C (``adbc_ingest``) inside one
  ``BEGIN IMMEDIATE`` transaction: a process killed part-way leaves its uncommitted pages in
  the WAL, which SQLite ignores; the store is as it was.
- **PostgreSQL**: the ADBC PostgreSQL driver, binary ``COPY ... FROM STDIN``, one transaction
  holding the writers' advisory lock (``ADVISORY_LOCK_KEY``); a dropped connection aborts it.

Per table, two ways in:

- **fresh** (the table is empty, or ``--replace`` emptied it in this transaction): the sorted
  rows go straight into the table with its secondary indexes dropped, which are rebuilt once
  at the end (faster than keeping them up to date row by row). On PostgreSQL ``follow_edges``
  also loses its primary key and the reverse-copy trigger for the load; both directions are
  copied (the reverse one sorted by followee from the staging area), then the keys rebuilt and
  the trigger restored, all inside the transaction.
- **merge** (the table has rows): the rows go into a temporary table, those whose key the table
  already holds come back as ``already_in_store`` rejects (users with ``--update-existing``
  update them instead), and the rest are inserted in one statement (PostgreSQL's triggers keep
  ``follow_edges_reverse`` in step).

Follow counts (``user_follow_counts``) change in the same transaction: rebuilt from the counts
the staging area summed (fresh) or incremented by the merged rows' (merge), so ``recs
reconcile`` finds no drift. Accounts the rows name but the store lacks are created
(``create_users``). No ``ANALYZE``: on PostgreSQL autovacuum gathers statistics once the
transaction commits (it took 13 % of a 2 M-edge import), and nothing in the import needs them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from recs.contracts import TS
from recs.errors import ImportInputError, LiveStoreError
from recs.imports.tables import CREATED_USER_DEFAULTS, ImportTable
from recs.store import schema
from recs.store.bulk import prefetched, secondary_index_ddl
from recs.store.connections import (
    apply_sqlite_pragmas,
    display_url,
    engine_for,
    is_postgres,
    libpq_url,
    one_line,
    sqlite_file,
    sqlite_timestamp_array,
)
from recs.store.relationships import ADVISORY_LOCK_KEY, PAIR_TABLES

log = logging.getLogger("recs.imports.writers")

Progress = Callable[[str], None]

PROGRESS_EVERY_ROWS = 1 << 20
"""A progress line about every this many rows written."""

POSTGRES_MAINTENANCE_WORK_MEM = "512MB"
"""``maintenance_work_mem`` of the import's transaction: the memory PostgreSQL sorts a rebuilt
primary key in (the server default, 64 MB, spills a 10 M-edge key to disk several times)."""

_RELATION_OF_TABLE = {table: relation for relation, (table, *_rest) in PAIR_TABLES.items()}
_TEMP = "recs_import"
_USERS_TEMP = "recs_import_users"


@dataclass
class Loaded:
    """What ``StoreWriter.load`` did: rows ``inserted`` (or ``updated``), and ``existing``:
    ``line_number`` plus the key of each row whose key the table already held."""

    inserted: int = 0
    updated: int = 0
    existing: pl.DataFrame | None = None


class StoreWriter:
    """One import's transaction on the live store (module docstring). ``backend`` is
    ``sqlite`` or ``postgresql``; ``url`` the store as messages show it."""

    backend: str
    temp_schema: str

    def __init__(self, url: str) -> None:
        self.url = url
        self.where = display_url(url)
        self.connection: Any = None
        self.cursor: Any = None

    # --- transaction --------------------------------------------------------------------------

    def begin(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def commit(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def rollback(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        for handle in (self.cursor, self.connection):
            if handle is not None:
                try:
                    handle.close()
                except Exception:  # noqa: BLE001 - closing after an error
                    pass
        self.cursor = self.connection = None

    def execute(self, sql: str) -> None:
        self.cursor.execute(sql)

    def scalar(self, sql: str) -> Any:
        self.cursor.execute(sql)
        row = self.cursor.fetchone()
        return row[0] if row else None

    def frame(self, sql: str) -> pl.DataFrame:
        self.cursor.execute(sql)
        frame = pl.from_arrow(self.cursor.fetch_arrow_table())
        assert isinstance(frame, pl.DataFrame)
        return frame

    # --- what both backends share ------------------------------------------------------------

    def is_empty(self, table: str) -> bool:
        return not self.scalar(f"SELECT EXISTS (SELECT 1 FROM {table})")

    def clear(self, spec: ImportTable) -> None:
        """``--replace``: empty ``spec``'s table and what is kept from its rows (follow counts,
        the relation's tombstones, users' field versions), in this transaction."""
        self._truncate(spec.table)
        if spec.table == "follow_edges":
            self.execute("DELETE FROM user_follow_counts")
        if spec.table == "users":
            self.execute("DELETE FROM user_field_versions")
        relation = _RELATION_OF_TABLE.get(spec.table)
        if relation:
            self.execute(f"DELETE FROM relationship_tombstones WHERE relation = '{relation}'")

    def _truncate(self, table: str) -> None:
        self.execute(f"DELETE FROM {table}")

    def _ingest(
        self,
        table: str,
        frames: Iterable[pl.DataFrame],
        *,
        label: str,
        progress: Progress | None,
        temporary: bool = False,
        unit: str = "rows written",
    ) -> int:
        """Append ``frames`` (store columns) to ``table`` through the bulk path; rows written.
        ``temporary``: create it as a temporary table from the first frame's schema. Progress
        lines read ``<label>: N <unit>``."""
        done = 0
        reported = 0
        created = not temporary
        for batch in prefetched(self._arrow(frame) for frame in frames):
            if not batch.num_rows and created:
                continue
            self.cursor.adbc_ingest(
                table,
                batch,
                mode="append" if created else "create",
                temporary=temporary,
            )
            created = True
            done += batch.num_rows
            if progress is not None and done - reported >= PROGRESS_EVERY_ROWS:
                progress(f"{label}: {done:,} {unit}")
                reported = done
        if progress is not None and done != reported:
            progress(f"{label}: {done:,} {unit}")
        return done

    def _arrow(self, frame: pl.DataFrame) -> pa.RecordBatch:
        table = frame.to_arrow()
        batches = table.combine_chunks().to_batches()
        if batches:
            return batches[0]
        return pa.RecordBatch.from_pylist([], schema=table.schema)

    def load(
        self,
        spec: ImportTable,
        frames: Iterator[pl.DataFrame],
        *,
        fresh: bool,
        update_existing: bool = False,
        updated_columns: tuple[str, ...] = (),
        reverse: Callable[[], Iterator[pl.DataFrame]] | None = None,
        progress: Progress | None = None,
    ) -> Loaded:
        """Write the distinct rows of ``spec`` (frames of ``line_number`` plus the table's
        columns, sorted by key) into its table: ``fresh`` straight in (module docstring), else
        merged; with ``update_existing``, a row the table holds gets the ``updated_columns``
        (the ones the input maps) and keeps its other columns (if only the key is mapped, it
        is rejected as ``already_in_store``, as without). ``reverse``: the same rows by
        reverse key (PostgreSQL ``follow_edges``)."""
        columns = [column.name for column in spec.columns]
        if fresh:
            return Loaded(inserted=self._load_fresh(spec, columns, frames, reverse, progress))
        updated = [c for c in updated_columns if c not in spec.key] if update_existing else []
        return self._merge(spec, columns, frames, updated, progress)

    def _load_fresh(self, spec, columns, frames, reverse, progress) -> int:
        drop, create = secondary_index_ddl(self.backend, [spec.table])
        for statement in drop:
            self.execute(statement)
        inserted = self._ingest(
            spec.table, (f.select(columns) for f in frames), label=spec.table, progress=progress
        )
        self._build(create, progress)
        return inserted

    def _build(self, statements: list[str], progress: Progress | None) -> None:
        started = time.perf_counter()
        for statement in statements:
            self.execute(statement)
        if statements and progress is not None:
            progress(f"built {len(statements)} index(es) in {time.perf_counter() - started:.1f} s")

    def _temp(self, name: str) -> str:
        return f"{self.temp_schema}.{name}"

    def _merge(self, spec, columns, frames, updated_columns, progress) -> Loaded:
        temp = self._temp(_TEMP)
        self.execute(f"DROP TABLE IF EXISTS {temp}")
        staged = self._ingest(
            _TEMP,
            (f.select(["line_number", *columns]) for f in frames),
            # not yet the table's: the merge below loads the new ones and, asked to, updates
            # (a newcomer read "2 rows written" of a merge that loaded 1, and of one that failed)
            label=spec.table,
            unit="rows staged to merge",
            progress=progress,
            temporary=True,
        )
        if not staged:
            return Loaded(existing=None)
        matches = " AND ".join(f"t.{k} = r.{k}" for k in spec.key)
        exists = f"EXISTS (SELECT 1 FROM {spec.table} AS t WHERE {matches})"
        names = ", ".join(columns)
        if updated_columns:  # the columns the input maps: the others keep the stored values
            updated = int(self.scalar(f"SELECT count(*) FROM {temp} AS r WHERE {exists}"))
            sets = ", ".join(f"{c} = excluded.{c}" for c in updated_columns)
            self.execute(
                f"INSERT INTO {spec.table} ({names}) SELECT {names} FROM {temp} WHERE true "
                f"ON CONFLICT ({', '.join(spec.key)}) DO UPDATE SET {sets}"
            )
            self.execute(f"DROP TABLE {temp}")
            return Loaded(inserted=staged - updated, updated=updated)
        existing = self.frame(  # whole rows: the rejects file keeps what they held
            f"SELECT r.line_number, {', '.join('r.' + c for c in columns)} "
            f"FROM {temp} AS r WHERE {exists} ORDER BY r.line_number"
        )
        if existing.height:
            self.execute(f"DELETE FROM {temp} AS r WHERE {exists}")
        self.execute(f"INSERT INTO {spec.table} ({names}) SELECT {names} FROM {temp}")
        if spec.table == "follow_edges":
            self._add_counts_from(temp)
        self.execute(f"DROP TABLE {temp}")
        return Loaded(inserted=staged - existing.height, existing=existing)

    def _add_counts_from(self, temp: str) -> None:
        """Add the active follows of ``temp`` to ``user_follow_counts``."""
        self.execute(
            "INSERT INTO user_follow_counts (user_id, follower_count, following_count) "
            "SELECT user_id, sum(followers), sum(following) FROM ("
            f"SELECT followee_id AS user_id, 1 AS followers, 0 AS following FROM {temp} "
            "WHERE status = 'active' UNION ALL "
            f"SELECT follower_id, 0, 1 FROM {temp} WHERE status = 'active'"
            ") AS edges WHERE true GROUP BY user_id "
            "ON CONFLICT (user_id) DO UPDATE SET "
            "follower_count = user_follow_counts.follower_count + excluded.follower_count, "
            "following_count = user_follow_counts.following_count + excluded.following_count"
        )

    def set_follow_counts(self, frames: Iterable[pl.DataFrame], progress: Progress | None) -> int:
        """Make ``user_follow_counts`` these counts (after a fresh load of ``follow_edges``)."""
        self.execute("DELETE FROM user_follow_counts")
        return self._ingest(
            "user_follow_counts", frames, label="user_follow_counts", progress=progress
        )

    def create_users(
        self, frames: Iterable[pl.DataFrame], *, fresh: bool, progress: Progress | None = None
    ) -> int:
        """Create the accounts of ``frames`` (the ``users`` columns, by ``user_id``) that the
        store lacks; returns how many. ``fresh``: ``users`` was empty, all are created."""
        if fresh:
            return self._ingest("users", frames, label="users (created)", progress=progress)
        temp = self._temp(_USERS_TEMP)
        self.execute(f"DROP TABLE IF EXISTS {temp}")
        staged = self._ingest(
            _USERS_TEMP, frames, label="users (named by the rows)", progress=None, temporary=True
        )
        if not staged:
            return 0
        absent = "NOT EXISTS (SELECT 1 FROM users AS u WHERE u.user_id = r.user_id)"
        created = int(self.scalar(f"SELECT count(*) FROM {temp} AS r WHERE {absent}"))
        names = ", ".join(_USER_COLUMNS)
        if created:
            self.execute(
                f"INSERT INTO users ({names}) SELECT {names} FROM {temp} AS r WHERE {absent}"
            )
        self.execute(f"DROP TABLE {temp}")
        return created

    def add_rows(self, table: str, frames: Iterable[pl.DataFrame], progress=None) -> int:
        """Append rows known to be new (generated ones) to ``table``."""
        return self._ingest(table, frames, label=table, progress=progress)


_USER_COLUMNS = (
    "user_id",
    "created_at",
    "last_active_at",
    "account_status",
    "is_discoverable",
    "is_private",
)


def created_users_frame(summary: pl.DataFrame, default_time) -> pl.DataFrame:
    """Rows of ``users`` for accounts created by an import: ``summary`` (``user_id,
    created_at, last_active_at``) with ``CREATED_USER_DEFAULTS``; a missing ``created_at`` is
    ``default_time``."""
    return summary.select(
        pl.col("user_id"),
        pl.col("created_at").fill_null(default_time).cast(TS),
        pl.col("last_active_at").cast(TS),
        *(pl.lit(value).alias(name) for name, value in CREATED_USER_DEFAULTS.items()),
    )


class _SqliteWriter(StoreWriter):
    backend = "sqlite"
    temp_schema = "temp"

    def begin(self) -> None:
        import adbc_driver_sqlite.dbapi as adbc

        self.connection = adbc.connect(sqlite_file(self.url), autocommit=True)
        self.cursor = self.connection.cursor()
        apply_sqlite_pragmas(self.cursor, "bulk_load")
        self.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        started = time.perf_counter()
        self.execute("COMMIT")
        log.info("committed in %.1f s", time.perf_counter() - started)

    def rollback(self) -> None:
        if self.cursor is not None:
            try:
                self.execute("ROLLBACK")
            except Exception:  # noqa: BLE001 - nothing to roll back
                pass

    def _arrow(self, frame: pl.DataFrame) -> pa.RecordBatch:
        batch = super()._arrow(frame)
        columns = [
            sqlite_timestamp_array(column) if pa.types.is_timestamp(column.type) else column
            for column in batch.columns
        ]
        return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


class _PostgresWriter(StoreWriter):
    backend = "postgresql"
    temp_schema = "pg_temp"

    def begin(self) -> None:
        import adbc_driver_postgresql.dbapi as adbc

        self.connection = adbc.connect(libpq_url(self.url))  # autocommit off: one transaction
        self.cursor = self.connection.cursor()
        self.execute(f"SELECT pg_advisory_xact_lock({ADVISORY_LOCK_KEY})")
        self.execute(f"SET LOCAL maintenance_work_mem = '{POSTGRES_MAINTENANCE_WORK_MEM}'")

    def commit(self) -> None:
        self.connection.commit()

    def rollback(self) -> None:
        if self.connection is not None:
            try:
                self.connection.rollback()
            except Exception:  # noqa: BLE001 - a dropped connection rolled back already
                pass

    def _truncate(self, table: str) -> None:
        # TRUNCATE follow_edges also empties follow_edges_reverse (its truncate trigger)
        self.execute(f"TRUNCATE {table}")

    def _load_fresh(self, spec, columns, frames, reverse, progress) -> int:
        if spec.table != "follow_edges":
            return super()._load_fresh(spec, columns, frames, reverse, progress)
        keys = {
            "follow_edges": ("pk_follow_edges", "follower_id, followee_id"),
            "follow_edges_reverse": ("pk_follow_edges_reverse", "followee_id, follower_id"),
        }
        trigger = "recs_follow_edges_reverse_insert"
        self.execute(f"ALTER TABLE follow_edges DISABLE TRIGGER {trigger}")
        for table, (name, _) in keys.items():
            self.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        inserted = self._ingest(
            "follow_edges",
            (f.select(columns) for f in frames),
            label="follow_edges",
            progress=progress,
        )
        reverse_columns = ["followee_id", "follower_id", "created_at", "status"]
        copied = self._ingest(
            "follow_edges_reverse",
            (f.select(reverse_columns) for f in reverse()) if reverse else iter(()),
            label="follow_edges_reverse",
            progress=progress,
        )
        if copied != inserted:  # pragma: no cover - a staging defect, never the input's
            raise LiveStoreError(f"copied {copied:,} reverse edges for {inserted:,} edges")
        self._build(
            [
                f"ALTER TABLE {table} ADD CONSTRAINT {name} PRIMARY KEY ({columns_})"
                for table, (name, columns_) in keys.items()
            ],
            progress,
        )
        self.execute(f"ALTER TABLE follow_edges ENABLE TRIGGER {trigger}")
        return inserted


@contextmanager
def open_writer(url: str) -> Iterator[StoreWriter]:
    """A ``StoreWriter`` on the store at ``url`` with its transaction begun (the schema created
    first if missing). The caller commits; leaving the block without a commit, by an error or
    an interrupt, rolls everything back. Raises ``ImportInputError`` for a backend ``recs
    import`` has no bulk path for, ``LiveStoreError`` if the store cannot be opened."""
    path = sqlite_file(url)
    if path is not None:
        writer: StoreWriter = _SqliteWriter(url)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    elif is_postgres(url):
        writer = _PostgresWriter(url)
    else:
        raise ImportInputError(
            f"recs import writes SQLite files (sqlite:///path) and PostgreSQL stores, not "
            f"{display_url(url)}"
        )
    # The schema through SQLAlchemy first, its engine disposed of before the ADBC connection
    # opens (two SQLite libraries must not hold one file open at once: recs/store/README.md).
    engine = engine_for(url)
    try:
        if not schema.schema_is_current(engine):  # else no DDL (and no lock) to take
            schema.create_schema(engine)
    except Exception as error:  # noqa: BLE001 - unreachable store: one line, not a traceback
        raise LiveStoreError(
            f"cannot open the live store {writer.where}: {one_line(error, url, limit=300)}"
        ) from None
    finally:
        engine.dispose()
    try:
        writer.begin()
    except Exception as error:  # noqa: BLE001
        writer.close()
        raise LiveStoreError(
            f"cannot write to the live store {writer.where}: {one_line(error, url, limit=300)}"
        ) from None
    try:
        yield writer
    except BaseException:
        writer.rollback()
        raise
    finally:
        writer.close()
