"""The live store's dismissal writes (``LiveStore.add_dismissal`` / ``remove_dismissal``): one
transaction per group of waiting writes (``group_commit``), SQLite's write lock asked for by
polling, the relationship version of each write (``recs.store.relationships``).

A mixin of ``live_store.LiveStore``: it uses the store's pool, identity checks and errors
(``_acquire``, ``_expected_identity``, ``_unavailable``, ...); its contract is the store's
(``live_store``'s docstring; ``serving/README.md``, "The write path").
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from recs.errors import StoreUnavailableError, UnknownUserError
from recs.serving.group_commit import Write
from recs.serving.metrics import STORE_ERRORS
from recs.store.relationships import ADVISORY_LOCK_KEY, write_time_after
from recs.times import epoch_micros, wall_clock

LOCK_POLL_SECONDS = 0.0002
"""How often a dismissal asks again for SQLite's write lock while another writer holds it."""
_SQLITE_BUSY = (sqlite3.SQLITE_BUSY, getattr(sqlite3, "SQLITE_BUSY_SNAPSHOT", 517))

API_EVENT_IDS = {"dismiss": "api:dismiss", "undismiss": "api:undismiss"}
"""The event id of a dismissal write made through the API, as the relationship version records
it (ties at the same microsecond are ordered by event id, as in ``recs.ingest``)."""


class LiveStoreWrites:
    """Dismissal writes of a ``LiveStore`` (see the module docstring)."""

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
        the next one (``group_commit.GroupCommit``): one lock wait and one fsync for all of
        them. Raises
        ``StoreUnavailableError`` for any driver error (the connection is dropped; no write of
        that transaction is kept) or if the SQLite file was replaced during the transaction."""
        return self._group.run(Write(operation, body))

    def _commit(self, writes: list[Write]) -> None:
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
