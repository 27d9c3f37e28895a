"""recs.imports.sources and typed_sources: delimited text (line numbers, comments, quoting, gzip,
separators, headers), Parquet row batches and SQL queries, on hand-made files."""

from __future__ import annotations

import gzip
import sqlite3
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from recs.errors import ImportInputError, RecsError
from recs.imports.sources import DelimitedFile, open_source, parse_separator
from recs.imports.typed_sources import ParquetSource, SqlQuery


def write(path: Path, text: str, *, gz: bool = False) -> Path:
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def rows_of(source) -> tuple[list[tuple], list[int], list]:
    """(rows, line numbers, malformed rejects as (line, detail, text)) of every batch."""
    rows, lines, malformed = [], [], []
    for batch in source.batches():
        rows += batch.frame.rows()
        lines += batch.line_numbers.tolist()
        if batch.malformed is not None:
            malformed += batch.malformed.select("line_number", "detail", "line").rows()
    return rows, lines, malformed


def test_lines_keep_their_numbers_past_comments_blank_lines_and_the_header(tmp_path):
    """Line 1 comment, 2 header, 3 data, 4 blank, 5 comment, 6 data, 7 whitespace-free data
    with CRLF, 8 data without a final newline."""
    text = "# exported\nfollower_id,followee_id\n1,2\n\n# again\n3,4\r\n5,6\r\n7,8"
    source = open_source(str(write(tmp_path / "e.csv", text)), batch_rows=1024)
    assert source.columns == ["follower_id", "followee_id"] and not source.headerless
    rows, lines, malformed = rows_of(source)
    assert rows == [("1", "2"), ("3", "4"), ("5", "6"), ("7", "8")]
    assert lines == [3, 6, 7, 8]
    assert malformed == []


def test_lines_split_across_blocks_are_read_whole_and_numbered(tmp_path):
    """A 7-byte block cuts most lines in two; every line still comes out once, numbered."""
    text = "".join(f"{i}\t{i + 1}\n" for i in range(1, 40))
    path = write(tmp_path / "e.tsv", text)
    source = DelimitedFile(path, block_bytes=7)
    rows, lines, _ = rows_of(source)
    assert rows == [(str(i), str(i + 1)) for i in range(1, 40)]
    assert lines == list(range(1, 40))


def test_a_headerless_numeric_file_gets_positional_columns_and_gzip_is_seen_by_content(tmp_path):
    path = write(tmp_path / "plain-name.txt", "# snap\n0\t1\n1\t0\n", gz=True)
    source = open_source(str(path), batch_rows=1024)
    assert source.headerless and source.columns == ["1", "2"]
    assert source.separator == "\t"
    assert rows_of(source)[0] == [("0", "1"), ("1", "0")]


@pytest.mark.parametrize(
    ("text", "separator"),
    [("a;b\n1;2\n", ";"), ("a|b\n1|2\n", "|"), ("a b\n1 2\n", " "), ("a,b\n1,2\n", ",")],
)
def test_the_separator_is_taken_from_the_first_data_line(tmp_path, text, separator):
    source = open_source(str(write(tmp_path / "x.dat", text)), batch_rows=1024)
    assert source.separator == separator and source.columns == ["a", "b"]
    assert rows_of(source)[0] == [("1", "2")]


def test_separator_names_and_bad_separators():
    assert parse_separator("tab") == "\t" and parse_separator("\\t") == "\t"
    assert parse_separator("comma") == "," and parse_separator(";") == ";"
    assert parse_separator(None) is None
    for bad in ("ab", '"', ""):
        with pytest.raises(ImportInputError, match="--separator"):
            parse_separator(bad)


def test_header_and_no_header_override_detection(tmp_path):
    path = write(tmp_path / "e.csv", "10,20\n30,40\n")
    as_header = open_source(str(path), header=True, batch_rows=1024)
    assert as_header.columns == ["10", "20"] and rows_of(as_header)[0] == [("30", "40")]
    named = write(tmp_path / "n.csv", "src,dst\n1,2\n")
    as_data = open_source(str(named), header=False, batch_rows=1024)
    assert as_data.columns == ["1", "2"] and rows_of(as_data)[0] == [("src", "dst"), ("1", "2")]


def test_quoted_fields_may_hold_the_separator_and_ragged_lines_are_malformed(tmp_path):
    """Line 3 has a quoted comma; line 4 has three fields, line 5 one: both malformed."""
    text = 'user_id,tag\n1,music\n2,"rock, roll"\n3,a,b\n4\n5,books\n'
    source = open_source(str(write(tmp_path / "i.csv", text)), batch_rows=1024)
    rows, lines, malformed = rows_of(source)
    assert rows == [("1", "music"), ("2", "rock, roll"), ("5", "books")]
    assert lines == [2, 3, 6]
    assert malformed == [(4, "3 fields, expected 2", "3,a,b"), (5, "1 fields, expected 2", "4")]


def test_an_unbalanced_quote_spoils_only_its_own_line(tmp_path):
    """Line 2 opens a quote it never closes: malformed; lines 1 and 3 are read."""
    text = 'a,b\n1,"x\n2,3\n'
    rows, lines, malformed = rows_of(DelimitedFile(write(tmp_path / "q.csv", text)))
    assert rows == [("2", "3")] and lines == [3]
    assert malformed == [(2, "an unbalanced double quote", '1,"x')]


def test_texts_of_rows_are_the_original_lines(tmp_path):
    text = "a\tb\n# c\n1\t2\n3\t4\r\n"
    source = open_source(str(write(tmp_path / "t.tsv", text)), batch_rows=1024)
    batch = next(source.batches())
    assert batch.text(np.array([1, 0])) == ["3\t4", "1\t2"]


def test_an_empty_file_has_no_columns_and_no_rows(tmp_path):
    source = open_source(str(write(tmp_path / "empty.csv", "# only a comment\n")), batch_rows=1)
    assert source.columns == []
    assert rows_of(source)[0] == []


def test_duplicate_header_names_are_refused(tmp_path):
    with pytest.raises(ImportInputError, match="names a twice"):
        open_source(str(write(tmp_path / "d.csv", "a,a\n1,2\n")), batch_rows=1024)


def test_parquet_is_read_by_batches_with_row_numbers_and_json_text(tmp_path):
    path = tmp_path / "e.parquet"
    pl.DataFrame({"follower_id": list(range(10)), "followee_id": list(range(1, 11))}).write_parquet(
        path, row_group_size=4
    )
    source = open_source(str(path), batch_rows=3)
    assert isinstance(source, ParquetSource)
    batches = list(source.batches())
    assert [b.frame.height for b in batches] == [3, 3, 3, 1]
    assert np.concatenate([b.line_numbers for b in batches]).tolist() == list(range(1, 11))
    assert batches[1].text(np.array([0])) == ['{"follower_id":3,"followee_id":4}']


def test_arrow_columns_polars_cannot_read_exactly_arrive_as_their_exact_text(tmp_path):
    """(From a review.) ADBC gives PostgreSQL's NUMERIC as an opaque extension column: every id
    was refused as non_integer_id; a decimal256 Parquet column was a traceback; a binary id's
    reject row could not be written as JSON (a traceback)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recs.imports.typed_sources import arrow_frame

    numeric = pa.ExtensionArray.from_storage(
        pa.opaque(pa.string(), "numeric", "PostgreSQL"),
        pa.array(["9007199254740993", "7.00", "7.50", "-0", None]),
    )
    frame = arrow_frame(pa.record_batch([numeric], names=["follower_id"]))
    assert frame.schema == {"follower_id": pl.String}
    assert frame["follower_id"].to_list() == ["9007199254740993", "7", "7.50", "-0", None]
    path = tmp_path / "wide.parquet"
    pq.write_table(
        pa.table({
            "follower_id": pa.array([2**70, 5], pa.decimal256(40, 1)),
            "followee_id": pa.array([b"\x01", b"ab"], pa.binary()),
        }),
        path,
    )  # fmt: skip
    # (a second review's) dictionary-encoded text ids were refused as not whole numbers
    coded = arrow_frame(
        pa.record_batch([pa.array(["7", "8", "7"]).dictionary_encode()], names=["follower_id"])
    )
    assert coded.schema == {"follower_id": pl.String} and coded.rows() == [("7",), ("8",), ("7",)]
    batch = next(open_source(str(path), batch_rows=9).batches())
    assert batch.frame["follower_id"].to_list() == [str(2**70), "5"]
    assert batch.text(np.array([0, 1])) == [
        f'{{"follower_id":"{2**70}","followee_id":"01"}}',
        '{"follower_id":"5","followee_id":"6162"}',
    ]


def test_sql_source_reads_a_query_on_a_sqlite_database(tmp_path):
    path = tmp_path / "service.db"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE follows (src INTEGER, dst INTEGER)")
    connection.executemany("INSERT INTO follows VALUES (?, ?)", [(1, 2), (2, 3), (3, 1)])
    connection.commit()
    connection.close()
    source = open_source(
        None,
        from_sql=f"sqlite:///{path}",
        query="SELECT src AS follower_id, dst AS followee_id FROM follows ORDER BY src",
        batch_rows=1024,
    )
    assert isinstance(source, SqlQuery) and source.columns == ["follower_id", "followee_id"]
    rows, lines, _ = rows_of(source)
    assert rows == [(1, 2), (2, 3), (3, 1)] and lines == [1, 2, 3]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"path": "nowhere.csv"}, "no such file"),
        ({"path": None}, "give a file to import"),
        ({"path": "x.csv", "from_sql": "sqlite:///x.db", "query": "SELECT 1"}, "not both"),
        ({"path": None, "from_sql": "sqlite:///x.db"}, "needs --query"),
        ({"path": None, "query": "SELECT 1"}, "needs --query"),
        ({"path": None, "from_sql": "sqlite:///nowhere.db", "query": "SELECT 1"}, "no SQLite"),
        # (a review's: a thread error from SQLAlchemy's pool after a stray driver line)
        ({"path": None, "from_sql": "sqlite://", "query": "SELECT 1"}, "in-memory SQLite"),
        ({"path": None, "from_sql": "sqlite:///:memory:", "query": "SELECT 1"}, "in-memory"),
        (
            {"path": None, "query": "SELECT 1",
             "from_sql": "sqlite:///file::memory:?cache=shared&uri=true"},
            "in-memory",
        ),
    ],
)
def test_input_errors_are_one_readable_line(tmp_path, monkeypatch, kwargs, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ImportInputError, match=message) as raised:
        open_source(batch_rows=1024, **kwargs)
    assert "\n" not in str(raised.value) and isinstance(raised.value, RecsError)


def test_a_failing_query_and_a_folder_are_input_errors(tmp_path):
    path = tmp_path / "s.db"
    sqlite3.connect(path).close()
    with pytest.raises(ImportInputError, match="the query failed"):
        open_source(None, from_sql=f"sqlite:///{path}", query="SELECT * FROM nope", batch_rows=9)
    with pytest.raises(ImportInputError, match="is a folder"):
        open_source(str(tmp_path), batch_rows=9)
    with pytest.raises(ImportInputError, match="--format must be"):
        open_source(str(path), file_format="xlsx", batch_rows=9)


def test_id_columns_are_parsed_as_integers_until_a_block_holds_something_else(tmp_path):
    """Blocks of ~12 bytes: the first ones are all integers (read as Int64); from the block
    with 'x' on, the file is read as text (that block and the rest), values unchanged."""
    text = "a,b\n1,2\n3,4\n5,6\nx,8\n9,10\n"
    source = DelimitedFile(write(tmp_path / "e.csv", text), block_bytes=12)
    source.integer_columns = {"a", "b"}
    batches = [batch for batch in source.batches() if batch.frame.height]
    dtypes = [batch.frame.schema["a"] for batch in batches]
    assert dtypes[0] == pl.Int64 and dtypes[-1] == pl.String
    assert [str(v) for batch in batches for v in batch.frame["a"].to_list()] == [
        "1",
        "3",
        "5",
        "x",
        "9",
    ]


def test_corrupt_compressed_data_and_lone_carriage_returns_are_one_line(tmp_path):
    """A gzip header over bytes that are not deflate data (zlib's own error, not a gzip one),
    and a file whose lines end in a bare carriage return: each is an input error naming what
    to do, not a traceback; a CRLF file reads as usual."""
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbagegarbage")
    with pytest.raises(ImportInputError, match="cannot read .*invalid code lengths"):
        open_source(str(bad), batch_rows=1024)
    with pytest.raises(ImportInputError, match="carriage return alone"):
        open_source(str(write(tmp_path / "cr.csv", "follower_id,followee_id\r1,2\r")),
                    batch_rows=1024)  # fmt: skip
    crlf = open_source(str(write(tmp_path / "crlf.csv", "follower_id,followee_id\r\n1,2\r\n")),
                       batch_rows=1024)  # fmt: skip
    assert crlf.columns == ["follower_id", "followee_id"] and rows_of(crlf)[0] == [("1", "2")]


@pytest.mark.parametrize("text", ["follower_id,followee_id\n1,2\n", "1,2\n"])
def test_a_utf8_byte_order_mark_is_not_part_of_the_first_field(tmp_path, text):
    """Spreadsheets write a BOM first: the header is still found, and a headerless first row
    still holds the id 1."""
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    source = open_source(str(path), batch_rows=1024)
    assert source.columns[:2] in (["follower_id", "followee_id"], ["1", "2"])
    assert rows_of(source)[0] == [("1", "2")]
