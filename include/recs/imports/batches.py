"""What every source of ``recs import`` yields (``sources``, ``typed_sources``): ``SourceBatch``es,
through the ``Source`` protocol, and its rejected rows in ``REJECT_SCHEMA``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import polars as pl


@dataclass
class SourceBatch:
    """Rows of a source: ``frame`` (the source's columns: text for CSV/TSV, the source's own
    types otherwise), ``line_numbers`` (int64, 1-based line or row number of each row),
    ``text(positions)`` (the original text of the rows at those positions: for rejects) and
    ``malformed`` (rows the reader itself rejected: ``line_number, reason, detail, line``)."""

    frame: pl.DataFrame
    line_numbers: np.ndarray
    text: Callable[[np.ndarray], list[str]]
    malformed: pl.DataFrame | None = None


class Source(Protocol):
    """A readable input: ``name`` (a path, or a URL with its password masked) and ``columns``
    (names; a headerless file's are ``"1"``, ``"2"``, ...), known before any row is read."""

    name: str
    columns: list[str]
    headerless: bool

    def batches(self) -> Iterator[SourceBatch]: ...


REJECT_SCHEMA = {
    "line_number": pl.Int64,
    "reason": pl.String,
    "detail": pl.String,
    "line": pl.String,
}


def reject_frame(line_numbers, reason: str, details, lines) -> pl.DataFrame:
    """A frame of rejects in ``REJECT_SCHEMA`` (``details`` one string or one per row)."""
    count = len(line_numbers)
    if isinstance(details, str):
        details = [details] * count
    return pl.DataFrame(
        {
            "line_number": np.asarray(line_numbers, dtype=np.int64),
            "reason": [reason] * count,
            "detail": list(details),
            "line": list(lines),
        },
        schema=REJECT_SCHEMA,
    )
