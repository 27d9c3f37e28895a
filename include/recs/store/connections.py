"""Connections to the live store: URLs, engines, and the SQLite settings of each role.

Any SQLAlchemy URL names the store; ``postgresql://`` gets the psycopg (3) driver
(``normalize_url``), a ``sqlite:///`` file is opened in WAL mode. Messages, logs and manifests
show a URL only through ``display_url`` / ``one_line`` (password masked).

**SQLite settings per role** (``SQLITE_PRAGMAS``; one home, ``sqlite_pragmas`` renders them):
``store`` is every SQLAlchemy connection (``engine_for``): WAL, so the nightly snapshot never
blocks a writer nor is blocked by one (sqlite.org/wal.html), ``synchronous = NORMAL``, a 10 s
busy timeout and foreign keys. The others are added on top by the code of that role:
``ingest`` (``recs.ingest.session``: a large page cache, rarer WAL checkpoints), ``snapshot``
(``recs.store.readers``: a read-only WAL reader), ``bulk_load`` (``recs.store.bulk``) and
``read_api`` (the read path: a dismissal that returned 2xx survives a power cut). Why each value:
``recs/store/README.md``.

**Timestamps in SQLite** are text, the way SQLAlchemy's ``DateTime`` stores them
(``YYYY-MM-DD HH:MM:SS.ffffff``, naive UTC): ``SQLITE_TIMESTAMP_FORMAT`` (Python),
``SQLITE_TIMESTAMP_FORMAT_POLARS`` and ``sqlite_timestamp_text`` for epoch microseconds.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from sqlalchemy import Engine, create_engine, event

from recs.config import normalize_url  # noqa: F401 - the rule's home: settings read it too
from recs.times import EPOCH, MICROS_PER_DAY, MICROS_PER_SECOND

BUSY_TIMEOUT_MS = 10_000

SQLITE_PRAGMAS: dict[str, tuple[tuple[str, object], ...]] = {
    "store": (
        ("journal_mode", "WAL"),
        ("synchronous", "NORMAL"),
        ("busy_timeout", BUSY_TIMEOUT_MS),
        ("foreign_keys", "ON"),
    ),
    "ingest": (("cache_size", -256 * 1024), ("wal_autocheckpoint", 10_000)),
    "snapshot": (("busy_timeout", BUSY_TIMEOUT_MS),),
    "bulk_load": (("busy_timeout", BUSY_TIMEOUT_MS), ("cache_size", -1024 * 1024), ("threads", 4)),
    "read_api": (
        ("busy_timeout", 2000),
        ("synchronous", "FULL"),
        ("cache_size", -64 * 1024),
        ("mmap_size", 1 << 30),
    ),
}
"""``PRAGMA`` settings of a SQLite connection by role, in the order they are set (a negative
``cache_size`` is KiB). ``read_api``'s ``busy_timeout`` is ``Settings.api_store_timeout_ms``."""

SQLITE_TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
"""How SQLAlchemy's SQLite ``DateTime`` stores a timestamp (``datetime.strftime``)."""
SQLITE_TIMESTAMP_FORMAT_POLARS = "%Y-%m-%d %H:%M:%S%.6f"
"""The same text as a Polars ``dt.strftime`` format (the bulk loader)."""


def sqlite_pragmas(role: str, **values: object) -> list[str]:
    """The ``PRAGMA name=value`` statements of ``role`` (``SQLITE_PRAGMAS``), in order;
    ``values`` replaces some (``busy_timeout=500``). Raises ``KeyError`` for an unknown role."""
    settings = dict(SQLITE_PRAGMAS[role])
    unknown = set(values) - set(settings)
    if unknown:
        raise KeyError(f"no such setting of role {role!r}: {sorted(unknown)}")
    settings.update(values)
    return [f"PRAGMA {name}={value}" for name, value in settings.items()]


def apply_sqlite_pragmas(cursor, role: str, **values: object) -> None:
    """Run ``sqlite_pragmas(role, **values)`` on a DB-API cursor (sqlite3 or ADBC)."""
    for statement in sqlite_pragmas(role, **values):
        cursor.execute(statement)


def _store_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    apply_sqlite_pragmas(cursor, "store")
    cursor.close()


def is_postgres(url: str) -> bool:
    """Whether ``url`` names a PostgreSQL database (any driver)."""
    return url.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres")


SECRET_QUERY_KEYS = ("password", "passfile", "sslpassword", "sslkey")
"""Query parameters of a URL that hold a secret (libpq accepts ``?password=``)."""


def display_url(url: str) -> str:
    """``url`` with its password, and any query parameter in ``SECRET_QUERY_KEYS``, replaced by
    ``***``: what messages, logs and manifests show."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    hidden = {k: "***" for k in parsed.query if k.lower() in SECRET_QUERY_KEYS}
    if hidden:
        parsed = parsed.update_query_dict(hidden)
    return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def one_line(error: BaseException, url: str | None = None, *, limit: int | None = None) -> str:
    """A driver error as one line of text (whitespace runs collapsed; the class name if it has
    no message), the password of ``url`` (if any) masked in it, cut to ``limit`` characters."""
    from sqlalchemy.engine import make_url

    message = " ".join(str(error).split()) or type(error).__name__
    parsed = make_url(url) if url else None
    secrets = [parsed.password] if parsed is not None and parsed.password else []
    if parsed is not None:
        for key, value in parsed.query.items():
            if key.lower() in SECRET_QUERY_KEYS:
                secrets += [value] if isinstance(value, str) else list(value)
    for secret in secrets:
        message = message.replace(str(secret), "***")
    return message[:limit] if limit else message


def libpq_url(url: str) -> str:
    """A PostgreSQL SQLAlchemy URL as a libpq connection URI (for psycopg and ADBC)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(normalize_url(url)).set(drivername="postgresql")
    return parsed.render_as_string(hide_password=False)


def sqlite_path(url: str) -> str | None:
    """The file path of a ``sqlite:///`` URL, or None for another backend."""
    prefix = "sqlite:///"
    return url[len(prefix) :] if url.startswith(prefix) else None


def sqlite_file(url: str) -> str | None:
    """The database file of a ``sqlite:///path`` URL; None for in-memory, URI or other stores
    (the ones the ADBC readers and the bulk loader cannot open by path)."""
    path = sqlite_path(url)
    if path is None or path in ("", ":memory:") or path.startswith("file:"):
        return None
    return path


def engine_for(url: str, **options: Any) -> Engine:
    """A SQLAlchemy engine for the live store; SQLite connections get the ``store`` role's
    settings (WAL, busy timeout). ``postgresql://`` URLs get psycopg 3 (``normalize_url``).
    ``options`` go to ``sqlalchemy.create_engine`` (pool size and timeout, ``connect_args``)."""
    engine = create_engine(normalize_url(url), **options)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _store_pragmas)
    return engine


@functools.lru_cache(maxsize=1 << 12)
def _sqlite_day(days: int) -> str:
    return (EPOCH + dt.timedelta(days=days)).date().isoformat()


def sqlite_timestamp_text(time_us: int | None) -> str | None:
    """Epoch microseconds as SQLite's timestamp text (``SQLITE_TIMESTAMP_FORMAT``), None as
    None. The date part is cached: the ingest path formats millions of event times."""
    if time_us is None:
        return None
    days, micros = divmod(time_us, MICROS_PER_DAY)
    seconds, micros = divmod(micros, MICROS_PER_SECOND)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    return f"{_sqlite_day(days)} {hours:02d}:{minutes:02d}:{seconds:02d}.{micros:06d}"


def sqlite_timestamp_array(values):
    """A ``pyarrow`` ``timestamp[us]`` array (naive UTC) as SQLite's timestamp text
    (``SQLITE_TIMESTAMP_FORMAT``, nulls kept): Arrow's cast to string writes exactly that text
    (checked against ``sqlite_timestamp_text`` by a test); a batch of one repeated time (an
    import's default) copies one formatted value, ~4x faster than formatting each."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(values) and not values.null_count:
        low, high = pc.min_max(values).values()
        if low == high:
            one = pa.array([low.as_py()], pa.timestamp("us")).cast(pa.string())
            return one.take(pa.array(np.zeros(len(values), dtype=np.int32)))
    return values.cast(pa.string())
