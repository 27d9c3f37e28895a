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
  disconnect drops the pool. Reads retry once on a fresh connection after a disconnect. Its
  connections are named ``recs pid N`` (libpq's ``fallback_application_name``: unless the URL,
  ``PGAPPNAME`` or a service names them), so ``pg_stat_activity`` shows which worker holds
  which.
- SQL is written once with DB-API placeholders and run on raw DB-API connections (SQLAlchemy's
  statement layer costs more than the query itself here).

``is_local``: SQLite in this process, where a query costs microseconds and the API runs reads
on the event loop; other backends go through the API's store thread pool.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from recs.errors import StoreUnavailableError
from recs.serving.group_commit import GroupCommit
from recs.serving.metrics import STORE_ERRORS, STORE_RECONNECTS
from recs.serving.writes import LiveStoreWrites
from recs.store.connections import SQLITE_TIMESTAMP_FORMAT, apply_sqlite_pragmas, one_line
from recs.times import naive_utc

log = logging.getLogger("recs.serving")

# Drop reasons of the fail-closed check, most important first (a candidate excluded for
# several is counted once, for the first); the read path adds the fail-open ones.
HARD_REASONS = ("dismissed", "blocked", "blocked_by", "muted")


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


class LiveStore(LiveStoreWrites):
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
            if url.startswith(("postgresql", "postgres:")):
                # which process holds a connection, in pg_stat_activity (a worker per pid);
                # libpq's fallback: the URL's application_name, PGAPPNAME or a service win
                arguments: dict[str, Any] = {"fallback_application_name": f"recs pid {os.getpid()}"}
                if self._timeout_ms:
                    seconds = max(2, -(-self._timeout_ms // 1000))  # libpq's minimum is 2 s
                    arguments["connect_timeout"] = seconds
                    arguments["options"] = (
                        f"-c statement_timeout={self._timeout_ms} "
                        f"-c lock_timeout={self._timeout_ms}"
                    )
                options["connect_args"] = arguments
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
        self._group = GroupCommit(self._commit)

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
