"""The ADBC SQLite driver's Arrow batches as the snapshot contract's frames.

SQLite has no timestamp or boolean type: timestamps are text (SQLAlchemy's ``DateTime``,
``recs.store.connections``), booleans 0/1, and the reader reads a nullable text column's NULL
as '' (the driver types a column from its first batch). ``conform`` undoes all three; the
reader is ``recs.store.readers``.
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from recs.contracts import TS
from recs.errors import LiveStoreError


def conform(
    table: pa.Table | None, contract: dict[str, pl.DataType], nullable: set[str]
) -> pl.DataFrame:
    """An ADBC SQLite batch to the contract: parse text timestamps, 0/1 to Boolean, ''->NULL."""
    if table is None or table.num_rows == 0:
        return pl.DataFrame(schema=contract)
    arrays = {}
    for column, dtype in contract.items():
        array = table.column(column)
        if column in nullable and pa.types.is_string(array.type):
            array = pc.if_else(pc.equal(array, ""), pa.scalar(None, array.type), array)
        if dtype == TS:
            array = parse_timestamps(array)
        arrays[column] = array
    frame = pl.from_arrow(pa.table(arrays))
    assert isinstance(frame, pl.DataFrame)
    try:
        return frame.cast(dict(contract))
    except pl.exceptions.PolarsError as error:
        raise LiveStoreError(
            f"the live store holds a value outside its contract: {error}"
        ) from None


_UTC_SUFFIX = r"(Z|[+-]00:?00)$"


def parse_timestamps(text: pa.ChunkedArray) -> pa.ChunkedArray:
    """Naive UTC microseconds from SQLite's text ``YYYY-MM-DD HH:MM:SS[.ffffff]``.

    Arrow's ISO-8601 cast (also accepts a ``T`` separator; 16x faster than Polars' parser,
    ``bench/README.md``). A ``Z`` / ``+00:00``
    suffix (clients other than SQLAlchemy) is stripped on a second try; any other offset or
    text is a ``LiveStoreError``.
    """
    if not (pa.types.is_string(text.type) or pa.types.is_large_string(text.type)):
        return pc.cast(text, pa.timestamp("us"))  # all NULL: typed int64 by the driver
    try:
        return pc.cast(text, pa.timestamp("us"))
    except pa.ArrowInvalid:
        pass
    try:
        return pc.cast(pc.replace_substring_regex(text, _UTC_SUFFIX, ""), pa.timestamp("us"))
    except pa.ArrowInvalid as error:
        raise LiveStoreError(f"the live store holds a timestamp that is not UTC: {error}") from None
