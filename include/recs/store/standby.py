"""Where a snapshot reads the live store: the primary, or a PostgreSQL hot standby of it.

``snapshot_source(settings)`` returns ``store_url``, or ``snapshot_store_url`` once
``wait_for_standby`` has checked that it is a streaming hot standby *of* that primary (same
system identifier) and has replayed every transaction the primary had committed when the
freeze started. The batch's read load then never reaches the primary the write path uses (the
design: the write path is "never blocked, throttled, or slowed" by the batch). Why the cut-off
is a synchronously committed WAL marker, and the cut-offs that failed: ``recs/store/README.md``.
"""

from __future__ import annotations

import time
from typing import Any

from recs.config import Settings
from recs.errors import LiveStoreError
from recs.store.connections import display_url, is_postgres, libpq_url, one_line

STANDBY_POLL_SECONDS = 0.05
"""How often ``wait_for_standby`` asks the standby how far it has replayed."""


def wait_for_standby(primary_url: str, standby_url: str, timeout_seconds: float) -> dict[str, Any]:
    """Check that ``standby_url`` is a PostgreSQL hot standby *of* the primary at
    ``primary_url``, and wait until it has replayed every transaction the primary had committed
    when this was called, so a snapshot read from the standby contains every follow committed
    before the freeze started, as a read of the primary would.

    The cut-off: on the primary, a transaction that writes one WAL record and nothing else (a
    transactional ``pg_logical_emit_message``, no table touched; any role may call it at
    ``wal_level = replica``) commits with ``synchronous_commit = on``, which flushes the WAL up
    to its commit record, past the commit record of every transaction committed before it
    (even with the store's ``synchronous_commit = off``); the target is then
    ``pg_current_wal_flush_lsn()``. Flushed WAL is what streams, so a healthy standby reaches
    it in milliseconds, whatever other transactions are still open (the cut-offs that do not
    work: ``recs/store/README.md``). This is the only statement the snapshot sends the primary.

    Replication is asynchronous: the primary never waits for the standby. Returns
    ``{"target_lsn", "replayed_lsn", "waited_seconds"}`` (seconds of wall time).

    Raises ``LiveStoreError`` (one line, password masked) if either server cannot be reached or
    fails a query; if ``primary_url`` is itself in recovery; if ``standby_url`` is not in
    recovery (the primary under another URL, or a promoted former standby, which no longer
    receives follows); if its ``pg_control_system()`` system identifier differs from the
    primary's (a standby of another cluster); or if it has not replayed up to the target
    within ``timeout_seconds`` (replication stopped or far behind).
    """
    import psycopg
    from sqlalchemy.engine import make_url

    primary_shown, standby_shown = display_url(primary_url), display_url(standby_url)

    def failed(role: str, shown: str, error: Exception) -> LiveStoreError:
        return LiveStoreError(f"the {role} {shown} failed: {one_line(error, limit=300)}")

    def connect(url: str, role: str, shown: str) -> psycopg.Connection:
        while True:
            try:
                return psycopg.connect(libpq_url(url), autocommit=True, connect_timeout=10)
            except psycopg.Error as error:
                # A database created on the primary moments ago exists on the standby only
                # once its creation is replayed: retry that one error until the deadline
                # (psycopg gives no SQLSTATE for a refused connection: match its message).
                database = make_url(url).database
                missing = f'database "{database}" does not exist' in str(error)
                if missing and time.monotonic() - started <= timeout_seconds:
                    time.sleep(STANDBY_POLL_SECONDS)
                    continue
                message = one_line(error, url, limit=300)
                raise LiveStoreError(f"cannot connect to the {role} {shown}: {message}") from None

    identity = "SELECT pg_is_in_recovery(), system_identifier FROM pg_control_system()"
    started = time.monotonic()
    with connect(primary_url, "live store", primary_shown) as primary:
        try:
            in_recovery, system = primary.execute(identity).fetchone()
            if not in_recovery:
                with primary.transaction():
                    primary.execute("SET LOCAL synchronous_commit = on")
                    primary.execute(
                        "SELECT pg_logical_emit_message(true, 'recs', 'freeze_snapshot cut-off')"
                    )
                (target,) = primary.execute("SELECT pg_current_wal_flush_lsn()").fetchone()
        except psycopg.Error as error:
            raise failed("live store", primary_shown, error) from None
    if in_recovery:
        raise LiveStoreError(
            f"store_url {primary_shown} is a standby: it must name the primary the write path "
            "uses (snapshot_store_url names the standby)"
        )
    with connect(standby_url, "snapshot standby", standby_shown) as standby:
        try:
            in_recovery, standby_system = standby.execute(identity).fetchone()
            if not in_recovery:
                raise LiveStoreError(
                    f"snapshot_store_url {standby_shown} is not a standby (pg_is_in_recovery() "
                    "is false): it must name a hot standby of store_url; unset it to read "
                    "store_url itself"
                )
            if standby_system != system:
                raise LiveStoreError(
                    f"snapshot_store_url {standby_shown} is not a standby of store_url "
                    f"{primary_shown}: system identifier {standby_system} != {system}"
                )
            while True:
                replayed, caught_up = standby.execute(
                    "SELECT pg_last_wal_replay_lsn(), pg_last_wal_replay_lsn() >= %s::pg_lsn",
                    (str(target),),
                ).fetchone()
                if caught_up:
                    break
                waited = time.monotonic() - started
                if waited > timeout_seconds:
                    raise LiveStoreError(
                        f"snapshot standby {standby_shown} has replayed up to {replayed}, "
                        f"behind the primary's {target} at the freeze, after {waited:.0f} s "
                        "(RECS_SNAPSHOT_STANDBY_WAIT_SECONDS): check pg_stat_replication on the "
                        "primary"
                    )
                time.sleep(STANDBY_POLL_SECONDS)
        except psycopg.Error as error:
            raise failed("snapshot standby", standby_shown, error) from None
    return {
        "target_lsn": str(target),
        "replayed_lsn": str(replayed),
        "waited_seconds": round(time.monotonic() - started, 3),
    }


def snapshot_source(settings: Settings) -> tuple[str, dict[str, Any] | None]:
    """Where ``freeze_snapshot`` reads: ``(url, standby)``. ``store_url`` itself, with
    ``standby`` None, unless ``snapshot_store_url`` is set; then that URL, after
    ``wait_for_standby`` (its result is ``standby``). Raises ``LiveStoreError`` if
    ``snapshot_store_url`` is not a URL, or is set while ``store_url`` is not PostgreSQL or it
    is not (a standby only exists for a PostgreSQL primary), or as ``wait_for_standby``."""
    from sqlalchemy.exc import ArgumentError

    primary, url = settings.live_store_url, settings.snapshot_store_url
    if not url:
        return primary, None
    try:
        display_url(url)
    except ArgumentError:
        raise LiveStoreError(
            "snapshot_store_url is not a database URL: expected "
            "postgresql://user:password@host:port/database (a hot standby of store_url)"
        ) from None
    if not (is_postgres(url) and is_postgres(primary)):
        raise LiveStoreError(
            "snapshot_store_url must name a PostgreSQL hot standby of a PostgreSQL store_url "
            f"(store_url: {display_url(primary)}, "
            f"snapshot_store_url: {display_url(url)})"
        )
    return url, wait_for_standby(primary, url, settings.snapshot_standby_wait_seconds)
