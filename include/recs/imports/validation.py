"""Rows of a source checked and converted to a store table's columns, vectorised (Polars).

``column_mapping`` decides which source column feeds each store column; ``validate`` turns one
``SourceBatch`` into ``(accepted, rejects)``:

- ``accepted``: ``line_number`` (Int64) plus the table's columns in contract dtypes (ids Int64,
  times ``Datetime("us")`` naive UTC, statuses and tags String, flags Boolean); a column the
  source does not have takes its default (``recs.imports.tables``).
- ``rejects``: ``line_number, reason, detail, line`` (``REJECT_REASONS``): each rejected row
  once, with the first reason found checking the columns in the table's order (the ids and the
  self-loop first), a detail naming the column and value, and the original text.

Duplicates and rows the store already holds are found later, across batches
(``recs.imports.staging``, ``recs.imports.writers``). Text ids are read by one cast; only the
values it refuses are examined again (whitespace, sign, overflow) to name the reason. ISO times
go through Arrow's ISO-8601 cast (16x faster than Polars' parser, ``bench/README.md``).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

import numpy as np
import polars as pl

from recs.contracts import MAX_USER_ID, TS
from recs.errors import ImportInputError
from recs.imports.batches import REJECT_SCHEMA, Source, SourceBatch
from recs.imports.tables import DEFAULT_TIME, EARLIEST_TIME, TAG_MAX_CHARS, ImportTable
from recs.times import MAX_EPOCH_US

TIME_FORMATS = ("iso", "epoch-s", "epoch-ms", "epoch-us")
"""``--time-format`` values beside a ``strftime`` pattern (any text with a ``%``)."""

_TRUE = ("true", "t", "yes", "y", "1")
_FALSE = ("false", "f", "no", "n", "0")
_ZONED = r"\d[Tt ]\d.*(?:[Zz]|[+-]\d\d(?::?\d\d)?)$"
_EPOCH_UNITS = {"epoch-s": 1_000_000, "epoch-ms": 1_000, "epoch-us": 1}

FLOAT_EXACT_IDS = {pl.Float16: 2**11 - 1, pl.Float32: 2**24 - 1, pl.Float64: 2**53 - 1}
"""The largest id a floating-point column holds unambiguously, 2**p - 1 for a p-bit significand
(float64: JavaScript's ``Number.MAX_SAFE_INTEGER``): from there on a float stands for more than
one whole number (2**53 + 1 is stored as 2**53), so an id may have been rounded on its way into
the file. Refused (``inexact_float_id``), never imported as another account's; a float type
not listed has no exact ids."""


@dataclass(frozen=True)
class ParseOptions:
    """How values are read: ``time_format`` (``TIME_FORMATS`` or a strftime pattern),
    ``default_time`` (unmapped time columns) and ``latest_time`` (later times are rejected:
    the wall clock plus ``RECS_INGEST_MAX_FUTURE_SECONDS``), all naive UTC."""

    time_format: str = "iso"
    default_time: dt.datetime = DEFAULT_TIME
    latest_time: dt.datetime = dt.datetime(9999, 12, 31)

    def __post_init__(self) -> None:
        if self.time_format not in TIME_FORMATS and "%" not in self.time_format:
            raise ImportInputError(
                f"--time-format must be {', '.join(TIME_FORMATS)} or a strftime pattern "
                f"(e.g. '%d/%m/%Y %H:%M'), not {self.time_format!r}"
            )


def shown_columns(columns: list[str], limit: int = 300) -> str:
    """``columns`` for an error line: names with a control or undecodable character escaped
    (``ascii``: a binary file's "header" must not write raw bytes to the terminal), the whole
    cut at ``limit`` characters; ``none`` when there are none."""
    if not columns:
        return "none"
    text = ", ".join(c if c.isprintable() and "\ufffd" not in c else ascii(c) for c in columns)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def column_mapping(
    table: ImportTable, source: Source, given: dict[str, str | None]
) -> dict[str, str | None]:
    """Store column -> source column (None: not in the source, the default applies).

    ``given`` holds the ``--<column>-col`` options (store column name -> source column). A
    column not given is found by its store name; in a headerless file the required id columns
    (and an interest's tag) default to positions ``1``, ``2``, ... in the table's order.
    Raises ``ImportInputError`` naming the available columns when a given column is absent or
    a required one cannot be found, and saying so when the source has no columns at all (an
    empty file).
    """
    columns = source.columns
    if not columns:
        raise ImportInputError(f"{source.name} is empty: no header and no rows to import")
    shown = shown_columns(columns)
    mapping: dict[str, str | None] = {}
    position = 0
    for column in table.columns:
        wanted = given.get(column.name)
        if wanted is not None:
            if wanted not in columns:
                raise ImportInputError(
                    f"{column.option} {wanted}: {source.name} has no such column (columns: {shown})"
                )
            mapping[column.name] = wanted
            continue
        if column.name in columns:
            mapping[column.name] = column.name
        elif column.required and source.headerless and position < len(columns):
            mapping[column.name] = columns[position]
        elif column.required:
            hint = (
                " (its first line was read as a header: pass --no-header if it is data)"
                if not source.headerless and hasattr(source, "has_header")
                else ""
            )
            raise ImportInputError(
                f"{source.name} has no column {column.name}{hint}: name the source column "
                f"with {column.option} (columns: {shown})"
            )
        else:
            mapping[column.name] = None
        if column.required:
            position += 1
    used = [name for name in mapping.values() if name is not None]
    twice = sorted({name for name in used if used.count(name) > 1})
    if twice:
        raise ImportInputError(f"source column {', '.join(twice)} is mapped to two store columns")
    return mapping


# --- per kind: parsed values and the reason a value is refused --------------------------------


def constant(value, rows: int, dtype) -> pl.Series:
    """A Series of ``rows`` copies of ``value`` (without a Python list of them)."""
    return pl.repeat(value, rows, dtype=dtype, eager=True)


def _missing(values: pl.Series) -> pl.Series:
    if values.dtype == pl.String:
        return values.is_null() | (values.str.strip_chars() == "")
    return values.is_null()


def _reasons(values: pl.Series, bad: pl.Series, reason: str) -> pl.Series:
    """``reason`` where ``bad``, ``missing_value`` where the value is empty, else null."""
    return pl.select(
        pl.when(_missing(values))
        .then(pl.lit("missing_value"))
        .when(bad)
        .then(pl.lit(reason))
        .otherwise(pl.lit(None, dtype=pl.String))
    ).to_series()


def parse_ids(values: pl.Series) -> tuple[pl.Series, pl.Series]:
    """User ids: ``(Int64 values, reasons)``; reasons ``missing_value``, ``non_integer_id``,
    ``id_out_of_range`` (negative or above ``MAX_USER_ID``), ``inexact_float_id`` (above
    ``FLOAT_EXACT_IDS`` of its float type) or null. Text must be a whole decimal;
    integer and decimal columns are read exactly, floats whole and up to ``FLOAT_EXACT_IDS``."""
    dtype = values.dtype
    if dtype == pl.String:
        parsed = values.cast(pl.Int64, strict=False)
        refused = parsed.is_null() | (parsed < 0)
        reasons = constant(None, len(values), pl.String)
        if not refused.any():  # every value a plain id: the usual case
            return parsed, reasons
        at = pl.Series(np.flatnonzero(refused.to_numpy()))  # only those are looked at again
        text = values.gather(at)
        stripped = text.str.strip_chars()
        again = stripped.cast(pl.Int64, strict=False)
        why = pl.select(
            pl.when(stripped.is_null() | (stripped == ""))
            .then(pl.lit("missing_value"))
            .when(~stripped.str.contains(r"^[+-]?[0-9]+$"))  # \d would take any script's digits
            .then(pl.lit("non_integer_id"))
            .when(again.is_null() | (again < 0))
            .then(pl.lit("id_out_of_range"))
            .otherwise(pl.lit(None, dtype=pl.String))
        ).to_series()
        return parsed.scatter(at, again), reasons.scatter(at, why)
    if dtype.is_integer():
        parsed = values.cast(pl.Int64, strict=False)
        bad = (parsed.is_null() & values.is_not_null()) | (parsed < 0).fill_null(False)
        return parsed, _reasons(values, bad, "id_out_of_range")
    if dtype.is_decimal():  # exact: a NUMERIC id above 2**53 is not rounded through a float
        parsed = values.cast(pl.Int64, strict=False)  # a fraction truncated, overflow null
        # truncated and back: the value itself only if whole (a floor overflows Decimal(38, 38))
        whole = (parsed.cast(dtype, strict=False) == values).fill_null(False)
        reasons = pl.select(
            pl.when(values.is_null())
            .then(pl.lit("missing_value"))
            .when(parsed.is_null())
            .then(pl.lit("id_out_of_range"))
            .when(~whole)
            .then(pl.lit("non_integer_id"))
            .when(parsed < 0)
            .then(pl.lit("id_out_of_range"))
            .otherwise(pl.lit(None, dtype=pl.String))
        ).to_series()
        return pl.select(pl.when(reasons.is_null()).then(parsed)).to_series(), reasons
    if dtype.is_float():
        floats = values.cast(pl.Float64)
        whole = floats.is_finite() & (floats == floats.floor())
        in_range = (floats >= 0) & (floats < float(MAX_USER_ID + 1))  # float(MAX_USER_ID): 2**63
        exact = floats <= float(FLOAT_EXACT_IDS.get(dtype, -1))
        parsed = pl.select(
            pl.when(whole & in_range & exact).then(floats.cast(pl.Int64, strict=False))
        ).to_series()
        reasons = pl.select(
            pl.when(values.is_null())
            .then(pl.lit("missing_value"))
            .when(~whole.fill_null(False))
            .then(pl.lit("non_integer_id"))
            .when(~in_range.fill_null(False))
            .then(pl.lit("id_out_of_range"))
            .when(parsed.is_null())
            .then(pl.lit("inexact_float_id"))
            .otherwise(pl.lit(None, dtype=pl.String))
        ).to_series()
        return parsed, reasons
    parsed = constant(None, len(values), pl.Int64)
    return parsed, _reasons(values, constant(True, len(values), pl.Boolean), "non_integer_id")


def parse_times(
    values: pl.Series, options: ParseOptions, *, nullable: bool = False
) -> tuple[pl.Series, pl.Series]:
    """Times: ``(Datetime("us") naive UTC, reasons)``; ``bad_timestamp`` for a value that does
    not parse as ``options.time_format`` or lies outside ``EARLIEST_TIME ..
    options.latest_time``; an empty value is ``missing_value`` unless ``nullable`` (then NULL).

    Formats: ``iso`` (ISO-8601 / RFC 3339 text: a date, or date and time with ``T`` or a space,
    optional fraction, optional ``Z`` or ``±HH:MM``; no zone means UTC), ``epoch-s`` (may have
    a fraction), ``epoch-ms``, ``epoch-us``, or a ``strftime`` pattern. Typed sources: a
    timestamp column is taken as it is (an aware one converted to UTC), a date as midnight."""
    fmt = options.time_format
    dtype = values.dtype
    if isinstance(dtype, pl.Datetime):
        parsed = values
        if dtype.time_zone is not None:
            parsed = parsed.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
        parsed = parsed.cast(TS)
    elif dtype == pl.Date:
        parsed = values.cast(TS)
    elif fmt in _EPOCH_UNITS:
        parsed = _epoch(values, _EPOCH_UNITS[fmt])
    elif dtype != pl.String:
        parsed = constant(None, len(values), TS)  # a number read as an ISO time
    elif fmt == "iso":
        parsed = _iso(values)
        if parsed.null_count() > values.null_count():  # surrounding spaces, or bad values
            parsed = _iso(values.str.strip_chars())
    else:
        parsed = _strptime(values.str.strip_chars(), fmt)
    low, high = EARLIEST_TIME, options.latest_time
    bad = parsed.is_null() | (parsed < low) | (parsed > high)
    if not bad.any():  # the usual case
        return parsed, constant(None, len(values), pl.String)
    missing = _missing(values)
    reasons = pl.select(
        pl.when(missing)
        .then(pl.lit(None if nullable else "missing_value", dtype=pl.String))
        .when(bad)
        .then(pl.lit("bad_timestamp"))
        .otherwise(pl.lit(None, dtype=pl.String))
    ).to_series()
    parsed = pl.select(pl.when(~missing & ~bad).then(parsed)).to_series().cast(TS)
    return parsed, reasons


def _epoch(values: pl.Series, micros_per_unit: int) -> pl.Series:
    """Numbers (or their text) of epoch units as timestamps; beyond year 9999: null. Whole
    numbers are converted exactly, fractions (``1289241911.72836`` s) rounded to 1 µs."""
    if values.dtype == pl.String:
        values = values.str.strip_chars()
    limit = MAX_EPOCH_US // micros_per_unit
    numbers = pl.DataFrame(
        {
            "whole": values.cast(pl.Int64, strict=False),
            "float": values.cast(pl.Float64, strict=False),
        }
    )
    micros = numbers.select(
        pl.when(pl.col("whole").is_not_null())
        .then(pl.when(pl.col("whole").abs() <= limit).then(pl.col("whole") * micros_per_unit))
        .when(pl.col("float").abs() <= limit)
        .then((pl.col("float") * micros_per_unit).round(0).cast(pl.Int64))
    ).to_series()
    return micros.cast(pl.Datetime("us"))


def _iso(values: pl.Series) -> pl.Series:
    """ISO-8601 text to naive UTC through Arrow's cast; values it refuses become null. A
    column of one style (all with a zone, or none) is one cast; a mix is split by zone."""
    import pyarrow as pa

    naive, aware = pa.timestamp("us"), pa.timestamp("us", "UTC")
    arrow = values.to_arrow()
    first = values.drop_nulls().head(1).to_list()
    guess = aware if first and re.search(_ZONED, first[0]) else naive
    try:
        return pl.Series(arrow.cast(guess).cast(naive)).cast(TS)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    zoned = values.str.contains(_ZONED).fill_null(False)
    out = constant(None, len(values), TS)
    for mask, arrow_type in ((~zoned, naive), (zoned, aware)):
        if not mask.any():
            continue
        positions = np.flatnonzero(mask.to_numpy())
        cast = _arrow_cast(values.gather(positions).to_arrow(), arrow_type).cast(naive)
        out = out.scatter(positions, pl.Series(cast).cast(TS))
    return out


def _arrow_cast(array, arrow_type):
    """``array`` cast to ``arrow_type``, values that do not parse as null: the whole array in
    one cast, else split in halves until the refused values are found (a few casts per bad
    value, not one per row)."""
    import pyarrow as pa

    try:
        return array.cast(arrow_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    if len(array) <= 16:
        cells = []
        for value in array:
            try:
                cells.append(pa.array([value.as_py()], pa.string()).cast(arrow_type)[0].as_py())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                cells.append(None)
        return pa.array(cells, arrow_type)
    half = len(array) // 2
    return pa.concat_arrays(
        [_arrow_cast(array.slice(0, half), arrow_type), _arrow_cast(array.slice(half), arrow_type)]
    )


def _strptime(values: pl.Series, fmt: str) -> pl.Series:
    try:
        parsed = values.str.strptime(pl.Datetime("us"), fmt, strict=False)
    except Exception as error:  # noqa: BLE001 - an unusable pattern
        raise ImportInputError(f"--time-format {fmt!r} is not a usable pattern: {error}") from None
    if parsed.dtype.time_zone is not None:  # type: ignore[union-attr]
        parsed = parsed.dt.convert_time_zone("UTC").dt.replace_time_zone(None)
    return parsed


def parse_statuses(values: pl.Series, accepted: tuple[str, ...]) -> tuple[pl.Series, pl.Series]:
    """Statuses, trimmed and lower-cased: ``unknown_status`` outside ``accepted``."""
    text = _text(values).str.strip_chars().str.to_lowercase()
    bad = ~text.is_in(list(accepted)).fill_null(False)
    return text, _reasons(values, bad, "unknown_status")


def parse_booleans(values: pl.Series) -> tuple[pl.Series, pl.Series]:
    """Flags: Boolean columns as they are; text true/false, t/f, yes/no, y/n, 1/0 (any case)
    and integers 0/1; else ``bad_boolean``."""
    if values.dtype == pl.Boolean:
        return values, _reasons(values, constant(False, len(values), pl.Boolean), "bad_boolean")
    text = _text(values).str.strip_chars().str.to_lowercase()
    parsed = pl.select(
        pl.when(text.is_in(list(_TRUE)))
        .then(pl.lit(True))
        .when(text.is_in(list(_FALSE)))
        .then(pl.lit(False))
        .otherwise(pl.lit(None, dtype=pl.Boolean))
    ).to_series()
    return parsed, _reasons(values, parsed.is_null(), "bad_boolean")


def parse_tags(values: pl.Series) -> tuple[pl.Series, pl.Series]:
    """Interest tags, trimmed: ``bad_tag`` if longer than ``TAG_MAX_CHARS``, or bytes that are
    not UTF-8 text."""
    text = _text(values).str.strip_chars()
    bad = (text.str.len_chars() > TAG_MAX_CHARS).fill_null(False) | (
        text.is_null() & values.is_not_null()  # bytes that are not UTF-8 text
    )
    return text, _reasons(values, bad, "bad_tag")


def _text(values: pl.Series) -> pl.Series:
    """``values`` as text; a binary column's decoded as UTF-8, null where they are not (polars'
    cast raises there), so the caller refuses them with its reason."""
    if values.dtype != pl.Binary:
        return values.cast(pl.String)

    def decoded(value: bytes | None) -> str | None:
        try:
            return None if value is None else value.decode("utf-8")
        except UnicodeDecodeError:
            return None

    return pl.Series(values.name, [decoded(v) for v in values.to_list()], dtype=pl.String)


# --- one batch ------------------------------------------------------------------------------


_EXPLAINED = {
    "missing_value": "is empty",
    "non_integer_id": "is not a whole number",
    "id_out_of_range": "is outside 0 .. 2**63-1",
    "inexact_float_id": "is above {exact}, the largest whole number a {dtype} column holds "
    "exactly: it may have been rounded (store ids as integers)",
    "bad_timestamp": "is not a valid time in 1970 .. now (--time-format {fmt})",
    "unknown_status": "is not one of {accepted}",
    "bad_boolean": "is not true/false, t/f, yes/no, y/n or 1/0",
    "bad_tag": f"is longer than {TAG_MAX_CHARS} characters",
}


def validate(
    batch: SourceBatch,
    table: ImportTable,
    mapping: dict[str, str | None],
    options: ParseOptions,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(accepted, rejects)`` of one batch (module docstring)."""
    frame = batch.frame
    rows = frame.height
    parsed: dict[str, pl.Series] = {}
    reason = constant(None, rows, pl.String)
    failed = constant(None, rows, pl.String)

    def note(name: str, reasons: pl.Series) -> None:
        nonlocal reason, failed
        fresh = reason.is_null() & reasons.is_not_null()
        if fresh.any():
            reason = pl.select(pl.when(fresh).then(reasons).otherwise(reason)).to_series()
            failed = pl.select(pl.when(fresh).then(pl.lit(name)).otherwise(failed)).to_series()

    for column in table.columns:
        source = mapping.get(column.name)
        if source is None:
            parsed[column.name] = _default(column, options, rows)
            continue
        values = frame.get_column(source)
        if column.kind == "id":
            value, reasons = parse_ids(values)
        elif column.kind == "time":
            value, reasons = parse_times(values, options, nullable=column.nullable)
        elif column.kind == "status":
            value, reasons = parse_statuses(values, column.accepted)
        elif column.kind == "boolean":
            value, reasons = parse_booleans(values)
        else:
            value, reasons = parse_tags(values)
        parsed[column.name] = value
        note(column.name, reasons)
        if table.pair and column.name == table.columns[1].name:
            left, right = parsed[table.columns[0].name], value
            loops = (left == right).fill_null(False)
            note(
                "",
                pl.select(
                    pl.when(loops).then(pl.lit("self_loop")).otherwise(pl.lit(None, pl.String))
                ).to_series(),
            )
    if table.time_order is not None and all(mapping.get(name) for name in table.time_order):
        earlier, later = (parsed[name] for name in table.time_order)
        inverted = (later < earlier).fill_null(False)  # a NULL (never active) is no inversion
        note(
            table.time_order[1],
            pl.select(
                pl.when(inverted)
                .then(pl.lit("active_before_created"))
                .otherwise(pl.lit(None, pl.String))
            ).to_series(),
        )
    ok = reason.is_null()
    accepted = (
        pl.DataFrame({"line_number": batch.line_numbers, **parsed}).filter(ok)
        if rows
        else _empty_accepted(table)
    )
    bad = np.flatnonzero(~ok.to_numpy()) if rows else np.zeros(0, np.int64)
    rejects = _rejects(batch, table, mapping, options, bad, reason, failed, parsed)
    if batch.malformed is not None and batch.malformed.height:
        rejects = pl.concat([batch.malformed, rejects])
    return accepted, rejects


def _default(column, options: ParseOptions, rows: int) -> pl.Series:
    if column.kind == "time":
        value = None if column.nullable else options.default_time
        return constant(value, rows, TS)
    dtype = pl.Boolean if column.kind == "boolean" else pl.String
    return constant(column.default, rows, dtype)


def accepted_schema(table: ImportTable) -> dict[str, pl.DataType]:
    """The columns and dtypes of ``validate``'s accepted frame."""
    kinds = {"id": pl.Int64, "time": TS, "status": pl.String, "boolean": pl.Boolean}
    return {
        "line_number": pl.Int64,
        **{column.name: kinds.get(column.kind, pl.String) for column in table.columns},
    }


def row_text(frame: pl.DataFrame, table: ImportTable) -> pl.Series:
    """Each row as read, the table's columns comma-separated in its order (a null is empty, a
    time ``YYYY-MM-DD HH:MM:SS.ffffff`` UTC): the ``line`` of a reject found after the input
    was parsed (``duplicate``, ``already_in_store``), whose raw text is not kept."""
    columns = [column.name for column in table.columns if column.name in frame.columns]
    return frame.select(
        pl.concat_str(
            [pl.col(name).cast(pl.String).fill_null("") for name in columns], separator=","
        ).alias("line")
    ).to_series()


def _empty_accepted(table: ImportTable) -> pl.DataFrame:
    return pl.DataFrame(schema=accepted_schema(table))


def _rejects(batch, table, mapping, options, bad, reason, failed, parsed) -> pl.DataFrame:
    if not len(bad):
        return pl.DataFrame(schema=REJECT_SCHEMA)
    reasons = reason.gather(bad).to_list()
    columns = failed.gather(bad).to_list()
    raw = {
        name: batch.frame.get_column(source).gather(bad).to_list()
        for name, source in mapping.items()
        if source is not None
    }
    if table.pair:
        left, right = table.columns[0].name, table.columns[1].name
        loop_ids = parsed[left].gather(bad).to_list()
    details = []
    for i, (why, name) in enumerate(zip(reasons, columns, strict=True)):
        if why == "self_loop":
            details.append(f"{left} = {right} = {loop_ids[i]}")
            continue
        if why == "active_before_created":
            first, second = table.time_order
            details.append(f"{second} {str(raw[second][i])!r} is before {first} "
                           f"{str(raw[first][i])!r}")  # fmt: skip
            continue
        column = table.column(name)
        kind = batch.frame.get_column(mapping[name]).dtype if why == "inexact_float_id" else None
        explained = _EXPLAINED[why].format(
            fmt=options.time_format,
            accepted=", ".join(column.accepted),
            dtype=str(kind).lower(),
            exact=f"{FLOAT_EXACT_IDS.get(kind, 0):,}",
        )
        shown = "" if why == "missing_value" else f" {str(raw[name][i])!r}"
        details.append(f"{name}{shown} {explained}")
    return pl.DataFrame(
        {
            "line_number": batch.line_numbers[bad],
            "reason": reasons,
            "detail": details,
            "line": batch.text(bad),
        },
        schema=REJECT_SCHEMA,
    )
