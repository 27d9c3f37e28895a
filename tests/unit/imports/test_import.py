"""recs.imports.run.import_table end to end on hand-made files, on SQLite and PostgreSQL.

Every test takes ``store_url`` (tests/conftest.py), so it runs against a SQLite file and a
database on a real PostgreSQL server; the expected rows are derived by hand in each docstring.
"""

from __future__ import annotations

import datetime as dt
import gzip
import re
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from recs.config import Settings
from recs.errors import ImportInputError, LiveStoreError
from recs.imports import staging as staging_module
from recs.imports import writers
from recs.imports.run import ImportOptions, import_table, parse_options
from recs.imports.sources import open_source
from recs.imports.tables import DEFAULT_TIME
from recs.ingest.reconcile import reconcile_counts
from recs.store.connections import engine_for
from recs.store.readers import open_reader

T = dt.datetime


def settings_for(store_url: str, tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home", store_url=store_url)


def run_import(
    settings: Settings,
    tmp_path: Path,
    command: str,
    text: str | None = None,
    *,
    name: str = "input.csv",
    columns: dict | None = None,
    source_options: dict | None = None,
    time_format: str = "iso",
    progress=None,
    **options,
) -> dict:
    path = None
    if text is not None:
        path = tmp_path / name
        data = text.encode()
        path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    source = open_source(
        str(path) if path else None, batch_rows=settings.import_batch_rows, **(source_options or {})
    )
    parse = parse_options(settings, time_format=time_format)
    return import_table(
        command, source, columns or {}, settings, ImportOptions(parse=parse, **options), progress
    )


def table(settings: Settings, name: str, order: tuple[str, ...] | None = None) -> list[tuple]:
    with open_reader(settings.live_store_url) as reader:
        frame = reader.read_table(name)
    return frame.sort(order or frame.columns[:2]).rows()


def follow_counts(settings: Settings) -> list[tuple]:
    engine = engine_for(settings.live_store_url)
    try:
        with engine.connect() as connection:
            rows = connection.exec_driver_sql(
                "SELECT user_id, follower_count, following_count FROM user_follow_counts "
                "ORDER BY user_id"
            ).all()
    finally:
        engine.dispose()
    return [tuple(row) for row in rows]


def scalar(settings: Settings, sql: str):
    engine = engine_for(settings.live_store_url)
    try:
        with engine.connect() as connection:
            return connection.exec_driver_sql(sql).scalar()
    finally:
        engine.dispose()


def empty(settings: Settings) -> None:
    """Delete the edges and accounts (the engine disposed of at once: the import's ADBC writer
    must not find this process's sqlite3 holding the file, recs/store/README.md)."""
    engine = engine_for(settings.live_store_url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM follow_edges")
            connection.exec_driver_sql("DELETE FROM users")
    finally:
        engine.dispose()


EDGES = """follower_id,followee_id,created_at,status
1,2,2026-01-01T00:00:00Z,active
2,1,2026-01-02T00:00:00Z,active
1,3,2026-01-03T00:00:00Z,pending
3,4,2026-01-04T00:00:00Z,active
"""


def test_edges_into_an_empty_store_create_the_accounts_they_name(store_url, tmp_path):
    """Four follows; accounts 1..4 are created: created_at the earliest time of a row naming
    them (1: Jan 1, 2: Jan 1, 3: Jan 3, 4: Jan 4), last_active_at the latest follow they made
    (1: Jan 3, 2: Jan 2, 3: Jan 4, 4: none). Counts count active follows only (1 -> 3 is
    pending): 1 has 1 follower and 1 following, 2 has 1/1, 3 has 0/1, 4 has 1/0."""
    settings = settings_for(store_url, tmp_path)
    summary = run_import(settings, tmp_path, "edges", EDGES)
    assert summary["mode"] == "fresh" and summary["loaded"] == 4 and summary["rejected"] == 0
    assert summary["users_created"] == 4 and summary["balanced"]
    assert summary["rejects_file"] is None
    assert_reverse_copy_complete(settings)
    assert table(settings, "follow_edges") == [
        (1, 2, T(2026, 1, 1), "active"),
        (1, 3, T(2026, 1, 3), "pending"),
        (2, 1, T(2026, 1, 2), "active"),
        (3, 4, T(2026, 1, 4), "active"),
    ]
    assert table(settings, "users") == [
        (1, T(2026, 1, 1), T(2026, 1, 3), "active", True, False),
        (2, T(2026, 1, 1), T(2026, 1, 2), "active", True, False),
        (3, T(2026, 1, 3), T(2026, 1, 4), "active", True, False),
        (4, T(2026, 1, 4), None, "active", True, False),
    ]
    assert follow_counts(settings) == [(1, 1, 1), (2, 1, 1), (3, 0, 1), (4, 1, 0)]
    assert reconcile_counts(settings)["users_drifted"] == 0


def test_a_file_without_times_gets_the_default_time_and_no_activity(store_url, tmp_path):
    """SNAP-style: headerless, tab-separated, a comment line; the self-loop 0 0 (line 3) is
    rejected. Follows get DEFAULT_TIME; accounts created_at DEFAULT_TIME and no activity."""
    settings = settings_for(store_url, tmp_path)
    summary = run_import(settings, tmp_path, "edges", "# snap\n0\t1\n0\t0\n1\t0\n", name="g.txt")
    assert summary["loaded"] == 2 and summary["rejected_by_reason"] == {"self_loop": 1}
    assert table(settings, "follow_edges") == [
        (0, 1, DEFAULT_TIME, "active"),
        (1, 0, DEFAULT_TIME, "active"),
    ]
    assert table(settings, "users") == [
        (0, DEFAULT_TIME, None, "active", True, False),
        (1, DEFAULT_TIME, None, "active", True, False),
    ]
    rejects = pl.read_csv(summary["rejects_file"])
    assert rejects.rows() == [(3, "self_loop", "follower_id = followee_id = 0", "0\t0")]


def test_users_blocks_mutes_dismissals_and_interests(store_url, tmp_path):
    """Users first (1 and 2, every column); then one row of each relationship table, which
    also creates account 9 (named by a block only: created_at its block's time, and as the
    blocked one no activity)."""
    settings = settings_for(store_url, tmp_path)
    users = (
        "user_id,created_at,last_active_at,account_status,is_discoverable,is_private\n"
        "1,2020-01-01,2026-10-31T12:00:00Z,active,true,false\n"
        "2,2020-02-01,,suspended,no,yes\n"
    )
    assert run_import(settings, tmp_path, "users", users)["loaded"] == 2
    for command, text in (
        ("blocks", "blocker_id,blocked_id,created_at\n1,9,2026-03-01\n"),
        ("mutes", "muter_id,muted_id\n2,1\n"),
        ("dismissals", "user_id,candidate_id,dismissed_at\n1,2,2026-04-01T10:00:00\n"),
        ("interests", "user_id,tag\n1, music \n1,books\n2,music\n"),
    ):
        summary = run_import(settings, tmp_path, command, text, name=f"{command}.csv")
        assert summary["rejected"] == 0 and summary["balanced"], summary
    assert table(settings, "users") == [
        (1, T(2020, 1, 1), T(2026, 10, 31, 12), "active", True, False),
        (2, T(2020, 2, 1), None, "suspended", False, True),
        (9, T(2026, 3, 1), None, "active", True, False),
    ]
    assert table(settings, "blocks") == [(1, 9, T(2026, 3, 1))]
    assert table(settings, "mutes") == [(2, 1, DEFAULT_TIME)]
    assert table(settings, "dismissed_candidates") == [(1, 2, T(2026, 4, 1, 10))]
    assert table(settings, "user_interests") == [(1, "books"), (1, "music"), (2, "music")]


def test_every_rejection_reason_is_counted_and_written_with_its_line(store_url, tmp_path):
    """One file per table, each line commented with the reason it must get; the rejects file
    lists them by line number. already_in_store needs a second import (below)."""
    settings = settings_for(store_url, tmp_path)
    edges = (
        "follower_id,followee_id,created_at,status\n"  # line 1
        "1,2,2026-01-01,active\n"  # 2 ok
        "1,2,2026-01-05,active\n"  # 3 duplicate of line 2
        "3,3,2026-01-01,active\n"  # 4 self_loop
        "x,4,2026-01-01,active\n"  # 5 non_integer_id
        "-5,4,2026-01-01,active\n"  # 6 id_out_of_range
        "9223372036854775808,4,2026-01-01,active\n"  # 7 id_out_of_range
        "4,5,2026-02-30,active\n"  # 8 bad_timestamp
        "4,6,2026-01-01,muted\n"  # 9 unknown_status
        ",6,2026-01-01,active\n"  # 10 missing_value
        "4,7,2026-01-01\n"  # 11 malformed_line
        "2,1,2026-01-02,active\n"  # 12 ok
    )
    summary = run_import(settings, tmp_path, "edges", edges, rejects=tmp_path / "edges.rej.csv")
    assert summary["loaded"] == 2 and summary["rejected"] == 9 and summary["balanced"]
    rejects = pl.read_csv(summary["rejects_file"]).select("line_number", "reason").rows()
    assert rejects == [
        (3, "duplicate"),
        (4, "self_loop"),
        (5, "non_integer_id"),
        (6, "id_out_of_range"),
        (7, "id_out_of_range"),
        (8, "bad_timestamp"),
        (9, "unknown_status"),
        (10, "missing_value"),
        (11, "malformed_line"),
    ]
    assert summary["rejects_file"] == str(tmp_path / "edges.rej.csv")
    lines = dict(pl.read_csv(summary["rejects_file"]).select("line_number", "line").rows())
    assert lines[4] == "3,3,2026-01-01,active"  # refused while reading: the raw text
    assert lines[3] == "1,2,2026-01-05 00:00:00.000000,active"  # the duplicate's own values
    said = []
    again = run_import(
        settings, tmp_path, "edges", "follower_id,followee_id,status\n2,1,pending\n9,1,active\n",
        name="more.csv", rejects=tmp_path / "more.rej.csv", progress=said.append,
    )
    assert again["mode"] == "merge" and again["loaded"] == 1
    # (a newcomer read "2 rows written" of this merge, which loaded 1)
    assert "follow_edges: 2 rows staged to merge" in said
    assert not any(line.startswith("follow_edges: ") and "written" in line for line in said)
    assert again["rejected_by_reason"] == {"already_in_store": 1}
    assert pl.read_csv(again["rejects_file"]).select("line_number", "reason", "line").rows() == [
        (2, "already_in_store", "2,1,2000-01-01 00:00:00.000000,pending")  # as read
    ]
    users = run_import(
        settings,
        tmp_path,
        "users",
        "user_id,is_private\n20,maybe\n21,no\n",
        name="users.csv",
    )
    assert users["rejected_by_reason"] == {"bad_boolean": 1}
    # a NULL last activity (never active) and an equal time are not inverted
    inverted = run_import(
        settings,
        tmp_path,
        "users",
        "user_id,created_at,last_active_at\n"
        "30,2026-05-02,2026-05-01T23:59:59\n31,2026-05-01,2026-05-01\n32,2026-05-02,\n",
        name="inverted.csv",
    )
    assert (inverted["loaded"], inverted["rejected_by_reason"]) == (2, {"active_before_created": 1})
    assert pl.read_csv(inverted["rejects_file"]).select("detail", "line").rows() == [(
        "last_active_at '2026-05-01T23:59:59' is before created_at '2026-05-02'",
        "30,2026-05-02,2026-05-01T23:59:59",
    )]  # fmt: skip
    swapped = "user_id,created_at,last_active_at\n33,2026-05-02,2026-05-01\n"
    with pytest.raises(ImportInputError, match=r"1 as active_before_created, e\.g\. line 2: "
                       r"last_active_at '2026-05-01' is before created_at '2026-05-02' \(are "
                       r"--created-at-col and --last-active-at-col the other way round\?\)"):
        run_import(settings, tmp_path, "users", swapped, name="swapped.csv")  # fmt: skip
    tags = run_import(
        settings, tmp_path, "interests", f"user_id,tag\n1,{'x' * 65}\n1,ok\n", name="tags.csv"
    )
    assert tags["rejected_by_reason"] == {"bad_tag": 1}
    floats = tmp_path / "floats.parquet"  # 2**53 + 1 written as a float64 reads as 2**53
    pl.DataFrame(
        {"follower_id": [2.0**53 + 1, 40.0, -float("inf")], "followee_id": [41.0, 42.0, 43.0]}
    ).write_parquet(floats)
    source = open_source(str(floats), batch_rows=settings.import_batch_rows)
    options = ImportOptions(parse=parse_options(settings))
    typed = import_table("edges", source, {}, settings, options)
    assert (typed["loaded"], typed["rejected_by_reason"]) == (
        1,
        {"non_integer_id": 1, "inexact_float_id": 1},
    )
    assert pl.read_csv(typed["rejects_file"]).select("detail", "line").rows() == [
        (
            "follower_id '9007199254740992.0' is above 9,007,199,254,740,991, the largest whole "
            "number a float64 column holds exactly: it may have been rounded (store ids as "
            "integers)",
            '{"followee_id":41.0,"follower_id":9007199254740992.0}',
        ),
        (  # not null, as polars' JSON writes an infinity
            "follower_id '-inf' is not a whole number",
            '{"followee_id":43.0,"follower_id":-Infinity}',
        ),
    ]
    seen = set(summary["rejected_by_reason"]) | {"already_in_store", "bad_boolean", "bad_tag"}
    seen |= set(typed["rejected_by_reason"]) | set(inverted["rejected_by_reason"])
    from recs.imports.tables import REJECT_REASONS

    assert seen == set(REJECT_REASONS)


def test_appending_merges_new_rows_and_keeps_counts_exact(store_url, tmp_path):
    """First 1->2, 2->1 (fresh). Then 2->1 again (in the store), 3->1 and 1->3 (new): two
    loaded, one rejected; account 3 is created, 1 and 2 are not touched; counts become
    1: 2 followers / 2 following, 2: 1/1, 3: 1/1."""
    settings = settings_for(store_url, tmp_path)
    run_import(settings, tmp_path, "edges", "follower_id,followee_id\n1,2\n2,1\n")
    summary = run_import(
        settings,
        tmp_path,
        "edges",
        "follower_id,followee_id,created_at\n2,1,2026-05-01\n3,1,2026-05-02\n1,3,2026-05-03\n",
        name="second.csv",
    )
    assert summary["mode"] == "merge" and summary["loaded"] == 2 and summary["users_created"] == 1
    assert summary["rejected_by_reason"] == {"already_in_store": 1} and summary["balanced"]
    assert [row[:2] for row in table(settings, "follow_edges")] == [(1, 2), (1, 3), (2, 1), (3, 1)]
    assert follow_counts(settings) == [(1, 2, 2), (2, 1, 1), (3, 1, 1)]
    assert table(settings, "users")[2] == (3, T(2026, 5, 2), T(2026, 5, 2), "active", True, False)
    assert reconcile_counts(settings)["users_drifted"] == 0
    assert_reverse_copy_complete(settings)


def assert_reverse_copy_complete(settings: Settings) -> None:
    """PostgreSQL: follow_edges_reverse holds exactly follow_edges' rows (SQLite: no table)."""
    if not settings.live_store_url.startswith("postgresql"):
        return
    engine = engine_for(settings.live_store_url)
    try:
        with engine.connect() as connection:
            forward, reverse = (
                sorted(connection.exec_driver_sql(sql).all())
                for sql in (
                    "SELECT follower_id, followee_id, created_at, status FROM follow_edges",
                    "SELECT follower_id, followee_id, created_at, status FROM follow_edges_reverse",
                )
            )
    finally:
        engine.dispose()
    assert forward == reverse and forward


def test_replace_empties_that_table_only(store_url, tmp_path):
    """Edges 1->2, a block 1->2 and a follow tombstone; --replace with 5->6 leaves only 5->6,
    rebuilds the counts, drops the follow tombstones, keeps the block and accounts 1, 2."""
    settings = settings_for(store_url, tmp_path)
    run_import(settings, tmp_path, "edges", "follower_id,followee_id\n1,2\n")
    run_import(settings, tmp_path, "blocks", "blocker_id,blocked_id\n1,2\n", name="b.csv")
    engine = engine_for(settings.live_store_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO relationship_tombstones VALUES ('follow', 7, 8, 1, 'e1'), "
            "('block', 7, 8, 1, 'e2')"
        )
    engine.dispose()
    summary = run_import(
        settings, tmp_path, "edges", "follower_id,followee_id\n5,6\n", name="new.csv", replace=True
    )
    assert summary["mode"] == "fresh" and summary["replace"] and summary["loaded"] == 1
    assert [row[:2] for row in table(settings, "follow_edges")] == [(5, 6)]
    assert follow_counts(settings) == [(5, 0, 1), (6, 1, 0)]
    assert table(settings, "blocks") == [(1, 2, DEFAULT_TIME)]
    assert [row[0] for row in table(settings, "users")] == [1, 2, 5, 6]
    assert scalar(settings, "SELECT count(*) FROM relationship_tombstones") == 1
    assert reconcile_counts(settings)["users_drifted"] == 0


def test_users_created_with_defaults_are_updated_only_when_asked(store_url, tmp_path):
    settings = settings_for(store_url, tmp_path)
    run_import(settings, tmp_path, "edges", "follower_id,followee_id\n1,2\n")
    users = "user_id,account_status,last_active_at\n1,suspended,2026-10-01\n3,active,\n"
    plain = run_import(settings, tmp_path, "users", users, name="u.csv")
    assert plain["loaded"] == 1 and plain["rejected_by_reason"] == {"already_in_store": 1}
    assert plain["hint"] == (
        f"accounts of {tmp_path / 'u.csv'} already in the store: 1; if an earlier import "
        "created them with default columns (one of edges, say), import this file again with "
        "--update-existing to set their columns from it"
    )
    updated = run_import(settings, tmp_path, "users", users, name="u.csv", update_existing=True)
    assert updated["updated"] == 2 and updated["loaded"] == 0 and updated["balanced"]
    assert updated["hint"] is None
    assert table(settings, "users")[0] == (
        1,
        DEFAULT_TIME,
        T(2026, 10, 1),
        "suspended",
        True,
        False,
    )
    # (From a newcomer's run.) A file that maps fewer columns updates those only: account 1
    # stays suspended with its activity; every unmapped column was reset to its default
    private = "user_id,is_private,created_at\n1,true,2026-09-01\n"
    again = run_import(settings, tmp_path, "users", private, name="p.csv", update_existing=True)
    assert (again["updated"], again["loaded"]) == (1, 0)
    assert table(settings, "users")[0] == (1, T(2026, 9, 1), T(2026, 10, 1), "suspended",
                                           True, True)  # fmt: skip
    # a file mapping no column but the key has nothing to update: its rows are in the store
    ids_only = run_import(settings, tmp_path, "users", "user_id\n1\n", name="i.csv",
                          update_existing=True)  # fmt: skip
    assert (ids_only["updated"], ids_only["rejected_by_reason"]) == (0, {"already_in_store": 1})
    assert table(settings, "users")[0][5] is True


def test_a_failure_part_way_leaves_the_store_as_it_was(store_url, tmp_path, monkeypatch):
    """A store with 1->2; a --replace import of 40 follows fails on its third batch of 4 rows
    (after --replace emptied the table and two batches went in): the store still holds
    exactly 1->2, its counts and its accounts."""
    settings = settings_for(store_url, tmp_path)
    run_import(settings, tmp_path, "edges", "follower_id,followee_id\n1,2\n")
    before = {name: table(settings, name) for name in ("follow_edges", "users")}
    monkeypatch.setattr(staging_module, "STREAM_BATCH_ROWS", 4)
    calls = []
    real = writers.StoreWriter._ingest

    def failing(self, *args, **kwargs):
        def frames(inner):
            for frame in inner:
                calls.append(frame.height)
                if len(calls) == 3:
                    raise OSError("disk full (simulated)")
                yield frame

        return real(self, args[0], frames(args[1]), **kwargs)

    monkeypatch.setattr(writers.StoreWriter, "_ingest", failing)
    big = "follower_id,followee_id\n" + "".join(f"{i},{i + 1}\n" for i in range(10, 50))
    with pytest.raises(OSError, match="simulated"):
        run_import(settings, tmp_path, "edges", big, name="big.csv", replace=True)
    assert calls == [4, 4, 4]
    assert {name: table(settings, name) for name in before} == before
    assert follow_counts(settings) == [(1, 0, 1), (2, 1, 0)]
    assert not list((settings.home / "tmp").glob("import-*"))  # the staging area is gone


def test_duplicates_are_found_across_batches(store_url, tmp_path, monkeypatch):
    """Batches of 2 rows in key order: (1,2)x3 spans two batches; only its first line (2)
    is kept, lines 4 and 6 are duplicates of it."""
    monkeypatch.setattr(staging_module, "STREAM_BATCH_ROWS", 2)
    settings = settings_for(store_url, tmp_path)
    text = "follower_id,followee_id\n1,2\n0,5\n1,2\n0,6\n1,2\n3,4\n"
    summary = run_import(settings, tmp_path, "edges", text)
    assert summary["loaded"] == 4
    rejects = pl.read_csv(summary["rejects_file"]).select("line_number", "detail").rows()
    assert rejects == [
        (4, "same follower_id 1, followee_id 2 as line 2"),
        (6, "same follower_id 1, followee_id 2 as line 2"),
    ]


def test_csv_tsv_gzip_parquet_and_sql_give_the_same_store(store_url, tmp_path):
    frame = pl.DataFrame(
        {
            "src": [1, 2, 3, 1],
            "dst": [2, 3, 1, 3],
            "at": [
                "2026-01-01T00:00:00Z",
                "2026-01-02T00:00:00Z",
                "2026-01-03T00:00:00Z",
                "2026-01-04T00:00:00Z",
            ],
        }
    )
    mapping = {"follower_id": "src", "followee_id": "dst", "created_at": "at"}
    inputs = {
        "csv": frame.write_csv(),
        "tsv.gz": frame.write_csv(separator="\t"),
    }
    results = []
    for index, (suffix, text) in enumerate(inputs.items()):
        settings = settings_for(store_url, tmp_path / str(index))
        (tmp_path / str(index)).mkdir()
        run_import(settings, tmp_path, "edges", text, name=f"in.{suffix}", columns=mapping)
        results.append(table(settings, "follow_edges"))
        empty(settings)  # the next format starts from an empty store again
    parquet = tmp_path / "in.parquet"
    frame.with_columns(pl.col("at").str.to_datetime(time_zone="UTC")).write_parquet(parquet)
    database = tmp_path / "service.db"
    connection = sqlite3.connect(database)
    connection.execute("CREATE TABLE follows (src INTEGER, dst INTEGER, at TEXT)")
    connection.executemany("INSERT INTO follows VALUES (?, ?, ?)", frame.rows())
    connection.commit()
    connection.close()
    for index, source_options in enumerate(
        [
            {"path": str(parquet)},
            {"path": None, "from_sql": f"sqlite:///{database}", "query": "SELECT * FROM follows"},
        ],
        start=len(results),
    ):
        settings = settings_for(store_url, tmp_path / str(index))
        source = open_source(batch_rows=1024, **source_options)
        import_table(
            "edges", source, mapping, settings, ImportOptions(parse=parse_options(settings))
        )
        results.append(table(settings, "follow_edges"))
        empty(settings)
    assert len(results) == 4 and all(result == results[0] for result in results)
    assert results[0][0] == (1, 2, T(2026, 1, 1), "active")


def test_a_column_that_does_not_parse_at_all_stops_the_import(store_url, tmp_path):
    """Bitcoin-OTC-style epoch seconds read as ISO: every row refused for one reason, so
    nothing is written and the message says what to check."""
    settings = settings_for(store_url, tmp_path)
    text = "1,2,5,1289241911.72836\n2,3,5,1289241941.53378\n"
    with pytest.raises(ImportInputError, match=r"rejected, 2 as bad_timestamp.*--time-format"):
        run_import(settings, tmp_path, "edges", text, columns={"created_at": "4"})
    summary = run_import(
        settings, tmp_path, "edges", text, columns={"created_at": "4"}, time_format="epoch-s"
    )
    assert summary["loaded"] == 2
    assert table(settings, "follow_edges")[0][2] == T(2010, 11, 8, 18, 45, 11, 728360)


def test_ids_pandas_wrote_as_decimals_are_refused_with_the_fix(store_url, tmp_path):
    """pandas writes a float id column (one with a NaN) as 1000.0: the import stops and says
    how to write the ids instead, naming each source column that holds such ids (a review: the
    store's name was given, and only the first column's); a fractional id among them gets the
    generic advice, and so does a file of fractions."""
    settings = settings_for(store_url, tmp_path)
    whole = "src,dst\n1000.0,2.0\n3.0,4\n"
    with pytest.raises(ImportInputError, match=re.escape(
        "2 as non_integer_id, e.g. line 2: follower_id '1000.0' is not a whole number (the ids "
        "are written as decimals, as pandas writes a float column: write them as integers, "
        "e.g. df.astype({'src': 'Int64', 'dst': 'Int64'}) before to_csv, or write Parquet")):
        run_import(settings, tmp_path, "edges", whole,
                   columns={"follower_id": "src", "followee_id": "dst"})  # fmt: skip
    generic = r"is not a whole number \(check the --<column>-col options"
    for text in ("follower_id,followee_id\n1.0,2\n1.5,3\n2.5,4\n", "1.5,2\n2.5,3\n"):
        with pytest.raises(ImportInputError, match=generic):
            run_import(settings, tmp_path, "edges", text)
    text_ids = tmp_path / "text-ids.parquet"  # text in a typed source: no pandas advice
    pl.DataFrame({"follower_id": ["7.0"], "followee_id": ["2"]}).write_parquet(text_ids)
    source = open_source(str(text_ids), batch_rows=settings.import_batch_rows)
    with pytest.raises(ImportInputError, match=re.escape(
        "(the ids are text written as decimals: store follower_id as integers")):
        import_table("edges", source, {}, settings, ImportOptions(parse=parse_options(settings)))


def test_a_wrong_time_format_is_not_hidden_by_a_few_other_bad_lines(store_url, tmp_path):
    """Most rows refused as bad_timestamp, one self-loop and one non-integer id beside them:
    still no row accepted, so the import stops (exit 2 in the CLI) and names each count; the
    store stays empty."""
    settings = settings_for(store_url, tmp_path)
    text = "".join(f"{i},{i + 1},5,12892419{i}.5\n" for i in range(1, 5)) + "7,7,5,1\nx,2,5,1\n"
    with pytest.raises(ImportInputError, match=r"all 6 rows .* rejected, 4 as bad_timestamp "
                       r"\(also (self_loop 1, non_integer_id 1|non_integer_id 1, self_loop 1)\)"):
        run_import(settings, tmp_path, "edges", text, columns={"created_at": "4"})
    try:  # refused before the store is opened: a new SQLite store is not even created
        assert table(settings, "follow_edges") == []
    except LiveStoreError as missing:
        assert "load data first" in str(missing)


def test_generate_missing_fills_what_the_input_and_store_lack(store_url, tmp_path):
    """A 30-node ring with chords and no times: users, follow times, pending requests, blocks,
    mutes, dismissals and interests are generated (the store was empty); a second import with
    --generate-missing into the now non-empty tables generates only the new accounts."""
    settings = settings_for(store_url, tmp_path)
    text = "follower_id,followee_id\n" + "".join(
        f"{i},{(i + step) % 30}\n" for i in range(30) for step in (1, 2, 7)
    )
    summary = run_import(settings, tmp_path, "edges", text, generate_missing=True)
    assert summary["loaded"] == 90 and summary["users_created"] == 30 and summary["balanced"]
    assert set(summary["generated"]) >= {
        "users.created_at",
        "users.account_status",
        "follow_edges.created_at",
        "follow_edges (status='pending')",
        "user_interests",
    }
    assert summary["generated_rows"]["user_interests"] > 0
    statuses = {row[3] for row in table(settings, "users")}
    assert statuses <= {"active", "suspended", "deactivated"}
    edges = table(settings, "follow_edges")
    assert len(edges) == 90 + summary["generated_rows"]["pending_follows"]
    assert all(row[2] != DEFAULT_TIME for row in edges)
    assert reconcile_counts(settings)["users_drifted"] == 0
    again = run_import(
        settings,
        tmp_path,
        "edges",
        "follower_id,followee_id\n100,101\n",
        name="more.csv",
        generate_missing=True,
    )
    assert again["users_created"] == 2 and "user_interests" not in again["generated"]
    assert "follow_edges (status='pending')" not in again["generated"]


def test_options_that_belong_to_another_table_are_refused(tmp_path):
    settings = Settings(home=tmp_path)
    with pytest.raises(ImportInputError, match="--update-existing applies to recs import users"):
        run_import(settings, tmp_path, "edges", EDGES, update_existing=True)
    with pytest.raises(ImportInputError, match="--generate-missing applies to recs import edges"):
        run_import(settings, tmp_path, "users", "user_id\n1\n", generate_missing=True)


def test_only_sqlite_files_and_postgresql_are_bulk_targets(tmp_path):
    settings = Settings(home=tmp_path, store_url="sqlite://")
    with pytest.raises(ImportInputError, match="writes SQLite files"):
        run_import(settings, tmp_path, "edges", EDGES)


def _layout(url: str) -> dict[str, list[tuple]]:
    """Indexes, constraints and triggers of the store's tables (PostgreSQL catalogue)."""
    engine = engine_for(url)
    try:
        with engine.connect() as connection:
            return {
                "indexes": connection.exec_driver_sql(
                    "SELECT tablename, indexname, indexdef FROM pg_indexes "
                    "WHERE schemaname = 'public' ORDER BY 1, 2"
                ).all(),
                "constraints": connection.exec_driver_sql(
                    "SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid) "
                    "FROM pg_constraint WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2"
                ).all(),
                "triggers": connection.exec_driver_sql(
                    "SELECT tgrelid::regclass::text, tgname, tgenabled FROM pg_trigger "
                    "WHERE NOT tgisinternal ORDER BY 1, 2"
                ).all(),
            }
    finally:
        engine.dispose()


def test_a_fresh_postgresql_load_leaves_the_schema_exactly_as_created(postgres_url, tmp_path):
    """The fresh path drops and re-adds follow_edges' keys and toggles the reverse trigger:
    afterwards every index, constraint and trigger is the one create_schema makes, and a
    write through the trigger still reaches follow_edges_reverse."""
    from recs.store import schema

    engine = engine_for(postgres_url)
    schema.create_schema(engine)
    engine.dispose()
    created = _layout(postgres_url)
    settings = settings_for(postgres_url, tmp_path)
    run_import(settings, tmp_path, "edges", EDGES)
    assert _layout(postgres_url) == created
    engine = engine_for(postgres_url)
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO follow_edges (follower_id, followee_id, created_at) VALUES (4, 1, now())"
        )
    engine.dispose()
    assert (
        scalar(
            settings,
            "SELECT count(*) FROM follow_edges_reverse WHERE followee_id = 1 AND follower_id = 4",
        )
        == 1
    )
    assert scalar(settings, "SELECT count(*) FROM follow_edges_reverse") == 5


def test_from_sql_reads_the_follow_services_own_postgresql(store_url, postgres_url, tmp_path):
    """A follow service's table on PostgreSQL (its own names and a timestamptz), imported with
    --from-sql/--query into each store: typed columns come through as they are."""
    service = engine_for(postgres_url)
    with service.begin() as connection:
        connection.exec_driver_sql(
            "CREATE TABLE follows (src bigint, dst bigint, at timestamptz, state text)"
        )
        connection.exec_driver_sql(
            "INSERT INTO follows VALUES (1, 2, '2026-01-01 10:00+02', 'active'), "
            "(2, 1, '2026-01-02 00:00+00', 'pending'), (3, 3, '2026-01-03 00:00+00', 'active')"
        )
    service.dispose()
    settings = settings_for(store_url, tmp_path)
    source = open_source(
        None,
        from_sql=postgres_url,
        query="SELECT src, dst, at, state FROM follows ORDER BY src",
        batch_rows=1024,
    )
    summary = import_table(
        "edges",
        source,
        {"follower_id": "src", "followee_id": "dst", "created_at": "at", "status": "state"},
        settings,
        ImportOptions(parse=parse_options(settings)),
    )
    assert summary["loaded"] == 2 and summary["rejected_by_reason"] == {"self_loop": 1}
    assert table(settings, "follow_edges") == [
        (1, 2, T(2026, 1, 1, 8), "active"),
        (2, 1, T(2026, 1, 2), "pending"),
    ]
    rejects = pl.read_csv(summary["rejects_file"])
    assert rejects["line_number"].to_list() == [3]  # the result's third row
    assert rejects["line"][0].startswith('{"src":3,"dst":3')


def test_postgresql_numeric_ids_are_read_exactly(postgres_url, tmp_path):
    """(From a review: ADBC gives NUMERIC as an opaque column, and every such id was refused as
    non_integer_id.) 2**53 + 1 arrives exact, 7.00 is 7, 7.50 is refused."""
    service = engine_for(postgres_url)
    with service.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE wide (src numeric(20, 0), dst numeric(20, 2))")
        connection.exec_driver_sql(
            "INSERT INTO wide VALUES (9007199254740993, 7.00), (8, 7.50)"
        )
    service.dispose()
    settings = settings_for(f"sqlite:///{tmp_path / 'live.db'}", tmp_path)

    def imported(command: str, query: str, mapping: dict) -> dict:
        source = open_source(None, from_sql=postgres_url, query=query, batch_rows=1024)
        options = ImportOptions(parse=parse_options(settings))
        return import_table(command, source, mapping, settings, options)

    edges = {"follower_id": "src", "followee_id": "dst"}
    summary = imported("edges", "SELECT src, dst FROM wide ORDER BY src DESC", edges)
    assert (summary["loaded"], summary["rejected_by_reason"]) == (1, {"non_integer_id": 1})
    assert [row[:2] for row in table(settings, "follow_edges")] == [(2**53 + 1, 7)]
    # (a second review's) money came as int64 cents (7 imported as 700); an interval column,
    # even unmapped, stopped the import; bytes in a flag column were a traceback
    query = "SELECT 9::money AS src, 8 AS dst, '1 day'::interval AS waited"
    assert imported("edges", query, edges)["loaded"] == 1
    assert (9, 8) in [row[:2] for row in table(settings, "follow_edges")]
    # (the same review's) an oid came as int32: 3,000,000,000 wrapped and was refused
    assert imported("edges", "SELECT 3000000000::oid AS src, 8::oid AS dst", edges)["loaded"] == 1
    assert (3_000_000_000, 8) in [row[:2] for row in table(settings, "follow_edges")]
    # (a third review's) an infinity or NaN inside a list was null; a time in the line is
    # written as polars writes it whichever JSON writer the row needs
    query = (
        "SELECT 'x' AS src, 3 AS dst, '2020-01-01+00'::timestamptz AS at, "
        "ARRAY['Infinity'::float8, 'NaN'] AS arr UNION ALL SELECT '4', 5, NULL, NULL"
    )
    summary = imported("edges", query, edges)
    assert pl.read_csv(summary["rejects_file"])["line"].to_list() == [
        '{"src":"x","dst":3,"at":"2020-01-01T00:00:00+00:00","arr":[Infinity,NaN]}'
    ]
    query = (
        "SELECT 30 AS user_id, '\\xff'::bytea AS is_private, "
        "ARRAY['\\xff'::bytea] AS extra UNION ALL SELECT 31, 'true'::bytea, NULL"
    )
    summary = imported("users", query, {"user_id": "user_id", "is_private": "is_private"})
    assert (summary["loaded"], summary["rejected_by_reason"]) == (1, {"bad_boolean": 1})
    assert pl.read_csv(summary["rejects_file"])["line"].to_list() == [
        '{"user_id":30,"is_private":"ff","extra":["ff"]}'
    ]


def test_rejects_that_cannot_be_written_import_nothing(store_url, tmp_path):
    """--rejects naming a folder is refused before any work; a rejects file that fails to be
    written after the rows were staged (the disk full) rolls the import back:
    nothing in the store, so a rerun imports everything once."""
    settings = settings_for(store_url, tmp_path)
    text = "1,2\n2,2\n3,4\n"  # 2,2 is a self-loop: one reject to keep
    (tmp_path / "a-folder").mkdir()
    with pytest.raises(ImportInputError, match="is a folder"):
        run_import(settings, tmp_path, "edges", text, rejects=tmp_path / "a-folder")
    with pytest.raises(ImportInputError, match="does not exist"):
        run_import(settings, tmp_path, "edges", text, rejects=tmp_path / "gone" / "r.csv")
    def disk_full(self, path):
        raise OSError(28, "No space left on device")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(staging_module.Staging, "write_rejects", disk_full)
        with pytest.raises(ImportInputError, match="cannot write the rejects file.*No space.*"
                           "nothing imported"):
            run_import(settings, tmp_path, "edges", text, rejects=tmp_path / "r.csv")
    try:
        assert table(settings, "follow_edges") == []
    except LiveStoreError as missing:
        assert "load data first" in str(missing)
    summary = run_import(settings, tmp_path, "edges", text, rejects=tmp_path / "r.csv")
    assert summary["loaded"] == 2 and summary["rejected_by_reason"] == {"self_loop": 1}


def test_replacing_users_that_other_rows_name_is_refused(store_url, tmp_path):
    """import users --replace while follow edges name the accounts would orphan every edge:
    refused in one line, nothing changed; into a store with users only it replaces them."""
    settings = settings_for(store_url, tmp_path)
    run_import(settings, tmp_path, "users", "user_id\n1\n2\n3\n", name="u.csv")
    replaced = run_import(settings, tmp_path, "users", "user_id\n7\n8\n", name="u2.csv",
                          replace=True)  # fmt: skip
    assert replaced["loaded"] == 2 and [r[0] for r in table(settings, "users")] == [7, 8]
    run_import(settings, tmp_path, "edges", "follower_id,followee_id\n7,8\n", name="e.csv")
    with pytest.raises(ImportInputError, match="refusing import users --replace: follow_edges"):
        run_import(settings, tmp_path, "users", "user_id\n9\n", name="u3.csv", replace=True)
    assert [r[0] for r in table(settings, "users")] == [7, 8]
    assert [r[:2] for r in table(settings, "follow_edges")] == [(7, 8)]
