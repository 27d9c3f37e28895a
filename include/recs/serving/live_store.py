"""The live store as the read path sees it: point reads and dismissal writes over a bounded pool.

Contract (``serving/README.md`` has the reasoning):

- Connections come from one bounded pool per process (``pool_size``, no overflow) and are held
  for one request at most (``session()``), never by a thread, so a thread pool that retires
  idle threads cannot leak them. A checkout waits at most ``timeout_ms``; SQLite waits at most
  as long for a lock (``busy_timeout``), PostgreSQL as long for a statement
  (``statement_timeout``) or a lock (``lock_timeout``). Past any of them:
  ``StoreUnavailableError`` (503); so does every driver error.
- Identity: a SQLite store is ``stat``-ed at every checkout. A missing file is 503 (it is
  opened ``mode=rw``: never recreated empty); another file under the name (a new inode) drops
  every pooled connection and reopens. A dismissal is answered only if the file it committed
  to is still the store. PostgreSQL: each new connection reads its database's oid; pooled
  connections to an older database (dropped and recreated) are dropped at checkout, and a
  disconnect drops the pool. Reads retry once on a fresh connection after a disconnect.
- SQL is written once with DB-API placeholders and run on raw DB-API connections (SQLAlchemy's
  statement layer costs more than the query itself here).

``is_local``: SQLite in this process, where a query costs microseconds and the API runs reads
on the event loop; other backends go through the API's store thread pool.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from recs.errors import StoreUnavailableError, UnknownUserError
from recs.serving.metrics import STORE_ERRORS, STORE_RECONNECTS
from recs.store.connections import SQLITE_TIMESTAMP_FORMAT, apply_sqlite_pragmas, one_line
from recs.store.relationships import ADVISORY_LOCK_KEY, write_time_after
from recs.times import epoch_micros, naive_utc, wall_clock

log = logging.getLogger("recs.serving")

# Drop reasons of the fail-closed check, most important first (a candidate excluded for
# several is counted once, for the first); the read path adds the fail-open ones.
HARD_REASONS = ("dismissed", "blocked", "blocked_by", "muted")

LOCK_POLL_SECONDS = 0.0002
"""How often a dismissal asks again for SQLite's write lock while another writer holds it."""
_SQLITE_BUSY = (sqlite3.SQLITE_BUSY, getattr(sqlite3, "SQLITE_BUSY_SNAPSHOT", 517))

API_EVENT_IDS = {"dismiss": "api:dismiss", "undismiss": "api:undismiss"}
"""The event id of a dismissal write made through the API, as the relationship version records
it (ties at the same microsecond are ordered by event id, as in ``recs.ingest``)."""


@dataclass(frozen=True, slots=True)
class Account:
    """The requesting user's account as the read path needs it (live store, naive UTC).

    ``following`` is the number of active follows counted up to the cap the caller passed
    (so ``following == cap`` means "at least cap")."""

    user_id: int
    created_at: dt.datetime
    account_status: str
    is_discoverable: bool
    following: int


class LiveStore:
    """Point queries and dismissal writes against the live store (module docstring: contract).

    ``url`` is any SQLAlchemy URL of the live store (``recs.store.engine_for``);
    ``timeout_ms`` bounds every wait (0: no bound); ``pool_size`` is the most connections this
    process holds (the API sizes it to its store concurrency)."""

    def __init__(self, url: str, *, timeout_ms: int = 2000, pool_size: int = 8) -> None:
        from sqlalchemy import event
        from sqlalchemy.exc import SQLAlchemyError

        from recs.store.connections import engine_for, sqlite_path

        self.url = url
        path = sqlite_path(url)
        self.is_local = path is not None and path not in ("", ":memory:")
        self.pool_size = max(int(pool_size), 1)
        self._timeout_ms = int(timeout_ms)
        self._file: Path | None = None
        options: dict[str, Any] = {
            "pool_size": self.pool_size,
            "max_overflow": 0,
            "pool_timeout": self._timeout_ms / 1000 if self._timeout_ms else 3600.0,
        }
        if self.is_local:
            self._file = Path(path).expanduser().resolve()
            engine_url = f"sqlite:///file:{quote(str(self._file))}?mode=rw&uri=true"
        else:
            engine_url = url
            if url.startswith(("postgresql", "postgres:")) and self._timeout_ms:
                seconds = max(2, -(-self._timeout_ms // 1000))  # libpq's minimum is 2 s
                options["connect_args"] = {
                    "connect_timeout": seconds,
                    "options": f"-c statement_timeout={self._timeout_ms} "
                    f"-c lock_timeout={self._timeout_ms}",
                }
        self._engine = engine_for(engine_url, **options)
        self._dialect = self._engine.dialect.name
        event.listen(self._engine, "connect", self._on_connect)
        dbapi = self._engine.dialect.dbapi
        self._errors: tuple[type[BaseException], ...] = (SQLAlchemyError, OSError)
        if dbapi is not None:
            self._errors = (dbapi.Error, *self._errors)
        self._ph = "?" if self._engine.dialect.paramstyle == "qmark" else "%s"
        self._text_timestamps = self._dialect == "sqlite"
        self._local = threading.local()
        self._pg_identity: Any = None
        self._identity_lock = threading.Lock()
        self._group = _GroupCommit(self._commit)

    # -- connections ------------------------------------------------------------------------
    def _on_connect(self, dbapi_connection, record) -> None:
        cursor = dbapi_connection.cursor()
        if self._dialect == "sqlite":
            apply_sqlite_pragmas(cursor, "read_api", busy_timeout=self._timeout_ms)
            record.info["identity"] = self._file_identity()
        else:
            cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
            (oid,) = cursor.fetchone()
            dbapi_connection.rollback()
            record.info["identity"] = oid
            with self._identity_lock:
                if self._pg_identity is not None and self._pg_identity != oid:
                    STORE_RECONNECTS.labels("replaced").inc()
                    log.warning("live store database was recreated (oid %s -> %s)",
                                self._pg_identity, oid)  # fmt: skip
                self._pg_identity = oid
        cursor.close()

    def _file_identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the SQLite file, or None if there is none."""
        try:
            info = os.stat(self._file)
        except FileNotFoundError:
            return None
        return (info.st_dev, info.st_ino)

    def _expected_identity(self, operation: str) -> Any:
        if self._file is None:
            return self._pg_identity
        identity = self._file_identity()
        if identity is None:
            STORE_ERRORS.labels(operation).inc()
            raise StoreUnavailableError(f"live store unavailable ({operation}): {self._missing()}")
        return identity

    def _missing(self) -> str:
        return (
            f"no SQLite file at {self._file} (RECS_HOME is relative to the working folder: "
            "set it, or RECS_STORE_URL, to where the live store is)"
        )

    @contextmanager
    def session(self) -> Iterator[None]:
        """Scope one request: its queries share one connection, returned to the pool at the end
        (in whatever thread the request ran). Nested sessions join the outer one."""
        local = self._local
        if getattr(local, "scoped", False):
            yield
            return
        local.scoped = True
        try:
            yield
        finally:
            local.scoped = False
            connection = getattr(local, "connection", None)
            local.connection = None
            if connection is not None:
                self._release(connection)

    def _acquire(self, operation: str):
        """The request's connection, or a new checkout (bound to the request if one is open)."""
        local = self._local
        connection = getattr(local, "connection", None)
        if connection is not None:
            return connection
        expected = self._expected_identity(operation)
        for _ in range(2):
            try:
                connection = self._engine.raw_connection()
            except self._errors as error:
                raise self._unavailable(operation, error) from None
            if expected is None or connection.info.get("identity") == expected:
                break
            # Pooled connections to a store that is no longer the store: drop them all.
            connection.invalidate()
            STORE_RECONNECTS.labels("replaced").inc()
            log.warning("live store %s was replaced: reopening", self._file or "database")
            self._engine.dispose()
            expected = self._expected_identity(operation)
        else:
            connection.invalidate()
            raise self._unavailable(operation, RuntimeError("store identity keeps changing"))
        if getattr(local, "scoped", False):
            local.connection = connection
        return connection

    def _done(self, connection) -> None:
        """End one operation's use of ``connection``: back to the pool unless a request holds it."""
        if getattr(self._local, "connection", None) is not connection:
            self._release(connection)

    def _release(self, connection) -> None:
        try:
            connection.close()  # back to the pool (rolled back)
        except Exception:  # noqa: BLE001 - a broken connection: drop it
            connection.invalidate()

    def _drop(self, connection, error: BaseException) -> bool:
        """Discard ``connection`` after ``error``; True if it was a disconnect (then every
        pooled connection is dropped too: they are likely as dead)."""
        if getattr(self._local, "connection", None) is connection:
            self._local.connection = None
        disconnect = False
        try:
            disconnect = self._engine.dialect.is_disconnect(
                error, connection.dbapi_connection, None
            )
        except Exception:  # noqa: BLE001 - the dialect cannot tell: treat as not
            pass
        try:
            connection.invalidate()
        except Exception:  # noqa: BLE001 - already broken
            pass
        if disconnect:
            STORE_RECONNECTS.labels("disconnected").inc()
            self._engine.dispose()
        return bool(disconnect)

    def _unavailable(self, operation: str, error: BaseException) -> StoreUnavailableError:
        from sqlalchemy.exc import TimeoutError as PoolTimeout

        STORE_ERRORS.labels(operation).inc()
        if isinstance(error, PoolTimeout):
            detail = (
                f"all {self.pool_size} connections busy for {self._timeout_ms} ms "
                "(RECS_API_STORE_CONNECTIONS)"
            )
        elif self._file is not None and self._file_identity() is None:
            detail = self._missing()
        else:
            detail = one_line(error, self.url, limit=300)
        return StoreUnavailableError(f"live store unavailable ({operation}): {detail}")

    def _read(self, operation: str, sql: str, params: Iterable[Any]) -> list[tuple]:
        params = tuple(params)
        for attempt in (1, 2):
            connection = self._acquire(operation)
            try:
                cursor = connection.cursor()
                try:
                    cursor.execute(sql, params)
                    rows = cursor.fetchall()
                finally:
                    cursor.close()
            except self._errors as error:
                if self._drop(connection, error) and attempt == 1:
                    continue  # a pooled connection the server had closed: once more, fresh
                raise self._unavailable(operation, error) from None
            self._done(connection)
            return rows
        raise AssertionError("unreachable")

    def _in(self, values: list[int]) -> str:
        return ", ".join([self._ph] * len(values))

    def _timestamp(self, value: Any) -> dt.datetime:
        return naive_utc(dt.datetime.fromisoformat(value) if isinstance(value, str) else value)

    def _bind_timestamp(self, value: dt.datetime) -> Any:
        # SQLAlchemy's SQLite DateTime text, so the snapshot parses it like the rest.
        return value.strftime(SQLITE_TIMESTAMP_FORMAT) if self._text_timestamps else value

    # -- reads ------------------------------------------------------------------------------
    def account(self, user_id: int, following_cap: int) -> Account | None:
        """The user's account and active-follow count (capped); None if there is no such user.
        Raises ``StoreUnavailableError``."""
        p = self._ph
        rows = self._read(
            "account",
            "SELECT created_at, account_status, is_discoverable, "
            "(SELECT count(*) FROM (SELECT 1 FROM follow_edges WHERE follower_id = "
            f"{p} AND status = 'active' LIMIT {p}) AS capped) "
            f"FROM users WHERE user_id = {p}",
            (user_id, max(int(following_cap), 1), user_id),
        )
        if not rows:
            return None
        created_at, status, discoverable, following = rows[0]
        return Account(user_id, self._timestamp(created_at), status, bool(discoverable), following)

    def hard_exclusions(self, user_id: int, ids: list[int] | None, cap: int = 0) -> dict | None:
        """``{id: reason}`` for accounts the user dismissed, blocked, is blocked by or muted
        (the first of ``HARD_REASONS`` that applies). Fail closed: raises
        ``StoreUnavailableError``.

        With ``ids=None``, all of the user's rows are fetched -- one cheap query whose result
        serves every candidate of the request -- unless there are more than ``cap``, in which
        case None is returned and the caller asks per list of ids (``IN (...)``, O(len(ids))).
        """
        p = self._ph
        if ids is None:
            rows = self._read(
                "hard_exclusions",
                "SELECT candidate_id, 'dismissed' FROM (SELECT candidate_id FROM "
                f"dismissed_candidates WHERE user_id = {p} LIMIT {p}) AS d "
                "UNION ALL SELECT blocked_id, 'blocked' FROM (SELECT blocked_id FROM blocks "
                f"WHERE blocker_id = {p} LIMIT {p}) AS b1 "
                "UNION ALL SELECT blocker_id, 'blocked_by' FROM (SELECT blocker_id FROM blocks "
                f"WHERE blocked_id = {p} LIMIT {p}) AS b2 "
                "UNION ALL SELECT muted_id, 'muted' FROM (SELECT muted_id FROM mutes "
                f"WHERE muter_id = {p} LIMIT {p}) AS m",
                [user_id, cap + 1] * 4,
            )
            if len(rows) > cap:  # possibly truncated: never guess, ask per id instead
                return None
        elif not ids:
            return {}
        else:
            marks = self._in(ids)
            rows = self._read(
                "hard_exclusions",
                f"SELECT candidate_id, 'dismissed' FROM dismissed_candidates "
                f"WHERE user_id = {p} AND candidate_id IN ({marks}) "
                f"UNION ALL SELECT blocked_id, 'blocked' FROM blocks "
                f"WHERE blocker_id = {p} AND blocked_id IN ({marks}) "
                f"UNION ALL SELECT blocker_id, 'blocked_by' FROM blocks "
                f"WHERE blocked_id = {p} AND blocker_id IN ({marks}) "
                f"UNION ALL SELECT muted_id, 'muted' FROM mutes "
                f"WHERE muter_id = {p} AND muted_id IN ({marks})",
                [user_id, *ids] * 4,
            )
        found: dict[int, str] = {}
        for other, reason in rows:
            known = found.get(other)
            if known is None or HARD_REASONS.index(reason) < HARD_REASONS.index(known):
                found[other] = reason
        return found

    def follows(self, user_id: int, ids: list[int] | None, cap: int = 0) -> dict | None:
        """``{followee_id: status}`` (``active`` or ``pending``) of the user's follows; with
        ``ids`` only those among them, with ``ids=None`` all of them unless there are more than
        ``cap`` (then None). Raises ``StoreUnavailableError``; callers fail open."""
        p = self._ph
        if ids is None:
            rows = self._read(
                "follows",
                f"SELECT followee_id, status FROM follow_edges WHERE follower_id = {p} LIMIT {p}",
                (user_id, cap + 1),
            )
            if len(rows) > cap:
                return None
        elif not ids:
            return {}
        else:
            rows = self._read(
                "follows",
                f"SELECT followee_id, status FROM follow_edges "
                f"WHERE follower_id = {p} AND followee_id IN ({self._in(ids)})",
                [user_id, *ids],
            )
        return dict(rows)

    def account_states(self, ids: list[int]) -> dict[int, tuple[str, bool]]:
        """``{id: (account_status, is_discoverable)}``; ids without an account are absent.
        Raises ``StoreUnavailableError``; callers fail open."""
        if not ids:
            return {}
        rows = self._read(
            "account_states",
            "SELECT user_id, account_status, is_discoverable FROM users "
            f"WHERE user_id IN ({self._in(ids)})",
            ids,
        )
        return {other: (status, bool(discoverable)) for other, status, discoverable in rows}

    def interests(self, user_id: int) -> list[str]:
        """The user's interest tags, sorted. Raises ``StoreUnavailableError``."""
        rows = self._read(
            "interests",
            f"SELECT tag FROM user_interests WHERE user_id = {self._ph} ORDER BY tag",
            (user_id,),
        )
        return [tag for (tag,) in rows]

    def eligible_accounts(self, user_id: int, after_id: int, limit: int) -> list[int]:
        """Up to ``limit`` account ids above ``after_id``, ascending, that the user may be shown:
        active, discoverable, not the user, not followed or requested, not blocked either way,
        not muted, not dismissed (the cold-start path's last resort). Fail closed: raises
        ``StoreUnavailableError``."""
        p = self._ph
        rows = self._read(
            "eligible_accounts",
            "SELECT u.user_id FROM users AS u "
            f"WHERE u.user_id > {p} AND u.user_id <> {p} AND u.account_status = 'active' "
            f"AND u.is_discoverable = {p} "
            "AND NOT EXISTS (SELECT 1 FROM follow_edges AS f "
            f"WHERE f.follower_id = {p} AND f.followee_id = u.user_id) "
            "AND NOT EXISTS (SELECT 1 FROM blocks AS b "
            f"WHERE b.blocker_id = {p} AND b.blocked_id = u.user_id) "
            "AND NOT EXISTS (SELECT 1 FROM blocks AS b "
            f"WHERE b.blocked_id = {p} AND b.blocker_id = u.user_id) "
            "AND NOT EXISTS (SELECT 1 FROM mutes AS m "
            f"WHERE m.muter_id = {p} AND m.muted_id = u.user_id) "
            "AND NOT EXISTS (SELECT 1 FROM dismissed_candidates AS d "
            f"WHERE d.user_id = {p} AND d.candidate_id = u.user_id) "
            f"ORDER BY u.user_id LIMIT {p}",
            (after_id, user_id, True, user_id, user_id, user_id, user_id, user_id, limit),
        )
        return [other for (other,) in rows]

    # -- writes -----------------------------------------------------------------------------
    # A dismissal is a relationship of ``recs.ingest`` (user -> candidate, relation "dismiss"):
    # it keeps the (time, id) of the last write applied to it, on its row or, once deleted, as
    # a ``relationship_tombstones`` row, and ingestion supersedes any event not newer than
    # that. An API write is such an event at the request's clock time, with event id
    # ``API_EVENT_IDS[kind]``, ordered after the version it replaces
    # (``store.relationships.write_time_after``), so the user's action always takes effect and
    # a later-arriving older event cannot undo it.

    def _write(self, operation: str, body: Callable[[Any], Any]) -> Any:
        """Run ``body(cursor)`` in a write transaction and commit it: returns what it returns,
        or raises what it raised (its own refusals: nothing of it is kept). Writes of this
        process that arrive while another transaction is committing are committed together in
        the next one (``_GroupCommit``): one lock wait and one fsync for all of them. Raises
        ``StoreUnavailableError`` for any driver error (the connection is dropped; no write of
        that transaction is kept) or if the SQLite file was replaced during the transaction."""
        return self._group.run(_Write(operation, body))

    def _commit(self, writes: list[_Write]) -> None:
        """One transaction for ``writes``, in order, each in a savepoint of its own (so one
        write's refusal, such as an unknown user, rolls back only that write); sets each
        write's ``result`` or ``error``. Every write fails with ``StoreUnavailableError`` if the
        transaction does: a driver error, or a store that is not the one it committed to."""
        operation = writes[0].operation
        try:
            connection = self._acquire(operation)
        except StoreUnavailableError as error:
            for write in writes:
                write.error = error
            return
        try:
            cursor = connection.cursor()
            try:
                self._begin_relationship_write(cursor)
                for write in writes:
                    cursor.execute("SAVEPOINT api_write")
                    try:
                        write.result = write.body(cursor)
                    except self._errors:
                        raise
                    except Exception as refusal:  # noqa: BLE001 - the write's own, re-raised
                        write.error = refusal
                        cursor.execute("ROLLBACK TO SAVEPOINT api_write")
                    cursor.execute("RELEASE SAVEPOINT api_write")
                connection.commit()
            finally:
                cursor.close()
        except self._errors as error:
            self._drop(connection, error)
            failure = self._unavailable(operation, error)
            for write in writes:
                write.error = failure
            return
        except BaseException:
            try:
                connection.rollback()
            except self._errors as error:
                self._drop(connection, error)
                raise
            self._done(connection)
            raise
        if self._file is not None and connection.info.get("identity") != self._file_identity():
            self._drop(connection, RuntimeError("replaced"))
            STORE_ERRORS.labels(operation).inc()
            failure = StoreUnavailableError(
                f"live store unavailable ({operation}): the SQLite file {self._file} was "
                "removed or replaced during the write, so it was not kept; retry"
            )
            for write in writes:
                write.error = failure
            return
        self._done(connection)

    def _begin_relationship_write(self, cursor: Any) -> None:
        """Begin the transaction the way an ingest batch does, so this read-modify-write of a
        dismissal's version never interleaves with one: SQLite ``BEGIN IMMEDIATE`` (waits up to
        the busy timeout), PostgreSQL ingestion's transaction-scoped advisory lock (waits up to
        ``lock_timeout`` = the same timeout). Past the timeout: ``StoreUnavailableError``."""
        if self._dialect == "sqlite":
            self._begin_immediate(cursor)
        else:
            cursor.execute(f"SELECT pg_advisory_xact_lock({self._ph})", (ADVISORY_LOCK_KEY,))

    def _begin_immediate(self, cursor: Any) -> None:
        """SQLite ``BEGIN IMMEDIATE``, asking for the write lock again every
        ``LOCK_POLL_SECONDS`` until ``timeout_ms`` has passed (then "database is locked": 503).

        Not SQLite's own busy handler: it sleeps 1, 2, 5, 10, 15, 20, 25 ms... between tries,
        so a write that found the lock held for one commit (an fsync, 2-4 ms on this machine)
        got it only after 3 or 8 ms, and later still behind a queue of writers. The busy
        timeout is off only for this statement."""
        deadline = time.monotonic() + self._timeout_ms / 1000
        cursor.execute("PRAGMA busy_timeout = 0")
        try:
            while True:
                try:
                    cursor.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as error:
                    busy = getattr(error, "sqlite_errorcode", None) in _SQLITE_BUSY
                    if not busy or time.monotonic() >= deadline:  # timeout 0: one try
                        raise
                time.sleep(LOCK_POLL_SECONDS)
        finally:
            cursor.execute(f"PRAGMA busy_timeout = {self._timeout_ms}")

    def _dismissal_version(
        self, cursor: Any, user_id: int, candidate_id: int
    ) -> tuple[Any, tuple[int, str] | None]:
        """``(dismissed_at or None if no row, version)`` as ingestion reads them: the row's
        ``(event_time_us, event_id)`` (None for a row without one) or, with no row, the
        tombstone's (None if there is none)."""
        p = self._ph
        cursor.execute(
            "SELECT dismissed_at, event_time_us, event_id FROM dismissed_candidates "
            f"WHERE user_id = {p} AND candidate_id = {p}",
            (user_id, candidate_id),
        )
        row = cursor.fetchone()
        if row is not None:
            return row[0], None if row[1] is None else (row[1], row[2])
        cursor.execute(
            "SELECT event_time_us, event_id FROM relationship_tombstones "
            f"WHERE relation = 'dismiss' AND source_id = {p} AND target_id = {p}",
            (user_id, candidate_id),
        )
        tombstone = cursor.fetchone()
        return None, None if tombstone is None else (tombstone[0], tombstone[1])

    def add_dismissal(
        self, user_id: int, candidate_id: int, at: dt.datetime
    ) -> tuple[bool, dt.datetime]:
        """Record that ``user_id`` dismissed ``candidate_id`` at ``at`` (naive UTC; the
        request's clock), as a ``dismiss`` event ``api:dismiss`` of the relationship (see
        above): committed before returning, with the row's version, in one transaction
        serialised with ingestion. Idempotent: returns ``(created, dismissed_at)`` --
        ``created`` False if it was already there (its original time is returned; its version
        moves to this request, as an ingested dismiss of an existing dismissal does). Raises
        ``UnknownUserError`` if either account does not exist, ``StoreUnavailableError`` if
        the write fails, waits longer than the timeout or the store was replaced under it."""
        p = self._ph
        event_id = API_EVENT_IDS["dismiss"]

        def dismiss(cursor: Any) -> tuple[bool, Any]:
            cursor.execute(
                f"SELECT user_id FROM users WHERE user_id IN ({p}, {p})", (user_id, candidate_id)
            )
            present = {row[0] for row in cursor.fetchall()}
            for who, label in ((user_id, "user"), (candidate_id, "candidate")):
                if who not in present:
                    raise UnknownUserError(f"unknown {label} {who}: not in the live store")
            dismissed_at, version = self._dismissal_version(cursor, user_id, candidate_id)
            time_us = write_time_after(epoch_micros(at), event_id, version)
            created = dismissed_at is None
            if created:
                dismissed_at = self._bind_timestamp(at)
                # ON CONFLICT: a writer outside the lock (a loader, psql) cannot make this fail.
                cursor.execute(
                    "INSERT INTO dismissed_candidates (user_id, candidate_id, dismissed_at, "
                    f"event_time_us, event_id) VALUES ({p}, {p}, {p}, {p}, {p}) "
                    "ON CONFLICT (user_id, candidate_id) DO UPDATE SET "
                    "event_time_us = excluded.event_time_us, event_id = excluded.event_id",
                    (user_id, candidate_id, dismissed_at, time_us, event_id),
                )
            else:
                cursor.execute(
                    f"UPDATE dismissed_candidates SET event_time_us = {p}, event_id = {p} "
                    f"WHERE user_id = {p} AND candidate_id = {p}",
                    (time_us, event_id, user_id, candidate_id),
                )
            return created, dismissed_at

        created, dismissed_at = self._write("add_dismissal", dismiss)
        return created, self._timestamp(dismissed_at)

    def remove_dismissal(
        self, user_id: int, candidate_id: int, at: dt.datetime | None = None
    ) -> bool:
        """Undo the dismissal at ``at`` (naive UTC; default the wall clock), as an
        ``undismiss`` event ``api:undismiss`` of the relationship (see above): the row is
        deleted and the version kept as a tombstone, in one transaction serialised with
        ingestion. True if there was a row; with none (the API answers 404) nothing is written,
        so requests naming pairs that were never dismissed (unknown users included) cannot
        grow the tombstones. Raises ``StoreUnavailableError``."""
        p = self._ph
        event_id = API_EVENT_IDS["undismiss"]
        at = wall_clock() if at is None else at

        def undismiss(cursor: Any) -> bool:
            dismissed_at, version = self._dismissal_version(cursor, user_id, candidate_id)
            if dismissed_at is None:
                return False  # nothing written
            time_us = write_time_after(epoch_micros(at), event_id, version)
            cursor.execute(
                f"DELETE FROM dismissed_candidates WHERE user_id = {p} AND candidate_id = {p}",
                (user_id, candidate_id),
            )
            cursor.execute(
                "INSERT INTO relationship_tombstones (relation, source_id, target_id, "
                f"event_time_us, event_id) VALUES ('dismiss', {p}, {p}, {p}, {p}) "
                "ON CONFLICT (relation, source_id, target_id) DO UPDATE SET "
                "event_time_us = excluded.event_time_us, event_id = excluded.event_id",
                (user_id, candidate_id, time_us, event_id),
            )
            return True

        return self._write("remove_dismissal", undismiss)

    # -- lifecycle --------------------------------------------------------------------------
    def ping(self) -> bool:
        """True if a trivial query succeeds."""
        try:
            self._read("ping", "SELECT 1", ())
        except StoreUnavailableError:
            return False
        return True

    def checked_out(self) -> int:
        """Connections in use right now (the pool's own count)."""
        return self._engine.pool.checkedout()

    def close(self) -> None:
        """Close every pooled connection and dispose of the engine."""
        self._engine.dispose()


_UNSET = object()


class _Write:
    """One write waiting for its transaction (``LiveStore._write``)."""

    __slots__ = ("operation", "body", "result", "error", "wake", "lead")

    def __init__(self, operation: str, body: Callable[[Any], Any]) -> None:
        self.operation = operation
        self.body = body
        self.result: Any = _UNSET
        self.error: BaseException | None = None
        self.wake = threading.Event()
        self.lead = False

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class _GroupCommit:
    """Group commit of one process's writes (the way databases batch commits).

    The first write to find no transaction of this process in progress leads: it commits
    every write waiting at that moment, in arrival order, in one transaction
    (``LiveStore._commit``), then passes the lead to the first write that arrived meanwhile and
    wakes the writes it committed. So a write waits at most for the transaction in progress
    and its own, however many arrive together, instead of one commit (an fsync) per write
    queued before it; the transaction's lock and fsync are shared. Every wait is bounded by
    the store's own timeouts (the leader's lock wait, its statements)."""

    def __init__(self, commit: Callable[[list[_Write]], None]) -> None:
        self._commit = commit
        self._lock = threading.Lock()
        self._waiting: list[_Write] = []
        self._busy = False

    def run(self, write: _Write) -> Any:
        with self._lock:
            self._waiting.append(write)
            write.lead = not self._busy
            self._busy = True
        if not write.lead:
            write.wake.wait()  # set by the leader: committed, or this write leads now
            if not write.lead:
                return write.outcome()
        with self._lock:
            batch, self._waiting = self._waiting, []
        try:
            self._commit(batch)
        except BaseException as error:
            for each in batch:  # the leader failed unexpectedly: so did the transaction
                if each.result is _UNSET and each.error is None:
                    each.error = error
            raise
        finally:
            with self._lock:
                if self._waiting:
                    self._waiting[0].lead = True
                    self._waiting[0].wake.set()
                else:
                    self._busy = False
            for other in batch:
                if other is not write:
                    other.wake.set()
        return write.outcome()
