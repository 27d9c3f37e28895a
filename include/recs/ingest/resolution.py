"""Event ingestion: the upstream relationship event stream, applied to the live store.

Input: JSON Lines files (``.jsonl``, ``.ndjson``, ``.json``, optionally ``.gz``) or Parquet files
(``.parquet``), or folders of them (their event files, non-recursive, by name). One event per
line (row)::

    {"event_id": "e-17", "event_type": "follow", "event_time": "2026-11-01T08:30:00Z",
     "actor_id": 42, "target_id": 7}

``event_id``, ``event_type``, ``event_time`` (ISO-8601; ``Z``/offsets are converted to UTC, a
time without an offset is taken as UTC) and ``actor_id`` (integer >= 0) are required;
``target_id`` for every type but ``user_upsert``. Other keys are ignored. Blank lines are skipped
(not counted).

``event_id`` is an opaque identifier: a string of 1 to 128 printable characters, compared byte
for byte (``"007"`` and ``"7"`` are two ids). A JSON integer (a Parquet integer column) is taken
as its decimal text, the way Kafka keys are bytes whatever produced them: ``7`` and ``"7"`` are
the *same* event id, so the second one to arrive is a duplicate. An empty id, a float (even
``7.0``), a boolean, an object or array, a longer id or one with a control character (NUL,
tab, ...) is quarantined, each with its own reason.

``event_time`` must fall in a sanity window (``time_window``; settings
``ingest_min_event_time``, default 2000-01-01, and ``ingest_max_future_seconds``, default 3600):
not before the lower bound (an unset or zeroed clock) and not more than that many seconds after
the ingesting machine's clock. Last writer wins by ``event_time``, so an event dated in the far
future (year 9999) would otherwise win over every later event of its relationship forever.

Event types and what they do (actor -> target; the *relationship* each one belongs to):

==================  ===================================================================  ========
follow              follow target: ``active``, or ``pending`` if the target is private   follow
follow_request      the same as ``follow`` (a private target makes it a pending request) follow
follow_accept       actor (the followee) accepts target's request: the follow target ->  follow
                    actor becomes ``active``
follow_reject       actor (the followee) rejects target's pending request: deleted       follow
unfollow            delete the follow actor -> target, active or pending (a withdrawal)  follow
block / unblock     add / remove the block; a block deletes follows in both directions   block
mute / unmute       add / remove the mute                                                mute
dismiss/undismiss   add / remove the dismissed candidate target of user actor            dismiss
user_upsert         create or update user actor: any of ``created_at``, ``status``       user
                    (active/suspended/deactivated), ``is_discoverable``, ``is_private``
                    (booleans), ``last_active_at`` (ISO-8601 or null), ``interests`` (a
                    list of tags: replaces the user's tags)
==================  ===================================================================  ========

Semantics (the follow-service design, ``../shared/design-docs/002_*``, and issue 4):

- **Pending** follows (``status = 'pending'``) never count as follows: not in the counts, not in
  ``mutual_follows``, not a first hop of the traversal (only an exclusion). A follow or
  follow_request to a public account is active at once; an accept activates a pending one; a
  reject of an already active follow changes nothing.
- **Blocks**: a block deletes the follows (active or pending) in both directions and, while it
  stands, a follow, follow_request or follow_accept between the two users changes nothing (it
  is *applied* as a refused no-op, ``effects.follows_refused_blocked``). An unblock restores
  nothing.
- **Idempotent**: an ``event_id`` already applied or found superseded is a *duplicate*, in the
  same batch or any earlier one (``ingested_events``), and changes nothing. Within a batch the
  copies of an id are tried in file order and the first one that is not quarantined wins: a
  quarantined copy is not seen (below), so the next copy of its id is tried instead, at that
  copy's own place in ``(event_time, event_id)`` order (at once if the place is past).
- **Out of order, last writer wins per relationship**: every relationship (follow A->B, block
  A->B, mute A->B, dismissal A->B) keeps the time and id of the last event applied to it: on its
  row (``event_time_us``, ``event_id``) and, once the row is deleted, as a tombstone
  (``relationship_tombstones``); every user attribute likewise (``user_field_versions``). An
  event not newer than that, ordered by ``(event_time, event_id)``, is *superseded* and changes
  nothing: a stale unfollow never deletes a newer follow, a stale follow never undoes a newer
  unfollow. A block acts on each follow direction like an unfollow at the block's own time: a
  follow older than the block is deleted (tombstone), a newer one stays (the follow service
  accepted it after the block, so an unblock came between). Within a batch, events are applied
  in ``(event_time, event_id)`` order.
- **Counts**: ``user_follow_counts`` changes with every transition into or out of ``active``,
  in the same transaction as the edge; ``reconcile_counts`` (``recs reconcile``) recomputes
  them from the edges and reports (or repairs) drift. ``mutual_follows`` lists friends.
- **Bad input** is quarantined (``quarantined_events``: file, the file's sha256, line number,
  original line, reason; keyed by all three, so a new file under an old name, a daily
  ``events.jsonl``, keeps the rows of the one before) and never stops the file: a line that is
  not a JSON object, an unknown type, a missing or empty field, a non-integer, negative or
  out-of-range id, a bad timestamp or user field, a self-relationship (self-follow, self-block,
  ...) and an event naming a user that does not exist (yet: a ``user_upsert`` earlier in
  ``(event_time, event_id)`` order creates it); also a line nested too deep for the decoder
  (``malformed: JSON nested too deep``), an ``event_time`` outside the window or outside years
  1-9999 in UTC (whatever the window) and, in Parquet, a value Python cannot represent (a
  timestamp past year 9999: only that row). A quarantined event is not recorded as seen: fixed
  and re-sent, in a later file or later in the same one, it applies. A line longer than
  ``MAX_QUARANTINED_LINE_CHARS`` is stored cut to that length (its reason says so).
- Every run reports ``read = applied + duplicates + superseded + quarantined``, in total and per
  file (``IngestCounts``; also one ``ingested_files`` row per file).

Known limits of last-writer-wins per relationship without a full history: a follow refused by a
standing block is not replayed when an *older* unblock arrives later; and a ``follow_accept`` is
taken as proof of a request, so it activates the follow even before the request arrives.

Write path: events are applied in batches of ``BATCH_EVENTS``, each batch one transaction
(SQLite ``BEGIN IMMEDIATE``; PostgreSQL a transaction-scoped advisory lock, so concurrent
ingesters serialise). A batch reads every row and version it touches in a few set queries
(``StoreSession.load_state``), resolves its events in memory (``_Batch``) and writes only the
changed rows: ``executemany`` on SQLite; on PostgreSQL one ``unnest`` statement per table, the
reads and the writes each pipelined into one round trip. For large files a parser process
does everything that needs no write lock (``prepare_batch``: decoding, validation,
de-duplication, ordering, the keys to read; and on SQLite the reads themselves, ahead, on a
read-only connection: ``ingest_file``) while this process applies the previous batch.
``apply_events`` is the same path for a single event: the live follow/unfollow write that
``make bench-ingest`` times. Measured rates are in ``bench/ingest.py``'s docstring.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import gzip
import hashlib
import heapq
import itertools
import json
import logging
import reprlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from recs import store
from recs.config import Settings
from recs.errors import RecsError, StoreUnavailableError

log = logging.getLogger("recs.ingest")

BATCH_EVENTS = 20_000
"""Events per transaction. Measured on SQLite (320 k events, this shared 2-core machine): 20 k,
50 k and 100 k events per batch ingest within the run-to-run noise (about 15 %); 20 k holds
the SQLite write lock for well under a second per batch."""

PARSE_WORKER_BYTES = 16 << 20
"""JSON Lines files from this size on are parsed in a helper process (``ingest_file``)."""
SQLITE_CHECKPOINT_PAGES = 10_000
"""WAL pages between automatic checkpoints on the ingesting connection (default 1,000)."""
SQLITE_CACHE_KIB = 256 * 1024
"""Page cache of the ingesting SQLite connection (KiB)."""
MAX_EVENT_ID_LENGTH = 128
"""The width of every ``event_id`` column of the store (``String(128)``)."""
MAX_TAG_LENGTH = 64
MAX_QUARANTINED_LINE_CHARS = 65_536
"""A quarantined line longer than this is stored cut to its first this-many characters: an
event line is ~150 bytes, and a runaway one (a 50 MB line, or past SQLite's and PostgreSQL's
1 GB limit on one value, which would fail the batch) must not fill ``quarantined_events``."""
MAX_ID = 2**63 - 1
EVENT_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet")
LANDING_DIR = "landing"
"""Folder under ``RECS_HOME`` where upstream drops event files (``recs_ingest_events`` DAG)."""
INGESTED_DIR = "ingested"
"""Sub-folder of the landing folder that ingested files are moved to."""
ADVISORY_LOCK_KEY = 0x7265_6373_696E  # 'recsin': one ingesting writer at a time on PostgreSQL

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

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)
_MIN_US = (dt.datetime.min - _EPOCH) // _US  # what a naive datetime can hold, as epoch µs
_MAX_US = (dt.datetime.max - _EPOCH) // _US
_ACCEPTING = ("follow_accept", "follow_reject")  # actor is the followee


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80
_SHOWN.maxlevel = 3


def _shown(value: Any) -> str:
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
        now = dt.datetime.now(dt.UTC)
    now_us = _micros(now)
    future_us = round(settings.ingest_max_future_seconds * 1_000_000)  # finite: <= 10 years
    return within_datetime_range(
        TimeWindow(_micros(settings.ingest_min_event_time), now_us + future_us, now_us)
    )


def within_datetime_range(window: TimeWindow) -> TimeWindow:
    """``window`` cut to years 1-9999 UTC (``datetime.min`` .. ``datetime.max``), so an
    event_time inside it always converts to a ``datetime``: ``9999-12-31T23:59:59-05:00``
    (year 10000 in UTC) is quarantined as out of range however far ahead the window reaches,
    instead of failing the batch when the store's timestamp is formatted."""
    lowest, highest, now = window
    if _MIN_US <= lowest and highest <= _MAX_US:
        return window
    return TimeWindow(max(lowest, _MIN_US), min(highest, _MAX_US), now)


def _micros(moment: dt.datetime) -> int:
    if moment.tzinfo is None:
        return (moment - _EPOCH) // _US
    return (moment - _EPOCH_UTC) // _US


def _utc_text(time_us: int) -> str:
    return _datetime(time_us).isoformat() + "Z"


def _outside(time_us: int, window: TimeWindow, value: Any) -> Rejected:
    """The quarantine reason of an event_time outside ``window`` (``value``: as given)."""
    if not _MIN_US <= time_us <= _MAX_US:  # e.g. 0001-01-01T00:00:00+05:00, before year 1 UTC
        return Rejected(f"bad_time: event_time is out of range: {_shown(value)}")
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


class IngestInputError(RecsError):
    """A path to ingest that does not exist or is not an event file."""


class CountsDriftError(RecsError):
    """``recs reconcile`` found follower/following counts that differ from the edges."""

    exit_code = 1


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


# --- counts ------------------------------------------------------------------------------------


@dataclass
class IngestCounts:
    """What one file (or a whole run) did; ``read = applied + duplicates + superseded +
    quarantined`` always. ``effects``: how applied events changed the store;
    ``quarantine_reasons``: quarantined events by reason code."""

    read: int = 0
    applied: int = 0
    duplicates: int = 0
    superseded: int = 0
    quarantined: int = 0
    effects: Counter = field(default_factory=Counter)
    quarantine_reasons: Counter = field(default_factory=Counter)

    def add(self, other: IngestCounts) -> None:
        for name in ("read", "applied", "duplicates", "superseded", "quarantined"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.effects.update(other.effects)
        self.quarantine_reasons.update(other.quarantine_reasons)

    @property
    def balanced(self) -> bool:
        return self.read == self.applied + self.duplicates + self.superseded + self.quarantined

    def to_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "applied": self.applied,
            "duplicates": self.duplicates,
            "superseded": self.superseded,
            "quarantined": self.quarantined,
            "balanced": self.balanced,
            "effects": dict(sorted(self.effects.items())),
            "quarantine_reasons": dict(sorted(self.quarantine_reasons.items())),
        }


# --- parsing and validation ----------------------------------------------------------------------


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
                f"bad_time: {name} is not an ISO-8601 timestamp: {_shown(value)}"
            ) from None
    elif isinstance(value, dt.datetime):
        moment = value
    else:
        raise Rejected(f"bad_time: {name} is not an ISO-8601 timestamp: {_shown(value)}")
    return _micros(moment)


def _stored_time(value: Any, name: str) -> int:
    """``parse_time`` of a user attribute the store keeps as a ``DateTime``: also within
    years 1-9999 in UTC (``0001-01-01T00:00:00+05:00`` is not), else ``Rejected``."""
    time_us = parse_time(value, name)
    if not _MIN_US <= time_us <= _MAX_US:
        raise Rejected(f"bad_time: {name} is out of range: {_shown(value)}")
    return time_us


def _user_id(record: dict[str, Any], name: str) -> int:
    value = record.get(name)
    if value is None:
        raise Rejected(f"missing_field: {name}")
    if type(value) is not int:  # bool, float, "12": not an integer id
        raise Rejected(f"bad_id: {name} is not an integer: {_shown(value)}")
    if value < 0:
        raise Rejected(f"bad_id: {name} is negative: {value}")
    if value > MAX_ID:
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
                f"bad_field: event_id is neither a string nor an integer: {_shown(value)}"
            )
        shown = f": {_shown(value)}" if kind in ("a boolean", "a float") else ""
        raise Rejected(f"bad_field: event_id is {kind}, not a string or an integer{shown}")
    if not value:
        raise Rejected("bad_field: event_id is empty")
    if len(value) > MAX_EVENT_ID_LENGTH:
        raise Rejected(
            f"bad_field: event_id is longer than {MAX_EVENT_ID_LENGTH} characters ({len(value)})"
        )
    if not value.isprintable():
        raise Rejected(
            f"bad_field: event_id has a control or non-printable character: {_shown(value)}"
        )
    return value


def _quarantined_event_id(record: Any) -> str | None:
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
            if value not in store.ACCOUNT_STATUSES:
                raise Rejected(
                    f"bad_field: status must be one of {', '.join(store.ACCOUNT_STATUSES)}: "
                    f"{_shown(value)}"
                )
            fields[name] = value
        elif name in ("is_discoverable", "is_private"):
            if type(value) is not bool:
                raise Rejected(f"bad_field: {name} is not a boolean: {_shown(value)}")
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
                    f"printable strings: {_shown(value)}"
                )
            fields[name] = tuple(sorted(set(value)))
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
        raise Rejected(f"unknown_type: {_shown(event_type)}")
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


def _validated(
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
        _quarantined_event_id(record),
    )


def _read_json_lines(
    path: Path, window: TimeWindow, offsets: bool = False
) -> Iterator[Event | Quarantined]:
    """msgspec decodes (and UTF-8-validates) each line: measured 5x faster than ``json.loads``
    here (0.2 s vs 1.0 s for 320 k event lines). With ``offsets`` an event's ``line`` is the
    byte offset of its line (cheaper to send between processes), not the line itself.

    msgspec recurses once per nesting level and raises ``RecursionError`` at Python's recursion
    limit (~1,000 levels, fewer deep in a call stack): such a line is quarantined as
    ``malformed: JSON nested too deep`` (an event nests 2 levels at most)."""
    import msgspec

    decode = msgspec.json.Decoder().decode
    opener = gzip.open if _is_gzip(path) else open
    offset = 0
    with opener(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            start, offset = offset, offset + len(raw)
            try:
                record = decode(raw)
            except msgspec.DecodeError as error:
                if not raw.strip():
                    continue  # a blank line
                yield Quarantined(line_number, line_text(raw), f"malformed: {error}")
                continue
            except RecursionError:
                yield Quarantined(line_number, line_text(raw), NESTED_TOO_DEEP)
                continue
            yield _validated(record, line_number, start if offsets else raw, raw, window)


def _parquet_rows(batch: Any) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """A record batch as dicts, and ``{row index: reason}`` for rows holding a value Python
    cannot represent (a ``timestamp[s]`` past year 9999, an unknown time zone, ...): their
    cell holds a placeholder. Converting the batch at once is the fast path; only if that
    fails is each column, and in a failing column each cell, converted on its own."""
    try:
        return batch.to_pylist(), {}
    except Exception:  # noqa: BLE001 - whatever pyarrow raises, find the rows and go on
        pass
    bad: dict[int, str] = {}
    columns = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        try:
            columns[name] = column.to_pylist()
            continue
        except Exception:  # noqa: BLE001
            pass
        cells = []
        for index in range(len(column)):
            try:
                cells.append(column[index].as_py())
            except Exception as error:  # noqa: BLE001
                detail = " ".join(str(error).split()) or type(error).__name__
                cells.append(f"<{column.type} value Python cannot represent: {detail}>")
                bad.setdefault(
                    index, f"malformed: {name} ({column.type}) cannot be converted: {detail}"
                )
        columns[name] = cells
    rows = [
        dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)
    ]
    return rows, bad


def _row_text(record: dict[str, Any]) -> str:
    """A Parquet row as one JSON line (non-JSON values as ``str``), for the quarantine."""
    try:
        return json.dumps(record, default=str, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return _shown(record)


def _read_parquet(path: Path, window: TimeWindow) -> Iterator[Event | Quarantined]:
    import pyarrow.parquet as pq

    line_number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_EVENTS):
        rows, bad = _parquet_rows(batch)
        for index, record in enumerate(rows):
            line_number += 1
            record = {key: value for key, value in record.items() if value is not None}
            line = _row_text(record)
            if index in bad:
                yield Quarantined(line_number, line, bad[index], _quarantined_event_id(record))
            else:
                yield _validated(record, line_number, line, None, window)


def read_events(
    path: Path, window: TimeWindow, *, offsets: bool = False
) -> Iterator[Event | Quarantined]:
    """Every line (row) of one event file, validated against ``window`` (``time_window``), in
    file order.

    A file that cannot be read (or stops being readable part-way) ends with one
    ``Quarantined`` entry at line number 0, reason ``unreadable_file: ...``. ``offsets``: see
    ``_read_json_lines`` (Parquet rows always carry their text).
    """
    window = within_datetime_range(window)
    unreadable: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError)
    try:
        if _suffix(path) == ".parquet":
            import pyarrow

            # ArrowNotImplementedError (an unsupported type) is no ValueError, for one.
            unreadable = (*unreadable, pyarrow.ArrowException)
            yield from _read_parquet(path, window)
        else:
            yield from _read_json_lines(path, window, offsets)
    except unreadable as error:  # truncated gzip, corrupt Parquet, ...
        detail = " ".join(str(error).split()) or type(error).__name__
        yield Quarantined(0, "", f"unreadable_file: {detail}"[:512])


def _is_gzip(path: Path) -> bool:
    return path.suffix.lower() == ".gz"


def _suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def is_event_file(path: Path) -> bool:
    """Whether ``path`` names an event file (by suffix; hidden and ``_`` files never are)."""
    if path.name.startswith((".", "_")):
        return False
    return _suffix(path) in EVENT_SUFFIXES and not (
        path.suffix.lower() == ".gz" and _suffix(path) == ".parquet"
    )


def event_files(paths: Iterable[str | Path]) -> list[Path]:
    """The files to ingest: each path is a file, or a folder whose event files (not sub-folders)
    are taken in name order. Raises ``IngestInputError`` for a missing path or a file that is not
    an event file."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.is_file() and is_event_file(p)))
        elif path.is_file():
            if not is_event_file(path):
                raise IngestInputError(
                    f"{path} is not an event file: expected {', '.join(EVENT_SUFFIXES)} "
                    "(optionally .gz for JSON Lines)"
                )
            files.append(path)
        else:
            raise IngestInputError(f"no such file or folder: {path}")
    return files


# --- the store session: bulk reads and writes on one connection ----------------------------------


def _datetime(time_us: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=time_us)


@functools.lru_cache(maxsize=1 << 12)
def _sqlite_day(days: int) -> str:
    return (_EPOCH + dt.timedelta(days=days)).date().isoformat()


def _sqlite_text(time_us: int | None) -> str | None:
    """How SQLAlchemy's SQLite ``DateTime`` stores a timestamp (``recs.datasets`` does too):
    ``YYYY-MM-DD HH:MM:SS.ffffff``; the date part cached (measured 2.5x faster than
    ``datetime.isoformat`` per call)."""
    if time_us is None:
        return None
    days, micros = divmod(time_us, 86_400_000_000)
    seconds, micros = divmod(micros, 1_000_000)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    return f"{_sqlite_day(days)} {hours:02d}:{minutes:02d}:{seconds:02d}.{micros:06d}"


_PAIR_TABLES = {
    "follow": ("follow_edges", "follower_id", "followee_id", "created_at"),
    "block": ("blocks", "blocker_id", "blocked_id", "created_at"),
    "mute": ("mutes", "muter_id", "muted_id", "created_at"),
    "dismiss": ("dismissed_candidates", "user_id", "candidate_id", "dismissed_at"),
}
"""Store table, source column, target column and timestamp column of each relation."""


class StoreSession:
    """One DBAPI connection to the live store with the bulk reads and writes ingestion needs.

    SQLite: ``sqlite3`` in autocommit mode with explicit ``BEGIN IMMEDIATE`` / ``COMMIT``; key
    sets are passed as one JSON array parameter and joined through ``json_each`` (measured
    1.5x faster than filling a temporary table with ``executemany``). PostgreSQL: psycopg; key
    sets are array parameters joined through ``unnest``, and each write batch takes
    ``pg_advisory_xact_lock(ADVISORY_LOCK_KEY)``. Creates (or upgrades) the store's schema if a
    table or column is missing.

    Raises ``StoreUnavailableError`` (one line, the URL's password masked) if the store cannot
    be connected to: a server that is down, a bad password or database name, a SQLite file
    that cannot be opened.
    """

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        from sqlalchemy.exc import DBAPIError

        self.url = url
        path = store.sqlite_path(url)
        if path and not path.startswith(":memory:") and not read_only:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise StoreUnavailableError(
                    f"cannot create the folder of the live store {store.display_url(url)}: "
                    f"{error.strerror or error}"
                ) from None
        self.engine = store.engine_for(url)
        self.backend = self.engine.dialect.name
        dbapi = self.engine.dialect.loaded_dbapi
        try:
            # raw_connection raises the driver's own exception (not wrapped by SQLAlchemy).
            self._pooled = self.engine.raw_connection()
        except (dbapi.OperationalError, dbapi.InterfaceError, DBAPIError) as error:
            self.engine.dispose()
            raise StoreUnavailableError(
                f"cannot connect to the live store {store.display_url(url)}: "
                f"{store.one_line(getattr(error, 'orig', None) or error, url)}"
            ) from None
        try:
            if not read_only and not store.schema_is_current(self.engine):
                store.create_schema(self.engine)
        except BaseException:
            self._pooled.close()
            self.engine.dispose()
            raise
        self.connection: Any = self._pooled.driver_connection
        self.postgres = self.backend == "postgresql"
        if not self.postgres:
            self.connection.isolation_level = None  # explicit BEGIN IMMEDIATE / COMMIT
            # The default 2 MB page cache re-reads B-tree pages on every batch.
            self.connection.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")
            # Checkpoint the WAL every ~40 MB instead of every 4 MB: a checkpoint syncs the
            # database file, and a batch writes megabytes of pages.
            self.connection.execute(f"PRAGMA wal_autocheckpoint={SQLITE_CHECKPOINT_PAGES}")
            if read_only:
                self.connection.execute("PRAGMA query_only=ON")
        self.cursor = self.connection.cursor()
        self._in_transaction = False
        self._pending_lock: tuple[str, Sequence[Any]] | None = None
        # SQLite write transactions begun, and the last one at whose start another connection
        # had committed since the one before (``PRAGMA data_version``): see ``quiet_since``.
        self.write_begins = 0
        self._data_version: int | None = None
        self._changed_at = 0
        self.batch_begins: list[int] = []  # write_begins of each applied batch
        self.last_batch: _Batch | None = None

    # SQL is written with '?' placeholders; psycopg wants '%s'.
    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        self.cursor.execute(self._sql(sql), params)
        return self.cursor

    def insert_rows(
        self,
        table: str,
        columns: dict[str, str],
        rows: Sequence[Sequence[Any]],
        *,
        conflict: Sequence[str] = (),
        update: str | None = None,
    ) -> None:
        """Insert ``rows`` (tuples in ``columns`` order; ``columns`` maps each name to its
        PostgreSQL type). With ``conflict`` columns, an existing row is updated: by ``update``
        (SQL over ``excluded.``) or else by setting every other column. Keys must be unique
        within ``rows``.

        SQLite: ``executemany`` (a C loop over the rows). PostgreSQL: one statement over
        ``unnest`` of one array per column, so a batch costs one round trip and the edge
        triggers fire once (``executemany`` measured 5x slower: per-row statements and
        trigger calls).
        """
        if not rows:
            return
        names = ", ".join(columns)
        tail = ""
        if conflict:
            update = update or ", ".join(
                f"{name} = excluded.{name}" for name in columns if name not in conflict
            )
            tail = f" ON CONFLICT ({', '.join(conflict)}) DO UPDATE SET {update}"
        if self.postgres:
            arrays = [list(values) for values in zip(*rows, strict=True)]
            source = ", ".join(f"%s::{sql_type}[]" for sql_type in columns.values())
            self.cursor.execute(
                f"INSERT INTO {table} ({names}) SELECT * FROM unnest({source}){tail}",  # noqa: S608
                arrays,
            )
        else:
            marks = ", ".join("?" * len(columns))
            self.cursor.executemany(
                f"INSERT INTO {table} ({names}) VALUES ({marks}){tail}",  # noqa: S608
                rows,
            )

    def delete_rows(
        self, table: str, columns: dict[str, str], keys: Sequence[Sequence[Any]]
    ) -> None:
        """Delete the rows whose ``columns`` equal one of ``keys`` (see ``insert_rows``)."""
        if not keys:
            return
        if self.postgres:
            arrays = [list(values) for values in zip(*keys, strict=True)]
            source = ", ".join(f"%s::{sql_type}[]" for sql_type in columns.values())
            names = ", ".join(columns)
            match = " AND ".join(f"{table}.{name} = k.{name}" for name in columns)
            self.cursor.execute(
                f"DELETE FROM {table} USING unnest({source}) AS k({names}) "  # noqa: S608
                f"WHERE {match}",
                arrays,
            )
        else:
            match = " AND ".join(f"{name} = ?" for name in columns)
            self.cursor.executemany(f"DELETE FROM {table} WHERE {match}", keys)  # noqa: S608

    def begin(self, *, write: bool = True, defer_lock: bool = False) -> None:
        """Start a transaction: a write one (SQLite ``BEGIN IMMEDIATE``, PostgreSQL the
        ingestion advisory lock) or a consistent read-only one (PostgreSQL REPEATABLE READ).
        ``defer_lock``: PostgreSQL sends the lock with the first ``load_state`` (or ``commit``)
        instead of in a round trip of its own."""
        if self.postgres:
            # With the lock, SET LOCAL: no hash or merge joins, no sequential scans and no JIT
            # in this transaction. Every read here is a key set (unnest) probing a primary key.
            # Left to itself the planner merge-joins 20 k keys with the whole edge table (345
            # ms on 1 M edges, a full scan per batch, vs ~70 ms of index probes), seq-scans a
            # bookkeeping table whose statistics still say it is empty (it grows during the
            # run: quadratic), and JIT-compiles the plan (36 ms).
            lock = (
                "SELECT pg_advisory_xact_lock(?), set_config('enable_hashjoin', 'off', true), "
                "set_config('enable_mergejoin', 'off', true), "
                "set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)",
                (ADVISORY_LOCK_KEY,),
            )
            if write and defer_lock:
                self._pending_lock = lock
            elif write:
                self.execute(*lock)
            else:
                self.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        else:
            self.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            if write:
                self.write_begins += 1
                version = self.execute("PRAGMA data_version").fetchall()[0][0]
                if version != self._data_version:
                    self._changed_at = self.write_begins
                    self._data_version = version
        self._in_transaction = True

    def quiet_since(self, begin: int) -> bool:
        """SQLite: whether no other connection has committed since write transaction number
        ``begin`` of this session started (``PRAGMA data_version`` unchanged at every write
        ``begin`` after it; our own commits never change it, and while we hold the write lock
        nobody else can commit)."""
        return not self.postgres and 0 < begin and self._changed_at <= begin

    def commit(self) -> None:
        if self.postgres:
            if self._pending_lock:  # a transaction that read nothing still serialises
                self.execute(*self._pending_lock)
                self._pending_lock = None
            self.connection.commit()
        else:
            self.execute("COMMIT")
        self._in_transaction = False

    def rollback(self) -> None:
        self._pending_lock = None
        if not self._in_transaction:
            return
        self._in_transaction = False
        if self.postgres:
            self.connection.rollback()
        else:
            self.execute("ROLLBACK")

    def close(self) -> None:
        try:
            self.rollback()
        finally:
            self.cursor.close()
            self._pooled.close()
            self.engine.dispose()

    def timestamp(self, time_us: int | None) -> Any:
        """A parameter for a ``DateTime`` column: SQLite text, PostgreSQL ``datetime``."""
        if time_us is None:
            return None
        return _datetime(time_us) if self.postgres else _sqlite_text(time_us)

    # --- key sets as a FROM item ``k`` ---

    def _pairs(self, pairs: Iterable[tuple[int, int]]) -> tuple[str, list[Any]]:
        """FROM item ``k(a, b)`` over the pairs, and its parameters."""
        if self.postgres:
            left, right = [], []
            for a, b in pairs:
                left.append(a)
                right.append(b)
            return "unnest(?::bigint[], ?::bigint[]) AS k(a, b)", [left, right]
        return (
            "(SELECT value ->> 0 AS a, value ->> 1 AS b FROM json_each(?)) AS k",
            [json.dumps(list(pairs))],
        )

    def _values(self, values: Iterable[Any], sql_type: str) -> tuple[str, list[Any]]:
        """FROM item ``k(v)`` over single values (``sql_type``: bigint or text)."""
        if self.postgres:
            return f"unnest(?::{sql_type}[]) AS k(v)", [list(values)]
        return "(SELECT value AS v FROM json_each(?)) AS k", [json.dumps(list(values))]

    # --- reads of the batch's state (inside the batch transaction) ---

    def fetch_all(self, queries: Sequence[tuple[str, Sequence[Any]]]) -> list[list[tuple]]:
        """Run read queries in order and return the rows of each. PostgreSQL sends them all
        in one pipeline (one round trip instead of one per query; with the writes pipelined too,
        the single-event write path measured 3.1 ms -> 1.8 ms p50 per event)."""
        if not self.postgres:
            return [self.execute(sql, params).fetchall() for sql, params in queries]
        cursors = [self.connection.cursor() for _ in queries]
        try:
            with self.connection.pipeline():
                for cursor, (sql, params) in zip(cursors, queries, strict=True):
                    cursor.execute(self._sql(sql), params)
            return [cursor.fetchall() if cursor.description else [] for cursor in cursors]
        finally:
            for cursor in cursors:
                cursor.close()

    def pipeline(self) -> contextlib.AbstractContextManager:
        """PostgreSQL: queue the writes and send them in one round trip; SQLite: nothing."""
        return self.connection.pipeline() if self.postgres else contextlib.nullcontext()

    def load_state(
        self,
        event_ids: Sequence[str],
        user_ids: set[int],
        pairs: dict[str, set[tuple[int, int]]],
        upserted: set[int],
        *,
        blocks_among_users: bool,
    ) -> dict[str, Any]:
        """Everything a batch reads, in one go (``fetch_all``; after the write lock on
        PostgreSQL, which ``begin`` queued first).

        Returns ``seen`` (the ``event_ids`` already in ``ingested_events``), ``users``
        (``{user_id: [created_at, last_active_at, status, discoverable, private]}``),
        ``rows`` and ``versions`` per relation (``{(a, b): [created_at(, status)]}`` for pairs
        with a row; ``{(a, b): (time_us, event_id)}`` from the row, or from its tombstone when
        there is no row), ``field_versions`` (``{(user_id, field): (time_us, event_id)}``).
        Timestamps stay as the driver returns them: they are only ever written back unchanged.
        With ``blocks_among_users`` the block rows also include every block between two of
        ``user_ids`` (one primary-key range per user instead of a lookup per follow in both
        directions).
        """
        queries: list[tuple[str, Sequence[Any]]] = []
        if self._pending_lock:
            queries.append(self._pending_lock)
        names: list[str] = []

        def add(name: str, sql: str, params: Sequence[Any]) -> None:
            names.append(name)
            queries.append((sql, params))

        if event_ids:
            keys, params = self._values(event_ids, "text")
            add(
                "seen",
                f"SELECT e.event_id FROM {keys} CROSS JOIN ingested_events AS e "  # noqa: S608
                "WHERE e.event_id = k.v",
                params,
            )
        if user_ids:
            keys, params = self._values(user_ids, "bigint")
            add(
                "users",
                "SELECT u.user_id, u.created_at, u.last_active_at, u.account_status, "  # noqa: S608
                f"u.is_discoverable, u.is_private FROM {keys} CROSS JOIN users AS u "
                "WHERE u.user_id = k.v",
                params,
            )
        for relation, wanted in pairs.items():
            if not wanted:
                continue
            table, left, right, at = _PAIR_TABLES[relation]
            source, params = self._pairs(wanted)
            status = "status" if relation == "follow" else "NULL"
            if self.postgres:
                # LATERAL ... LIMIT 1: one parameterized primary-key probe per key, whatever
                # the (possibly stale) statistics of a table growing during the run suggest.
                columns, present = "t.present, t.created_at, t.status", "t.present"
                joins = (
                    f"LEFT JOIN LATERAL (SELECT {left} AS present, {at} AS created_at, "
                    f"{status} AS status, event_time_us, event_id FROM {table} "
                    f"WHERE {left} = k.a AND {right} = k.b LIMIT 1) AS t ON true "
                    "LEFT JOIN LATERAL (SELECT source_id, event_time_us, event_id "
                    "FROM relationship_tombstones WHERE relation = ? AND source_id = k.a "
                    "AND target_id = k.b LIMIT 1) AS v ON true"
                )
            else:
                columns = f"t.{left}, t.{at}, {'t.status' if status == 'status' else 'NULL'}"
                present = f"t.{left}"
                joins = (
                    f"LEFT JOIN {table} AS t ON t.{left} = k.a AND t.{right} = k.b "
                    "LEFT JOIN relationship_tombstones AS v ON v.relation = ? "
                    "AND v.source_id = k.a AND v.target_id = k.b"
                )
            add(
                relation,
                f"SELECT k.a, k.b, {columns}, t.event_time_us, t.event_id, "  # noqa: S608
                f"v.event_time_us, v.event_id FROM {source} {joins} "
                f"WHERE {present} IS NOT NULL OR v.source_id IS NOT NULL",
                [*params, relation],
            )
        if blocks_among_users and user_ids:
            keys, params = self._values(user_ids, "bigint")
            add(
                "blocks_among",
                "SELECT b.blocker_id, b.blocked_id, b.created_at "  # noqa: S608
                f"FROM {keys} CROSS JOIN blocks AS b WHERE b.blocker_id = k.v",
                params,
            )
        if upserted:
            keys, params = self._values(upserted, "bigint")
            add(
                "fields",
                "SELECT v.user_id, v.field, v.event_time_us, v.event_id "  # noqa: S608
                f"FROM {keys} CROSS JOIN user_field_versions AS v WHERE v.user_id = k.v",
                params,
            )
        results = self.fetch_all(queries)
        if self._pending_lock:
            results = results[1:]
            self._pending_lock = None
        found = dict(zip(names, results, strict=True))
        state: dict[str, Any] = {
            "seen": {row[0] for row in found.get("seen", ())},
            "users": {
                row[0]: [row[1], row[2], row[3], bool(row[4]), bool(row[5])]
                for row in found.get("users", ())
            },
            "rows": {},
            "versions": {},
            "field_versions": {(r[0], r[1]): (r[2], r[3]) for r in found.get("fields", ())},
        }
        for relation in store.RELATIONS:
            rows: dict[tuple[int, int], list[Any]] = {}
            versions: dict[tuple[int, int], tuple[int, str]] = {}
            for a, b, present, created, status, row_time, row_id, dead_time, dead_id in found.get(
                relation, ()
            ):
                if present is not None:
                    rows[(a, b)] = [created, status] if relation == "follow" else [created]
                    if row_time is not None:
                        versions[(a, b)] = (row_time, row_id)
                elif dead_time is not None:
                    versions[(a, b)] = (dead_time, dead_id)
            state["rows"][relation] = rows
            state["versions"][relation] = versions
        for a, b, created in found.get("blocks_among", ()):
            if b in user_ids:
                state["rows"]["block"].setdefault((a, b), [created])
        return state


# --- applying a batch ----------------------------------------------------------------------------


_APPLIED, _SUPERSEDED, _QUARANTINED = "applied", "superseded", None
_USER_PRIVACY = {False: (None, None, None, None, False), True: (None, None, None, None, True)}
"""A user row reduced to what a relationship event reads: index 4, ``is_private``."""
_USER_COLUMNS = {
    "created_at": 0,
    "last_active_at": 1,
    "status": 2,
    "is_discoverable": 3,
    "is_private": 4,
}
"""Position of each ``user_upsert`` field in a user row (``StoreSession.load_state``)."""


class _Batch:
    """One batch in memory: the state it touches is loaded, the events are applied in order,
    then the changed rows are written back (``StoreSession``, same transaction)."""

    def __init__(
        self,
        session: StoreSession,
        prepared: PreparedBatch,
        line_at: Callable[[int], str] | None = None,
        prefetched: tuple[dict[str, Any], _Batch | None] | None = None,
    ) -> None:
        self.session = session
        self.line_at = line_at
        self.ts = session.timestamp
        self.stamps = prepared.stamps
        self.events = prepared.events
        self.counts = IngestCounts()
        self.effects = self.counts.effects
        self.quarantine: list[Quarantined] = []
        self.seen: list[tuple[str, int, str]] = []  # (event_id, time_us, outcome)
        self.count_delta: dict[int, list[int]] = {}  # user -> [followers, following]
        self.dirty: dict[str, set[tuple[int, int]]] = {r: set() for r in store.RELATIONS}
        self.dirty_users: set[int] = set()
        self.dirty_fields: set[tuple[int, str]] = set()
        self.interests: dict[int, tuple[str, ...]] = {}
        self.duplicates = 0  # first copies whose event id an earlier batch recorded
        # Later copies of an event id (file order), tried only if the copy before was
        # quarantined; ``retried``: how many were tried (the rest are duplicates).
        self.later = {event_id: list(copies) for event_id, copies in prepared.later.items()}
        self.waiting: list[Event] = []  # a heap of copies waiting for their place in order
        self.retried = 0
        self._load(prepared, prefetched)

    def _load(
        self,
        prepared: PreparedBatch,
        prefetched: tuple[dict[str, Any], _Batch | None] | None,
    ) -> None:
        if prefetched is None:
            state = self.session.load_state(
                [event[1] for event in self.events],
                prepared.user_ids,
                prepared.pairs,
                prepared.upserted,
                blocks_among_users=bool(prepared.pairs["follow"]),
            )
        else:
            state = _overlaid(*prefetched, prepared)
        if state["seen"]:  # applied in an earlier batch or file: duplicates
            self.duplicates = len(state["seen"])
            self.events = [event for event in self.events if event[1] not in state["seen"]]
        self.users = state["users"]
        self.rows: dict[str, dict[tuple[int, int], list[Any]]] = state["rows"]
        self.versions: dict[str, dict[tuple[int, int], tuple[int, str]]] = state["versions"]
        self.field_versions = state["field_versions"]
        self.original = {relation: set(rows) for relation, rows in self.rows.items()}
        self.follows, self.blocks = self.rows["follow"], self.rows["block"]  # the hot ones

    # --- per event ---

    def run(self) -> None:
        """Apply the events in ``(event_time, event_id)`` order.

        A quarantined event is not seen (module doc): if its id has a later copy in the batch
        (``PreparedBatch.later``), the next copy in file order is tried, at its own place in
        that order if it is still ahead, else at once (an out-of-order arrival: last writer
        wins settles it); the copies after the first that is not quarantined are duplicates.
        The fast path pays one truth test per event for this (``waiting``) and one for each
        quarantined event (``later``)."""
        seen = self.seen.append
        later, waiting = self.later, self.waiting
        applied = superseded = 0
        for event in self.events:
            if waiting and waiting[0] < event:
                self._run_waiting(event)
            if event[4] is None:  # target_id: a user_upsert
                outcome = self._upsert_user(event)
            else:
                outcome = self._relationship(event)
            if outcome is _QUARANTINED:
                if later and event[1] in later:
                    self._wait_for_next_copy(event[1])
                continue
            seen((event[1], event[0], outcome))
            if outcome is _APPLIED:
                applied += 1
            else:
                superseded += 1
        self.counts.applied += applied
        self.counts.superseded += superseded
        if waiting:
            self._run_waiting(None)

    def _wait_for_next_copy(self, event_id: str) -> None:
        """Queue the next copy (file order) of ``event_id``, whose copy was just quarantined."""
        copies = self.later[event_id]
        copy = copies.pop(0)
        if not copies:
            del self.later[event_id]
        self.retried += 1
        heapq.heappush(self.waiting, copy)

    def _run_waiting(self, before: Event | None) -> None:
        """Try the waiting copies that sort before event ``before`` (all of them if None), in
        ``(event_time, event_id)`` order. Ids are unique among the batch's first copies and at
        most one copy of an id waits, so events compare by time and id alone."""
        waiting = self.waiting
        while waiting and (before is None or waiting[0] < before):
            event = heapq.heappop(waiting)
            if event[4] is None:
                outcome = self._upsert_user(event)
            else:
                outcome = self._relationship(event)
            if outcome is _QUARANTINED:
                if event[1] in self.later:
                    self._wait_for_next_copy(event[1])
                continue
            self.seen.append((event[1], event[0], outcome))
            if outcome is _APPLIED:
                self.counts.applied += 1
            else:
                self.counts.superseded += 1

    def _reject(self, event: Event, reason: str) -> None:
        time_us, event_id, _, _, _, _, line_number, line = event
        text = self.line_at(line) if type(line) is int and self.line_at else line_text(line)
        self.quarantine.append(Quarantined(line_number, text, reason, event_id))

    def _set_follow(self, a: int, b: int, before: str | None, status: str | None, at: int) -> None:
        """Follow ``a -> b`` goes from ``before`` to ``status`` (None: no row) at ``at``."""
        if before == "active" or status == "active":
            step = 1 if status == "active" else -1
            delta = self.count_delta
            followee = delta.get(b)
            if followee is None:
                followee = delta[b] = [0, 0]
            followee[0] += step
            follower = delta.get(a)
            if follower is None:
                follower = delta[a] = [0, 0]
            follower[1] += step
        if status is None:
            del self.follows[(a, b)]
        else:  # created_at: when the edge entered its current status
            self.follows[(a, b)] = [self.stamps[at], status]

    def _relationship(self, event: Event) -> str | None:
        time_us, event_id, kind, actor, target = event[0], event[1], event[2], event[3], event[4]
        users = self.users
        if actor not in users:
            return self._reject(event, f"unknown_user: actor_id {actor} does not exist")
        if target not in users:
            return self._reject(event, f"unknown_user: target_id {target} does not exist")
        relation = RELATION_OF[kind]
        key = (target, actor) if kind in _ACCEPTING else (actor, target)
        stamp = (time_us, event_id)
        versions = self.versions[relation]
        version = versions.get(key)
        if version is not None and stamp <= version:
            return _SUPERSEDED
        effects = self.effects
        if relation == "follow":
            row = self.follows.get(key)
            before = row[1] if row else None
            if kind == "unfollow":
                status = None
            elif kind == "follow_reject":
                if before == "active":  # nothing pending to reject: no effect, no version
                    effects["noop"] += 1
                    return _APPLIED
                status = None
            elif self.blocks and self._blocked(key):
                effects["follows_refused_blocked"] += 1
                return _APPLIED
            elif kind == "follow_accept":
                status = "active"
            else:  # follow, follow_request: pending while the followee is private
                status = "active" if before == "active" or not users[key[1]][4] else "pending"
            if status == before:
                effects["noop"] += 1
            else:
                self._set_follow(key[0], key[1], before, status, time_us)
                if status == "active":
                    effects["follows_accepted" if before == "pending" else "follows_added"] += 1
                else:
                    effects["follow_requests_pending" if status else "follows_removed"] += 1
        elif relation == "block":
            blocks = self.rows["block"]
            present = key in blocks
            if kind == "block":
                if not present:
                    blocks[key] = [self.stamps[time_us]]
                effects["noop" if present else "blocks_added"] += 1
                self._unfollow_both_ways(key, stamp)
            else:
                if present:
                    del blocks[key]
                effects["blocks_removed" if present else "noop"] += 1
        else:
            rows = self.rows[relation]
            present = key in rows
            adding = kind in ("mute", "dismiss")
            if adding == present:
                effects["noop"] += 1
            else:
                if adding:
                    rows[key] = [self.stamps[time_us]]
                else:
                    del rows[key]
                noun = "mutes" if relation == "mute" else "dismissals"
                effects[f"{noun}_{'added' if adding else 'removed'}"] += 1
        versions[key] = stamp
        self.dirty[relation].add(key)
        return _APPLIED

    def _blocked(self, key: tuple[int, int]) -> bool:
        blocks = self.blocks
        return key in blocks or (key[1], key[0]) in blocks

    def _unfollow_both_ways(self, key: tuple[int, int], stamp: tuple[int, str]) -> None:
        """A block acts on both follow directions like an unfollow at its own time: it deletes
        a follow older than itself and leaves a tombstone; a newer follow stays."""
        follows, versions = self.rows["follow"], self.versions["follow"]
        for pair in (key, (key[1], key[0])):
            version = versions.get(pair)
            if version is not None and version > stamp:
                continue
            row = follows.get(pair)
            if row is not None:
                self._set_follow(*pair, row[1], None, stamp[0])
                self.effects["follows_removed_by_block"] += 1
            versions[pair] = stamp
            self.dirty["follow"].add(pair)

    def _upsert_user(self, event: Event) -> str:
        time_us, event_id, _, user_id, _, fields = event[:6]
        stamp = (time_us, event_id)
        row = self.users.get(user_id)
        created = row is None
        if created:
            # created_at defaults to the event's time; the other columns to the store defaults.
            row = self.users[user_id] = [self.stamps[time_us], None, "active", True, False]
        applied = created
        for name, value in (fields or {}).items():
            key = (user_id, name)
            version = self.field_versions.get(key)
            if version is not None and stamp <= version:
                continue
            self.field_versions[key] = stamp
            self.dirty_fields.add(key)
            applied = True
            if name == "interests":
                self.interests[user_id] = value
            elif name in ("created_at", "last_active_at"):
                row[_USER_COLUMNS[name]] = self.ts(value)
            else:
                row[_USER_COLUMNS[name]] = value
        if not applied:
            return _SUPERSEDED
        self.dirty_users.add(user_id)
        self.effects["users_created" if created else "users_updated"] += 1
        return _APPLIED

    # --- writing back ---

    def write(self, source: str, sha256: Callable[[], str]) -> None:
        """Write the changed rows back; quarantine rows under ``source`` and ``sha256()`` (called
        only if there are any)."""
        session = self.session
        ts = "timestamp"
        session.insert_rows(
            "users",
            {
                "user_id": "bigint",
                "created_at": ts,
                "last_active_at": ts,
                "account_status": "text",
                "is_discoverable": "boolean",
                "is_private": "boolean",
            },
            [(user, *self.users[user]) for user in sorted(self.dirty_users)],
            conflict=("user_id",),
        )
        tagged = sorted(self.interests)
        session.delete_rows("user_interests", {"user_id": "bigint"}, [(u,) for u in tagged])
        session.insert_rows(
            "user_interests",
            {"user_id": "bigint", "tag": "text"},
            [(user, tag) for user in tagged for tag in self.interests[user]],
        )
        session.insert_rows(
            "user_field_versions",
            {"user_id": "bigint", "field": "text", "event_time_us": "bigint", "event_id": "text"},
            [(*key, *self.field_versions[key]) for key in sorted(self.dirty_fields)],
            conflict=("user_id", "field"),
        )
        for relation in store.RELATIONS:
            self._write_relation(relation)
        session.insert_rows(
            "user_follow_counts",
            {"user_id": "bigint", "follower_count": "bigint", "following_count": "bigint"},
            [(u, *d) for u, d in sorted(self.count_delta.items()) if d[0] or d[1]],
            conflict=("user_id",),
            update="follower_count = user_follow_counts.follower_count + "
            "excluded.follower_count, following_count = user_follow_counts.following_count + "
            "excluded.following_count",
        )
        session.insert_rows(
            "ingested_events",
            {"event_id": "text", "event_time_us": "bigint", "outcome": "text"},
            sorted(self.seen),  # in key order: neighbouring B-tree pages
        )
        if self.quarantine:
            write_quarantine(session, source, sha256(), self.quarantine)

    def _write_relation(self, relation: str) -> None:
        """Rows that exist after the batch are upserted with their version; rows that no
        longer exist are deleted and their version kept as a tombstone."""
        dirty = self.dirty[relation]
        if not dirty:
            return
        table, left, right, at = _PAIR_TABLES[relation]
        rows, versions, original = self.rows[relation], self.versions[relation], self.original
        upserts, deletes, tombstones = [], [], []
        for key in sorted(dirty):
            row = rows.get(key)
            if row is not None:
                upserts.append((*key, *row, *versions[key]))
            else:
                if key in original[relation]:
                    deletes.append(key)
                tombstones.append((relation, *key, *versions[key]))
        session = self.session
        session.delete_rows(table, {left: "bigint", right: "bigint"}, deletes)
        columns = {left: "bigint", right: "bigint", at: "timestamp"}
        if relation == "follow":
            columns["status"] = "text"
        session.insert_rows(
            table,
            {**columns, "event_time_us": "bigint", "event_id": "text"},
            upserts,
            conflict=(left, right),
        )
        session.insert_rows(
            "relationship_tombstones",
            {
                "relation": "text",
                "source_id": "bigint",
                "target_id": "bigint",
                "event_time_us": "bigint",
                "event_id": "text",
            },
            tombstones,
            conflict=("relation", "source_id", "target_id"),
        )


def _overlaid(
    state: dict[str, Any], previous: _Batch | None, prepared: PreparedBatch
) -> dict[str, Any]:
    """A batch's state read ahead by the parser process (``load_state`` on its own read-only
    connection, begun after the batch before the previous one committed), brought up to date
    with what the previous batch wrote: the rows, versions and users it changed that this
    batch reads, and the event ids it recorded. Rows are copied: a batch mutates its own."""
    if previous is None:
        return state
    recorded = {seen[0] for seen in previous.seen}
    state["seen"] |= {event[1] for event in prepared.events if event[1] in recorded}
    for user in previous.dirty_users & prepared.user_ids:
        state["users"][user] = list(previous.users[user])
    for key in previous.dirty_fields:
        if key[0] in prepared.upserted:
            state["field_versions"][key] = previous.field_versions[key]
    for relation in store.RELATIONS:
        dirty = previous.dirty[relation]
        if relation != "block":  # blocks: also those among the batch's users (few anyway)
            dirty = dirty & prepared.pairs[relation]
        rows, versions = state["rows"][relation], state["versions"][relation]
        for key in dirty:
            row = previous.rows[relation].get(key)
            if row is None:
                rows.pop(key, None)
            else:
                rows[key] = list(row)
            versions[key] = previous.versions[relation][key]
    return state


def _storable(text: str) -> str:
    """PostgreSQL text cannot hold NUL characters (a broken line may): U+FFFD instead."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def _quarantine_row(source: str, sha256: str, entry: Quarantined) -> tuple[Any, ...]:
    """One ``quarantined_events`` row: reason at most 512 characters (the column), a line
    longer than ``MAX_QUARANTINED_LINE_CHARS`` cut to that, and the reason saying so."""
    line, reason = entry.line, entry.reason
    if len(line) > MAX_QUARANTINED_LINE_CHARS:
        note = (
            f" (line cut to its first {MAX_QUARANTINED_LINE_CHARS:,} of {len(line):,} characters)"
        )
        reason = reason[: 512 - len(note)] + note
        line = line[:MAX_QUARANTINED_LINE_CHARS]
    return (
        source,
        sha256,
        entry.line_number,
        _storable(reason[:512]),
        _storable(line),
        entry.event_id,
    )


def write_quarantine(
    session: StoreSession, source: str, sha256: str, rows: Sequence[Quarantined]
) -> None:
    """Upsert quarantine rows of ``source`` whose content has hash ``sha256`` (hex): keyed by
    ``(source, sha256, line_number)``, so the same bytes ingested again replace their earlier
    rows and a new file under the same name adds its own."""
    session.insert_rows(
        "quarantined_events",
        {
            "source": "text",
            "sha256": "text",
            "line_number": "bigint",
            "reason": "text",
            "line": "text",
            "event_id": "text",
        },
        [_quarantine_row(source, sha256, entry) for entry in rows],
        conflict=("source", "sha256", "line_number"),
    )


class PreparedBatch(NamedTuple):
    """One batch of lines, checked and ordered, ready to apply (``prepare_batch``): all the
    work that needs no database, so the parser process can do it."""

    read: int
    quarantined: list[Quarantined]
    duplicates: int  # later copies of an event id within the batch
    later: dict[str, list[Event]]  # those copies by event id, in file order
    events: list[Event]  # the first copy of each event id, by (event_time, event_id)
    user_ids: set[int]  # every actor and target
    pairs: dict[str, set[tuple[int, int]]]  # relation -> (source, target) keys to read
    upserted: set[int]  # users with a user_upsert
    stamps: dict[int, Any]  # event time (us) -> how the store's DateTime column takes it


def prepare_batch(items: Sequence[Event | Quarantined], backend: str = "sqlite") -> PreparedBatch:
    """Split validated lines (file order) into quarantined ones, later copies of an
    ``event_id`` (``later``: tried by ``apply_batch`` only if the copy before them is
    quarantined when applied, else duplicates) and the events to apply (the first copy of each
    id), sorted by ``(event_time, event_id)``; collect the keys the batch must read (the later
    copies' too) and format its event times for ``backend`` (``sqlite``: text; otherwise
    ``datetime``)."""
    quarantined: list[Quarantined] = []
    first: dict[str, Event] = {}
    later: dict[str, list[Event]] = {}
    duplicates = 0
    for item in items:
        if type(item) is Quarantined:
            quarantined.append(item)
        elif item[1] in first:
            duplicates += 1
            copies = later.get(item[1])
            if copies is None:
                later[item[1]] = [item]
            else:
                copies.append(item)
        else:
            first[item[1]] = item
    # Events compare as tuples, (time_us, event_id, ...), and the ids are unique here.
    events = sorted(first.values())
    user_ids: set[int] = set()
    upserted: set[int] = set()
    pairs: dict[str, set[tuple[int, int]]] = {relation: set() for relation in store.RELATIONS}
    follow_keys, block_keys = pairs["follow"], pairs["block"]
    spares = [copy for copies in later.values() for copy in copies]
    for _, _, kind, actor, target, *_ in itertools.chain(events, spares):
        user_ids.add(actor)
        if target is None:
            upserted.add(actor)
            continue
        user_ids.add(target)
        relation = RELATION_OF[kind]
        if relation == "follow":
            follow_keys.add((target, actor) if kind in _ACCEPTING else (actor, target))
        elif relation == "block":  # a block also rewrites both follow directions
            block_keys.add((actor, target))
            follow_keys.add((actor, target))
            follow_keys.add((target, actor))
        else:
            pairs[relation].add((actor, target))
    stored = _sqlite_text if backend == "sqlite" else _datetime
    stamps = {event[0]: stored(event[0]) for event in itertools.chain(events, spares)}
    return PreparedBatch(
        len(items), quarantined, duplicates, later, events, user_ids, pairs, upserted, stamps
    )


def apply_batch(
    session: StoreSession,
    items: Sequence[Event | Quarantined] | PreparedBatch,
    source: str,
    *,
    line_at: Callable[[int], str] | None = None,
    prefetched: tuple[dict[str, Any], _Batch | None, int] | None = None,
    sha256: str | Callable[[], str] | None = None,
) -> IngestCounts:
    """Apply one batch of validated lines in one transaction; returns its counts.

    ``items`` in file order (or already a ``PreparedBatch``): duplicates are decided in that
    order (the first copy of an ``event_id`` that is not quarantined wins: ``_Batch.run``),
    and the events are applied in ``(event_time, event_id)`` order. ``line_at`` turns an
    event's ``line`` given as a byte offset (the parser process sends offsets, not lines)
    into the original line.
    ``prefetched``: ``(state, previous batch, begin)``: the state read ahead by the parser
    process after write transaction ``begin`` of this session committed (``ingest_file``); it
    is used, updated with the previous batch's writes, only if no other connection has
    committed since (``StoreSession.quiet_since``), else the state is read again.
    ``sha256``: the hex content hash of the input, recorded with each quarantine row of
    ``source`` (``write_quarantine``): the file's (``ingest_file``), or a function computing it
    only if the batch quarantines anything; None: the hash of the batch's own lines.
    """
    prepared = items if isinstance(items, PreparedBatch) else prepare_batch(items, session.backend)
    if sha256 is None:
        sha256 = functools.partial(_batch_sha256, prepared, line_at)
    elif isinstance(sha256, str):
        sha256 = functools.partial(str, sha256)
    counts = IngestCounts(read=prepared.read, duplicates=prepared.duplicates)
    session.begin(defer_lock=True)
    session.batch_begins.append(session.write_begins)
    if prefetched is not None and not session.quiet_since(prefetched[2]):
        prefetched = None  # another connection wrote since the read-ahead: read again
    try:
        batch = _Batch(session, prepared, line_at, prefetched and prefetched[:2])
        batch.run()
        counts.duplicates += batch.duplicates - batch.retried
        batch.quarantine = prepared.quarantined + batch.quarantine
        with session.pipeline():
            batch.write(source, sha256)
            session.commit()
    except BaseException:
        session.rollback()
        raise
    counts.applied = batch.counts.applied
    counts.superseded = batch.counts.superseded
    counts.effects = batch.counts.effects
    counts.quarantined = len(batch.quarantine)
    counts.quarantine_reasons = Counter(q.reason.split(":", 1)[0] for q in batch.quarantine)
    session.last_batch = batch
    return counts


def apply_events(
    session: StoreSession,
    records: Sequence[dict[str, Any]],
    source: str = "<api>",
    *,
    now: dt.datetime | None = None,
    settings: Settings | None = None,
) -> IngestCounts:
    """Validate and apply a few events (dicts as in a JSON line) in one transaction.

    The live write path: what ``bench/ingest.py`` times per follow/unfollow. Invalid events are
    quarantined under ``source`` with their position (1-based) as the line number. The
    event_time window is ``settings``' (default: the process settings) at ``now`` (default:
    the wall clock).
    """
    if settings is None:
        from recs.config import get_settings

        settings = get_settings()
    window = time_window(settings, now)
    items = [
        _validated(record, number, _row_text(record), None, window)
        for number, record in enumerate(records, start=1)
    ]
    return apply_batch(session, items, source)


def _lines_sha256(lines: Iterable[str]) -> str:
    """sha256 (hex) of lines, each followed by a newline (a JSON Lines file's bytes)."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8", errors="surrogatepass"))
        digest.update(b"\n")
    return digest.hexdigest()


def _batch_sha256(prepared: PreparedBatch, line_at: Callable[[int], str] | None) -> str:
    """The content hash ``quarantined_events.sha256`` records for a batch that is no file
    (``apply_events``: one per call): ``_lines_sha256`` of its lines in line order, so a
    re-sent batch replaces its own quarantine rows and another batch adds its own."""
    entries = [(entry.line_number, entry.line) for entry in prepared.quarantined]
    entries += [(event[6], event[7]) for event in prepared.events]
    entries += [(event[6], event[7]) for copies in prepared.later.values() for event in copies]
    entries.sort(key=lambda entry: entry[0])

    def text(line: str | bytes | int) -> str:
        if type(line) is int:  # a byte offset (from the parser process)
            return line_at(line) if line_at else str(line)
        return line_text(line)

    return _lines_sha256(text(line) for _, line in entries)


# --- files and runs ------------------------------------------------------------------------------


ProgressCallback = Callable[[str], None]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _batches(
    path: Path, batch_events: int, backend: str, window: TimeWindow, *, offsets: bool = False
) -> Iterator[PreparedBatch]:
    pending: list[Event | Quarantined] = []
    for item in read_events(path, window, offsets=offsets):
        pending.append(item)
        if len(pending) >= batch_events:
            yield prepare_batch(pending, backend)
            pending = []
    if pending:
        yield prepare_batch(pending, backend)


def parse_worker_main() -> None:
    """Entry point of the parser process (``_batches_from_worker``). ``argv``: path, batch size,
    store backend, the ``TimeWindow`` (``lowest,highest,now`` in µs) and, to read ahead, the
    SQLite store URL. Writes one pickled ``("batch",
    PreparedBatch, state)`` per batch to stdout, then ``("done", None, None)`` (or ``("error",
    message, None)``). With a URL, ``state`` is ``StoreSession.load_state`` of the batch, read
    on a read-only connection once the parent acknowledged (one byte on stdin) the batch
    before: by then every batch before that one has committed."""
    import gc
    import pickle
    import sys

    gc.disable()  # short-lived and allocation-heavy: the cyclic collector only costs time
    out = sys.stdout.buffer
    path, batch_events, backend = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    window = TimeWindow(*(int(bound) for bound in sys.argv[4].split(",")))
    url = sys.argv[5] if len(sys.argv) > 5 else ""
    reader = StoreSession(url, read_only=True) if url else None
    try:
        batches = _batches(path, batch_events, backend, window, offsets=True)
        for number, prepared in enumerate(batches):
            state = None
            if reader is not None:
                if number and sys.stdin.buffer.read(1) != b"1":
                    return  # the parent went away
                reader.begin(write=False)
                try:
                    state = reader.load_state(
                        [event[1] for event in prepared.events],
                        prepared.user_ids,
                        prepared.pairs,
                        prepared.upserted,
                        blocks_among_users=bool(prepared.pairs["follow"]),
                    )
                finally:
                    reader.rollback()
                # Only upserted users need their whole row; for the others existence and
                # privacy, as one of two shared tuples (pickled once each: 3x less to send).
                state["users"] = {
                    user: row if user in prepared.upserted else _USER_PRIVACY[row[4]]
                    for user, row in state["users"].items()
                }
            # Plain tuples unpickle 3.5x faster than named ones; the batch code indexes them.
            plain = prepared._replace(
                events=[tuple(event) for event in prepared.events],
                later={key: [tuple(c) for c in copies] for key, copies in prepared.later.items()},
            )
            pickle.dump(("batch", plain, state), out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
        pickle.dump(("done", None, None), out)
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises
        pickle.dump(("error", f"{type(error).__name__}: {error}", None), out)
    finally:
        out.flush()
        if reader is not None:
            reader.close()


def _batches_from_worker(
    path: Path, batch_events: int, backend: str, window: TimeWindow, read_ahead_url: str | None
) -> Iterator[tuple[PreparedBatch, dict[str, Any] | None]]:
    """``_batches`` computed by a parser process, so parsing (and, for SQLite, reading the
    next batch's state) runs on another core while this process applies the previous batch.
    A plain ``python -c`` child (not ``multiprocessing``): nothing of the caller's
    ``__main__`` is re-imported. Yields ``(batch, state read ahead or None)``."""
    import pickle
    import subprocess
    import sys
    import tempfile

    errors = tempfile.TemporaryFile()  # a file, not a pipe: a chatty child never blocks on it
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from recs.ingest import parse_worker_main; parse_worker_main()",
            str(path),
            str(batch_events),
            backend,
            ",".join(str(bound) for bound in window),
            *([read_ahead_url] if read_ahead_url else []),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
    )
    assert worker.stdout is not None and worker.stdin is not None
    try:
        while True:
            try:
                kind, payload, state = pickle.load(worker.stdout)
            except EOFError:
                worker.wait(timeout=30)
                errors.seek(0)
                detail = errors.read().decode(errors="replace").strip()[-500:]
                raise RecsError(f"the parser process for {path} died: {detail}") from None
            if kind == "done":
                return
            if kind == "error":
                raise RecsError(f"parsing {path} failed: {payload}")
            if read_ahead_url:  # every batch before this one has committed
                with contextlib.suppress(BrokenPipeError):  # after its last batch it may exit
                    worker.stdin.write(b"1")
                    worker.stdin.flush()
            yield payload, state
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait(timeout=30)
        for stream in (worker.stdin, worker.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        errors.close()


class _LineAt:
    """The original line at a byte offset of a JSON Lines file (for late quarantines)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, offset: int) -> str:
        with open(self.path, "rb") as handle:
            handle.seek(offset)
            return line_text(handle.readline())


def ingest_file(
    session: StoreSession,
    path: Path,
    *,
    batch_events: int = BATCH_EVENTS,
    progress: ProgressCallback | None = None,
    parse_in_worker: bool | None = None,
    window: TimeWindow | None = None,
) -> IngestCounts:
    """Apply every event of one file in batches of ``batch_events`` (one transaction each) and
    record the file in ``ingested_files``. Returns the file's counts. ``window``: the
    event_time window (default: the process settings' at the wall clock, ``time_window``).

    Plain JSON Lines files of ``PARSE_WORKER_BYTES`` or more (or any plain JSON Lines file
    with ``parse_in_worker=True``) are parsed by a helper process, overlapping parsing with
    the database work; on SQLite it also reads each batch's state ahead, on its own read-only
    connection, while this process applies the batch before (``_overlaid`` brings it up to
    date; it is discarded if another connection wrote meanwhile). The result is the same
    either way.

    The file's sha256 is taken first: its quarantine rows are keyed by ``(source, sha256,
    line_number)`` (``write_quarantine``) and its ``ingested_files`` row by ``(source,
    sha256)``; ``source`` is the resolved path.
    """
    source = str(path.resolve())
    digest = _sha256(path)
    counts = IngestCounts()
    plain_json = _suffix(path) != ".parquet" and not _is_gzip(path)
    if parse_in_worker is None:
        parse_in_worker = plain_json and path.stat().st_size >= PARSE_WORKER_BYTES
    parse_in_worker = parse_in_worker and plain_json
    if window is None:
        from recs.config import get_settings

        window = time_window(get_settings())
    if parse_in_worker:
        read_ahead = None if session.postgres else session.url
        batches = _batches_from_worker(path, batch_events, session.backend, window, read_ahead)
    else:
        batches = ((batch, None) for batch in _batches(path, batch_events, session.backend, window))
    line_at = _LineAt(path)
    for prepared, state in batches:
        prefetched = None
        if state is not None and len(session.batch_begins) >= 2:
            # Read after the batch before the previous one committed (the worker waits for
            # our acknowledgement of the previous one): valid if nobody else wrote since.
            prefetched = (state, session.last_batch, session.batch_begins[-2])
        counts.add(
            apply_batch(
                session, prepared, source, line_at=line_at, prefetched=prefetched, sha256=digest
            )
        )
        if progress is not None:
            progress(f"{path.name}: {counts.read:,} events")
    session.begin()
    try:
        session.execute(
            "DELETE FROM ingested_files WHERE source = ? AND sha256 = ?", (source, digest)
        )
        session.execute(
            "INSERT INTO ingested_files (source, sha256, ingested_at, read, applied, duplicates, "
            "superseded, quarantined) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                source,
                digest,
                session.timestamp((dt.datetime.now(dt.UTC) - _EPOCH_UTC) // _US),
                counts.read,
                counts.applied,
                counts.duplicates,
                counts.superseded,
                counts.quarantined,
            ),
        )
        session.commit()
    except BaseException:
        session.rollback()
        raise
    log.info("ingested %s: %s", path, counts.to_dict())
    return counts


def ingest_paths(
    paths: Iterable[str | Path],
    settings: Settings,
    *,
    batch_events: int = BATCH_EVENTS,
    progress: ProgressCallback | None = None,
    parse_in_worker: bool | None = None,
    now: dt.datetime | None = None,
) -> dict[str, Any]:
    """Ingest event files (or folders of them) into ``settings.live_store_url``.

    Event ids: opaque strings, a JSON integer taken as its decimal text (``7`` and ``"7"``
    are one id; see the module doc). Events whose event_time is outside ``time_window
    (settings, now)`` are quarantined; ``now`` (naive UTC) is this machine's clock at the start
    of the run, read from the wall clock if None (tests pass one).

    Returns the run's counts (``IngestCounts.to_dict``: ``read, applied, duplicates,
    superseded, quarantined, balanced, effects, quarantine_reasons``) plus ``files`` (one entry
    per file: ``path`` and its counts), ``store`` (backend), ``seconds`` and
    ``events_per_second``. Raises ``IngestInputError`` for a missing path or a non-event file;
    bad lines never raise, they are quarantined.
    """
    import gc

    files = event_files(paths)
    window = time_window(settings, now)
    started = time.perf_counter()
    total = IngestCounts()
    per_file = []
    collecting = gc.isenabled()
    # Batches allocate millions of short-lived tuples and no cycles: pausing the cyclic
    # collector measured 12 % less CPU for 320 k events.
    gc.disable()
    session = StoreSession(settings.live_store_url)
    try:
        for path in files:
            counts = ingest_file(
                session,
                path,
                batch_events=batch_events,
                progress=progress,
                parse_in_worker=parse_in_worker,
                window=window,
            )
            total.add(counts)
            per_file.append({"path": str(path), **counts.to_dict()})
        backend = session.backend
    finally:
        session.close()
        if collecting:
            gc.enable()
    seconds = time.perf_counter() - started
    return {
        **total.to_dict(),
        "files": per_file,
        "store": backend,
        "seconds": round(seconds, 3),
        "events_per_second": round(total.read / seconds) if seconds > 0 else 0,
    }


def landing_dir(settings: Settings) -> Path:
    """The landing folder upstream drops event files into: ``<RECS_HOME>/landing``."""
    return Path(settings.home) / LANDING_DIR


def pending_files(settings: Settings) -> list[Path]:
    """Event files waiting in the landing folder, by name (producers must write them under a
    hidden ``.name`` or a non-event suffix and rename them when complete)."""
    folder = landing_dir(settings)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and is_event_file(p))


def ingest_landing(
    settings: Settings,
    files: Iterable[str | Path] | None = None,
    *,
    batch_events: int = BATCH_EVENTS,
    progress: ProgressCallback | None = None,
    now: dt.datetime | None = None,
) -> dict[str, Any]:
    """Ingest the landing folder's pending files (or the given ones), then move each into
    ``landing/ingested/`` (the ``recs_ingest_events`` DAG task and ``recs ingest --landing``).
    ``batch_events`` and ``now``: as in ``ingest_paths``.

    Files that vanished since they were listed (another run took them) are skipped. Rerunning
    after a crash is safe: a file not yet moved is ingested again, its applied events count as
    duplicates. Returns ``ingest_paths``'s result plus ``archived`` (the new paths).
    """
    chosen = pending_files(settings) if files is None else [Path(f) for f in files]
    chosen = [path for path in chosen if path.is_file()]
    result = ingest_paths(chosen, settings, batch_events=batch_events, progress=progress, now=now)
    archive = landing_dir(settings) / INGESTED_DIR
    archive.mkdir(parents=True, exist_ok=True)
    archived = []
    for path in chosen:
        target = archive / path.name
        if target.exists():
            target = archive / f"{path.stem}.{_sha256(path)[:12]}{path.suffix}"
        path.replace(target)
        archived.append(str(target))
    return {**result, "archived": archived}


# --- counts and mutual follows --------------------------------------------------------------------


def reconcile_counts(settings: Settings, *, repair: bool = False, examples: int = 10):
    """Recompute follower/following counts from the active edges and compare with
    ``user_follow_counts`` (the design's periodic reconciliation job).

    Returns ``users_checked`` (users with a stored or actual count), ``users_drifted``,
    ``follower_drift`` / ``following_drift`` (sums of absolute differences), ``examples`` (up to
    ``examples`` drifted users: ``user_id``, stored and actual counts), ``repaired``. With
    ``repair`` the stored counts are replaced by the actual ones in the same transaction (a
    write transaction: concurrent ingestion waits).
    """
    compared = f"""
        WITH actual AS ({store.FOLLOW_COUNTS_SQL}),
        stored AS (SELECT user_id, follower_count, following_count FROM user_follow_counts),
        keys AS (SELECT user_id FROM actual UNION SELECT user_id FROM stored)
        SELECT keys.user_id,
               COALESCE(stored.follower_count, 0) AS follower_count,
               COALESCE(actual.follower_count, 0) AS actual_follower_count,
               COALESCE(stored.following_count, 0) AS following_count,
               COALESCE(actual.following_count, 0) AS actual_following_count
        FROM keys
        LEFT JOIN actual ON actual.user_id = keys.user_id
        LEFT JOIN stored ON stored.user_id = keys.user_id
    """
    session = StoreSession(settings.live_store_url)
    try:
        session.begin(write=repair)
        checked, drifted_count, follower_drift, following_drift = session.execute(
            f"SELECT COUNT(*), "  # noqa: S608 - fixed SQL
            "COALESCE(SUM(CASE WHEN follower_count <> actual_follower_count "
            "OR following_count <> actual_following_count THEN 1 ELSE 0 END), 0), "
            "COALESCE(SUM(ABS(follower_count - actual_follower_count)), 0), "
            f"COALESCE(SUM(ABS(following_count - actual_following_count)), 0) FROM ({compared}) "
            "AS compared"
        ).fetchone()
        drifted = session.execute(
            f"SELECT * FROM ({compared}) AS compared WHERE "  # noqa: S608 - fixed SQL
            "follower_count <> actual_follower_count OR following_count <> "
            "actual_following_count ORDER BY user_id LIMIT ?",
            (examples,),
        ).fetchall()
        if repair and drifted_count:
            for statement in store.REBUILD_FOLLOW_COUNTS_SQL:
                session.execute(statement)
        session.commit()
    finally:
        session.close()
    return {
        "users_checked": int(checked),
        "users_drifted": int(drifted_count),
        "follower_drift": int(follower_drift),
        "following_drift": int(following_drift),
        "examples": [
            {
                "user_id": r[0],
                "follower_count": r[1],
                "actual_follower_count": r[2],
                "following_count": r[3],
                "actual_following_count": r[4],
            }
            for r in drifted
        ],
        "repaired": bool(repair and drifted_count),
    }


def mutual_follows(settings: Settings, user_id: int) -> list[int]:
    """The users ``user_id`` follows and is followed by (both follows active), ascending."""
    from sqlalchemy import text

    engine = store.engine_for(settings.live_store_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    f"SELECT friend_id FROM {store.MUTUAL_FOLLOWS_VIEW} WHERE user_id = :user_id "
                    "ORDER BY friend_id"
                ),
                {"user_id": user_id},
            ).fetchall()
    finally:
        engine.dispose()
    return [row[0] for row in rows]


def follow_counts(settings: Settings, user_id: int) -> dict[str, int]:
    """``{"follower_count", "following_count"}`` of one user as maintained (0 if no row)."""
    from sqlalchemy import select

    engine = store.engine_for(settings.live_store_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                select(
                    store.user_follow_counts.c.follower_count,
                    store.user_follow_counts.c.following_count,
                ).where(store.user_follow_counts.c.user_id == user_id)
            ).first()
    finally:
        engine.dispose()
    return {"follower_count": row[0] if row else 0, "following_count": row[1] if row else 0}
