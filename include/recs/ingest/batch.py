"""A batch of events before it touches the store: split, de-duplicated, ordered, keyed.

``prepare_batch`` does all the work of a batch that needs no database (so the parser process
can do it, ``recs.ingest.worker``): quarantined lines apart, the first copy of each
``event_id`` to apply and its later copies (tried only if an earlier one is quarantined), the
events sorted by ``(event_time, event_id)``, the keys the batch must read, and its event times
as the store's ``DateTime`` columns take them. ``IngestCounts`` is what a batch, a file or a
run did: ``read = applied + duplicates + superseded + quarantined`` always.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from recs.ingest.events import ACCEPTING, RELATION_OF, Event, Quarantined
from recs.store.connections import sqlite_timestamp_text
from recs.store.relationships import RELATIONS
from recs.times import from_epoch_micros

BATCH_EVENTS = 20_000
"""Events per transaction: well under a second of SQLite's write lock per batch; 50 k and 100 k
ingest no faster (``bench/README.md``)."""

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
    pairs: dict[str, set[tuple[int, int]]] = {relation: set() for relation in RELATIONS}
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
            follow_keys.add((target, actor) if kind in ACCEPTING else (actor, target))
        elif relation == "block":  # a block also rewrites both follow directions
            block_keys.add((actor, target))
            follow_keys.add((actor, target))
            follow_keys.add((target, actor))
        else:
            pairs[relation].add((actor, target))
    stored = sqlite_timestamp_text if backend == "sqlite" else from_epoch_micros
    stamps = {event[0]: stored(event[0]) for event in itertools.chain(events, spares)}
    return PreparedBatch(
        len(items), quarantined, duplicates, later, events, user_ids, pairs, upserted, stamps
    )
