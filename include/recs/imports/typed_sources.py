"""The typed sources of ``recs import`` (``sources.open_source`` opens them): a Parquet file and
the result of a SQL query, whose columns arrive with the source's types as Arrow record batches.

- **Parquet**: read by record batches (``pyarrow.parquet.ParquetFile.iter_batches``), only the
  mapped columns; a row's "line number" is its 1-based row number, its text the row as JSON.
- **SQL** (``--from-sql URL --query SQL``): PostgreSQL and SQLite through ADBC (PostgreSQL
  streams the result as binary ``COPY``), any other SQLAlchemy URL through
  ``polars.read_database`` in batches; "line number" = 1-based row of the result. An in-memory
  SQLite URL is refused (a new, empty database).
- Every batch goes through ``arrow_frame``, so validation reads each value exactly.

Errors a user can cause (a file that is not Parquet, a query that fails) raise
``ImportInputError`` with one readable line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from recs.errors import ImportInputError
from recs.imports.batches import SourceBatch

# --- Parquet ------------------------------------------------------------------------------------


class ParquetSource:
    """A Parquet file read by record batches of ``batch_rows`` (only the mapped columns)."""

    headerless = False

    def __init__(self, path: Path, *, batch_rows: int) -> None:
        import pyarrow.parquet as pq

        self.path = Path(path)
        self.name = str(path)
        self.batch_rows = batch_rows
        try:
            self._file = pq.ParquetFile(self.path)
        except FileNotFoundError:
            raise ImportInputError(f"no such file: {path}") from None
        except Exception as error:  # noqa: BLE001 - ArrowInvalid etc.
            raise ImportInputError(f"{path} is not a readable Parquet file: {error}") from None
        self.columns = list(self._file.schema_arrow.names)
        self.wanted: list[str] | None = None

    def batches(self) -> Iterator[SourceBatch]:
        offset = 0
        try:
            for batch in self._file.iter_batches(batch_size=self.batch_rows, columns=self.wanted):
                frame = arrow_frame(batch)
                numbers = np.arange(offset + 1, offset + frame.height + 1, dtype=np.int64)
                offset += frame.height
                yield SourceBatch(frame, numbers, _json_rows(frame))
        except OSError as error:
            raise ImportInputError(f"cannot read {self.path}: {error}") from None


def arrow_frame(batch) -> pl.DataFrame:
    """A record batch of a Parquet file or an ADBC result as a polars frame that validation
    reads exactly: a dictionary-encoded column decoded; an extension column (ADBC gives
    PostgreSQL's NUMERIC as an opaque one) as its storage; a 256-bit decimal, which polars
    cannot hold, and PostgreSQL's ``money`` (which ADBC gives as int64 cents: 7 read as 700) as
    decimal text, without a fraction of zeros (NUMERIC 7.00 is 7: text ids are whole decimals,
    ``parse_ids``); PostgreSQL's ``oid``, which ADBC gives as int32, as the unsigned number it
    is; a type polars cannot import (an interval, also inside a list) as text."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = []
    for column, field in zip(batch.columns, batch.schema, strict=True):
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        kind = column.type
        numeric = False
        if isinstance(kind, pa.BaseExtensionType):
            numeric = getattr(kind, "type_name", None) == "numeric"
            column, kind = column.storage, kind.storage_type
        if pa.types.is_decimal256(kind):
            column, numeric = pc.cast(column, pa.string()), True
        elif _postgresql_type(field) == "money" and pa.types.is_integer(kind):
            cents = column.to_pylist()
            column = pa.array([None if c is None else str(Decimal(c).scaleb(-2)) for c in cents])
            numeric = True
        elif _postgresql_type(field) == "oid" and pa.types.is_int32(kind):
            column = column.view(pa.uint32())  # unsigned 32 bits: 3,000,000,000 wrapped negative
        elif not _importable(kind):
            column = pa.array([None if v is None else str(v) for v in column.to_pylist()])
        if numeric and pa.types.is_string(column.type):
            column = pc.replace_substring_regex(column, r"^(-?\d+)\.0*$", r"\1")
        columns.append(column)
    frame = pl.from_arrow(pa.record_batch(columns, names=batch.schema.names))
    assert isinstance(frame, pl.DataFrame)
    return frame


def _postgresql_type(field) -> str | None:
    """The PostgreSQL type name ADBC's driver records in a result field's metadata, if any."""
    for key, value in (field.metadata or {}).items():
        if key.lower().endswith(b"type") and key.lower().startswith(b"postgresql"):
            return value.decode(errors="replace").lower()
    return None


def _importable(kind) -> bool:
    """Whether polars can import an Arrow type: not an interval, at any depth."""
    import pyarrow as pa

    if pa.types.is_interval(kind):
        return False
    return all(_importable(kind.field(i).type) for i in range(kind.num_fields))


def _json_rows(frame: pl.DataFrame) -> Callable[[np.ndarray], list[str]]:
    def text(positions: np.ndarray) -> list[str]:
        if not len(positions):
            return []
        rows = frame[positions.tolist()]
        if any(map(_polars_cannot_write, rows.iter_columns())):
            return [json.dumps(row, default=_jsonable, separators=(",", ":"))
                    for row in rows.iter_rows(named=True)]  # fmt: skip
        return rows.select(pl.struct(pl.all()).struct.json_encode()).to_series().to_list()

    return text


def _polars_cannot_write(column: pl.Series) -> bool:
    """Whether polars' JSON would lose ``column``'s values: it has no JSON of bytes, and writes
    an infinity or NaN as null (also inside a list or struct). Python's ``json`` writes them as
    JavaScript spells them (``Infinity``, ``NaN``), which Python's ``json`` reads back."""
    return "Binary" in str(column.dtype) or _non_finite(column)


def _non_finite(column: pl.Series) -> bool:
    kind = column.dtype
    if kind.is_float():
        return bool((~column.is_finite()).fill_null(False).any())
    if isinstance(kind, pl.List):
        return _non_finite(column.explode())
    if isinstance(kind, pl.Array):
        return _non_finite(column.arr.explode())
    if isinstance(kind, pl.Struct):
        return any(map(_non_finite, column.struct.unnest().iter_columns()))
    return False


def _jsonable(value: Any) -> Any:
    """A value ``json`` cannot write, as text: bytes as hex, a time in ISO 8601 as polars writes
    it, anything else as ``str``."""
    if isinstance(value, bytes):
        return value.hex()
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


# --- SQL ----------------------------------------------------------------------------------------


class SqlQuery:
    """The result of ``query`` on the database at ``url`` (module docstring)."""

    headerless = False

    def __init__(self, url: str, query: str, *, batch_rows: int) -> None:
        from recs.store.connections import display_url

        self.url, self.query, self.batch_rows = url, query, batch_rows
        try:
            self.name = display_url(url)
        except Exception:  # noqa: BLE001 - an unparsable URL
            raise ImportInputError(f"--from-sql: not a database URL: {url!r}") from None
        self._open()

    def _open(self) -> None:
        from recs.store.connections import is_postgres, libpq_url, one_line, sqlite_file

        path = sqlite_file(self.url)
        try:
            if is_postgres(self.url):
                import adbc_driver_postgresql.dbapi as adbc

                self._connection = adbc.connect(libpq_url(self.url))
            elif path is not None:
                import adbc_driver_sqlite.dbapi as adbc

                if not Path(path).is_file():
                    raise ImportInputError(f"--from-sql: no SQLite database at {path}")
                self._connection = adbc.connect(f"file:{path}?mode=ro", autocommit=True)
            elif _in_memory_sqlite(self.url):
                raise ImportInputError(
                    f"--from-sql: {self.url} is an in-memory SQLite database, empty when "
                    "opened: name the file, sqlite:///path/to/file.db"
                )
            else:
                self._connection = None
                self._reader = self._sqlalchemy_batches()
                self.columns = self._first_columns
                return
            self._cursor = self._connection.cursor()
            self._cursor.execute(self.query)
            self._reader = self._cursor.fetch_record_batch()
            self.columns = list(self._reader.schema.names)
        except ImportInputError:
            raise
        except Exception as error:  # noqa: BLE001 - driver errors: one line, password masked
            self.close()
            message = one_line(error, self.url, limit=300)
            raise ImportInputError(
                f"--from-sql: the query failed on {self.name}: {message}"
            ) from None

    def _sqlalchemy_batches(self) -> Iterator[pl.DataFrame]:
        from sqlalchemy import create_engine

        from recs.store.connections import normalize_url

        engine = create_engine(normalize_url(self.url))
        frames = pl.read_database(self.query, engine, iter_batches=True, batch_size=self.batch_rows)
        first = next(iter(frames), None)
        self._first_columns = list(first.columns) if first is not None else []

        def batches():
            try:
                if first is not None:
                    yield first
                yield from frames
            finally:
                engine.dispose()

        return batches()

    def batches(self) -> Iterator[SourceBatch]:
        from recs.store.connections import one_line

        offset = 0
        try:
            for batch in self._reader:
                frame = batch if isinstance(batch, pl.DataFrame) else arrow_frame(batch)
                numbers = np.arange(offset + 1, offset + frame.height + 1, dtype=np.int64)
                offset += frame.height
                yield SourceBatch(frame, numbers, _json_rows(frame))
        except ImportInputError:
            raise
        except Exception as error:  # noqa: BLE001
            raise ImportInputError(
                f"--from-sql: reading the result failed after {offset:,} rows: "
                f"{one_line(error, self.url, limit=300)}"
            ) from None
        finally:
            self.close()

    def close(self) -> None:
        for name in ("_cursor", "_connection"):
            handle = getattr(self, name, None)
            if handle is not None:
                try:
                    handle.close()
                except Exception:  # noqa: BLE001 - closing after an error
                    pass
                setattr(self, name, None)


def _in_memory_sqlite(url: str) -> bool:
    """Whether ``url`` names an in-memory SQLite database (``sqlite://``, ``sqlite:///:memory:``,
    a ``file::memory:`` or ``mode=memory`` URI): a new one, empty, for each connection."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    database = parsed.database or ""
    return parsed.get_backend_name() == "sqlite" and (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or "memory" in (parsed.query.get("mode"), database.partition("mode=")[2].split("&")[0])
    )
