"""recs.imports.validation: every value kind, every rejection reason, column mapping."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import numpy as np
import polars as pl
import pytest

from recs.errors import ImportInputError
from recs.imports.batches import SourceBatch
from recs.imports.tables import (
    ACCOUNT_STATUSES,
    DEFAULT_TIME,
    FOLLOW_STATUSES,
    IMPORT_TABLES,
    REJECT_REASONS,
)
from recs.imports.validation import (
    ParseOptions,
    column_mapping,
    parse_booleans,
    parse_ids,
    parse_statuses,
    parse_tags,
    parse_times,
    validate,
)
from recs.store import schema

NOW = dt.datetime(2026, 11, 2)
OPTIONS = ParseOptions(latest_time=NOW)


def ids(values, dtype=None):
    parsed, reasons = parse_ids(pl.Series(values, dtype=dtype))
    return parsed.to_list(), reasons.to_list()


def test_text_ids_plain_padded_signed_and_refused():
    assert ids(["5", " 6 ", "+7", "007", "9223372036854775807"]) == (
        [5, 6, 7, 7, 2**63 - 1],
        [None] * 5,
    )
    parsed, reasons = ids(
        ["", None, "x1", "1.0", "-3", "9223372036854775808", "1e3", "\u0663", "\uff17"]
    )
    assert reasons == [
        "missing_value",
        "missing_value",
        "non_integer_id",
        "non_integer_id",
        "id_out_of_range",
        "id_out_of_range",
        "non_integer_id",
        "non_integer_id",  # an Arabic-Indic 3: not an ASCII digit (was id_out_of_range)
        "non_integer_id",  # a fullwidth 7
    ]


def test_typed_ids_integers_floats_and_others():
    assert ids([1, -1, None], pl.Int64)[1] == [None, "id_out_of_range", "missing_value"]
    assert ids([2**64 - 1, 3], pl.UInt64) == ([None, 3], ["id_out_of_range", None])
    assert ids([3.0, 3.5, -1.0, float("nan")], pl.Float64)[1] == [
        None,
        "non_integer_id",
        "id_out_of_range",
        "non_integer_id",
    ]
    assert ids([True], pl.Boolean)[1] == ["non_integer_id"]


def test_float_ids_only_where_a_float_is_exact_and_decimal_ids_exactly():
    """A float64 holds every whole number up to 2**53 - 1; 2**53 also stands for 2**53 + 1 (the
    nearest float64), so it and above are refused; float32 likewise from 2**24. A decimal
    (SQL NUMERIC) is exact: 2**53 + 1 was imported as 2**53, another account's id."""
    assert ids([2.0**53 - 1, 2.0**53, 2.0**53 + 2, 3.0], pl.Float64) == (
        [2**53 - 1, None, None, 3],
        [None, "inexact_float_id", "inexact_float_id", None],
    )
    assert ids([16777215.0, 16777216.0, 1e30], pl.Float32) == (
        [16777215, None, None],
        [None, "inexact_float_id", "id_out_of_range"],
    )
    assert ids([2047.0, 2049.0], pl.Float16) == ([2047, None], [None, "inexact_float_id"])
    assert ids([2.0**63], pl.Float64)[1] == ["id_out_of_range"]  # not a whole id, rounded or not
    big = [2**53 + 1, 2**63 - 1, 2**63, -1, None]
    assert ids([None if v is None else Decimal(v) for v in big], pl.Decimal(20, 0)) == (
        [2**53 + 1, 2**63 - 1, None, None, None],
        [None, None, "id_out_of_range", "id_out_of_range", "missing_value"],
    )
    assert ids([Decimal("7.0"), Decimal("3.5")], pl.Decimal(10, 1)) == (
        [7, None],
        [None, "non_integer_id"],
    )
    # (a review's) a floor of these overflowed: a traceback instead of a reason
    assert ids([Decimal("-0.5"), Decimal("0")], pl.Decimal(38, 38)) == (
        [None, 0],
        ["non_integer_id", None],
    )
    assert ids([Decimal("-9999999999999999999999999999.5")], pl.Decimal(38, 10))[1] == [
        "id_out_of_range"
    ]


def times(values, fmt="iso", dtype=None, nullable=False):
    parsed, reasons = parse_times(
        pl.Series(values, dtype=dtype), ParseOptions(fmt, latest_time=NOW), nullable=nullable
    )
    return parsed.to_list(), reasons.to_list()


def test_iso_times_with_and_without_zones():
    parsed, reasons = times(
        [
            "2026-11-01T08:30:00Z",
            "2026-11-01 08:30:00.123456",
            "2026-11-01T10:30:00+02:00",
            "2026-11-01",
            " 2026-11-01T08:30 ",
            "2026-11-01T03:30:00-0500",
        ]
    )
    assert reasons == [None] * 6
    assert parsed == [
        dt.datetime(2026, 11, 1, 8, 30),
        dt.datetime(2026, 11, 1, 8, 30, 0, 123456),
        dt.datetime(2026, 11, 1, 8, 30),
        dt.datetime(2026, 11, 1),
        dt.datetime(2026, 11, 1, 8, 30),
        dt.datetime(2026, 11, 1, 8, 30),
    ]


def test_bad_and_out_of_range_times():
    parsed, reasons = times(
        ["2026-13-01", "yesterday", "1969-12-31T23:59:59Z", "2026-11-03", "", "2026-11-01"]
    )
    assert reasons == [
        "bad_timestamp",
        "bad_timestamp",
        "bad_timestamp",  # before 1970
        "bad_timestamp",  # after latest_time
        "missing_value",
        None,
    ]
    assert parsed[:5] == [None] * 5
    assert times(["", None], nullable=True) == ([None, None], [None, None])


def test_many_values_with_one_bad_one_are_found_by_splitting():
    values = ["2026-11-01T00:00:00"] * 1000
    values[637] = "2026-11-01T25:00:00"
    parsed, reasons = times(values)
    assert [i for i, r in enumerate(reasons) if r] == [637]
    assert sum(p is not None for p in parsed) == 999


def test_epoch_formats_text_and_numbers():
    assert times(["1289241911.72836"], "epoch-s")[0] == [
        dt.datetime(2010, 11, 8, 18, 45, 11, 728360)
    ]
    assert times([1289241911], "epoch-s", pl.Int64)[0] == [dt.datetime(2010, 11, 8, 18, 45, 11)]
    assert times(["1289241911728"], "epoch-ms")[0] == [dt.datetime(2010, 11, 8, 18, 45, 11, 728000)]
    assert times([1289241911728360], "epoch-us", pl.Int64)[0] == [
        dt.datetime(2010, 11, 8, 18, 45, 11, 728360)
    ]
    # epoch milliseconds read as seconds land in the far future: rejected, not loaded
    assert times(["1289241911728"], "epoch-s")[1] == ["bad_timestamp"]
    assert times(["abc", "99999999999999999999"], "epoch-s")[1] == ["bad_timestamp"] * 2


def test_strftime_patterns_and_typed_timestamps():
    assert times(["01/11/2026 08:30"], "%d/%m/%Y %H:%M")[0] == [dt.datetime(2026, 11, 1, 8, 30)]
    assert times(["2026-11-01"], "%d/%m/%Y")[1] == ["bad_timestamp"]
    aware = pl.Series([dt.datetime(2026, 11, 1, 10, 30)]).dt.replace_time_zone("Europe/Paris")
    parsed, reasons = parse_times(aware, OPTIONS)
    assert parsed.to_list() == [dt.datetime(2026, 11, 1, 9, 30)] and reasons.to_list() == [None]
    assert times([dt.date(2026, 11, 1)], dtype=pl.Date)[0] == [dt.datetime(2026, 11, 1)]
    assert times([1289241911], "iso", pl.Int64)[1] == ["bad_timestamp"]  # a number is not ISO


def test_time_format_must_be_known_or_a_pattern():
    with pytest.raises(ImportInputError, match="--time-format must be"):
        ParseOptions("unix")


def test_statuses_booleans_and_tags():
    parsed, reasons = parse_statuses(
        pl.Series([" Active", "pending", "blocked", ""]), FOLLOW_STATUSES
    )
    assert parsed.to_list()[:2] == ["active", "pending"]
    assert reasons.to_list() == [None, None, "unknown_status", "missing_value"]
    parsed, reasons = parse_booleans(pl.Series(["TRUE", "f", "yes", "N", "1", "0", "maybe", None]))
    assert parsed.to_list()[:6] == [True, False, True, False, True, False]
    assert reasons.to_list()[6:] == ["bad_boolean", "missing_value"]
    assert parse_booleans(pl.Series([True, None]))[1].to_list() == [None, "missing_value"]
    parsed, reasons = parse_tags(pl.Series([" music ", "x" * 65, ""]))
    assert parsed.to_list()[0] == "music"
    assert reasons.to_list() == [None, "bad_tag", "missing_value"]


class FakeSource:
    def __init__(self, columns, headerless=False):
        self.name, self.columns, self.headerless = "test.csv", columns, headerless


def test_mapping_by_name_by_position_and_by_option():
    edges = IMPORT_TABLES["edges"]
    by_name = column_mapping(edges, FakeSource(["followee_id", "follower_id", "x"]), {})
    assert by_name == {
        "follower_id": "follower_id",
        "followee_id": "followee_id",
        "created_at": None,
        "status": None,
    }
    positional = column_mapping(edges, FakeSource(["1", "2", "3"], headerless=True), {})
    assert positional["follower_id"] == "1" and positional["followee_id"] == "2"
    given = column_mapping(
        edges,
        FakeSource(["1", "2", "3", "4"], True),
        {"follower_id": "2", "followee_id": "1", "created_at": "4"},
    )
    assert given == {"follower_id": "2", "followee_id": "1", "created_at": "4", "status": None}


def test_mapping_errors_name_the_columns_there_are():
    edges = IMPORT_TABLES["edges"]
    with pytest.raises(ImportInputError, match=r"no column follower_id.*--follower-col.*a, b"):
        column_mapping(edges, FakeSource(["a", "b"]), {})
    with pytest.raises(ImportInputError, match=r"--created-at-col when: test.csv has no such"):
        column_mapping(edges, FakeSource(["follower_id", "followee_id"]), {"created_at": "when"})
    with pytest.raises(ImportInputError, match="mapped to two store columns"):
        column_mapping(edges, FakeSource(["a", "b"]), {"follower_id": "a", "followee_id": "a"})


def test_a_binary_files_header_is_escaped_and_cut_in_the_error():
    """(A newcomer's find.) A binary file read as CSV: its "column names" hold control bytes and
    U+FFFD; the error escapes them (no raw byte reaches the terminal) and stops at 300 chars."""
    edges = IMPORT_TABLES["edges"]
    names = ["\x07\ufffd\x1b[31m" + "x" * 400, "ok"]
    with pytest.raises(ImportInputError) as raised:
        column_mapping(edges, FakeSource(names), {})
    shown = str(raised.value).split("(columns: ", 1)[1]
    assert shown.startswith("'\\x07\\ufffd\\x1b[31mxxx") and shown.endswith("…)")
    assert len(shown) == 301 and str(raised.value).isprintable()


def batch_of(frame: pl.DataFrame, first_line: int = 2) -> SourceBatch:
    lines = [",".join("" if v is None else str(v) for v in row) for row in frame.rows()]
    return SourceBatch(
        frame,
        np.arange(first_line, first_line + frame.height, dtype=np.int64),
        lambda positions: [lines[i] for i in positions],
    )


def test_validate_converts_rows_and_rejects_each_once_with_the_first_reason():
    """Row by row (lines 2..8):
    2: a valid follow; 3: a self-loop; 4: a bad followee id and a bad time (the id comes first);
    5: an unknown status; 6: a bad time; 7: valid, pending; 8: an empty follower."""
    edges = IMPORT_TABLES["edges"]
    frame = pl.DataFrame(
        {
            "follower_id": ["1", "2", "3", "4", "5", "6", None],
            "followee_id": ["2", "2", "x", "1", "1", "1", "1"],
            "created_at": [
                "2026-01-01",
                "2026-01-01",
                "bad",
                "2026-01-01",
                "bad",
                "2026-01-02",
                "2026-01-01",
            ],
            "status": ["active", "active", "active", "gone", "active", "pending", "active"],
        }
    )
    mapping = {c: c for c in frame.columns}
    accepted, rejects = validate(batch_of(frame), edges, mapping, OPTIONS)
    assert accepted.rows() == [
        (2, 1, 2, dt.datetime(2026, 1, 1), "active"),
        (7, 6, 1, dt.datetime(2026, 1, 2), "pending"),
    ]
    assert rejects.select("line_number", "reason").rows() == [
        (3, "self_loop"),
        (4, "non_integer_id"),
        (5, "unknown_status"),
        (6, "bad_timestamp"),
        (8, "missing_value"),
    ]
    assert rejects["detail"].to_list() == [
        "follower_id = followee_id = 2",
        "followee_id 'x' is not a whole number",
        "status 'gone' is not one of active, pending",
        "created_at 'bad' is not a valid time in 1970 .. now (--time-format iso)",
        "follower_id is empty",
    ]
    assert rejects["line"].to_list()[0] == "2,2,2026-01-01,active"


def test_unmapped_columns_take_their_defaults():
    users = IMPORT_TABLES["users"]
    frame = pl.DataFrame({"user_id": ["5"]})
    mapping = column_mapping(users, FakeSource(["user_id"]), {})
    accepted, rejects = validate(batch_of(frame), users, mapping, OPTIONS)
    assert rejects.height == 0
    assert accepted.row(0, named=True) == {
        "line_number": 2,
        "user_id": 5,
        "created_at": DEFAULT_TIME,
        "last_active_at": None,
        "account_status": "active",
        "is_discoverable": True,
        "is_private": False,
    }


def test_the_import_specs_agree_with_the_store_schema():
    """Statuses, tables and columns of IMPORT_TABLES are the store's (the spec module stays
    light, so it repeats them); every reason has an explanation."""
    assert ACCOUNT_STATUSES == schema.ACCOUNT_STATUSES
    assert FOLLOW_STATUSES == schema.FOLLOW_STATUSES
    for spec in IMPORT_TABLES.values():
        table = schema.metadata.tables[spec.table]
        assert [c.name for c in spec.columns] == [
            c.name for c in table.columns if c.name not in ("event_time_us", "event_id")
        ]
        assert set(spec.key) == {c.name for c in table.primary_key.columns}
    assert all(REJECT_REASONS.values())
