"""The CLI's tables on a narrow terminal (``recs.cli.print_whole``, ``print_mapping``): run
ids and paths are printed whole on one line, wider than the terminal if need be."""

from __future__ import annotations

import pytest
from rich.table import Table

from recs.cli.app import out, print_mapping, print_whole


@pytest.fixture
def narrow(monkeypatch, capsys):
    """The CLI's console at 80 columns; returns a reader of what it printed."""
    width = out.width
    out.width = 80
    yield lambda: capsys.readouterr().out
    out.width = width


def test_a_path_with_wide_characters_and_brackets_prints_whole_and_as_it_is(narrow):
    """(From a review.) A CJK path counts two screen cells per character, and "[b]" is text,
    not Rich markup: the value comes out on one line, character for character."""
    path = "/srv/データ/推薦/[b]nightly[/b]/" + "x" * 70 + "/index.html"
    print_mapping("run r", {"Data Docs": path, "shards": "000 computed, 001 computed"})
    lines = narrow().splitlines()
    assert any(path in line for line in lines), lines


def test_a_long_run_id_stays_whole_beside_a_column_that_wraps(narrow):
    """(From a review.) 200 carried-over shards beside a 64-character run id: the id and the
    numbers stay whole (they were cut with "…" and the columns dropped), the list wraps."""
    run_id = "scheduled__2026-11-01T00.00.00-a-backfill-of-last-weeks-" + "x" * 8
    carried = ", ".join(f"{i:03d} ({run_id})" for i in range(200))
    table = Table(title="published versions")
    for column in ("run_id", "rows", "carried over (from)"):
        table.add_column(column, no_wrap=column != "carried over (from)")
    table.add_row(run_id, "985,580", carried)
    print_whole(table)
    lines = narrow().splitlines()
    assert any(run_id in line and "985,580" in line for line in lines), lines[:6]
    assert sum(line.count(f"({run_id})") for line in lines) == 200


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("users", 82_168, "82,168"),
        ("seed", 20_261_101, "20261101"),
        ("shard_id", 12_345, "12345"),
        ("share", 0.05, "0.050"),
        ("previous", None, "none"),
        ("current", True, "yes"),
        ("rebuilt", False, "no"),
        ("discarded_snapshots", [], "none"),
        ("dates", ["2026-11-01", "2026-11-02"], "2026-11-01, 2026-11-02"),
        ("computed_shards", [998, 1000, 1001], "998, 1000, 1001"),
        ("flags", [True, False], "yes, no"),
        ("by status", {"active": 79_796, "pending": 12}, "active 79,796, pending 12"),
        ("path", "/tmp/[b]x", "/tmp/[b]x"),
    ],
)
def test_a_key_value_table_shows_values_as_a_reader_reads_them(key, value, shown):
    """(From a newcomer: tables showed None, True, [] and {'active': 79796}, and the seed
    as 20,261,101.)"""
    from recs.cli.app import shown_value

    assert shown_value(key, value) == shown
