"""The live graph store's schema: tables, indexes, the ``mutual_follows`` view, upgrades.

Tables follow the design document's data model (``users``, ``follow_edges``,
``dismissed_candidates``) plus the relationship state the pruning step needs (``blocks``,
``mutes``), the interest tags cold start ranks by (``user_interests``) and ingestion's
bookkeeping: ``user_follow_counts`` (active follows only), relationship versions
(``event_time_us``/``event_id`` on each relationship row, ``relationship_tombstones`` once it is
deleted: ``recs.store.relationships``), ``user_field_versions``, ``ingested_events``,
``quarantined_events`` and ``ingested_files``.

``follow_edges`` is keyed ``(follower_id, followee_id)`` (the forward index) with a reverse
index ``(followee_id, follower_id)``; on SQLite it and the pair tables are ``WITHOUT ROWID``
(rows stored in key order, one B-tree fewer to write). On PostgreSQL both directions are tables
hash-partitioned into ``EDGE_PARTITIONS`` (``follow_edges`` by follower,
``follow_edges_reverse`` by followee), kept identical by statement-level triggers;
``tables_for`` gives the tables of a backend.
``create_schema`` creates or upgrades a store in place. Timestamps are naive UTC ``DATETIME``
(ISO text in SQLite). Why this layout: ``recs/store/README.md``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Connection,
    DateTime,
    Engine,
    Index,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

from recs.store.relationships import RELATIONS

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


def _last_event_columns() -> list[Column]:
    """The last ingested event applied to a relationship row (NULL: loaded in bulk)."""
    return [
        Column("event_time_us", BigInteger, nullable=True),
        Column("event_id", String(128), nullable=True),
    ]


follow_edges = Table(
    "follow_edges",
    metadata,
    Column("follower_id", BigInteger, nullable=False),
    Column("followee_id", BigInteger, nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("status", String(8), nullable=False, server_default="active"),
    *_last_event_columns(),
    PrimaryKeyConstraint("follower_id", "followee_id", name="pk_follow_edges"),
    CheckConstraint("status in ('active', 'pending')", name="ck_follow_edges_status"),
    CheckConstraint("follower_id <> followee_id", name="ck_follow_edges_no_self"),
    postgresql_partition_by="HASH (follower_id)",
    sqlite_with_rowid=False,
)


def _not_postgresql(ddl, target, bind, **kw) -> bool:
    return kw["dialect"].name != "postgresql"


# On PostgreSQL the reverse direction is the partitioned table below, not a partition-local index.
Index("ix_follow_edges_reverse", follow_edges.c.followee_id, follow_edges.c.follower_id).ddl_if(
    callable_=_not_postgresql
)

EDGE_PARTITIONS = 16
"""Hash partitions of ``follow_edges`` and ``follow_edges_reverse`` on PostgreSQL."""

follow_edges_reverse = Table(
    "follow_edges_reverse",
    metadata,
    Column("followee_id", BigInteger, nullable=False),
    Column("follower_id", BigInteger, nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("status", String(8), nullable=False),
    PrimaryKeyConstraint("followee_id", "follower_id", name="pk_follow_edges_reverse"),
    postgresql_partition_by="HASH (followee_id)",
    info={"backends": ("postgresql",)},
)


def _pair_table(name: str, left: str, right: str, at: str) -> Table:
    table = Table(
        name,
        metadata,
        Column(left, BigInteger, nullable=False),
        Column(right, BigInteger, nullable=False),
        Column(at, DateTime, nullable=False),
        *_last_event_columns(),
        PrimaryKeyConstraint(left, right, name=f"pk_{name}"),
        sqlite_with_rowid=False,
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

# --- ingestion bookkeeping (recs.ingest) -------------------------------------------------------

user_follow_counts = Table(
    "user_follow_counts",
    metadata,
    Column("user_id", BigInteger, primary_key=True, autoincrement=False),
    Column("follower_count", BigInteger, nullable=False, server_default="0"),
    Column("following_count", BigInteger, nullable=False, server_default="0"),
)
"""One row per user whose counts were ever non-zero (no row means 0/0): active follows only."""

relationship_tombstones = Table(
    "relationship_tombstones",
    metadata,
    Column("relation", String(8), nullable=False),
    Column("source_id", BigInteger, nullable=False),
    Column("target_id", BigInteger, nullable=False),
    Column("event_time_us", BigInteger, nullable=False),
    Column("event_id", String(128), nullable=False),
    PrimaryKeyConstraint("relation", "source_id", "target_id", name="pk_relationship_tombstones"),
    CheckConstraint(
        f"relation in ({', '.join(map(repr, RELATIONS))})", name="ck_relationship_tombstones"
    ),
    sqlite_with_rowid=False,
)
"""The last event applied to a relationship that has no row: deleted by it (an unfollow, an
unblock, ...) or left absent (an unfollow of nothing). Source -> target is follower ->
followee, blocker -> blocked, muter -> muted, user -> dismissed candidate. While a row exists
its own ``event_time_us``/``event_id`` are the relationship's version (a tombstone left from
an earlier delete is then stale and ignored)."""

user_field_versions = Table(
    "user_field_versions",
    metadata,
    Column("user_id", BigInteger, nullable=False),
    Column("field", String(32), nullable=False),
    Column("event_time_us", BigInteger, nullable=False),
    Column("event_id", String(128), nullable=False),
    PrimaryKeyConstraint("user_id", "field", name="pk_user_field_versions"),
    sqlite_with_rowid=False,
)
"""One row per (user, attribute) set by a ``user_upsert``: last writer wins per field."""

ingested_events = Table(
    "ingested_events",
    metadata,
    Column("event_id", String(128), primary_key=True),
    Column("event_time_us", BigInteger, nullable=False),
    Column("outcome", String(16), nullable=False),
    CheckConstraint("outcome in ('applied', 'superseded')", name="ck_ingested_events_outcome"),
    sqlite_with_rowid=False,
)
"""One row per event id ever applied or found superseded: a second copy is a duplicate."""

quarantined_events = Table(
    "quarantined_events",
    metadata,
    Column("source", String(1024), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("line_number", BigInteger, nullable=False),
    Column("reason", String(512), nullable=False),
    Column("line", Text, nullable=False),
    Column("event_id", String(128), nullable=True),
    PrimaryKeyConstraint("source", "sha256", "line_number", name="pk_quarantined_events"),
)
"""One row per rejected input line: the file, its content's sha256 (as in ``ingested_files``:
join on ``source, sha256``), its 1-based line (Parquet: row) number, why, and the original text
(Parquet: the row as JSON). Line 0 stands for a file that cannot be read. A new file under an
old name (a daily ``landing/events.jsonl``) has another hash, so it never overwrites the rows
of the one before; the same bytes ingested again replace their own rows. ``sha256`` is ``''``
for rows kept from a store keyed by ``(source, line_number)`` alone (``_rekey_quarantine``)."""

ingested_files = Table(
    "ingested_files",
    metadata,
    Column("source", String(1024), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("ingested_at", DateTime, nullable=False),
    Column("read", BigInteger, nullable=False),
    Column("applied", BigInteger, nullable=False),
    Column("duplicates", BigInteger, nullable=False),
    Column("superseded", BigInteger, nullable=False),
    Column("quarantined", BigInteger, nullable=False),
    PrimaryKeyConstraint("source", "sha256", name="pk_ingested_files"),
)
"""One row per ingested file (path and content hash): when, and its counts."""

MUTUAL_FOLLOWS_VIEW = "mutual_follows"
_MUTUAL_FOLLOWS_SELECT = """
SELECT forward.follower_id AS user_id,
       forward.followee_id AS friend_id,
       CASE WHEN forward.created_at > back.created_at
            THEN forward.created_at ELSE back.created_at END AS mutual_since
FROM follow_edges AS forward
INNER JOIN follow_edges AS back
    ON back.follower_id = forward.followee_id AND back.followee_id = forward.follower_id
WHERE forward.status = 'active' AND back.status = 'active'
"""
"""One row per ordered pair (user_id, friend_id) following each other with active follows, so
a user's friends are ``WHERE user_id = ?`` (a forward primary-key range plus point lookups)."""

SNAPSHOT_TABLES = (
    "users",
    "follow_edges",
    "blocks",
    "mutes",
    "dismissed_candidates",
    "user_interests",
)


def tables_for(dialect_name: str) -> list[Table]:
    """The tables of the live store on a backend (``follow_edges_reverse``: PostgreSQL only)."""
    return [
        table
        for table in metadata.sorted_tables
        if dialect_name in table.info.get("backends", (dialect_name,))
    ]


def create_schema(engine: Engine, *, drop_existing: bool = False) -> None:
    """Create every table, index, view and (PostgreSQL) partition and trigger of the live store.

    Idempotent unless ``drop_existing``, which drops the store's tables first. A store created
    before the ingestion tables existed gets them added (empty: run ``recs reconcile --repair``
    to fill ``user_follow_counts`` from its edges); a ``quarantined_events`` keyed by
    ``(source, line_number)`` is rebuilt with the ``(source, sha256, line_number)`` key, its
    rows kept with sha256 ``''``.
    """
    dialect = engine.dialect.name
    tables = tables_for(dialect)
    with engine.begin() as connection:
        if drop_existing:
            connection.exec_driver_sql(f"DROP VIEW IF EXISTS {MUTUAL_FOLLOWS_VIEW}")
            metadata.drop_all(connection, tables=tables)
        old_quarantine = _set_aside_old_quarantine(connection)
        metadata.create_all(connection, tables=tables)
        if old_quarantine:
            _rekey_quarantine(connection, old_quarantine)
        for table, column in _missing_columns(connection):
            # A store created before the column existed: add it (every added column is
            # nullable; PostgreSQL adds it to every partition).
            column_type = column.type.compile(dialect=connection.dialect)
            connection.exec_driver_sql(
                f"ALTER TABLE {table.name} ADD COLUMN {column.name} {column_type}"
            )
        if dialect == "postgresql":
            for statement in _postgres_ddl():
                connection.exec_driver_sql(statement)
        _create_view(connection)


_OLD_QUARANTINE = "quarantined_events_unkeyed"


def _set_aside_old_quarantine(connection: Connection) -> str | None:
    """A ``quarantined_events`` keyed by ``(source, line_number)`` alone (no ``sha256``: a
    store from before files were told apart by hash) is renamed ``_OLD_QUARANTINE`` (and,
    on PostgreSQL, its primary key dropped: the name is the new table's); returns that name,
    or None if there is nothing to set aside. A primary key cannot be changed in place on
    SQLite, so the table is rebuilt the same way on both backends."""
    from sqlalchemy import inspect

    inspector = inspect(connection)
    present = set(inspector.get_table_names())
    if _OLD_QUARANTINE in present:  # an upgrade interrupted after the rename (SQLite DDL)
        return _OLD_QUARANTINE
    if "quarantined_events" not in present:
        return None
    if any(c["name"] == "sha256" for c in inspector.get_columns("quarantined_events")):
        return None
    connection.exec_driver_sql(f"ALTER TABLE quarantined_events RENAME TO {_OLD_QUARANTINE}")
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(
            f"ALTER TABLE {_OLD_QUARANTINE} DROP CONSTRAINT IF EXISTS pk_quarantined_events"
        )
    return _OLD_QUARANTINE


def _rekey_quarantine(connection: Connection, old: str) -> None:
    """Copy the rows of the set-aside quarantine table ``old`` into the new one (sha256
    ``''``: unknown) and drop it."""
    connection.exec_driver_sql(
        "INSERT INTO quarantined_events (source, sha256, line_number, reason, line, event_id) "
        f"SELECT source, '', line_number, reason, line, event_id FROM {old} "  # noqa: S608
        "WHERE true ON CONFLICT DO NOTHING"  # WHERE: SQLite would read ON as a join's
    )
    connection.exec_driver_sql(f"DROP TABLE {old}")


def _missing_columns(connection: Connection) -> list[tuple[Table, Column]]:
    from sqlalchemy import inspect

    inspector = inspect(connection)
    present = set(inspector.get_table_names())
    missing = []
    for table in tables_for(connection.dialect.name):
        if table.name not in present:
            continue
        have = {column["name"] for column in inspector.get_columns(table.name)}
        missing += [(table, column) for column in table.columns if column.name not in have]
    return missing


def schema_is_current(engine: Engine) -> bool:
    """Whether every table and column of the live store exists (else ``create_schema``)."""
    from sqlalchemy import inspect

    with engine.connect() as connection:
        present = set(inspect(connection).get_table_names())
        if any(table.name not in present for table in tables_for(engine.dialect.name)):
            return False
        if _OLD_QUARANTINE in present:
            return False
        return not _missing_columns(connection)


def _create_view(connection: Connection) -> None:
    create = (
        "CREATE OR REPLACE VIEW"
        if connection.dialect.name == "postgresql"
        else "CREATE VIEW IF NOT EXISTS"
    )
    connection.exec_driver_sql(f"{create} {MUTUAL_FOLLOWS_VIEW} AS {_MUTUAL_FOLLOWS_SELECT}")


def _postgres_ddl() -> list[str]:
    """Partitions of both edge tables and the triggers that keep the reverse copy identical.

    Statement-level ``AFTER`` triggers with transition tables: one set-based statement per
    write statement, so a bulk ``COPY`` of millions of edges costs one reverse ``INSERT``, not
    one trigger call per row (PostgreSQL 10+ allows transition tables on a partitioned table's
    statement triggers).
    """
    statements = [
        f"CREATE TABLE IF NOT EXISTS {table}_p{remainder:02d} PARTITION OF {table} "
        f"FOR VALUES WITH (MODULUS {EDGE_PARTITIONS}, REMAINDER {remainder})"
        for table in ("follow_edges", "follow_edges_reverse")
        for remainder in range(EDGE_PARTITIONS)
    ]
    bodies = {
        "insert": "INSERT INTO follow_edges_reverse (followee_id, follower_id, created_at, status)"
        " SELECT followee_id, follower_id, created_at, status FROM new_rows;",
        "delete": "DELETE FROM follow_edges_reverse AS reverse USING old_rows"
        " WHERE reverse.followee_id = old_rows.followee_id"
        " AND reverse.follower_id = old_rows.follower_id;",
    }
    bodies["update"] = bodies["delete"] + " " + bodies["insert"]
    referencing = {
        "insert": "REFERENCING NEW TABLE AS new_rows",
        "delete": "REFERENCING OLD TABLE AS old_rows",
        "update": "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
    }
    for operation, body in bodies.items():
        function = f"recs_follow_edges_reverse_{operation}"
        statements.append(
            f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN {body} RETURN NULL; END $$"
        )
        statements.append(
            f"CREATE OR REPLACE TRIGGER {function} AFTER {operation.upper()} ON follow_edges "
            f"{referencing[operation]} FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )
    statements.append(
        "CREATE OR REPLACE FUNCTION recs_follow_edges_reverse_truncate() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN TRUNCATE follow_edges_reverse; RETURN NULL; END $$"
    )
    statements.append(
        "CREATE OR REPLACE TRIGGER recs_follow_edges_reverse_truncate AFTER TRUNCATE ON "
        "follow_edges FOR EACH STATEMENT EXECUTE FUNCTION recs_follow_edges_reverse_truncate()"
    )
    return statements


FOLLOW_COUNTS_SQL = """
SELECT user_id, SUM(followers) AS follower_count, SUM(following) AS following_count
FROM (
    SELECT followee_id AS user_id, 1 AS followers, 0 AS following
    FROM follow_edges WHERE status = 'active'
    UNION ALL
    SELECT follower_id AS user_id, 0 AS followers, 1 AS following
    FROM follow_edges WHERE status = 'active'
) AS edges
GROUP BY user_id
"""
"""Follower and following counts recomputed from the edges: one row per user with any."""

REBUILD_FOLLOW_COUNTS_SQL = (
    "DELETE FROM user_follow_counts",
    "INSERT INTO user_follow_counts (user_id, follower_count, following_count) "
    + FOLLOW_COUNTS_SQL,
)
"""Statements that make ``user_follow_counts`` exactly the counts of the edges (run them in
one transaction, e.g. at the end of a bulk load)."""

