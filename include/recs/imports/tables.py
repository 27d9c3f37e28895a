"""What ``recs import`` loads: one ``ImportTable`` per table of the live store, the columns each
reads, the documented defaults, and why a row is rejected.

Light module (standard library and ``recs.store.schema``'s constants only): the CLI builds its
sub-commands and their ``--<column>-col`` options from ``IMPORT_TABLES``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Literal

DEFAULT_TIME = dt.datetime(2000, 1, 1)
"""The time (naive UTC) given to rows whose source has no time column (``created_at`` of edges,
blocks, mutes and users; ``dismissed_at`` of dismissals), and the ``created_at`` of accounts
created for ids the imported rows name when none of those rows has a time. Fixed, not the
wall clock: an import then never makes accounts look brand new (cold start) or follows look
younger than a snapshot's cut-off. ``--default-time`` changes it."""

EARLIEST_TIME = dt.datetime(1970, 1, 1)
"""Times before this are rejected (``bad_timestamp``): an unset clock or a unit mix-up."""

REJECT_REASONS: dict[str, str] = {
    "malformed_line": "a CSV/TSV line with another number of fields than the header (or the "
    "first line)",
    "missing_value": "a mapped column is empty (null) in this row",
    "non_integer_id": "an id that is not a whole decimal number",
    "id_out_of_range": "an id outside 0 .. 2**63-1 (negative, or too large)",
    "inexact_float_id": "an id in a floating-point column (Parquet, SQL) above 2**53 - 1 "
    "(float32: 2**24 - 1, float16: 2**11 - 1), where a float stands for several whole numbers: "
    "it may have been rounded",
    "self_loop": "a row relating an account to itself (follower = followee, blocker = "
    "blocked, ...)",
    "bad_timestamp": "a time that does not parse as --time-format, or is before 1970-01-01 or "
    "more than RECS_INGEST_MAX_FUTURE_SECONDS (1 h) ahead of this machine's clock",
    "unknown_status": "a status outside the table's accepted values",
    "bad_boolean": "a flag that is not true/false, t/f, yes/no, y/n or 1/0",
    "bad_tag": "an interest tag longer than 64 characters (or bytes that are not UTF-8 text)",
    "active_before_created": "an account whose last_active_at is before its created_at (both "
    "mapped): one of them is wrong",
    "duplicate": "the key of an earlier row of the same input (the first row is kept)",
    "already_in_store": "the key of a row the live store already holds (appending without "
    "--replace; users: unless --update-existing)",
}
"""Every reason a row is rejected (the ``reason`` column of the rejects file), in the order rows
are checked: a row gets the first reason that applies."""

ColumnKind = Literal["id", "time", "status", "boolean", "tag"]


@dataclass(frozen=True)
class ImportColumn:
    """One store column an import fills.

    ``option`` is the CLI option naming its source column (``--follower-col``). A ``required``
    column must be found in the source; an optional one not mapped takes ``default`` (None:
    NULL, or a computed default: ``DEFAULT_TIME`` for times). ``nullable``: an empty value in a
    mapped column is stored as NULL instead of rejected. ``accepted``: a status's values.
    """

    name: str
    option: str
    kind: ColumnKind
    help: str
    required: bool = False
    default: object = None
    nullable: bool = False
    accepted: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImportTable:
    """One sub-command of ``recs import`` and the store table it fills.

    ``key``: the columns that identify a row (a second row with the same key is a
    ``duplicate``). ``pair``: the first two columns are two accounts that must differ
    (``self_loop``). ``actor``: the id column whose account acted (the follower, the blocker);
    an account created for it gets ``last_active_at`` from its latest row. ``time_order``:
    ``(earlier, later)``, two time columns a row must not invert when both are mapped
    (``active_before_created``). ``grain`` starts "One row per ...".
    """

    command: str
    table: str
    grain: str
    columns: tuple[ImportColumn, ...]
    key: tuple[str, ...]
    pair: bool = False
    actor: str | None = None
    time_order: tuple[str, str] | None = None

    @property
    def id_columns(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns if column.kind == "id")

    @property
    def time_columns(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns if column.kind == "time")

    def column(self, name: str) -> ImportColumn:
        return next(column for column in self.columns if column.name == name)


ACCOUNT_STATUSES = ("active", "suspended", "deactivated")  # recs.store.schema's, checked by a test
FOLLOW_STATUSES = ("active", "pending")


def _id(name: str, option: str, help: str) -> ImportColumn:
    return ImportColumn(name, option, "id", help, required=True)


def _time(name: str, option: str, help: str, **kwargs) -> ImportColumn:
    return ImportColumn(name, option, "time", help, **kwargs)


def _pair(command: str, table: str, grain: str, left, right, at) -> ImportTable:
    return ImportTable(
        command,
        table,
        grain,
        (_id(*left), _id(*right), _time(*at)),
        key=(left[0], right[0]),
        pair=True,
        actor=left[0],
    )


_WHEN = "without one: --default-time, 2000-01-01T00:00:00Z"

IMPORT_TABLES: dict[str, ImportTable] = {
    spec.command: spec
    for spec in (
        ImportTable(
            "edges",
            "follow_edges",
            "One row per follow (or follow request): follower -> followee.",
            (
                _id("follower_id", "--follower-col", "The account that follows."),
                _id("followee_id", "--followee-col", "The account followed."),
                _time("created_at", "--created-at-col", f"When the follow was made ({_WHEN})."),
                ImportColumn(
                    "status",
                    "--status-col",
                    "status",
                    "active or pending (a request to a private account); default active.",
                    default="active",
                    accepted=FOLLOW_STATUSES,
                ),
            ),
            key=("follower_id", "followee_id"),
            pair=True,
            actor="follower_id",
        ),
        ImportTable(
            "users",
            "users",
            "One row per account.",
            (
                _id("user_id", "--user-col", "The account id."),
                _time("created_at", "--created-at-col", f"Account creation ({_WHEN})."),
                _time(
                    "last_active_at",
                    "--last-active-at-col",
                    "Last activity; empty values and the default are NULL (never active: not "
                    "eligible for a nightly list).",
                    nullable=True,
                ),
                ImportColumn(
                    "account_status",
                    "--status-col",
                    "status",
                    "active, suspended or deactivated; default active.",
                    default="active",
                    accepted=ACCOUNT_STATUSES,
                ),
                ImportColumn(
                    "is_discoverable",
                    "--discoverable-col",
                    "boolean",
                    "May be recommended to others; default true.",
                    default=True,
                ),
                ImportColumn(
                    "is_private",
                    "--private-col",
                    "boolean",
                    "Follows need approval; default false.",
                    default=False,
                ),
            ),
            key=("user_id",),
            time_order=("created_at", "last_active_at"),
        ),
        _pair(
            "blocks",
            "blocks",
            "One row per block: blocker -> blocked.",
            ("blocker_id", "--blocker-col", "The account that blocks."),
            ("blocked_id", "--blocked-col", "The account blocked."),
            ("created_at", "--created-at-col", f"When ({_WHEN})."),
        ),
        _pair(
            "mutes",
            "mutes",
            "One row per mute: muter -> muted.",
            ("muter_id", "--muter-col", "The account that mutes."),
            ("muted_id", "--muted-col", "The account muted."),
            ("created_at", "--created-at-col", f"When ({_WHEN})."),
        ),
        _pair(
            "dismissals",
            "dismissed_candidates",
            "One row per dismissed recommendation: user -> candidate.",
            ("user_id", "--user-col", "The account that dismissed the recommendation."),
            ("candidate_id", "--candidate-col", "The account dismissed."),
            ("dismissed_at", "--dismissed-at-col", f"When ({_WHEN})."),
        ),
        ImportTable(
            "interests",
            "user_interests",
            "One row per (account, interest tag).",
            (
                _id("user_id", "--user-col", "The account."),
                ImportColumn(
                    "tag",
                    "--tag-col",
                    "tag",
                    "The interest tag, 1-64 characters (cold start ranks accounts by tag).",
                    required=True,
                ),
            ),
            key=("user_id", "tag"),
        ),
    )
}
"""The sub-commands of ``recs import``, by name, in the order ``--help`` lists them."""

TAG_MAX_CHARS = 64
"""The store's ``user_interests.tag`` is ``VARCHAR(64)``."""

CREATED_USER_DEFAULTS: dict[str, object] = {
    "account_status": "active",
    "is_discoverable": True,
    "is_private": False,
}
"""The fields of an account created for an id the imported rows name but the store lacks.
Its ``created_at`` is the earliest time of the imported rows naming it (``DEFAULT_TIME`` if they
have none), its ``last_active_at`` the latest time of the rows it is the ``actor`` of (the
follower, blocker, muter or dismissing user), NULL if none or if the rows have no time column."""
