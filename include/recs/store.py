"""The live graph store: schema and connection (SQLite in WAL mode by default, any SQLAlchemy URL).

Tables follow the design document's data model (``users``, ``follow_edges``,
``dismissed_candidates``) plus the relationship state the pruning step needs (``blocks``,
``mutes``) and the interest tags the cold-start path ranks by (``user_interests``).

``follow_edges`` has its primary key on ``(follower_id, followee_id)`` (the forward index: one
user's follows are contiguous) and an index on ``(followee_id, follower_id)`` (the reverse index
of the design, serving "who follows X", hub detection and popularity).

Timestamps are stored as timezone-naive UTC ``DATETIME`` (ISO text in SQLite).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Engine,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    create_engine,
    event,
)

metadata = MetaData()

ACCOUNT_STATUSES = ("active", "suspended", "deactivated")
FOLLOW_STATUSES = ("active", "pending")

users = Table(
    "users",
    metadata,
    Column("user_id", BigInteger, primary_key=True, autoincrement=False),
    Column("created_at", DateTime, nullable=False),
    Column("last_active_at", DateTime, nullable=True),
    Column("account_status", String(16), nullable=False, server_default="active"),
    Column("is_discoverable", Boolean, nullable=False, server_default="1"),
    Column("is_private", Boolean, nullable=False, server_default="0"),
    CheckConstraint(
        "account_status in ('active', 'suspended', 'deactivated')", name="ck_users_status"
    ),
    CheckConstraint("user_id >= 0", name="ck_users_id"),
)

follow_edges = Table(
    "follow_edges",
    metadata,
    Column("follower_id", BigInteger, nullable=False),
    Column("followee_id", BigInteger, nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("status", String(8), nullable=False, server_default="active"),
    PrimaryKeyConstraint("follower_id", "followee_id", name="pk_follow_edges"),
    CheckConstraint("status in ('active', 'pending')", name="ck_follow_edges_status"),
    CheckConstraint("follower_id <> followee_id", name="ck_follow_edges_no_self"),
)
Index("ix_follow_edges_reverse", follow_edges.c.followee_id, follow_edges.c.follower_id)


def _pair_table(name: str, left: str, right: str, at: str) -> Table:
    table = Table(
        name,
        metadata,
        Column(left, BigInteger, nullable=False),
        Column(right, BigInteger, nullable=False),
        Column(at, DateTime, nullable=False),
        PrimaryKeyConstraint(left, right, name=f"pk_{name}"),
    )
    Index(f"ix_{name}_reverse", table.c[right], table.c[left])
    return table


blocks = _pair_table("blocks", "blocker_id", "blocked_id", "created_at")
mutes = _pair_table("mutes", "muter_id", "muted_id", "created_at")
dismissed_candidates = _pair_table(
    "dismissed_candidates", "user_id", "candidate_id", "dismissed_at"
)

user_interests = Table(
    "user_interests",
    metadata,
    Column("user_id", BigInteger, nullable=False),
    Column("tag", String(64), nullable=False),
    PrimaryKeyConstraint("user_id", "tag", name="pk_user_interests"),
)

SNAPSHOT_TABLES = (
    "users",
    "follow_edges",
    "blocks",
    "mutes",
    "dismissed_candidates",
    "user_interests",
)


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    # WAL: readers (the nightly snapshot) never block the writer and vice versa.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def engine_for(url: str) -> Engine:
    """A SQLAlchemy engine for the live store; SQLite connections get WAL and a busy timeout."""
    engine = create_engine(url, future=True)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def create_schema(engine: Engine, *, drop_existing: bool = False) -> None:
    """Create every table and index of the live store (idempotent unless ``drop_existing``)."""
    if drop_existing:
        metadata.drop_all(engine)
    metadata.create_all(engine)


def sqlite_path(url: str) -> str | None:
    """The file path of a ``sqlite:///`` URL, or None for another backend."""
    prefix = "sqlite:///"
    return url[len(prefix) :] if url.startswith(prefix) else None
