"""The online read path as plain functions: batch list → read-time validation → cold start.

``who_to_follow`` answers one request. The API (``recs.api``) and ``recs recommend`` both call
it, so there is one read path. It reads only the published version ``CURRENT`` names
(``recs.published`` layout) and the live store, never a run's working files.

Flow for user ``u`` (design document, "Online Serving Layer and Cold-Start Handler"):

1. **Account** (live store): unknown → ``UnknownUserError`` (404); not ``active`` → the same.
   Cold start if the account is younger than ``cold_start_account_age_hours`` (24 h, measured
   from the *wall clock*: this is the online path; ``now`` is injected for tests) or follows
   fewer than ``cold_start_min_following`` (5) accounts (active follows, counted with a
   ``LIMIT`` so a user with 100 k follows costs the same as one with 5).
2. **Batch list**: the user's rows of the published version, best first.
3. **Read-time validation** -- the live-overlap check of design doc 004 (Twitter's
   ``getFollowOverlap``: every precomputed edge is re-checked against the live graph before it
   is served). Per request: the user's dismissals, blocks (both directions) and mutes, and the
   user's follows, each fetched whole in one query when there are at most ``FETCH_ALL_CAP``
   (otherwise asked per candidate list with ``IN (...)`` on a primary key or its reverse
   index: O(list length), never O(degree)), plus the listed candidates' account state.

   - *fail closed* (``LiveStore.hard_exclusions``): dismissed, blocked either way, muted since
     the snapshot. If this check fails the request fails with ``StoreUnavailableError``
     (503): a dismissed or blocked account is never shown. Mutes are held like blocks and
     dismissals (a user-safety signal), stricter than the issue requires.
   - *fail open* (``LiveStore.follows``, ``LiveStore.account_states``): followed or requested
     since the snapshot; suspended, deactivated, no longer discoverable or gone since. If this
     check fails the list is served without it and ``recs_api_fail_open_total{check}``
     counts it (doc 004's ``FailOpenHandler``).

   Every dropped candidate is counted in ``recs_api_dropped_candidates_total{source,
   reason}`` (doc 004's stale-edge counters). The "followed by" ids get the follow-overlap
   check itself (the user still actively follows them); stale ids are omitted and counted in
   ``recs_api_followed_by_dropped_total``. Their account state is not re-read (one more
   point query per id would double the cost of a request); the profile service that renders
   the names hides suspended accounts anyway. ``mutual_count`` stays the batch's figure and
   ``others = mutual_count - len(published ids)``.
4. **Cold start** when step 1 says so, or no version is loaded, or the user has no batch row,
   or every batch row was dropped: the popularity index of the user's interest tags (live
   ``user_interests``; merged by in-degree), then the ``_global`` list, then the version's
   ``api_cold_start_pool`` most-followed recommendable accounts, then -- only if all of those
   are exhausted -- a scan of the live store's eligible accounts by id. Each chunk of
   candidates goes through the same validation (self is dropped too), so the list is never
   the user, anyone it follows or requested, blocked either way, muted, dismissed,
   suspended, deactivated or non-discoverable, and never empty while an eligible account
   exists. It needs no batch row for the user, nor any published version at all.

Items are renumbered ``rank = 1..n`` after filtering (the served position). Cold-start items
have ``score = None``, ``mutual_count = 0`` and no "followed by".

**Published store.** ``PublishedVersion`` decodes each shard file once into Arrow-backed NumPy
columns sorted by ``(user_id, rank)`` -- no Python object per row -- and finds a user's rows
with two binary searches (``numpy.searchsorted``: O(log n)), then converts only those <= top_k
rows. Measured on soc-Slashdot0902 (247 k rows, 16 shards): loading a version takes ~0.7 s,
the two binary searches ~2.5 µs, a user's 20 rows as tuples ~25 µs. Memory is ~70 bytes per
row per process.

**Hot swap.** ``VersionCache`` holds the loaded version. A watcher thread looks at ``CURRENT``
(and the named version's manifest inode, so a rerun that replaced a version's folder is seen)
every ``api_reload_interval_seconds``; on a change it loads and checks the new version *in the
background*, then replaces one reference. A request reads that reference once and uses only
that object, so every response comes from exactly one version, and in-flight requests finish
on the old one, which stays valid (it is in memory; the files may go) until nothing refers to
it. A version that fails to load is logged and counted, and the old one keeps serving.

**Several replicas, one version.** Each replica keeps its own in-memory copy, which is fine
up to tens of millions of rows per node. Beyond that the published rows go into a shared
key-value store (Redis, Cassandra, DynamoDB, or RocksDB replicas) keyed by
``<run_id>:<user_id>`` with the encoded list as the value, written by ``publish_run`` before the
pointer swap; the pointer itself (``CURRENT``) becomes one key in the same store, read once per
request, and a version's keys are deleted a few nights later. Only ``PublishedVersion
.batch_rows`` changes (one ``GET`` instead of a binary search); validation and cold start stay
as they are because they already read the shared live store.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

from prometheus_client import Counter, Gauge, Histogram

from recs.config import Settings
from recs.contracts import GLOBAL_TAG
from recs.errors import InvalidRequestError, StoreUnavailableError, UnknownUserError
from recs.published import MANIFEST_FILE, check_version, current_version, shard_file
from recs.sharding import shard_of
from recs.store.connections import one_line

log = logging.getLogger("recs.serving")

MAX_ID = 2**63 - 1

# --- metrics (process-wide; exported by the API's /metrics) ----------------------------------
DROPPED = Counter(
    "recs_api_dropped_candidates",
    "Candidates dropped at read time, by path (batch, cold_start) and reason.",
    ["source", "reason"],
)
FOLLOWED_BY_DROPPED = Counter(
    "recs_api_followed_by_dropped",
    "'Followed by' ids omitted at read time (the user no longer follows them).",
    ["reason"],
)
COLD_START = Counter(
    "recs_api_cold_start", "Requests answered from the cold-start path, by why.", ["reason"]
)
FAIL_OPEN = Counter(
    "recs_api_fail_open",
    "Fail-open checks skipped because the live store failed (the list was served unchecked).",
    ["check"],
)
STORE_ERRORS = Counter(
    "recs_api_store_errors", "Live-store operations that failed, by operation.", ["operation"]
)
VERSION_INFO = Gauge(
    "recs_api_published_version_info",
    "1 for the published run_id this process serves, 0 for one it served before.",
    ["run_id"],
    multiprocess_mode="liveall",
)
VERSION_SWAPS = Counter("recs_api_version_swaps", "Published versions switched to.")
VERSION_LOAD_FAILURES = Counter(
    "recs_api_version_load_failures", "Published versions that failed to load (old one kept)."
)
VERSION_LOAD_SECONDS = Histogram(
    "recs_api_version_load_seconds",
    "Seconds to load and index one published version.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)

# Drop reasons, most important first ("self" before all): a candidate excluded for several is
# counted once, for the first.
HARD_REASONS = ("dismissed", "blocked", "blocked_by", "muted")
SOFT_REASONS = ("following", "pending", "suspended", "deactivated", "not_discoverable", "gone")


Clock = Callable[[], dt.datetime]
"""A function returning now as naive UTC (``wall_clock`` in production, a fixed one in tests)."""


def wall_clock() -> dt.datetime:
    """Now as naive UTC (the project's timestamp convention)."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


# --- parsing of request values (ids: recs.auth.parse_id) ----------------------------------------
def parse_limit(text: str | int | None, settings: Settings) -> int:
    """``?limit=`` as an int in ``1 .. api_max_limit`` (default ``api_default_limit``)."""
    if text is None or text == "":
        return min(settings.api_default_limit, settings.api_max_limit)
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        stripped = str(text).strip()
        if not stripped.isascii() or not stripped.isdigit() or len(stripped) > 9:
            value = -1
        else:
            value = int(stripped)
    if not 1 <= value <= settings.api_max_limit:
        raise InvalidRequestError(
            f"invalid limit {text!r}: expected an integer between 1 and {settings.api_max_limit}"
        )
    return value


# --- the live store ------------------------------------------------------------------------------
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
    """Point queries and dismissal writes against the live store, for the read path.

    Any SQLAlchemy URL works (``recs.store.engine_for``); SQL is written once with DB-API
    placeholders and run on raw DB-API connections, one per thread, because SQLAlchemy's
    statement layer cost ~130 µs per query here against ~35 µs raw (measured on the Slashdot
    store). A SQLite file is opened ``mode=rw`` so a missing store is an error, not a new empty
    database, with ``busy_timeout = api_store_timeout_ms`` and ``synchronous = FULL`` (a
    dismissal that returned 2xx survives a power cut). Every driver error becomes
    ``StoreUnavailableError`` and discards the thread's connection; the next call reconnects.

    ``is_local``: SQLite in this process, where a query costs microseconds and the API calls
    it on the event loop; other backends go through a thread pool.
    """

    def __init__(self, url: str, *, timeout_ms: int = 2000) -> None:
        from sqlalchemy import event
        from sqlalchemy.exc import SQLAlchemyError

        from recs.store.connections import engine_for, sqlite_path

        self.url = url
        path = sqlite_path(url)
        self.is_local = path is not None and path not in ("", ":memory:")
        self._file: Path | None = None
        if self.is_local:
            absolute = self._file = Path(path).expanduser().resolve()
            engine_url = f"sqlite:///file:{quote(str(absolute))}?mode=rw&uri=true"
        else:
            engine_url = url
        self._engine = engine_for(engine_url)
        self._timeout_ms = int(timeout_ms)
        if self._engine.dialect.name == "sqlite":
            event.listen(self._engine, "connect", self._sqlite_pragmas)
        dbapi = self._engine.dialect.dbapi
        self._errors: tuple[type[BaseException], ...] = (SQLAlchemyError, OSError)
        if dbapi is not None:
            self._errors = (dbapi.Error, *self._errors)
        self._ph = "?" if self._engine.dialect.paramstyle == "qmark" else "%s"
        self._text_timestamps = self._engine.dialect.name == "sqlite"
        self._local = threading.local()
        self._connections: list[Any] = []
        self._connections_lock = threading.Lock()

    def _sqlite_pragmas(self, dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={self._timeout_ms}")
        cursor.execute("PRAGMA synchronous=FULL")
        # Point reads at random users: keep hot pages in the connection (64 MiB) and read the
        # file through a memory map (no pread per page). Measured on the Slashdot store:
        # 20-id IN lookup 80 -> 40 µs.
        cursor.execute("PRAGMA cache_size=-65536")
        cursor.execute(f"PRAGMA mmap_size={1 << 30}")
        cursor.close()

    # -- plumbing --
    def _connection(self):
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = self._engine.raw_connection()
            self._local.connection = connection
            with self._connections_lock:
                self._connections.append(connection)
        return connection

    def _discard(self) -> None:
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            with self._connections_lock:
                if connection in self._connections:
                    self._connections.remove(connection)
            try:
                connection.invalidate()
            except Exception:  # noqa: BLE001 - already broken
                pass

    @contextmanager
    def _unavailable_on_error(self, operation: str) -> Iterator[None]:
        """Turn a store failure into ``StoreUnavailableError`` (connection dropped, counted)."""
        try:
            yield
        except self._errors as error:
            self._discard()
            STORE_ERRORS.labels(operation).inc()
            if self._file is not None and not self._file.exists():
                raise StoreUnavailableError(
                    f"live store unavailable ({operation}): no SQLite file at {self._file} "
                    "(RECS_HOME is relative to the working folder: set it, or RECS_STORE_URL, "
                    "to where the live store is)"
                ) from None
            raise StoreUnavailableError(
                f"live store unavailable ({operation}): {one_line(error, limit=300)}"
            ) from None

    def _read(self, operation: str, sql: str, params: Iterable[Any]) -> list[tuple]:
        with self._unavailable_on_error(operation):
            connection = self._connection()
            cursor = connection.cursor()
            try:
                cursor.execute(sql, tuple(params))
                rows = cursor.fetchall()
            finally:
                cursor.close()
            if not self.is_local:
                connection.rollback()  # end the implicit read transaction (PostgreSQL)
            return rows

    def _in(self, values: list[int]) -> str:
        return ", ".join([self._ph] * len(values))

    def _timestamp(self, value: Any) -> dt.datetime:
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value

    def _bind_timestamp(self, value: dt.datetime) -> Any:
        # SQLAlchemy's SQLite DateTime text format, so the snapshot parses it like the rest.
        return value.strftime("%Y-%m-%d %H:%M:%S.%f") if self._text_timestamps else value

    # -- reads --
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

    # -- writes --
    # A dismissal is a relationship of ``recs.ingest`` (user -> candidate, relation "dismiss"):
    # it keeps the (time, id) of the last write applied to it, on its row or, once deleted, as
    # a ``relationship_tombstones`` row, and ingestion supersedes any event not newer than
    # that. An API write is such an event: a dismiss or undismiss at the request's clock time,
    # with event id ``API_EVENT_IDS[kind]``. It is ordered after the version it replaces: if
    # that version is not older than the request's time (an upstream producer's clock ahead
    # of ours, by at most ``ingest_max_future_seconds``), the write takes that time + 1 µs,
    # so the user's action always takes effect and a later-arriving older event cannot undo it.

    def _begin_relationship_write(self, cursor: Any) -> None:
        """Begin the transaction the way an ingest batch does, so this read-modify-write of a
        dismissal's version never interleaves with one: SQLite ``BEGIN IMMEDIATE`` (waits up to
        the busy timeout), PostgreSQL ingestion's transaction-scoped advisory lock (waits up to
        ``lock_timeout`` = the same timeout; an ingest batch of 20 k events holds either for up
        to about a second). Past the timeout: ``StoreUnavailableError`` (503)."""
        from recs.store.relationships import ADVISORY_LOCK_KEY

        if self._engine.dialect.name == "sqlite":
            cursor.execute("BEGIN IMMEDIATE")
        else:
            cursor.execute(f"SET LOCAL lock_timeout = {int(self._timeout_ms)}")
            cursor.execute(f"SELECT pg_advisory_xact_lock({self._ph})", (ADVISORY_LOCK_KEY,))

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
        the write fails or waits longer than the timeout."""
        p = self._ph
        event_id = API_EVENT_IDS["dismiss"]
        with self._unavailable_on_error("add_dismissal"):
            connection = self._connection()
            cursor = connection.cursor()
            try:
                self._begin_relationship_write(cursor)
                cursor.execute(
                    f"SELECT user_id FROM users WHERE user_id IN ({p}, {p})",
                    (user_id, candidate_id),
                )
                present = {row[0] for row in cursor.fetchall()}
                for who, label in ((user_id, "user"), (candidate_id, "candidate")):
                    if who not in present:
                        connection.rollback()
                        raise UnknownUserError(f"unknown {label} {who}: not in the live store")
                dismissed_at, version = self._dismissal_version(cursor, user_id, candidate_id)
                time_us = _after(_epoch_micros(at), event_id, version)
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
                connection.commit()
            finally:
                cursor.close()
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
        with self._unavailable_on_error("remove_dismissal"):
            connection = self._connection()
            cursor = connection.cursor()
            try:
                self._begin_relationship_write(cursor)
                dismissed_at, version = self._dismissal_version(cursor, user_id, candidate_id)
                time_us = _after(_epoch_micros(at), event_id, version)
                removed = dismissed_at is not None
                if not removed:
                    connection.rollback()
                    return False
                cursor.execute(
                    "DELETE FROM dismissed_candidates "
                    f"WHERE user_id = {p} AND candidate_id = {p}",
                    (user_id, candidate_id),
                )
                cursor.execute(
                    "INSERT INTO relationship_tombstones (relation, source_id, target_id, "
                    f"event_time_us, event_id) VALUES ('dismiss', {p}, {p}, {p}, {p}) "
                    "ON CONFLICT (relation, source_id, target_id) DO UPDATE SET "
                    "event_time_us = excluded.event_time_us, event_id = excluded.event_id",
                    (user_id, candidate_id, time_us, event_id),
                )
                connection.commit()
            finally:
                cursor.close()
        return removed

    def ping(self) -> bool:
        """True if a trivial query succeeds."""
        try:
            self._read("ping", "SELECT 1", ())
        except StoreUnavailableError:
            return False
        return True

    def close(self) -> None:
        """Close every connection this store opened and dispose of the engine."""
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            try:
                connection.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
        self._local = threading.local()
        self._engine.dispose()


API_EVENT_IDS = {"dismiss": "api:dismiss", "undismiss": "api:undismiss"}
"""The event id of a dismissal write made through the API, as the relationship version records
it (ties at the same microsecond are ordered by event id, as in ``recs.ingest``)."""


def _epoch_micros(moment: dt.datetime) -> int:
    """Naive UTC (or aware) ``moment`` as epoch microseconds, the unit of ingestion's versions."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
    return (moment - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


def _after(time_us: int, event_id: str, version: tuple[int, str] | None) -> int:
    """The time of an API write at ``time_us``: itself, or 1 µs after ``version`` if that is
    not older (``(time, id)`` order, as ingestion compares), so the write supersedes it."""
    if version is not None and (time_us, event_id) <= tuple(version):
        return version[0] + 1
    return time_us


# --- the published version ----------------------------------------------------------------------
class BatchRow(NamedTuple):
    """One published row of a user's list (``RECOMMENDATION_SCHEMA``), best first. (A named
    tuple: building 20 per request costs a third of a frozen dataclass.)"""

    candidate_id: int
    rank: int
    score: float
    mutual_count: int
    followed_by: tuple[int, ...]


class _ShardIndex:
    """One shard's rows as NumPy columns sorted by (user_id, rank); a user's rows are the
    slice between two binary searches."""

    __slots__ = (
        "user_ids",
        "candidate_ids",
        "mutual_counts",
        "scores",
        "ranks",
        "followed_offsets",
        "followed_values",
        "generated_at",
    )

    def __init__(self, path: Path) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        columns = ["user_id", "candidate_id", "mutual_count", "score", "rank", "followed_by"]
        table = pq.read_table(path, columns=[*columns, "generated_at"], memory_map=True)
        table = table.combine_chunks()
        user_ids = table.column("user_id").to_numpy()
        ranks = table.column("rank").to_numpy()
        if len(user_ids) > 1 and not _sorted_by_user_and_rank(user_ids, ranks):
            order = np.lexsort((table.column("candidate_id").to_numpy(), ranks, user_ids))
            table = table.take(pa.array(order)).combine_chunks()
            user_ids = table.column("user_id").to_numpy()
            ranks = table.column("rank").to_numpy()
        followed = table.column("followed_by").chunk(0) if table.num_rows else None
        if followed is not None and followed.null_count:
            followed = pc.if_else(pc.is_null(followed), pa.scalar([], followed.type), followed)
        self.user_ids = user_ids
        self.candidate_ids = table.column("candidate_id").to_numpy()
        self.mutual_counts = table.column("mutual_count").to_numpy()
        self.scores = table.column("score").to_numpy()
        self.ranks = ranks
        if followed is None:
            self.followed_offsets = np.zeros(1, dtype=np.int64)
            self.followed_values = np.zeros(0, dtype=np.int64)
        else:
            self.followed_offsets = followed.offsets.to_numpy()
            self.followed_values = followed.values.to_numpy()
        generated = table.column("generated_at").cast(pa.int64())
        self.generated_at = generated.to_numpy() if table.num_rows else np.zeros(0, np.int64)

    def rows(self, user_id: int) -> tuple[list[BatchRow], dt.datetime | None]:
        lo = int(self.user_ids.searchsorted(user_id, "left"))
        hi = int(self.user_ids.searchsorted(user_id, "right"))
        if lo == hi:
            return [], None
        offsets = self.followed_offsets[lo : hi + 1].tolist()
        values = self.followed_values[offsets[0] : offsets[-1]].tolist()
        base = offsets[0]
        rows = [
            BatchRow(candidate, rank, score, mutual, tuple(values[start - base : end - base]))
            for candidate, rank, score, mutual, start, end in zip(
                self.candidate_ids[lo:hi].tolist(),
                self.ranks[lo:hi].tolist(),
                self.scores[lo:hi].tolist(),
                self.mutual_counts[lo:hi].tolist(),
                offsets[:-1],
                offsets[1:],
                strict=True,
            )
        ]
        generated = _EPOCH + dt.timedelta(microseconds=int(self.generated_at[lo]))
        return rows, generated


_EPOCH = dt.datetime(1970, 1, 1)


def _sorted_by_user_and_rank(user_ids, ranks) -> bool:
    import numpy as np

    step = np.diff(user_ids)
    if (step < 0).any():
        return False
    same_user = step == 0
    return bool((np.diff(ranks)[same_user] >= 0).all())


class PublishedVersion:
    """One published version, loaded for reads (immutable once built).

    ``load`` checks the version is complete (``published.check_version``) and reads its
    manifest, popularity index and the top ``cold_start_pool`` recommendable accounts of
    ``candidate_profiles``; ``eager`` also indexes every shard now (the API: no first-request
    cost, and a swap happens only once everything is in memory), otherwise each shard is
    indexed on first use (the CLI reads one user).
    """

    def __init__(
        self, published_dir: Path, manifest: dict[str, Any], key: tuple, *, cold_start_pool: int
    ) -> None:
        self.published_dir = Path(published_dir)
        self.manifest = manifest
        self.key = key
        self.run_id: str = manifest["run_id"]
        self.snapshot_date: str | None = manifest.get("snapshot_date")
        self.shard_count = int(manifest["shard_count"])
        generated = manifest.get("generated_at")
        self.generated_at = dt.datetime.fromisoformat(generated) if generated else None
        self._shards: list[_ShardIndex | None] = [None] * self.shard_count
        self._shard_lock = threading.Lock()
        self._tag_lists: dict[str, tuple[list[int], list[int]]] = {}
        self._pool: list[int] = []
        self._merged: dict[tuple[str, ...], list[int]] = {}
        self._load_exports(cold_start_pool)

    @classmethod
    def load(
        cls, published_dir: Path, run_id: str, *, eager: bool = True, cold_start_pool: int = 10_000
    ) -> PublishedVersion:
        """Load version ``run_id``. Raises ``RunNotFoundError`` if it is missing or incomplete
        (and whatever pyarrow raises for a damaged file)."""
        published_dir = Path(published_dir)
        key = _version_key(published_dir, run_id)
        manifest = check_version(published_dir, run_id)
        version = cls(published_dir, manifest, key, cold_start_pool=cold_start_pool)
        if eager:
            for shard_id in range(version.shard_count):
                version._shard(shard_id)
        return version

    def _load_exports(self, cold_start_pool: int) -> None:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        root = self.published_dir / self.run_id
        names = {entry["path"] for entry in self.manifest.get("exports", [])}
        if "popularity_index.parquet" in names:
            table = pq.read_table(
                root / "popularity_index.parquet",
                columns=["tag", "candidate_id", "popularity_rank", "in_degree"],
            ).sort_by([("tag", "ascending"), ("popularity_rank", "ascending")])
            tags = table.column("tag").to_pylist()
            ids = table.column("candidate_id").to_pylist()
            degrees = table.column("in_degree").to_pylist()
            for tag, candidate, degree in zip(tags, ids, degrees, strict=True):
                listed = self._tag_lists.setdefault(tag, ([], []))
                listed[0].append(candidate)
                listed[1].append(degree)
        if "candidate_profiles.parquet" in names and cold_start_pool > 0:
            table = pq.read_table(
                root / "candidate_profiles.parquet",
                columns=["candidate_id", "in_degree", "is_recommendable"],
            )
            table = table.filter(pc.field("is_recommendable"))
            table = table.sort_by([("in_degree", "descending"), ("candidate_id", "ascending")])
            self._pool = table.column("candidate_id").slice(0, cold_start_pool).to_pylist()

    def _shard(self, shard_id: int) -> _ShardIndex:
        index = self._shards[shard_id]
        if index is None:
            with self._shard_lock:
                index = self._shards[shard_id]
                if index is None:
                    index = _ShardIndex(shard_file(self.published_dir, self.run_id, shard_id))
                    self._shards[shard_id] = index
        return index

    def batch_rows(self, user_id: int) -> tuple[list[BatchRow], dt.datetime | None]:
        """The user's published rows in rank order and their ``generated_at`` (naive UTC);
        ``([], None)`` if the user has none. O(log n) in the shard's row count."""
        return self._shard(shard_of(user_id, self.shard_count)).rows(user_id)

    def popular_for(self, tags: Iterable[str]) -> list[int]:
        """Cold-start order before the pool: the popularity lists of ``tags`` merged by
        in-degree (desc, then candidate_id asc, duplicates dropped), then the ``_global``
        list. Unknown tags contribute nothing. Cached per tag set."""
        key = tuple(sorted({t for t in tags if t != GLOBAL_TAG}))
        merged = self._merged.get(key)
        if merged is None:
            pairs = []
            for tag in key:
                ids, degrees = self._tag_lists.get(tag, ([], []))
                pairs.extend(zip(degrees, ids, strict=True))
            pairs.sort(key=lambda pair: (-pair[0], pair[1]))
            ordered = dict.fromkeys(candidate for _, candidate in pairs)
            ordered.update(dict.fromkeys(self._tag_lists.get(GLOBAL_TAG, ([], []))[0]))
            merged = list(ordered)
            self._merged[key] = merged
        return merged

    @property
    def pool(self) -> list[int]:
        """The most-followed recommendable accounts (``candidate_profiles``), best first."""
        return self._pool


def _version_key(published_dir: Path, run_id: str) -> tuple:
    """Identity of a version on disk: its run id and its manifest's inode and mtime, so a
    rerun that replaced the folder under the same run id counts as a new version."""
    try:
        info = os.stat(Path(published_dir) / run_id / MANIFEST_FILE)
    except OSError:
        return (run_id, None, None)
    return (run_id, info.st_ino, info.st_mtime_ns)


class VersionCache:
    """The version the service answers from, swapped without a restart (module docstring).

    ``active`` is read once per request. ``refresh()`` swaps in whatever ``CURRENT`` names if
    it differs from the active version (loading it first; the previous handle is kept so a
    rollback to it is instant). ``start()`` runs ``refresh`` every ``interval_seconds`` in a
    daemon thread; ``stop()`` ends it.
    """

    def __init__(
        self,
        published_dir: Path,
        *,
        interval_seconds: float = 0.5,
        cold_start_pool: int = 10_000,
    ) -> None:
        self.published_dir = Path(published_dir)
        self.interval_seconds = interval_seconds
        self.cold_start_pool = cold_start_pool
        self.active: PublishedVersion | None = None
        self._previous: PublishedVersion | None = None
        self._failed_key: tuple | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> bool:
        """Load and swap to the version ``CURRENT`` names if it is new; True if swapped.
        Never raises for a bad version: it is logged, counted and the old one kept."""
        with self._lock:
            run_id = current_version(self.published_dir)
            if run_id is None:
                return False
            key = _version_key(self.published_dir, run_id)
            if self.active is not None and self.active.key == key:
                return False
            if key == self._failed_key:
                return False
            if self._previous is not None and self._previous.key == key:
                loaded = self._previous
            else:
                started = time.perf_counter()
                try:
                    loaded = PublishedVersion.load(
                        self.published_dir, run_id, cold_start_pool=self.cold_start_pool
                    )
                except Exception as error:  # noqa: BLE001 - keep serving the old version
                    self._failed_key = key
                    VERSION_LOAD_FAILURES.inc()
                    log.error(
                        "cannot load published version %s (still serving %s): %s",
                        run_id,
                        self.active.run_id if self.active else "none",
                        one_line(error, limit=300),
                    )
                    return False
                VERSION_LOAD_SECONDS.observe(time.perf_counter() - started)
            old, self._previous, self.active = self.active, self.active, loaded
            self._failed_key = None
            if old is not None and old.run_id != loaded.run_id:
                VERSION_INFO.labels(old.run_id).set(0)
            VERSION_INFO.labels(loaded.run_id).set(1)
            VERSION_SWAPS.inc()
            log.warning(
                "serving published version %s (was %s)",
                loaded.run_id,
                old.run_id if old else "none",
            )
            return True

    def start(self) -> None:
        """Start the watcher thread (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="recs-version-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the watcher thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - the watcher must survive anything
                log.exception("version watcher failed; retrying")


# --- the read path --------------------------------------------------------------------------
def who_to_follow(
    user_id: int,
    limit: int,
    *,
    version: PublishedVersion | None,
    store: LiveStore,
    settings: Settings,
    now: dt.datetime,
) -> dict[str, Any]:
    """One user's who-to-follow list (module docstring: the flow and every rule).

    ``version`` is the published version to read (None: nothing loaded, cold start only);
    ``now`` is naive UTC (the wall clock in production). Returns::

        {"user_id": int, "source": "batch" | "cold_start", "run_id": str | None,
         "generated_at": "YYYY-MM-DDTHH:MM:SSZ" | None,
         "items": [{"candidate_id": int, "rank": int (1..n), "score": float | None,
                    "mutual_count": int,
                    "followed_by": {"ids": [int, ...] (<= 3), "others": int}}, ...]}

    with at most ``limit`` items. Raises ``UnknownUserError`` (not in the live store, or not an
    active account) and ``StoreUnavailableError`` (the live store failed a fail-closed check).
    """
    account = store.account(user_id, settings.cold_start_min_following)
    if account is None:
        raise UnknownUserError(f"unknown user {user_id}: not in the live store")
    if account.account_status != "active":
        raise UnknownUserError(
            f"user {user_id} is {account.account_status}: only active accounts get recommendations"
        )
    age = now - account.created_at
    if age < dt.timedelta(hours=settings.cold_start_account_age_hours):
        reason = "new_account"
    elif account.following < settings.cold_start_min_following:
        reason = "thin_graph"
    elif version is None:
        reason = "no_version"
    else:
        rows, generated_at = version.batch_rows(user_id)
        if not rows:
            reason = "no_batch_row"
        else:
            items = _validated_batch(user_id, rows, limit, store)
            if items:
                return _document(user_id, "batch", version.run_id, generated_at, items)
            reason = "all_dropped"
    COLD_START.labels(reason).inc()
    items = _cold_start(user_id, limit, version, store)
    return _document(
        user_id,
        "cold_start",
        version.run_id if version else None,
        version.generated_at if version else None,
        items,
    )


def _document(user_id, source, run_id, generated_at, items) -> dict[str, Any]:
    return {
        "user_id": user_id,
        "source": source,
        "run_id": run_id,
        "generated_at": generated_at.isoformat() + "Z" if generated_at else None,
        "items": items,
    }


FETCH_ALL_CAP = 64
"""Up to this many of a user's dismissals+blocks+mutes, or follows, are fetched whole once per
request (one query, ~5-15 µs); above it each list of candidates is checked with ``IN (...)``
(~1.3 µs per id on SQLite), so a user following 100 k accounts costs no more than one
following 70. On Slashdot 96 % of users follow at most 64 accounts."""


class _LiveCheck:
    """Read-time validation of one request's candidates against the live store.

    Built once per request: fetches the user's hard exclusions (fail closed) and follows (fail
    open) whole when they are small; ``drops(ids)`` then returns ``{id: reason}`` for a list
    of candidates, asking the store only for what it does not already hold (the accounts'
    current state, plus the exclusions of heavy users by ``IN``)."""

    __slots__ = ("user_id", "store", "hard_all", "follows_all", "soft_ok")

    def __init__(self, user_id: int, store: LiveStore) -> None:
        self.user_id = user_id
        self.store = store
        self.hard_all = store.hard_exclusions(user_id, None, FETCH_ALL_CAP)  # fail closed
        self.soft_ok = True
        self.follows_all = None
        try:
            self.follows_all = store.follows(user_id, None, FETCH_ALL_CAP)
        except StoreUnavailableError as error:
            self._fail_open(error)

    def _fail_open(self, error: StoreUnavailableError) -> None:
        FAIL_OPEN.labels("follows_and_accounts").inc()
        log.warning("serving without follow/account checks: %s", error)
        self.soft_ok = False

    def drops(self, ids: list[int], extra_follows: list[int] = ()) -> tuple[dict, dict | None]:
        """``({candidate: reason}, follows)``: why each dropped candidate of ``ids`` must not
        be shown now (the first applicable of self, ``HARD_REASONS``, ``SOFT_REASONS``), and
        the user's follow status of ``ids`` + ``extra_follows`` (None if that check failed
        open). Raises ``StoreUnavailableError`` if the fail-closed check fails."""
        hard = self.hard_all
        if hard is None:
            hard = self.store.hard_exclusions(self.user_id, ids)
        follows = self.follows_all
        accounts = None
        if self.soft_ok:
            try:
                if follows is None:
                    follows = self.store.follows(self.user_id, [*ids, *extra_follows])
                accounts = self.store.account_states(ids)
            except StoreUnavailableError as error:
                self._fail_open(error)
                follows = None
        dropped = {}
        for candidate in ids:
            reason = _drop_reason(self.user_id, candidate, hard, follows, accounts)
            if reason is not None:
                dropped[candidate] = reason
        return dropped, follows


def _drop_reason(
    user_id: int,
    candidate: int,
    hard: dict[int, str],
    follows: dict[int, str] | None,
    accounts: dict[int, tuple[str, bool]] | None,
) -> str | None:
    """Why ``candidate`` must not be shown to ``user_id`` now, or None. ``follows`` or
    ``accounts`` None: that check failed open."""
    if candidate == user_id:
        return "self"
    reason = hard.get(candidate)
    if reason is not None:
        return reason
    if follows is not None:
        follow = follows.get(candidate)
        if follow is not None:
            return "following" if follow == "active" else "pending"
    if accounts is not None:
        state = accounts.get(candidate)
        if state is None:
            return "gone"
        status, discoverable = state
        if status != "active":
            return status
        if not discoverable:
            return "not_discoverable"
    return None


def _validated_batch(
    user_id: int, rows: list[BatchRow], limit: int, store: LiveStore
) -> list[dict[str, Any]]:
    check = _LiveCheck(user_id, store)
    candidates = [row.candidate_id for row in rows]
    mutuals = sorted({m for row in rows for m in row.followed_by})
    dropped, follows = check.drops(candidates, mutuals)
    items: list[dict[str, Any]] = []
    for row in rows:
        reason = dropped.get(row.candidate_id)
        if reason is not None:
            DROPPED.labels("batch", reason).inc()
            continue
        if len(items) >= limit:
            continue
        followed_by = list(row.followed_by)
        if follows is not None:
            followed_by = [m for m in row.followed_by if follows.get(m) == "active"]
            if len(followed_by) < len(row.followed_by):
                FOLLOWED_BY_DROPPED.labels("not_followed").inc(
                    len(row.followed_by) - len(followed_by)
                )
        items.append(
            {
                "candidate_id": row.candidate_id,
                "rank": len(items) + 1,
                "score": row.score,
                "mutual_count": row.mutual_count,
                "followed_by": {
                    "ids": followed_by,
                    "others": max(row.mutual_count - len(row.followed_by), 0),
                },
            }
        )
    return items


def _cold_start_candidates(version: PublishedVersion | None, tags: list[str]) -> Iterator[int]:
    if version is None:
        return
    seen: set[int] = set()
    for source in (version.popular_for(tags), version.pool):
        for candidate in source:
            if candidate not in seen:
                seen.add(candidate)
                yield candidate


def _cold_start(
    user_id: int, limit: int, version: PublishedVersion | None, store: LiveStore
) -> list[dict[str, Any]]:
    check = _LiveCheck(user_id, store)
    try:
        tags = store.interests(user_id)
    except StoreUnavailableError:
        FAIL_OPEN.labels("interests").inc()
        tags = []
    accepted: list[int] = []
    considered: set[int] = set()
    candidates = _cold_start_candidates(version, tags)
    while len(accepted) < limit:
        want = max(limit - len(accepted) + 8, 16)  # a few spare for the ones dropped
        chunk = list(itertools.islice(candidates, want))
        if not chunk:
            break
        considered.update(chunk)
        dropped, _ = check.drops(chunk)
        for candidate in chunk:
            reason = dropped.get(candidate)
            if reason is not None:
                DROPPED.labels("cold_start", reason).inc()
            elif len(accepted) < limit:
                accepted.append(candidate)
    after = -1
    while len(accepted) < limit:  # last resort: the live store itself (fail closed)
        page = store.eligible_accounts(user_id, after, max(4 * limit, 64))
        if not page:
            break
        accepted.extend(c for c in page if c not in considered)
        after = page[-1]
        del accepted[limit:]
    return [
        {
            "candidate_id": candidate,
            "rank": position,
            "score": None,
            "mutual_count": 0,
            "followed_by": {"ids": [], "others": 0},
        }
        for position, candidate in enumerate(accepted, start=1)
    ]


# --- dismissals ----------------------------------------------------------------------------------
def record_dismissal(
    store: LiveStore, user_id: int, candidate_id: int, now: dt.datetime
) -> dict[str, Any]:
    """Record that ``user_id`` dismissed ``candidate_id`` at ``now`` (naive UTC), committed
    before returning: from then on the candidate is dropped on every read path (the read-time
    check) and by every later batch (the snapshot's exclusions). It is a dismiss event at
    ``now`` for ingestion's last-writer-wins (``LiveStore.add_dismissal``): an ingested
    undismiss older than it is superseded.

    Returns ``{"user_id", "candidate_id", "dismissed_at" (ISO, Z), "created"}``; ``created``
    False if it was already dismissed. Raises ``InvalidRequestError`` for dismissing oneself,
    ``UnknownUserError`` for an unknown user or candidate, ``StoreUnavailableError``.
    """
    if user_id == candidate_id:
        raise InvalidRequestError(f"user {user_id} cannot dismiss itself")
    created, dismissed_at = store.add_dismissal(user_id, candidate_id, now)
    return {
        "user_id": user_id,
        "candidate_id": candidate_id,
        "dismissed_at": dismissed_at.isoformat() + "Z",
        "created": created,
    }


def remove_dismissal(
    store: LiveStore, user_id: int, candidate_id: int, now: dt.datetime | None = None
) -> None:
    """Undo a dismissal at ``now`` (naive UTC; default the wall clock): an undismiss event
    for ingestion's last-writer-wins (``LiveStore.remove_dismissal``). Raises
    ``DismissalNotFoundError`` if there was none (the undismissal is still recorded),
    ``StoreUnavailableError`` if the store failed."""
    from recs.errors import DismissalNotFoundError

    if not store.remove_dismissal(user_id, candidate_id, now):
        raise DismissalNotFoundError(f"user {user_id} has not dismissed {candidate_id}")


def load_current(settings: Settings, *, eager: bool = False) -> PublishedVersion | None:
    """The version ``CURRENT`` names, loaded (lazily by default: for one-off reads such as
    ``recs recommend``), or None if nothing is published. Raises ``RunNotFoundError`` if
    ``CURRENT`` names a missing or incomplete version."""
    run_id = current_version(settings.published_dir)
    if run_id is None:
        return None
    return PublishedVersion.load(
        settings.published_dir, run_id, eager=eager, cold_start_pool=settings.api_cold_start_pool
    )
