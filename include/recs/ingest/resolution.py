"""Batch resolution: one batch applied to the live store in one transaction, last writer wins.

``apply_batch`` loads every row and version the batch touches (``StoreSession.load_state``),
resolves its events in memory in ``(event_time, event_id)`` order (``Batch``) and writes only
the changed rows back, then commits. Per relationship the last writer wins by the
``(event_time_us, event_id)`` order of ``recs.store.relationships``: an event that does not
supersede the relationship's version is *superseded* and changes nothing; a block acts on both
follow directions like an unfollow at its own time. Idempotent by ``event_id``: a copy of an
event already applied or superseded, in this batch or any earlier one, is a *duplicate*.
``apply_events`` is the same path for a few events (the live follow/unfollow write). The rules,
event type by event type, and their known limits: ``recs/ingest/README.md``.
"""

from __future__ import annotations

import datetime as dt
import functools
import heapq
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from recs.config import Settings
from recs.ingest.batch import IngestCounts, PreparedBatch, prepare_batch
from recs.ingest.events import (
    ACCEPTING,
    RELATION_OF,
    Event,
    Quarantined,
    line_text,
    time_window,
    validated,
)
from recs.ingest.quarantine import batch_sha256, write_quarantine
from recs.ingest.readers import row_text
from recs.ingest.session import USER_COLUMNS, StoreSession
from recs.store.relationships import PAIR_TABLES, RELATIONS, supersedes

_APPLIED, _SUPERSEDED, _QUARANTINED = "applied", "superseded", None


class Batch:
    """One batch in memory: the state it touches is loaded, the events are applied in order,
    then the changed rows are written back (``StoreSession``, same transaction)."""

    def __init__(
        self,
        session: StoreSession,
        prepared: PreparedBatch,
        line_at: Callable[[int], str] | None = None,
        prefetched: tuple[dict[str, Any], Batch | None] | None = None,
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
        self.dirty: dict[str, set[tuple[int, int]]] = {r: set() for r in RELATIONS}
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
        prefetched: tuple[dict[str, Any], Batch | None] | None,
    ) -> None:
        if prefetched is None:
            state = self.session.load_batch_state(prepared)
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
        key = (target, actor) if kind in ACCEPTING else (actor, target)
        stamp = (time_us, event_id)
        versions = self.versions[relation]
        if not supersedes(stamp, versions.get(key)):
            if kind == "block":
                # Superseded as a block (an unblock, or a later block, is newer), but it did
                # happen: its unfollow of both directions at its own time still applies, so
                # the follows end the same whatever order the block and its undo arrive in.
                self._unfollow_both_ways(key, stamp)
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
            if version is not None and supersedes(version, stamp):
                continue  # the follow is newer than the block: it stays
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
            if not supersedes(stamp, self.field_versions.get(key)):
                continue
            self.field_versions[key] = stamp
            self.dirty_fields.add(key)
            applied = True
            if name == "interests":
                self.interests[user_id] = value
            elif name in ("created_at", "last_active_at"):
                row[USER_COLUMNS[name]] = self.ts(value)
            else:
                row[USER_COLUMNS[name]] = value
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
        for relation in RELATIONS:
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
        table, left, right, at = PAIR_TABLES[relation]
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
    state: dict[str, Any], previous: Batch | None, prepared: PreparedBatch
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
    for relation in RELATIONS:
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


def apply_batch(
    session: StoreSession,
    items: Sequence[Event | Quarantined] | PreparedBatch,
    source: str,
    *,
    line_at: Callable[[int], str] | None = None,
    prefetched: tuple[dict[str, Any], Batch | None, int] | None = None,
    sha256: str | Callable[[], str] | None = None,
) -> IngestCounts:
    """Apply one batch of validated lines in one transaction; returns its counts.

    ``items`` in file order (or already a ``PreparedBatch``): duplicates are decided in that
    order (the first copy of an ``event_id`` that is not quarantined wins: ``Batch.run``),
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
        sha256 = functools.partial(batch_sha256, prepared, line_at)
    elif isinstance(sha256, str):
        sha256 = functools.partial(str, sha256)
    counts = IngestCounts(read=prepared.read, duplicates=prepared.duplicates)
    session.begin(defer_lock=True)
    session.batch_begins.append(session.write_begins)
    if prefetched is not None and not session.quiet_since(prefetched[2]):
        prefetched = None  # another connection wrote since the read-ahead: read again
    try:
        batch = Batch(session, prepared, line_at, prefetched and prefetched[:2])
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
        validated(record, number, row_text(record), None, window)
        for number, record in enumerate(records, start=1)
    ]
    return apply_batch(session, items, source)


# --- files and runs ------------------------------------------------------------------------------


# --- counts and mutual follows --------------------------------------------------------------------


