"""One DB-API connection to the live store with the set-based reads and writes ingestion needs.

A batch is one transaction: ``begin`` (SQLite ``BEGIN IMMEDIATE``; PostgreSQL the relationship
writers' advisory lock, ``recs.store.relationships.ADVISORY_LOCK_KEY``), ``load_state`` (every
row and version the batch touches, in a few set queries), then ``insert_rows`` /
``delete_rows`` of the changed rows and ``commit``. SQLite key sets are one JSON array
parameter joined through ``json_each``; PostgreSQL's are arrays joined through ``unnest``,
and reads and writes are each pipelined into one round trip. Why these choices:
``recs/ingest/README.md``; measured speeds: ``bench/README.md``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recs.errors import StoreUnavailableError
from recs.store import schema
from recs.store.connections import (
    apply_sqlite_pragmas,
    display_url,
    engine_for,
    one_line,
    sqlite_path,
    sqlite_timestamp_text,
)
from recs.store.relationships import ADVISORY_LOCK_KEY, PAIR_TABLES, RELATIONS
from recs.times import from_epoch_micros

if TYPE_CHECKING:
    from recs.ingest.batch import PreparedBatch

USER_PRIVACY = {False: (None, None, None, None, False), True: (None, None, None, None, True)}
"""A user row reduced to what a relationship event reads: index 4, ``is_private``."""


USER_COLUMNS = {
    "created_at": 0,
    "last_active_at": 1,
    "status": 2,
    "is_discoverable": 3,
    "is_private": 4,
}
"""Position of each ``user_upsert`` field in a user row (``StoreSession.load_state``)."""


class StoreSession:
    """One DBAPI connection to the live store with the bulk reads and writes ingestion needs.

    SQLite: ``sqlite3`` in autocommit mode with explicit ``BEGIN IMMEDIATE`` / ``COMMIT``; key
    sets are passed as one JSON array parameter and joined through ``json_each`` (faster than a
    temporary table filled with ``executemany``). PostgreSQL: psycopg; key
    sets are array parameters joined through ``unnest``, and each write batch takes
    ``pg_advisory_xact_lock(ADVISORY_LOCK_KEY)``. Creates (or upgrades) the store's schema if a
    table or column is missing.

    Raises ``StoreUnavailableError`` (one line, the URL's password masked) if the store cannot
    be connected to: a server that is down, a bad password or database name, a SQLite file
    that cannot be opened.
    """

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        from sqlalchemy.exc import DBAPIError

        self.url = url
        path = sqlite_path(url)
        if path and not path.startswith(":memory:") and not read_only:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise StoreUnavailableError(
                    f"cannot create the folder of the live store {display_url(url)}: "
                    f"{error.strerror or error}"
                ) from None
        self.engine = engine_for(url)
        self.backend = self.engine.dialect.name
        dbapi = self.engine.dialect.loaded_dbapi
        try:
            # raw_connection raises the driver's own exception (not wrapped by SQLAlchemy).
            self._pooled = self.engine.raw_connection()
        except (dbapi.OperationalError, dbapi.InterfaceError, DBAPIError) as error:
            self.engine.dispose()
            raise StoreUnavailableError(
                f"cannot connect to the live store {display_url(url)}: "
                f"{one_line(getattr(error, 'orig', None) or error, url)}"
            ) from None
        try:
            if not read_only and not schema.schema_is_current(self.engine):
                schema.create_schema(self.engine)
        except BaseException:
            self._pooled.close()
            self.engine.dispose()
            raise
        self.connection: Any = self._pooled.driver_connection
        self.postgres = self.backend == "postgresql"
        if not self.postgres:
            self.connection.isolation_level = None  # explicit BEGIN IMMEDIATE / COMMIT
            # A 256 MiB page cache (the default 2 MB re-reads B-tree pages on every batch) and
            # a WAL checkpoint every ~40 MB instead of 4 MB (a checkpoint syncs the file).
            apply_sqlite_pragmas(self.connection, "ingest")
            if read_only:
                self.connection.execute("PRAGMA query_only=ON")
        self.cursor = self.connection.cursor()
        self._in_transaction = False
        self._pending_lock: tuple[str, Sequence[Any]] | None = None
        # SQLite write transactions begun, and the last one at whose start another connection
        # had committed since the one before (``PRAGMA data_version``): see ``quiet_since``.
        self.write_begins = 0
        self._data_version: int | None = None
        self._changed_at = 0
        self.batch_begins: list[int] = []  # write_begins of each applied batch
        self.last_batch: Any = None  # the recs.ingest.resolution.Batch applied last

    # SQL is written with '?' placeholders; psycopg wants '%s'.
    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        self.cursor.execute(self._sql(sql), params)
        return self.cursor

    def insert_rows(
        self,
        table: str,
        columns: dict[str, str],
        rows: Sequence[Sequence[Any]],
        *,
        conflict: Sequence[str] = (),
        update: str | None = None,
    ) -> None:
        """Insert ``rows`` (tuples in ``columns`` order; ``columns`` maps each name to its
        PostgreSQL type). With ``conflict`` columns, an existing row is updated: by ``update``
        (SQL over ``excluded.``) or else by setting every other column. Keys must be unique
        within ``rows``.

        SQLite: ``executemany`` (a C loop over the rows). PostgreSQL: one statement over
        ``unnest`` of one array per column, so a batch costs one round trip and the edge
        triggers fire once (``executemany`` is 5x slower: per-row statements and trigger
        calls; ``bench/README.md``).
        """
        if not rows:
            return
        names = ", ".join(columns)
        tail = ""
        if conflict:
            update = update or ", ".join(
                f"{name} = excluded.{name}" for name in columns if name not in conflict
            )
            tail = f" ON CONFLICT ({', '.join(conflict)}) DO UPDATE SET {update}"
        if self.postgres:
            arrays = [list(values) for values in zip(*rows, strict=True)]
            source = ", ".join(f"%s::{sql_type}[]" for sql_type in columns.values())
            self.cursor.execute(
                f"INSERT INTO {table} ({names}) SELECT * FROM unnest({source}){tail}",  # noqa: S608
                arrays,
            )
        else:
            marks = ", ".join("?" * len(columns))
            self.cursor.executemany(
                f"INSERT INTO {table} ({names}) VALUES ({marks}){tail}",  # noqa: S608
                rows,
            )

    def delete_rows(
        self, table: str, columns: dict[str, str], keys: Sequence[Sequence[Any]]
    ) -> None:
        """Delete the rows whose ``columns`` equal one of ``keys`` (see ``insert_rows``)."""
        if not keys:
            return
        if self.postgres:
            arrays = [list(values) for values in zip(*keys, strict=True)]
            source = ", ".join(f"%s::{sql_type}[]" for sql_type in columns.values())
            names = ", ".join(columns)
            match = " AND ".join(f"{table}.{name} = k.{name}" for name in columns)
            self.cursor.execute(
                f"DELETE FROM {table} USING unnest({source}) AS k({names}) "  # noqa: S608
                f"WHERE {match}",
                arrays,
            )
        else:
            match = " AND ".join(f"{name} = ?" for name in columns)
            self.cursor.executemany(f"DELETE FROM {table} WHERE {match}", keys)  # noqa: S608

    def begin(self, *, write: bool = True, defer_lock: bool = False) -> None:
        """Start a transaction: a write one (SQLite ``BEGIN IMMEDIATE``, PostgreSQL the
        ingestion advisory lock) or a consistent read-only one (PostgreSQL REPEATABLE READ).
        ``defer_lock``: PostgreSQL sends the lock with the first ``load_state`` (or ``commit``)
        instead of in a round trip of its own."""
        if self.postgres:
            # With the lock, SET LOCAL: no hash or merge joins, no sequential scans and no JIT
            # in this transaction. Every read here is a key set (unnest) probing a primary key.
            # Left to itself the planner merge-joins 20 k keys with the whole edge table (345
            # ms on 1 M edges, a full scan per batch, vs ~70 ms of index probes), seq-scans a
            # bookkeeping table whose statistics still say it is empty (it grows during the
            # run: quadratic), and JIT-compiles the plan (36 ms).
            lock = (
                "SELECT pg_advisory_xact_lock(?), set_config('enable_hashjoin', 'off', true), "
                "set_config('enable_mergejoin', 'off', true), "
                "set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)",
                (ADVISORY_LOCK_KEY,),
            )
            if write and defer_lock:
                self._pending_lock = lock
            elif write:
                self.execute(*lock)
            else:
                self.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        else:
            self.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            if write:
                self.write_begins += 1
                version = self.execute("PRAGMA data_version").fetchall()[0][0]
                if version != self._data_version:
                    self._changed_at = self.write_begins
                    self._data_version = version
        self._in_transaction = True

    def quiet_since(self, begin: int) -> bool:
        """SQLite: whether no other connection has committed since write transaction number
        ``begin`` of this session started (``PRAGMA data_version`` unchanged at every write
        ``begin`` after it; our own commits never change it, and while we hold the write lock
        nobody else can commit)."""
        return not self.postgres and 0 < begin and self._changed_at <= begin

    def commit(self) -> None:
        if self.postgres:
            if self._pending_lock:  # a transaction that read nothing still serialises
                self.execute(*self._pending_lock)
                self._pending_lock = None
            self.connection.commit()
        else:
            self.execute("COMMIT")
        self._in_transaction = False

    def rollback(self) -> None:
        self._pending_lock = None
        if not self._in_transaction:
            return
        self._in_transaction = False
        if self.postgres:
            self.connection.rollback()
        else:
            self.execute("ROLLBACK")

    def close(self) -> None:
        try:
            self.rollback()
        finally:
            self.cursor.close()
            self._pooled.close()
            self.engine.dispose()

    def timestamp(self, time_us: int | None) -> Any:
        """A parameter for a ``DateTime`` column: SQLite text, PostgreSQL ``datetime``."""
        if time_us is None:
            return None
        return from_epoch_micros(time_us) if self.postgres else sqlite_timestamp_text(time_us)

    # --- key sets as a FROM item ``k`` ---

    def _pairs(self, pairs: Iterable[tuple[int, int]]) -> tuple[str, list[Any]]:
        """FROM item ``k(a, b)`` over the pairs, and its parameters."""
        if self.postgres:
            left, right = [], []
            for a, b in pairs:
                left.append(a)
                right.append(b)
            return "unnest(?::bigint[], ?::bigint[]) AS k(a, b)", [left, right]
        return (
            "(SELECT value ->> 0 AS a, value ->> 1 AS b FROM json_each(?)) AS k",
            [json.dumps(list(pairs))],
        )

    def _values(self, values: Iterable[Any], sql_type: str) -> tuple[str, list[Any]]:
        """FROM item ``k(v)`` over single values (``sql_type``: bigint or text)."""
        if self.postgres:
            return f"unnest(?::{sql_type}[]) AS k(v)", [list(values)]
        return "(SELECT value AS v FROM json_each(?)) AS k", [json.dumps(list(values))]

    # --- reads of the batch's state (inside the batch transaction) ---

    def fetch_all(self, queries: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple]]:
        """Run read queries in order and return the rows of each. PostgreSQL sends them all
        in one pipeline (one round trip instead of one per query; ``bench/README.md``)."""
        if not self.postgres:
            return [self.execute(sql, params).fetchall() for sql, params in queries]
        cursors = [self.connection.cursor() for _ in queries]
        try:
            with self.connection.pipeline():
                for cursor, (sql, params) in zip(cursors, queries, strict=True):
                    cursor.execute(self._sql(sql), params)
            return [cursor.fetchall() if cursor.description else [] for cursor in cursors]
        finally:
            for cursor in cursors:
                cursor.close()

    def load_batch_state(self, prepared: PreparedBatch) -> dict[str, Any]:
        """``load_state`` of everything one prepared batch reads (its event ids, users, pairs
        and upserted users; the blocks among its users when it holds follows)."""
        return self.load_state(
            [event[1] for event in prepared.events],
            prepared.user_ids,
            prepared.pairs,
            prepared.upserted,
            blocks_among_users=bool(prepared.pairs["follow"]),
        )

    def pipeline(self) -> contextlib.AbstractContextManager:
        """PostgreSQL: queue the writes and send them in one round trip; SQLite: nothing."""
        return self.connection.pipeline() if self.postgres else contextlib.nullcontext()

    def load_state(
        self,
        event_ids: Sequence[str],
        user_ids: set[int],
        pairs: dict[str, set[tuple[int, int]]],
        upserted: set[int],
        *,
        blocks_among_users: bool,
    ) -> dict[str, Any]:
        """Everything a batch reads, in one go (``fetch_all``; after the write lock on
        PostgreSQL, which ``begin`` queued first).

        Returns ``seen`` (the ``event_ids`` already in ``ingested_events``), ``users``
        (``{user_id: [created_at, last_active_at, status, discoverable, private]}``),
        ``rows`` and ``versions`` per relation (``{(a, b): [created_at(, status)]}`` for pairs
        with a row; ``{(a, b): (time_us, event_id)}`` from the row, or from its tombstone when
        there is no row), ``field_versions`` (``{(user_id, field): (time_us, event_id)}``).
        Timestamps stay as the driver returns them: they are only ever written back unchanged.
        With ``blocks_among_users`` the block rows also include every block between two of
        ``user_ids`` (one primary-key range per user instead of a lookup per follow in both
        directions).
        """
        queries: list[tuple[str, Sequence[Any]]] = []
        if self._pending_lock:
            queries.append(self._pending_lock)
        names: list[str] = []

        def add(name: str, sql: str, params: Sequence[Any]) -> None:
            names.append(name)
            queries.append((sql, params))

        def add_keyed(name: str, values: Iterable[Any], sql_type: str, sql: str) -> None:
            """``sql`` joined with the key set ``{keys}`` (``k.v``) over ``values``."""
            keys, params = self._values(values, sql_type)
            add(name, sql.format(keys=keys), params)

        if event_ids:
            add_keyed(
                "seen",
                event_ids,
                "text",
                "SELECT e.event_id FROM {keys} CROSS JOIN ingested_events AS e "
                "WHERE e.event_id = k.v",
            )
        if user_ids:
            add_keyed(
                "users",
                user_ids,
                "bigint",
                "SELECT u.user_id, u.created_at, u.last_active_at, u.account_status, "
                "u.is_discoverable, u.is_private FROM {keys} CROSS JOIN users AS u "
                "WHERE u.user_id = k.v",
            )
        for relation, wanted in pairs.items():
            if not wanted:
                continue
            table, left, right, at = PAIR_TABLES[relation]
            source, params = self._pairs(wanted)
            status = "status" if relation == "follow" else "NULL"
            if self.postgres:
                # LATERAL ... LIMIT 1: one parameterized primary-key probe per key, whatever
                # the (possibly stale) statistics of a table growing during the run suggest.
                columns, present = "t.present, t.created_at, t.status", "t.present"
                joins = (
                    f"LEFT JOIN LATERAL (SELECT {left} AS present, {at} AS created_at, "
                    f"{status} AS status, event_time_us, event_id FROM {table} "
                    f"WHERE {left} = k.a AND {right} = k.b LIMIT 1) AS t ON true "
                    "LEFT JOIN LATERAL (SELECT source_id, event_time_us, event_id "
                    "FROM relationship_tombstones WHERE relation = ? AND source_id = k.a "
                    "AND target_id = k.b LIMIT 1) AS v ON true"
                )
            else:
                columns = f"t.{left}, t.{at}, {'t.status' if status == 'status' else 'NULL'}"
                present = f"t.{left}"
                joins = (
                    f"LEFT JOIN {table} AS t ON t.{left} = k.a AND t.{right} = k.b "
                    "LEFT JOIN relationship_tombstones AS v ON v.relation = ? "
                    "AND v.source_id = k.a AND v.target_id = k.b"
                )
            add(
                relation,
                f"SELECT k.a, k.b, {columns}, t.event_time_us, t.event_id, "  # noqa: S608
                f"v.event_time_us, v.event_id FROM {source} {joins} "
                f"WHERE {present} IS NOT NULL OR v.source_id IS NOT NULL",
                [*params, relation],
            )
        if blocks_among_users and user_ids:
            add_keyed(
                "blocks_among",
                user_ids,
                "bigint",
                "SELECT b.blocker_id, b.blocked_id, b.created_at "
                "FROM {keys} CROSS JOIN blocks AS b WHERE b.blocker_id = k.v",
            )
        if upserted:
            add_keyed(
                "fields",
                upserted,
                "bigint",
                "SELECT v.user_id, v.field, v.event_time_us, v.event_id "
                "FROM {keys} CROSS JOIN user_field_versions AS v WHERE v.user_id = k.v",
            )
        results = self.fetch_all(queries)
        if self._pending_lock:
            results = results[1:]
            self._pending_lock = None
        found = dict(zip(names, results, strict=True))
        state: dict[str, Any] = {
            "seen": {row[0] for row in found.get("seen", ())},
            "users": {
                row[0]: [row[1], row[2], row[3], bool(row[4]), bool(row[5])]
                for row in found.get("users", ())
            },
            "rows": {},
            "versions": {},
            "field_versions": {(r[0], r[1]): (r[2], r[3]) for r in found.get("fields", ())},
        }
        for relation in RELATIONS:
            rows: dict[tuple[int, int], list[Any]] = {}
            versions: dict[tuple[int, int], tuple[int, str]] = {}
            for a, b, present, created, status, row_time, row_id, dead_time, dead_id in found.get(
                relation, ()
            ):
                if present is not None:
                    rows[(a, b)] = [created, status] if relation == "follow" else [created]
                    if row_time is not None:
                        versions[(a, b)] = (row_time, row_id)
                elif dead_time is not None:
                    versions[(a, b)] = (dead_time, dead_id)
            state["rows"][relation] = rows
            state["versions"][relation] = versions
        for a, b, created in found.get("blocks_among", ()):
            if b in user_ids:
                state["rows"]["block"].setdefault((a, b), [created])
        return state
