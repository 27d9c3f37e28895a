"""Quarantined input: one ``quarantined_events`` row per rejected line, never a stopped file.

A row holds the file, its content's sha256, the 1-based line (Parquet: row) number, the
reason ``<code>: <detail>`` and the original text (line 0: a file that cannot be read). Rows
are keyed by ``(source, sha256, line_number)``: the same bytes ingested again replace their
own rows, and a new file under an old name (a daily ``landing/events.jsonl``) adds its own. A
quarantined event is not recorded as seen: fixed and re-sent, it applies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from recs.ingest.events import Quarantined, line_text

if TYPE_CHECKING:
    from recs.ingest.batch import PreparedBatch
    from recs.ingest.session import StoreSession

MAX_QUARANTINED_LINE_CHARS = 65_536
"""A quarantined line longer than this is stored cut to its first this-many characters: an
event line is ~150 bytes, and a runaway one (a 50 MB line, or past SQLite's and PostgreSQL's
1 GB limit on one value, which would fail the batch) must not fill ``quarantined_events``."""


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


def _lines_sha256(lines: Iterable[str]) -> str:
    """sha256 (hex) of lines, each followed by a newline (a JSON Lines file's bytes)."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8", errors="surrogatepass"))
        digest.update(b"\n")
    return digest.hexdigest()


def batch_sha256(prepared: PreparedBatch, line_at: Callable[[int], str] | None) -> str:
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
