"""Event files: JSON Lines (``.jsonl``, ``.ndjson``, ``.json``, optionally ``.gz``) and Parquet.

``event_files(paths)`` lists what to ingest (files, or folders' event files by name, not
recursive); ``read_events(path, window)`` yields every line (row) of one file in file order as
a validated ``Event`` or a ``Quarantined`` entry (``recs.ingest.events``). Blank lines are
skipped and not counted; a file that cannot be read (or stops being readable part-way) ends with
one ``Quarantined`` entry at line number 0, reason ``unreadable_file: ...``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from recs.errors import IngestInputError
from recs.ingest.batch import BATCH_EVENTS
from recs.ingest.events import (
    NESTED_TOO_DEEP,
    Event,
    Quarantined,
    TimeWindow,
    line_text,
    quarantined_event_id,
    shown_value,
    validated,
    within_datetime_range,
)

EVENT_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet")


def _read_json_lines(
    path: Path, window: TimeWindow, offsets: bool = False
) -> Iterator[Event | Quarantined]:
    """msgspec decodes (and UTF-8-validates) each line (5x faster than ``json.loads``,
    ``bench/README.md``). With ``offsets`` an event's ``line`` is the
    byte offset of its line (cheaper to send between processes), not the line itself.

    msgspec recurses once per nesting level and raises ``RecursionError`` at Python's recursion
    limit (~1,000 levels, fewer deep in a call stack): such a line is quarantined as
    ``malformed: JSON nested too deep`` (an event nests 2 levels at most)."""
    import msgspec

    decode = msgspec.json.Decoder().decode
    opener = gzip.open if is_gzip(path) else open
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
            yield validated(record, line_number, start if offsets else raw, raw, window)


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


def row_text(record: dict[str, Any]) -> str:
    """A Parquet row (or an event given as a dict) as one JSON line, non-JSON values as
    ``str``: the text a quarantine row keeps."""
    try:
        return json.dumps(record, default=str, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return shown_value(record)


def _read_parquet(path: Path, window: TimeWindow) -> Iterator[Event | Quarantined]:
    import pyarrow.parquet as pq

    line_number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_EVENTS):
        rows, bad = _parquet_rows(batch)
        for index, record in enumerate(rows):
            line_number += 1
            record = {key: value for key, value in record.items() if value is not None}
            line = row_text(record)
            if index in bad:
                yield Quarantined(line_number, line, bad[index], quarantined_event_id(record))
            else:
                yield validated(record, line_number, line, None, window)


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
        if event_suffix(path) == ".parquet":
            import pyarrow

            # ArrowNotImplementedError (an unsupported type) is no ValueError, for one.
            unreadable = (*unreadable, pyarrow.ArrowException)
            yield from _read_parquet(path, window)
        else:
            yield from _read_json_lines(path, window, offsets)
    except unreadable as error:  # truncated gzip, corrupt Parquet, ...
        detail = " ".join(str(error).split()) or type(error).__name__
        yield Quarantined(0, "", f"unreadable_file: {detail}"[:512])


def is_gzip(path: Path) -> bool:
    """Whether ``path`` is gzip-compressed (by its suffix)."""
    return path.suffix.lower() == ".gz"


def event_suffix(path: Path) -> str:
    """The format suffix of ``path`` (``.jsonl``, ``.parquet``, ...), a ``.gz`` looked through."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def is_event_file(path: Path) -> bool:
    """Whether ``path`` names an event file (by suffix; hidden and ``_`` files never are)."""
    if path.name.startswith((".", "_")):
        return False
    return event_suffix(path) in EVENT_SUFFIXES and not (
        path.suffix.lower() == ".gz" and event_suffix(path) == ".parquet"
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
