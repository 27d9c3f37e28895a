"""Events of the upstream relationship stream: their shape, and the checks each one must pass.

One event per JSON line (Parquet row)::

    {"event_id": "e-17", "event_type": "follow", "event_time": "2026-11-01T08:30:00Z",
     "actor_id": 42, "target_id": 7}

``event_id`` (opaque text, 1-128 printable characters; a JSON integer is taken as its decimal
text), ``event_type`` (``EVENT_TYPES``), ``event_time`` (ISO-8601, converted to UTC; none
means UTC) and ``actor_id`` (integer >= 0) are required; ``target_id`` for every type but
``user_upsert``, whose attributes are ``USER_FIELDS``. Other keys are ignored.
``validate_event`` turns one decoded line into an ``Event`` or raises ``Rejected``, whose
message is the quarantine reason ``<code>: <detail>`` (codes: ``QUARANTINE_REASONS``). The
event time must fall in the run's ``TimeWindow`` (``time_window``: not before
``ingest_min_event_time``, not more than ``ingest_max_future_seconds`` ahead of this machine's
clock). What each type does, and why the window: ``recs/ingest/README.md``.
"""

from __future__ import annotations

import datetime as dt
import reprlib
from typing import Any, NamedTuple

from recs.config import Settings
from recs.contracts import MAX_USER_ID
from recs.store.schema import ACCOUNT_STATUSES
from recs.times import MAX_EPOCH_US, MIN_EPOCH_US, epoch_micros, from_epoch_micros, wall_clock

MAX_EVENT_ID_LENGTH = 128
"""The width of every ``event_id`` column of the store (``String(128)``)."""
MAX_TAG_LENGTH = 64

FOLLOW_TYPES = ("follow", "follow_request", "follow_accept", "follow_reject", "unfollow")
RELATION_OF: dict[str, str] = {
    **dict.fromkeys(FOLLOW_TYPES, "follow"),
    "block": "block",
    "unblock": "block",
    "mute": "mute",
    "unmute": "mute",
    "dismiss": "dismiss",
    "undismiss": "dismiss",
}
EVENT_TYPES = (*RELATION_OF, "user_upsert")
USER_FIELDS = (
    "created_at",
    "status",
    "is_discoverable",
    "is_private",
    "last_active_at",
    "interests",
)
QUARANTINE_REASONS = (
    "malformed",
    "missing_field",
    "unknown_type",
    "bad_id",
    "bad_time",
    "bad_field",
    "self_relationship",
    "unknown_user",
    "unreadable_file",
)
"""Reason codes: each quarantine reason is ``<code>: <detail>``."""
NESTED_TOO_DEEP = "malformed: JSON nested too deep"
ACCEPTING = ("follow_accept", "follow_reject")
"""Event types whose actor is the followee (the follow they act on is target -> actor)."""

_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlevel = 3


def shown_value(value: Any) -> str:
    """``repr`` of an offending value for a quarantine reason: short (strings cut to ~80
    characters, containers to 3 levels), so a 50 MB or deeply nested value cannot blow up the
    reason (``repr`` of a 900-level list can itself exceed the recursion limit)."""
    return _SHOWN.repr(value)


class TimeWindow(NamedTuple):
    """The ``event_time`` an event may have, as epoch microseconds (UTC), both ends inclusive:
    ``lowest_us`` (``ingest_min_event_time``) to ``highest_us`` (``now_us`` +
    ``ingest_max_future_seconds``); ``now_us`` is the ingesting machine's clock. A window from
    ``time_window`` (or ``within_datetime_range``) never reaches outside years 1-9999 UTC, the
    times a ``datetime`` (and so the store) can hold."""

    lowest_us: int
    highest_us: int
    now_us: int


def time_window(settings: Settings, now: dt.datetime | None = None) -> TimeWindow:
    """The event_time window of an ingest run that starts at ``now`` (naive UTC, or aware; the
    wall clock if None: ingestion is an online path, and the bound is about this machine's
    clock). See ``Settings.ingest_max_future_seconds`` for why there is an upper bound (and
    why it is finite: at most 10 years). Cut to years 1-9999 UTC (``within_datetime_range``)."""
    if now is None:
        now = wall_clock()
    now_us = epoch_micros(now)
    future_us = round(settings.ingest_max_future_seconds * 1_000_000)  # finite: <= 10 years
    return within_datetime_range(
        TimeWindow(epoch_micros(settings.ingest_min_event_time), now_us + future_us, now_us)
    )


def within_datetime_range(window: TimeWindow) -> TimeWindow:
    """``window`` cut to years 1-9999 UTC (``datetime.min`` .. ``datetime.max``), so an
    event_time inside it always converts to a ``datetime``: ``9999-12-31T23:59:59-05:00``
    (year 10000 in UTC) is quarantined as out of range however far ahead the window reaches,
    instead of failing the batch when the store's timestamp is formatted."""
    lowest, highest, now = window
    if MIN_EPOCH_US <= lowest and highest <= MAX_EPOCH_US:
        return window
    return TimeWindow(max(lowest, MIN_EPOCH_US), min(highest, MAX_EPOCH_US), now)


def _utc_text(time_us: int) -> str:
    return from_epoch_micros(time_us).isoformat() + "Z"


def _outside(time_us: int, window: TimeWindow, value: Any) -> Rejected:
    """The quarantine reason of an event_time outside ``window`` (``value``: as given)."""
    # e.g. 0001-01-01T00:00:00+05:00: before year 1 in UTC
    if not MIN_EPOCH_US <= time_us <= MAX_EPOCH_US:
        return Rejected(f"bad_time: event_time is out of range: {shown_value(value)}")
    if time_us < window.lowest_us:
        return Rejected(
            f"bad_time: event_time {_utc_text(time_us)} is before {_utc_text(window.lowest_us)} "
            "(ingest_min_event_time): no real event is that old (an unset or zeroed clock)"
        )
    ahead = (window.highest_us - window.now_us) / 1_000_000
    return Rejected(
        f"bad_time: event_time {_utc_text(time_us)} is more than {ahead:g} s after this "
        f"machine's clock ({_utc_text(window.now_us)}; ingest_max_future_seconds): a future "
        "event would win over every later event of its relationship"
    )


class Event(NamedTuple):
    """One valid event. ``time_us``: epoch microseconds (UTC). ``fields``: user_upsert only.

    The batch code indexes events by position (the parser process sends plain tuples)."""

    time_us: int
    event_id: str
    event_type: str
    actor_id: int
    target_id: int | None
    fields: dict[str, Any] | None
    line_number: int
    line: str | bytes | int  # the original line; JSON Lines: its raw bytes or byte offset


class Quarantined(NamedTuple):
    line_number: int
    line: str
    reason: str
    event_id: str | None = None


class Rejected(Exception):
    """Raised while validating one event; its message is the quarantine reason."""


def parse_time(value: Any, name: str) -> int:
    """An ISO-8601 timestamp (or a ``datetime``) as epoch microseconds, UTC.

    ``Z`` and offsets are converted to UTC; a value without an offset is taken as UTC. Raises
    ``Rejected`` (``bad_time``) for anything else.
    """
    if isinstance(value, str):
        try:
            moment = dt.datetime.fromisoformat(value)
        except ValueError:
            raise Rejected(
                f"bad_time: {name} is not an ISO-8601 timestamp: {shown_value(value)}"
            ) from None
    elif isinstance(value, dt.datetime):
        moment = value
    else:
        raise Rejected(f"bad_time: {name} is not an ISO-8601 timestamp: {shown_value(value)}")
    return epoch_micros(moment)


def _stored_time(value: Any, name: str) -> int:
    """``parse_time`` of a user attribute the store keeps as a ``DateTime``: also within
    years 1-9999 in UTC (``0001-01-01T00:00:00+05:00`` is not), else ``Rejected``."""
    time_us = parse_time(value, name)
    if not MIN_EPOCH_US <= time_us <= MAX_EPOCH_US:
        raise Rejected(f"bad_time: {name} is out of range: {shown_value(value)}")
    return time_us


def _user_id(record: dict[str, Any], name: str) -> int:
    value = record.get(name)
    if value is None:
        raise Rejected(f"missing_field: {name}")
    if type(value) is not int:  # bool, float, "12": not an integer id
        raise Rejected(f"bad_id: {name} is not an integer: {shown_value(value)}")
    if value < 0:
        raise Rejected(f"bad_id: {name} is negative: {value}")
    if value > MAX_USER_ID:
        raise Rejected(f"bad_id: {name} is out of range: {value}")
    return value


def _event_id(record: dict[str, Any]) -> str:
    """The event id as its canonical text (see the module doc): a string as it is, an integer
    as its decimal text. Raises ``Rejected`` with a reason of its own for each kind of bad id."""
    value = record.get("event_id")
    if type(value) is str and 0 < len(value) <= MAX_EVENT_ID_LENGTH and value.isprintable():
        return value  # the common case: one type check, one length, one C scan
    if value is None:
        raise Rejected("missing_field: event_id")
    if type(value) is int:
        value = str(value)
    elif type(value) is not str:
        kind = (
            "a boolean" if isinstance(value, bool)
            else "a float" if isinstance(value, float)
            else "an object" if isinstance(value, dict)
            else "an array" if isinstance(value, list | tuple)
            else None
        )  # fmt: skip
        if kind is None:  # a Parquet binary, decimal, timestamp, ...
            raise Rejected(
                f"bad_field: event_id is neither a string nor an integer: {shown_value(value)}"
            )
        shown = f": {shown_value(value)}" if kind in ("a boolean", "a float") else ""
        raise Rejected(f"bad_field: event_id is {kind}, not a string or an integer{shown}")
    if not value:
        raise Rejected("bad_field: event_id is empty")
    if len(value) > MAX_EVENT_ID_LENGTH:
        raise Rejected(
            f"bad_field: event_id is longer than {MAX_EVENT_ID_LENGTH} characters ({len(value)})"
        )
    if not value.isprintable():
        raise Rejected(
            f"bad_field: event_id has a control or non-printable character: {shown_value(value)}"
        )
    return value


def quarantined_event_id(record: Any) -> str | None:
    """The event id a quarantine row records: the canonical id if the line has a valid one."""
    if not isinstance(record, dict):
        return None
    try:
        return _event_id(record)
    except Rejected:
        return None


def _user_fields(record: dict[str, Any]) -> dict[str, Any]:
    """The user attributes a ``user_upsert`` sets (timestamps as epoch microseconds)."""
    fields: dict[str, Any] = {}
    for name in USER_FIELDS:
        if name not in record:
            continue
        value = record[name]
        if name == "created_at":
            if value is None:
                raise Rejected("bad_field: created_at is null")
            fields[name] = _stored_time(value, name)
        elif name == "last_active_at":
            fields[name] = None if value is None else _stored_time(value, name)
        elif name == "status":
            if value not in ACCOUNT_STATUSES:
                raise Rejected(
                    f"bad_field: status must be one of {', '.join(ACCOUNT_STATUSES)}: "
                    f"{shown_value(value)}"
                )
            fields[name] = value
        elif name in ("is_discoverable", "is_private"):
            if type(value) is not bool:
                raise Rejected(f"bad_field: {name} is not a boolean: {shown_value(value)}")
            fields[name] = value
        else:  # interests
            if value is None:
                value = []
            if not isinstance(value, list | tuple) or not all(
                isinstance(tag, str) and 0 < len(tag) <= MAX_TAG_LENGTH and tag.isprintable()
                for tag in value
            ):
                raise Rejected(
                    f"bad_field: interests is not a list of 1-{MAX_TAG_LENGTH} character "
                    f"printable strings: {shown_value(value)}"
                )
            fields[name] = tuple(sorted(set(value)))
    created, active = fields.get("created_at"), fields.get("last_active_at")
    if created is not None and active is not None and active < created:
        raise Rejected(  # as an import refuses such a row (active_before_created)
            f"bad_field: last_active_at {shown_value(record['last_active_at'])} is before "
            f"created_at {shown_value(record['created_at'])}"
        )
    return fields


def validate_event(
    record: Any, line_number: int, line: str | bytes | int, window: TimeWindow | None = None
) -> Event:
    """One decoded line (a JSON object or a Parquet row as a dict) as an ``Event``.

    ``window``: the event_time window (``time_window``; None: the process settings' window
    at the wall clock, computed per call, so pass one when validating many); an event_time
    outside years 1-9999 UTC is rejected whatever the window (``within_datetime_range``).
    Raises ``Rejected`` whose message is the quarantine reason (``<code>: <detail>``, codes in
    ``QUARANTINE_REASONS``). Whether the users exist is checked when the event is applied.
    """
    if window is None:
        from recs.config import get_settings

        window = time_window(get_settings())
    return _checked_event(record, line_number, line, within_datetime_range(window))


def _checked_event(
    record: Any, line_number: int, line: str | bytes | int, window: TimeWindow
) -> Event:
    """``validate_event`` with ``window`` already within years 1-9999 UTC (the per-line path:
    ``read_events`` and ``apply_events`` cut the window once, not once per line)."""
    if not isinstance(record, dict):
        raise Rejected("malformed: not a JSON object")
    event_type = record.get("event_type")
    if event_type is None or event_type == "":
        raise Rejected("missing_field: event_type")
    if not isinstance(event_type, str) or (
        event_type not in RELATION_OF and event_type != "user_upsert"
    ):
        raise Rejected(f"unknown_type: {shown_value(event_type)}")
    event_id = _event_id(record)
    raw_time = record.get("event_time")
    if raw_time is None or raw_time == "":
        raise Rejected("missing_field: event_time")
    time_us = parse_time(raw_time, "event_time")
    if time_us < window[0] or time_us > window[1]:
        raise _outside(time_us, window, raw_time)
    actor_id = _user_id(record, "actor_id")
    if event_type == "user_upsert":
        return Event(
            time_us, event_id, event_type, actor_id, None, _user_fields(record), line_number, line
        )
    target_id = _user_id(record, "target_id")
    if target_id == actor_id:
        raise Rejected(
            f"self_relationship: self-{RELATION_OF[event_type]} (actor_id = target_id = {actor_id})"
        )
    return Event(time_us, event_id, event_type, actor_id, target_id, None, line_number, line)


def line_text(line: str | bytes) -> str:
    """The original line as text (a JSON line is kept as its raw bytes until quarantined)."""
    if isinstance(line, bytes):
        return line.decode("utf-8", errors="replace").rstrip("\r\n")
    if not isinstance(line, str):
        raise TypeError(f"not a line: {line!r}")
    return line


def validated(
    record: Any,
    line_number: int,
    line: str | bytes | int,
    raw: str | bytes | None,
    window: TimeWindow,
) -> Event | Quarantined:
    """``validate_event``, or the ``Quarantined`` entry for the line (``raw``: its text when
    ``line`` is a byte offset). ``window``: within years 1-9999 UTC (``within_datetime_range``)."""
    try:
        return _checked_event(record, line_number, line, window)
    except Rejected as rejected:
        reason = str(rejected)
    except RecursionError:  # a structure too deep to walk: never let it end the run
        reason = NESTED_TOO_DEEP
    return Quarantined(
        line_number,
        line_text(raw if raw is not None else line),
        reason,
        quarantined_event_id(record),
    )
