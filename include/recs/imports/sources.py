"""Where ``recs import`` reads rows from: delimited text files, Parquet files, a SQL query.

Each source yields ``SourceBatch``es (``batches``) of at most about ``batch_rows`` rows, so
memory is bounded by a batch, never by the input:

- **CSV/TSV** (optionally gzip-compressed; detected by its first bytes, not its name): read in
  blocks of ``block_bytes`` at line boundaries. Every line keeps its **line number** in the
  file, comment lines (``#`` by default) and blank lines included, so a rejected row points at
  its line. The separator (tab, comma, semicolon, pipe or space) is taken from the first data
  line unless given; the first data line is a header unless every field of it is a number (or
  ``header`` says). Fields are read as text (validation parses them) with standard CSV quoting;
  a quoted field may not span lines. A line with another number of fields than the header is
  rejected as ``malformed_line``.
- **Parquet** and **SQL** (``--from-sql URL --query SQL``): typed columns, ``typed_sources``.

Errors a user can cause (a missing file, a file that is not text, a query that fails) raise
``ImportInputError`` with one readable line.
"""

from __future__ import annotations

import gzip
import logging
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np
import polars as pl

from recs.errors import ImportInputError
from recs.imports.batches import Source, SourceBatch, reject_frame
from recs.imports.typed_sources import ParquetSource, SqlQuery

log = logging.getLogger("recs.imports.sources")

BLOCK_BYTES = 16 << 20
"""Bytes of (decompressed) text parsed at a time: about 1 M edge lines."""

SEPARATORS = {"tab": "\t", "comma": ",", "semicolon": ";", "pipe": "|", "space": " "}
"""Names ``--separator`` accepts beside a single character."""

PARQUET_SUFFIXES = (".parquet", ".pq")

_NEWLINE, _CR, _QUOTE = ord("\n"), ord("\r"), ord('"')
_NUMBER = re.compile(rb"^\s*[+-]?\d+(\.\d*)?([eE][+-]?\d+)?\s*$")


# --- delimited text ------------------------------------------------------------------------------


def _open_bytes(path: Path) -> IO[bytes]:
    """``path`` for reading bytes, gzip-decompressed if its first two bytes say so."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - returned open
    except FileNotFoundError:
        raise ImportInputError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise ImportInputError(f"{path} is a folder, not a file") from None
    except OSError as error:
        raise ImportInputError(f"cannot read {path}: {error.strerror or error}") from None
    if handle.read(2) == b"\x1f\x8b":
        handle.seek(0)
        return gzip.GzipFile(fileobj=handle, mode="rb")  # type: ignore[return-value]
    handle.seek(0)
    return handle


def parse_separator(value: str | None) -> str | None:
    """``--separator``: a name of ``SEPARATORS``, ``\\t``, or one character; None: detect."""
    if value is None:
        return None
    value = SEPARATORS.get(value.lower(), "\t" if value == "\\t" else value)
    if len(value) != 1 or value in ('"', "\n", "\r"):
        raise ImportInputError(
            f"--separator must be one character or one of {', '.join(SEPARATORS)}, not {value!r}"
        )
    return value


class DelimitedFile:
    """A CSV/TSV file, optionally gzipped (module docstring): header, separator and columns are
    read from its first data line when the file is opened."""

    def __init__(
        self,
        path: Path,
        *,
        separator: str | None = None,
        header: bool | None = None,
        comment: str | None = "#",
        block_bytes: int = BLOCK_BYTES,
    ) -> None:
        self.path = Path(path)
        self.name = str(path)
        self.comment = comment.encode() if comment else None
        self.block_bytes = block_bytes
        first = self._first_data_line()
        if first is None:
            self.separator = separator or ","
            self.has_header = bool(header)
            self.columns = []
        else:
            text = first.decode("utf-8", "replace")
            if "\r" in text.rstrip("\r"):
                raise ImportInputError(
                    f"{path}: its lines end with a carriage return alone (old Mac line ends): "
                    "convert them to newlines first, e.g. tr '\\r' '\\n' < in.csv > out.csv"
                )
            self.separator = separator or _sniff_separator(text)
            fields = _split_fields(first, self.separator)
            self.has_header = (
                header if header is not None else not all(_NUMBER.match(f) for f in fields)
            )
            if self.has_header:
                self.columns = [_field_text(f) for f in fields]
            else:
                self.columns = [str(i) for i in range(1, len(fields) + 1)]
        self.headerless = not self.has_header
        self.integer_columns: set[str] = set()  # set by the import: its id columns
        self._typed = True
        duplicated = sorted({c for c in self.columns if self.columns.count(c) > 1})
        if duplicated:
            raise ImportInputError(f"{path}: the header names {', '.join(duplicated)} twice")

    def _blocks(self) -> Iterator[tuple[bytes, int]]:
        """``(block, first line number)``: whole lines, each ending with a newline."""
        line_number = 1
        carry = b""
        first = True
        with _open_bytes(self.path) as handle:
            while True:
                try:
                    data = handle.read(self.block_bytes)
                except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as error:
                    raise ImportInputError(f"cannot read {self.path}: {error}") from None
                if first:  # a UTF-8 byte order mark (spreadsheet exports) is not text
                    data, first = data.removeprefix(b"\xef\xbb\xbf"), False
                if not data:
                    if carry:
                        yield carry + b"\n", line_number
                    return
                data = carry + data if carry else data
                cut = data.rfind(b"\n")
                if cut < 0:
                    carry = data
                    continue
                block, carry = data[: cut + 1], data[cut + 1 :]
                yield block, line_number
                line_number += block.count(b"\n")

    def _first_data_line(self) -> bytes | None:
        for block, _ in self._blocks():
            start = 0
            while start < len(block):
                stop = block.index(b"\n", start)
                line = block[start:stop].rstrip(b"\r")
                start = stop + 1
                if line.strip() and not (self.comment and line.startswith(self.comment)):
                    return line
        return None

    def batches(self) -> Iterator[SourceBatch]:
        """Every data line as a row of text fields (module docstring); the header line, comment
        and blank lines are skipped but counted in line numbers."""
        header_pending = self.has_header
        for block, first_line in self._blocks():
            lines = _BlockLines(block, self.separator, self.comment)
            keep = lines.data
            if header_pending and keep.any():
                keep = keep.copy()
                keep[np.flatnonzero(keep)[0]] = False
                header_pending = False
            width = len(self.columns)
            ragged = keep & ((lines.fields != width) | lines.unbalanced)
            malformed = None
            if ragged.any():
                at = np.flatnonzero(ragged)
                details = [
                    "an unbalanced double quote" if odd else f"{n} fields, expected {width}"
                    for n, odd in zip(
                        lines.fields[at].tolist(), lines.unbalanced[at].tolist(), strict=True
                    )
                ]
                malformed = reject_frame(
                    first_line + at, "malformed_line", details, lines.texts(at)
                )
                keep = keep & ~ragged
            kept = np.flatnonzero(keep)
            frame = self._parse(lines.select(keep), first_line + kept) if len(kept) else None
            yield SourceBatch(
                frame if frame is not None else pl.DataFrame(schema=self._schema()),
                (first_line + kept).astype(np.int64),
                lambda positions, lines=lines, kept=kept: lines.texts(kept[positions]),
                malformed,
            )

    def _schema(self, typed: bool = False) -> dict[str, pl.DataType]:
        return {
            name: pl.Int64 if typed and name in self.integer_columns else pl.String
            for name in self.columns
        }

    def _parse(self, text: bytes, line_numbers: np.ndarray) -> pl.DataFrame:
        """The lines as a frame: the ``integer_columns`` parsed as Int64 straight away (no text
        to allocate) while every value of the file has been one, else every column as text
        (after the first block that is not, the rest of the file too: no block parsed twice)."""
        attempts = (True, False) if self.integer_columns and self._typed else (False,)
        for typed in attempts:
            try:
                frame = pl.read_csv(
                    text,
                    has_header=False,
                    separator=self.separator,
                    schema=self._schema(typed),
                    quote_char='"',
                    encoding="utf8-lossy",
                    missing_columns="insert",
                    raise_if_empty=False,
                )
                if typed and any(frame[c].null_count() for c in self.integer_columns):
                    self._typed = False  # an empty id: read as text, so the reject names it
                    continue
                break
            except Exception as error:  # noqa: BLE001 - polars' ComputeError etc.: one line
                if typed:
                    self._typed = False  # a value that is not an integer: read it as text
                    continue
                first = " ".join(str(error).split())[:300]
                raise ImportInputError(
                    f"{self.path}: lines {line_numbers[0]:,}-{line_numbers[-1]:,} do not parse "
                    f"as {_separator_name(self.separator)}-separated text: {first}"
                ) from None
        if frame.height != len(line_numbers):  # a quoted field spanning lines
            raise ImportInputError(
                f"{self.path}: lines {line_numbers[0]:,}-{line_numbers[-1]:,} hold a quoted "
                "field that spans lines, which recs import does not read"
            )
        return frame


class _BlockLines:
    """The lines of one block as positions into it (vectorised: no Python loop per line)."""

    def __init__(self, block: bytes, separator: str, comment: bytes | None) -> None:
        self.block = block
        data = np.frombuffer(block, dtype=np.uint8)
        ends = np.flatnonzero(data == _NEWLINE)
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        # content ends before "\r\n" as before "\n"
        has_cr = (ends > starts) & (data[np.maximum(ends - 1, 0)] == _CR)
        self.starts, self.stops = starts, ends - has_cr
        blank = self.stops == self.starts
        skip = blank
        if comment:
            first = data[np.minimum(starts, len(data) - 1)]
            is_comment = ~blank & (first == comment[0])
            for offset, byte in enumerate(comment[1:], start=1):
                at = np.minimum(starts + offset, len(data) - 1)
                is_comment &= (self.stops - self.starts > offset) & (data[at] == byte)
            skip = skip | is_comment
        self.data = ~skip
        # fields per line: the separators outside double quotes (counted from the line's start,
        # so an unbalanced quote spoils only its own line), plus one
        at = np.flatnonzero(data == ord(separator))
        line_of = np.searchsorted(starts, at, side="right") - 1
        self.unbalanced = np.zeros(len(ends), dtype=bool)
        if _QUOTE in block:
            quotes = np.cumsum(data == _QUOTE, dtype=np.int64)
            before_line = np.concatenate(([0], quotes))[starts]
            line_of = line_of[(quotes[at] - before_line[line_of]) % 2 == 0]
            quote_lines = np.searchsorted(starts, np.flatnonzero(data == _QUOTE), "right") - 1
            self.unbalanced = np.bincount(quote_lines, minlength=len(ends)) % 2 == 1
        self.fields = np.bincount(line_of, minlength=len(ends)) + 1

    def select(self, keep: np.ndarray) -> bytes:
        """The bytes of the kept lines, each with its newline."""
        if keep.all():
            return self.block
        data = np.frombuffer(self.block, dtype=np.uint8)
        lengths = np.empty_like(self.starts)
        lengths[:-1] = self.starts[1:] - self.starts[:-1]
        lengths[-1] = len(data) - self.starts[-1]
        return data[np.repeat(keep, lengths)].tobytes()

    def texts(self, lines: np.ndarray) -> list[str]:
        """The text of the lines at these indexes (without the line end)."""
        block = self.block
        return [
            block[start:stop].decode("utf-8", "replace")
            for start, stop in zip(
                self.starts[lines].tolist(), self.stops[lines].tolist(), strict=True
            )
        ]


def _sniff_separator(line: str) -> str:
    for candidate in ("\t", ",", ";", "|", " "):
        if candidate in line:
            return candidate
    return ","


def _separator_name(separator: str) -> str:
    names = {value: name for name, value in SEPARATORS.items()}
    return names.get(separator, repr(separator))


def _split_fields(line: bytes, separator: str) -> list[bytes]:
    import csv

    try:
        fields = next(csv.reader([line.decode("utf-8", "replace")], delimiter=separator))
    except csv.Error as error:
        raise ImportInputError(f"cannot split the first line into fields: {error}") from None
    return [field.encode() for field in fields] or [b""]


def _field_text(field: bytes) -> str:
    return field.decode("utf-8", "replace").strip()


def open_source(
    path: str | None,
    *,
    from_sql: str | None = None,
    query: str | None = None,
    file_format: str = "auto",
    separator: str | None = None,
    header: bool | None = None,
    comment: str | None = "#",
    batch_rows: int,
) -> Source:
    """The source of an import: a file ``path`` (``file_format`` auto, csv, tsv or parquet), or
    the result of ``query`` on the database ``from_sql``. ``ImportInputError`` for a missing
    file, a bad option combination or a failing query."""
    if from_sql is not None or query is not None:
        if path is not None:
            raise ImportInputError("give a file to import or --from-sql/--query, not both")
        if not from_sql or not query:
            raise ImportInputError(
                "--from-sql URL needs --query SQL (and --query needs --from-sql)"
            )
        return SqlQuery(from_sql, query, batch_rows=batch_rows)
    if path is None:
        raise ImportInputError(
            "give a file to import (CSV/TSV, .gz, Parquet) or --from-sql URL --query SQL"
        )
    file = Path(path)
    if not file.exists():
        raise ImportInputError(f"no such file: {file}")
    if file.is_dir():
        raise ImportInputError(f"{file} is a folder, not a file")
    fmt = file_format.lower()
    if fmt == "auto":
        suffixes = [s.lower() for s in file.suffixes]
        fmt = "parquet" if suffixes and suffixes[-1] in PARQUET_SUFFIXES else "csv"
        if fmt == "csv" and separator is None and any(s in (".tsv", ".tab") for s in suffixes):
            separator = "\t"
    if fmt == "parquet":
        return ParquetSource(file, batch_rows=batch_rows)
    if fmt in ("csv", "tsv"):
        if fmt == "tsv" and separator is None:
            separator = "\t"
        return DelimitedFile(file, separator=separator, header=header, comment=comment)
    raise ImportInputError(f"--format must be auto, csv, tsv or parquet, not {file_format!r}")
